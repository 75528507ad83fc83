"""One node's frames for the Node page, from its history: busy per core and the pinned hogs,
the NUMA table, each pool's memory by locality. No streamlit here."""

from __future__ import annotations

import pandas as pd

from fleetscope.core import units
from fleetscope.dashboard.frames import last_rate, latest, timeline
from fleetscope.rules.promql import Series


def per_core_busy(series: Series) -> pd.DataFrame:
    """cpu x time busy fraction from fleetscope_cpu_seconds_total (per_core: full): busy is
    every mode but idle and iowait, over all modes. Empty when the source has no per-core
    series."""
    frame = timeline(series, "fleetscope_cpu_seconds_total")
    if frame.empty:
        return frame
    frame["idle"] = frame["mode"].isin(["idle", "iowait"])
    total = frame.groupby(["cpu", "time"])["value"].sum()
    idle = frame[frame["idle"]].groupby(["cpu", "time"])["value"].sum()
    busy = (1 - idle.reindex(total.index).fillna(0) / total).clip(0, 1)
    table = busy.unstack("time")
    table.index = table.index.astype(int)
    return table.sort_index()


def core_summary(busy: pd.DataFrame) -> dict:
    """What the per-core view says in numbers: the spread now and the pinned hogs."""
    if busy.empty:
        return {}
    now = busy.iloc[:, -1]
    hogs = busy[busy.iloc[:, -10:].mean(axis=1) > 0.9].index.tolist()  # the last 10 samples
    return {"median": float(now.median()), "max": float(now.max()),
            "spread": float(now.max() - now.median()), "hogs": hogs,
            "saturated_now": int((now > 0.9).sum())}


def numa_view(series: Series) -> pd.DataFrame:
    """Per NUMA node: CPUs, busy, run-queue wait per CPU and pages allocated off-node /s."""
    secs = timeline(series, "fleetscope_cpu_numa_node_seconds_total")
    if secs.empty:
        return pd.DataFrame()
    last = secs[secs["time"] == secs["time"].max()]
    total = last.groupby("numa_node")["value"].sum()
    idle = last[last["mode"].isin(["idle", "iowait"])].groupby("numa_node")["value"].sum()
    out = pd.DataFrame({"busy": 1 - idle / total})
    cpus = _per_label(latest(series, "fleetscope_cpu_numa_node_cpus"), "numa_node")
    out["cpus"] = cpus
    wait = last_rate(series, "fleetscope_schedstat_numa_node_waiting_seconds_total")
    if not wait.empty:
        out["run-queue wait s/s per CPU"] = _per_label(wait, "numa_node") / out["cpus"]
    for field_name, column in (("other_node", "pages off-node /s"),
                               ("local_node", "pages local /s")):
        pages = last_rate(series, "fleetscope_numastat_pages_total", {"field": field_name})
        if not pages.empty:
            out[column] = _per_label(pages, "numa_node")
    out.index.name = "numa_node"
    out = out.reset_index().sort_values("numa_node", key=lambda s: s.astype(int))
    return _merge_alike(out)


def _merge_alike(table: pd.DataFrame) -> pd.DataFrame:
    """NUMA nodes that read the same (within 1 %) are one row, "0-3": four identical rows
    say less than one row that says they are alike."""
    values = [c for c in table.columns if c != "numa_node"]
    if table.empty or not values:
        return table
    rounded = table[values].apply(lambda col: col.map(
        lambda v: float(f"{v:.2g}") if isinstance(v, float) and v == v else v))
    groups: list[list[int]] = []
    for position in range(len(table)):
        if groups and rounded.iloc[position].equals(rounded.iloc[groups[-1][0]]):
            groups[-1].append(position)
        else:
            groups.append([position])
    rows = []
    for members in groups:
        row = table.iloc[members[0]].copy()
        names = [str(table["numa_node"].iloc[m]) for m in members]
        row["numa_node"] = names[0] if len(names) == 1 else f"{names[0]}-{names[-1]}"
        rows.append(row)
    return pd.DataFrame(rows).reset_index(drop=True)


NUMA_UNITS = {"busy": "ratio", "cpus": "cpus", "run-queue wait s/s per CPU": "s/s",
              "pages off-node /s": "pages/s", "pages local /s": "pages/s"}


def numa_display(numa: pd.DataFrame) -> pd.DataFrame:
    """The NUMA table in units people read (%, ms/s, k pages/s)."""
    out = numa.copy()
    for column, unit in NUMA_UNITS.items():
        if column in out:
            out[column] = out[column].map(lambda v, u=unit: units.format_value(v, u))
    return out.rename(columns={"numa_node": "NUMA node", "run-queue wait s/s per CPU":
                               "run-queue wait per CPU", "pages off-node /s": "pages off-node",
                               "pages local /s": "pages local"})


def bytes_display(frame: pd.DataFrame) -> pd.DataFrame:
    """Byte columns (every column but the first) as GiB/MiB."""
    out = frame.copy()
    for column in out.columns[1:]:
        out[column] = out[column].map(lambda v: units.format_value(v, "bytes"))
    return out


def _per_label(frame: pd.DataFrame, label: str) -> pd.Series:
    if frame.empty or label not in frame:
        return pd.Series(dtype=float)
    return frame.groupby(label)["value"].sum()


def pool_memory(series: Series) -> pd.DataFrame:
    """Each pool's resident memory by locality (local / remote NUMA node)."""
    frame = latest(series, "fleetscope_pool_memory_bytes")
    if frame.empty or "locality" not in frame:
        return pd.DataFrame()
    return frame.pivot_table(index="pool", columns="locality", values="value",
                             aggfunc="sum").reset_index()
