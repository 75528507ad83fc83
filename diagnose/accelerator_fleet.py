"""The fleet's inference modules by model and driver/firmware pair, for
`fleetscope diagnose --fleet`:

    nodes with NVIDIA A100-SXM4-80GB, driver 535.54.03, VBIOS 92.00.36.00.02: 37, not in
    the matrix

Read from what each node's exporter reports (the spec of the fields: docs/diagnosis-json.md):

    fleetscope_accelerator_info{instance, vendor, device, model, driver, firmware} 1
    fleetscope_accelerator_matrix_listed{instance, vendor, device, model, driver, firmware}
        1 listed / 0 not (only where the node has a compatibility matrix configured)

The query engine counts (`count by (vendor, model, driver, firmware)` over a per-node count):
the answers hold one series per group, whatever the fleet's size. A node whose modules differ
(one card flashed with another VBIOS) counts in each of its groups.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from fleetscope.rules.catalog import NODE_LABELS

NODE_LABEL = NODE_LABELS[0]


class QueryClient(Protocol):
    """diagnose/remote.py's client: instant queries under its deadline and answer cap."""

    def query(self, promql: str, at: float, tag: str = "") -> list[dict]: ...

GROUP = ("vendor", "model", "driver", "firmware")
INFO = "fleetscope_accelerator_info"
LISTED = "fleetscope_accelerator_matrix_listed"
# What each vendor calls the firmware it reports (NVIDIA's is the VBIOS), and the name a
# model goes by where its own label lacks it (npu-smi and npu-exporter say "910B").
FIRMWARE_WORD = {"nvidia": "VBIOS"}
VENDOR_NAME = {"nvidia": "NVIDIA", "huawei": "Ascend"}


def _per_node(selector: str) -> str:
    by = ", ".join(GROUP)
    return f"count by ({by}) (count by ({NODE_LABEL}, {by}) ({selector}))"


QUERIES = {
    "nodes": _per_node(INFO),
    "devices": f"count by ({', '.join(GROUP)}) ({INFO})",
    "nodes_listed": _per_node(f"{LISTED} == 1"),
    "nodes_not_listed": _per_node(f"{LISTED} == 0"),
}


def _key(series: dict) -> tuple[str, ...]:
    metric = series.get("metric")
    found = metric if isinstance(metric, dict) else {}
    return tuple(str(found.get(name, "")) for name in GROUP)


def accelerator_groups(client: QueryClient, at: float) -> list[dict]:
    """One entry per (vendor, model, driver, firmware) at `at`: nodes, devices, how many of
    those nodes list the pair in their matrix and how many do not, and its sentence; pairs
    not in a matrix first, then the most nodes."""
    with ThreadPoolExecutor(max_workers=len(QUERIES)) as pool:
        answers = dict(zip(QUERIES, pool.map(
            lambda promql: client.query(promql, at, "accelerator groups"),
            QUERIES.values()), strict=True))
    counts: dict[tuple[str, ...], dict[str, int]] = {}
    for name, result in answers.items():
        for series in result:
            value = (series.get("value") or [0, "0"])[1]
            try:
                number = int(float(value))
            except (TypeError, ValueError):
                continue
            counts.setdefault(_key(series), {})[name] = number
    out = [group_entry(key, found) for key, found in counts.items() if found.get("nodes")]
    out.sort(key=lambda g: (-g["nodes_not_listed"], -g["nodes"], g["vendor"], g["model"],
                            g["driver"], g["firmware"]))
    return out


def matrix_words(nodes: int, listed: int, not_listed: int) -> tuple[str, str]:
    """(status, how it reads) of a group against the operators' matrices."""
    unchecked = max(0, nodes - listed - not_listed)
    if not_listed == nodes:
        return "not listed", "not in the matrix"
    if listed == nodes:
        return "listed", "in the matrix"
    # No verdict: no matrix configured there, or the pair could not be judged (firmware
    # unknown where the matrix names firmware: docs/accelerators.md).
    if unchecked == nodes:
        return "unchecked", "not checked against a matrix"
    parts = [f"{_count(not_listed)} not in the matrix"] if not_listed else []
    parts += [f"{_count(listed)} in it"] if listed else []
    parts += [f"{_count(unchecked)} not checked"] if unchecked else []
    return ("some not listed" if not_listed else "partly checked"), ", ".join(parts)


def group_entry(key: tuple[str, ...], found: dict[str, int]) -> dict:
    vendor, model, driver, firmware = key
    nodes = found.get("nodes", 0)
    listed, not_listed = found.get("nodes_listed", 0), found.get("nodes_not_listed", 0)
    status, words = matrix_words(nodes, listed, not_listed)
    pair = [f"driver {driver or 'unknown'}"]
    pair.append(f"{FIRMWARE_WORD.get(vendor, 'firmware')} {firmware or 'unknown'}")
    summary = (f"nodes with {module_name(vendor, model)}, {', '.join(pair)}: "
               f"{_count(nodes)}, {words}")
    return {"vendor": vendor, "model": model, "driver": driver, "firmware": firmware,
            "nodes": nodes, "devices": found.get("devices", 0), "matrix": status,
            "nodes_listed": listed, "nodes_not_listed": not_listed, "summary": summary}


def module_name(vendor: str, model: str) -> str:
    """The model as people name it: "NVIDIA A100-SXM4-80GB", "Ascend 910B"."""
    name = VENDOR_NAME.get(vendor, vendor)
    if not model:
        return f"{name or 'unknown'} modules"
    return model if not name or model.lower().startswith(name.lower()) else f"{name} {model}"


def _count(n: int) -> str:
    return f"{n:,}"
