"""A finding's evidence as the Node and Findings pages show it: its evidence table in units
people read, and its rule's evidence views (evidence_views.py declares them, this module
evaluates them on a node's history, charts.py draws them). No streamlit here."""

from __future__ import annotations

import math

import pandas as pd

from fleetscope.core import units
from fleetscope.dashboard import evidence_views
from fleetscope.dashboard.frames import local_times
from fleetscope.dashboard.rulebook import code_span
from fleetscope.rules.catalog import evidence_picks
from fleetscope.rules.promql import Series

MET = "met?"  # the evidence table's column: 'met, 6.3 % over it', 'not met, 50 % of it'
TABLE = ["signal", "value", "threshold", MET]  # what the table shows; the bars read the rest


def pending_text(pending: list[dict]) -> str:
    """Pending alerts (data.Snapshot.pending) in words: the condition holds, the rule's
    `for:` has not passed yet; when it would fire if it keeps holding."""
    said = []
    for item in pending:
        since = item.get("since")
        when = ""
        if since is not None:
            when = f" since {units.local_time(since)}"
            if item.get("for_seconds"):
                when += f", fires at {units.local_time(since + item['for_seconds'])} if it holds"
        said.append(f"**{item['rule']}** ({item['severity']}) on {item['node']}{when}")
    return "; ".join(said)


def subjects_line(subjects: dict[str, list]) -> str:
    """A finding's subjects as Markdown, each value as code: 'devices: `0`' is the device
    named 0 ('devices: 0' read as no device at all)."""
    return "**Subjects:** " + "; ".join(
        f"{kind}: {', '.join(code_span(str(value)) for value in values)}"
        for kind, values in subjects.items() if values)


def evidence_frame(finding: dict) -> pd.DataFrame:
    """The finding's evidence for people: value in its unit, what its threshold needs and
    whether the value meets it, and how far (units.reading, as the report reads it); the
    ratio stays numeric for the bars, 1 at the threshold and more past it on the side that
    fires (a floor: threshold over value); a moment against a moment has none."""
    rows = []
    picks = evidence_picks(finding.get("rule", ""))
    for e in finding.get("evidence", []):
        pick = e.get("pick") or picks.get(e["signal"], "max")
        value = units.format_value(e["value"], e["unit"])
        # a 0 threshold is context (idle CPUs, somaxconn): '–' past the value
        said = units.reading(e["value"], e["threshold"], e["unit"], pick)
        rows.append({"signal": e["signal"], "value": value, "threshold": said.needs or "–",
                     MET: said.result or "–", "ratio": said.ratio,
                     "reading": f"{value}: {said}" if said.needs else value})
    return pd.DataFrame(rows, columns=["signal", "value", "threshold", MET, "ratio",
                                       "reading"])


def panel_frame(panel: evidence_views.Panel, series: Series, labels: dict | None = None
                ) -> pd.DataFrame:
    """A panel's expression at every sample of `series`: time, series (legend), value;
    narrowed to the finding's labels (pool, binary, ...) where the panel says so."""
    keep = {k: v for k, v in (labels or {}).items() if k not in ("instance", "__name__")}
    rows = []
    for stamp in series.timestamps():
        for key, value in panel.expr.evaluate(series, stamp).items():
            as_dict = {k: v for k, v in key if k not in ("__name__", "instance")}
            if panel.narrow and any(as_dict.get(k, v) != v for k, v in keep.items()):
                continue
            if value != value or math.isinf(value):
                continue
            rows.append({"t_ms": stamp, "series": " · ".join(
                f"{v}" for _, v in sorted(as_dict.items())) or "value", "value": value})
    if not rows:
        return pd.DataFrame(columns=["time", "series", "value"])
    frame = pd.DataFrame(rows)
    frame["time"] = local_times(frame.pop("t_ms"))
    return frame[["time", "series", "value"]]


def evidence_panels(rule_id: str, series: Series, labels: dict | None = None
                    ) -> list[tuple[evidence_views.Panel, pd.DataFrame]]:
    """The rule's evidence views (dashboard/evidence_views.py) on one node's history; panels
    without data are left out."""
    out = []
    for panel in evidence_views.views_for(rule_id):
        try:
            frame = panel_frame(panel, series, labels)
        except (ArithmeticError, ValueError, KeyError, TypeError):
            continue  # a panel must never break the page it is on
        if not frame.empty:
            out.append((panel, frame))
    return out


def history_window(series: Series) -> tuple | None:
    """First and last sample of a node's history, as the charts' time axis range."""
    stamps = series.timestamps()
    if len(stamps) < 2:
        return None
    first, last = local_times([stamps[0], stamps[-1]])
    # wall-clock times without the offset: what plotly draws the (local) data at
    return first.tz_localize(None).to_pydatetime(), last.tz_localize(None).to_pydatetime()
