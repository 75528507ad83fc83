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


# A node's inference modules: the exporter's fleetscope_accelerator_* series, one row a device
# (a GPU, a MIG instance, an Ascend chip), keyed by vendor and device as the series are.
ACCELERATOR = "fleetscope_accelerator_"
MODULE_VALUES = {"utilization_ratio": "utilisation", "memory_used_bytes": "memory used",
                 "memory_total_bytes": "memory total", "temperature_celsius": "temperature",
                 "power_watts": "power", "ecc_uncorrected_errors": "ECC uncorrected",
                 "ecc_corrected_errors": "ECC corrected", "last_xid": "last XID",
                 "error_codes": "error codes", "healthy": "healthy",
                 "matrix_listed": "matrix listed"}
MODULE_COLUMNS = ["device", "model", "driver / firmware", "utilisation", "memory used / total",
                  "temperature", "power", "errors", "matrix listed"]


def _device_order(key: tuple[str, str]) -> tuple:
    """nvidia before huawei as listed, then device "2" before "10", "1/0" before "1/1"."""
    vendor, device = key
    return vendor, [int(p) if p.isdigit() else p for p in device.replace("/", " ").split()]


def modules(series: Series) -> pd.DataFrame:
    """One row per module the node reports, its values at the last sample: vendor, device,
    model, driver, firmware and a column per MODULE_VALUES name (NaN where the source does
    not say). Empty when the node has no module."""
    rows: dict[tuple[str, str], dict] = {}
    # The pair each module runs now: a node upgraded within its history has the old pair's
    # info series too, ended before the last sample.
    info = latest(series, f"{ACCELERATOR}info")
    for found in info.to_dict("records") if "device" in info else []:
        key = (str(found.get("vendor", "")), str(found["device"]))
        rows.setdefault(key, {}).update({name: found.get(name, "") for name in
                                         ("model", "driver", "firmware")})
    for suffix, column in MODULE_VALUES.items():
        frame = latest(series, ACCELERATOR + suffix)
        if frame.empty or "device" not in frame:
            continue
        for record in frame.to_dict("records"):
            key = (str(record.get("vendor", "")), str(record["device"]))
            rows.setdefault(key, {})[column] = record["value"]
    columns = ["vendor", "device", "model", "driver", "firmware", *MODULE_VALUES.values()]
    table = pd.DataFrame([{"vendor": vendor, "device": device, **values}
                          for (vendor, device), values in sorted(rows.items(),
                                                                 key=lambda r: _device_order(
                                                                     r[0]))],
                         columns=columns)
    return table


def _errors(row: pd.Series) -> str:
    """What the vendor says is wrong with a module now, or "none"; "not reported" where the
    source has no error series at all (nvidia-smi's table has no XID)."""
    said = []
    for column, say in (("last XID", lambda v: f"XID {v:.0f}"),
                        # the device's count since the driver loaded, not the window's growth
                        ("ECC uncorrected", lambda v: units.count(v, "uncorrected ECC error")
                         + " in total"),
                        ("error codes", lambda v: units.count(v, "error code"))):
        value = row.get(column)
        if value == value and value is not None and value > 0:
            said.append(say(value))
    healthy = row.get("healthy")
    if healthy == healthy and healthy is not None and healthy < 1:
        said.append("vendor health check failing")
    reported = [row.get(c) for c in ("last XID", "ECC uncorrected", "error codes", "healthy")]
    if said:
        return ", ".join(said)
    return "none" if any(v == v and v is not None for v in reported) else "not reported"


def modules_display(table: pd.DataFrame) -> pd.DataFrame:
    """The Node page's module table: MODULE_COLUMNS, in units people read."""
    from fleetscope.diagnose.accelerator_fleet import FIRMWARE_WORD, module_name

    def listed(value) -> str:
        if value != value or value is None:
            return "not checked"  # no matrix, or a pair it cannot judge
        return "yes" if value >= 1 else "no"

    rows = []
    for _, row in table.iterrows():
        firmware = f"{FIRMWARE_WORD.get(row['vendor'], 'firmware')} {row['firmware']}" \
            if isinstance(row["firmware"], str) and row["firmware"] else "firmware ?"
        driver = row["driver"] if isinstance(row["driver"], str) and row["driver"] else "?"
        model = row["model"] if isinstance(row["model"], str) else ""
        rows.append({
            "device": row["device"], "model": module_name(row["vendor"], model),
            "driver / firmware": f"{driver} / {firmware}",
            "utilisation": units.format_value(row["utilisation"], "ratio"),
            "memory used / total": f"{units.format_value(row['memory used'], 'bytes')} / "
                                   f"{units.format_value(row['memory total'], 'bytes')}",
            "temperature": units.format_value(row["temperature"], "°C"),
            "power": units.format_value(row["power"], "W"),
            "errors": _errors(row), "matrix listed": listed(row["matrix listed"])})
    return pd.DataFrame(rows, columns=MODULE_COLUMNS)
