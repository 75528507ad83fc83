"""Evidence as time series named as the exporter's metrics, whatever the source.

A bundle is replayed through the collectors sample by sample; the live node is sampled
through the same collectors; both land in a `Series` the rules evaluate. (Prometheus range
queries fill the same structure.)
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from fleetscope.collectors.base import bundle_roots
from fleetscope.config import Config
from fleetscope.exporter import Exporter
from fleetscope.exposition import Family
from fleetscope.rules.promql import Series

from .bundle import Bundle, replay_config

_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = re.compile(r"\\(.)")


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


class _LabelCache(dict):
    """Label string -> dict, parsed once: the same label sets recur in every sample."""

    def __missing__(self, label_string: str) -> dict[str, str]:
        parsed = {k: _unescape(v) for k, v in _LABEL.findall(label_string)}
        self[label_string] = parsed
        return parsed


def add_families(series: Series, families: list[Family], timestamp_ms: int,
                 cache: _LabelCache) -> None:
    for family in families:
        name = family.name
        for label_string, value in family.samples:
            series.add(name, cache[label_string], timestamp_ms, float(value))
        for block in family.blocks:
            for line in block.split("\n"):
                # Block lines carry their own sample name (a histogram's _bucket/_sum/_count).
                head, _, value = line.rpartition(" ")
                brace = head.find("{")
                sample_name = head if brace < 0 else head[:brace]
                label_string = "" if brace < 0 else head[brace + 1:-1]
                series.add(sample_name, cache[label_string], timestamp_ms, float(value))


def bundle_series(bundle: Bundle, config: Config,
                  progress: Callable[[int, int], None] | None = None) -> Series:
    """Replay every sample of a bundle through the collectors."""
    exporter = Exporter(bundle.samples[0].directory, replay_config(config))
    series = Series()
    cache = _LabelCache()
    for index, sample in enumerate(bundle.samples):
        families = exporter.collect(now=sample.time, roots=bundle_roots(sample.directory))
        add_families(series, families, int(round(sample.time * 1000)), cache)
        if progress:
            progress(index + 1, len(bundle.samples))
    return series


def live_series(config: Config, seconds: float, interval: float, root: str = "/",
                progress: Callable[[int, int], None] | None = None) -> Series:
    """Sample this node through the collectors for `seconds`, every `interval`."""
    exporter = Exporter(root, replay_config(config))
    series = Series()
    cache = _LabelCache()
    count = max(2, int(seconds / interval) + 1)
    start = time.monotonic()
    for index in range(count):
        target = start + index * interval
        delay = target - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        now = time.time()
        add_families(series, exporter.collect(now=now), int(round(now * 1000)), cache)
        if progress:
            progress(index + 1, count)
    return series
