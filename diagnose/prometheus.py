"""Evidence from a Prometheus server: range queries for every metric the rules read.

    GET /api/v1/query_range?query={__name__="fleetscope_cpu_core_busy_ratio",instance="n1"}
        &start=...&end=...&step=15s

Results land in the same `Series` a bundle replay fills, keeping their `instance` label, so
the same rules evaluate per node (`--node`) or across the fleet (`--fleet`).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request

from fleetscope.rules.promql import Series


class PrometheusError(Exception):
    """Prometheus unreachable or answering garbage: one line for the user."""


def _get(base: str, path: str, params: dict, timeout: float) -> dict:
    url = f"{base.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            document = json.load(response)
    except urllib.error.HTTPError as err:
        raise PrometheusError(f"Prometheus at {base} answered HTTP {err.code}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise PrometheusError(f"Prometheus at {base} is unreachable: {reason}") from None
    except ValueError:
        raise PrometheusError(f"Prometheus at {base} did not answer JSON") from None
    if not isinstance(document, dict) or document.get("status") != "success":
        error = document.get("error") if isinstance(document, dict) else None
        raise PrometheusError(f"Prometheus query failed: {error or 'unexpected answer'}")
    return document["data"]


def prometheus_series(base: str, metrics: set[str], seconds: float, node: str | None,
                      step: float = 15.0, timeout: float = 10.0) -> tuple[Series, list[str]]:
    """Range-query each metric over the last `seconds`; returns the series and the nodes."""
    end = time.time()
    start = end - max(seconds, step * 2)
    series = Series()
    nodes: set[str] = set()
    for name in sorted(metrics):
        selector = f'{{__name__="{name}"'
        if node:
            selector += f',instance="{node}"'
        selector += "}"
        data = _get(base, "/api/v1/query_range",
                    {"query": selector, "start": f"{start:.3f}", "end": f"{end:.3f}",
                     "step": f"{step:g}s"}, timeout)
        for result in data.get("result", []):
            labels = dict(result.get("metric", {}))
            labels.pop("__name__", None)
            labels.pop("job", None)
            if "instance" in labels:
                nodes.add(labels["instance"])
            for timestamp, value in result.get("values", []):
                series.add(name, labels, int(round(float(timestamp) * 1000)), float(value))
    return series, sorted(nodes)
