"""Series to pandas frames, as the rules read them: the building blocks the page frames
(fleet_frames, node_frames, latency_frames, evidence_frames) share. No streamlit here.

Tiles and rules read the same numbers: every value below is an expression of rules/promql.py
(the tree the rule engine evaluates), at the source's last sample, with the rate window the
rules use (WINDOW, capped like the engine's by series.max_window_ms).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import pandas as pd

from fleetscope.core import units
from fleetscope.rules.catalog import WINDOW
from fleetscope.rules.promql import (
    Rate,
    Selector,
    Series,
    extrapolated_delta,
)
from fleetscope.rules.recording import Recording

if TYPE_CHECKING:
    from fleetscope.dashboard.data import Snapshot


def _rows(vector: dict) -> pd.DataFrame:
    rows = [{**{k: v for k, v in labels if k != "__name__"}, "value": value}
            for labels, value in vector.items()]
    return pd.DataFrame(rows, columns=None if rows else ["instance", "value"])


def _instant(series: Series, expr, name: str) -> pd.DataFrame:
    at_ms = series.last_sample_ms([name])
    return _rows({} if at_ms is None else expr.evaluate(series, at_ms))


def latest(series: Series, name: str, matchers: dict | None = None) -> pd.DataFrame:
    """`name{matchers}` now (Prometheus's instant selector at the last sample, 5-minute
    look-back): one row per label set, column `value`."""
    return _instant(series, Selector(name, matchers or None), name)


def last_rate(series: Series, name: str, matchers: dict | None = None) -> pd.DataFrame:
    """`rate(name{matchers}[WINDOW])` now, as the rules compute it (extrapolated, counter
    resets counted from 0)."""
    return _instant(series, Rate(Selector(name, matchers or None), WINDOW), name)


def recorded(snapshot: Snapshot, recording: Recording) -> pd.DataFrame:
    """A recording rule's vector as a frame (labels..., value): what the query engine
    answered for a Prometheus source, else the same expression over the snapshot's series
    at its last sample of those metrics."""
    if snapshot.aggregates is not None:
        return _rows(snapshot.aggregates.get(recording.record, {}))
    at_ms = snapshot.series.last_sample_ms(recording.expr.metrics())
    return _rows({} if at_ms is None else recording.expr.evaluate(snapshot.series, at_ms))


def _frame_of(series: Series, name: str, matchers: dict | None, counter: bool) -> pd.DataFrame:
    """Long frame: labels..., time (datetime), value: the instant selector at each sample,
    or `rate(...[WINDOW])` at each sample after the first when `counter` (the rule engine's
    extrapolated rate, so a chart and a rule read the same number at the same time)."""
    rows = []
    window_ms = series.window_ms(WINDOW)
    for labels, points in Selector(name, matchers or None).matching(series):
        as_dict = dict(labels)
        if counter:
            times = [t for t, _ in points]
            for index in range(1, len(points)):
                end = times[index]
                first = bisect.bisect_left(times, end - window_ms, 0, index)
                value = extrapolated_delta(points[first:index + 1], end - window_ms, end, True)
                if value is not None:
                    rows.append({**as_dict, "t_ms": end, "value": value})
        else:
            rows.extend({**as_dict, "t_ms": t, "value": v} for t, v in points)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=["time", "value"])
    frame["time"] = local_times(frame["t_ms"])
    return frame.drop(columns="t_ms")


def is_counter(name: str) -> bool:
    return name.endswith(("_total", "_sum", "_count", "_bucket"))


def timeline(series: Series, name: str, matchers: dict | None = None) -> pd.DataFrame:
    """A metric over time: gauges as they are, counters as per-second rates."""
    return _frame_of(series, name, matchers, is_counter(name))


def local_times(t_ms) -> pd.Series:
    """Epoch milliseconds -> datetimes in the console's zone (charts show wall-clock time)."""
    index = t_ms.index if isinstance(t_ms, pd.Series) else None
    stamps = pd.to_datetime(pd.Series(t_ms, index=index), unit="ms", utc=True)
    return stamps.dt.tz_convert(units.console_zone())
