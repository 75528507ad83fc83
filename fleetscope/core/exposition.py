"""Metric families and their rendering in the Prometheus text formats.

Renders the classic text format 0.0.4 and OpenMetrics 1.0.0, e.g.

    # HELP fleetscope_cpu_seconds_total Seconds the CPUs spent in each mode.
    # TYPE fleetscope_cpu_seconds_total counter
    fleetscope_cpu_seconds_total{cpu="0",mode="user"} 8.37

Node state is rendered by hand rather than through prometheus-client's object model: on a
256-core node a scrape carries thousands of samples, and building a client object per sample
costs several times more CPU than formatting the line (see bench/). Label strings are built
once per label set and reused by the collectors that have many samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


class Family:
    """One metric family: a name, a type, a help text and its samples.

    A sample is `(label_string, value)`, the label string already rendered by `labels()`.
    Counter names end in `_total` as in the text format.
    """

    __slots__ = ("name", "type", "help", "samples", "blocks")

    def __init__(self, name: str, type: str, help: str):
        self.name = name
        self.type = type
        self.help = help
        self.samples: list[tuple[str, float]] = []
        # Sample lines rendered by the collector itself, for families with thousands of
        # samples (per-core counters): one string per block of lines, no trailing newline.
        self.blocks: list[str] = []

    def add(self, value: float, label_string: str = "") -> Family:
        self.samples.append((label_string, value))
        return self

    def __repr__(self) -> str:
        return f"Family({self.name!r}, {self.type!r}, {len(self.samples)} samples)"


def counter(name: str, help: str) -> Family:
    return Family(name, "counter", help)


def gauge(name: str, help: str) -> Family:
    return Family(name, "gauge", help)


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(**pairs: object) -> str:
    """Render a label set: labels(cpu=3, mode="user") -> 'cpu="3",mode="user"'."""
    return ",".join(f'{key}="{_escape_label_value(str(value))}"' for key, value in pairs.items())


def format_value(value: float) -> str:
    """A sample value as both formats spell it (Go-style +Inf/-Inf/NaN)."""
    if type(value) is int:
        return str(value)
    if math.isfinite(value):
        return repr(float(value))
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def _escape_help(text: str, openmetrics: bool) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if openmetrics else text


def render(families: Iterable[Family], openmetrics: bool = False) -> str:
    """Render families in the text format, or OpenMetrics without its trailing `# EOF`."""
    out: list[str] = []
    append = out.append
    fmt = format_value
    for family in families:
        name = family.name
        type_name = name
        if openmetrics and family.type == "counter" and name.endswith("_total"):
            type_name = name[:-6]  # OpenMetrics names the family without the suffix
        append(f"# HELP {type_name} {_escape_help(family.help, openmetrics)}")
        append(f"# TYPE {type_name} {family.type}")
        out.extend(family.blocks)
        for label_string, value in family.samples:
            if label_string:
                append(f"{name}{{{label_string}}} {fmt(value)}")
            else:
                append(f"{name} {fmt(value)}")
    if not out:
        return ""
    out.append("")
    return "\n".join(out)


def wants_openmetrics(accept_header: str | None) -> bool:
    """True when the scraper accepts OpenMetrics 1.0 (as Prometheus does by default).

    Prometheus sends e.g. 'application/openmetrics-text;version=1.0.0,...;q=0.75,
    text/plain;version=0.0.4;q=0.5,*/*;q=0.1'; we honour the highest-q offer we can serve.
    """
    if not accept_header:
        return False
    best_q, best_is_om = -1.0, False
    for offer in accept_header.split(","):
        media, *params = (p.strip() for p in offer.split(";"))
        q = 1.0
        version = None
        for param in params:
            key, _, val = param.partition("=")
            if key.strip() == "q":
                try:
                    q = float(val)
                except ValueError:
                    q = 0.0
            elif key.strip() == "version":
                version = val.strip()
        if media == "application/openmetrics-text" and version in (None, "1.0.0"):
            is_om = True
        elif media in ("text/plain", "*/*", "text/*"):
            is_om = False
        else:
            continue
        if q > best_q:
            best_q, best_is_om = q, is_om
    return best_is_om
