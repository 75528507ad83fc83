"""A fleet of a few hundred simulated nodes with inference modules, in a real Prometheus and
a real VictoriaMetrics on 127.0.0.1: what `diagnose --fleet` groups and the console draws.

Each node exports the series of docs/accelerators.md as the exporter writes them (with the
`instance` and `job` a scrape adds): `fleetscope_accelerator_info{vendor, device, model,
driver, firmware, source}`, `_matrix_listed`, utilisation, memory, temperature, power and
the vendor's error counts. The groups are real driver/firmware pairs from the fixtures and
the vendors' published pairings (tests/fixtures/inference/README.md); the plan below is the
ground truth the tests count against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

STEP_S = 60
BEFORE_MINUTES, AHEAD_MINUTES = 20, 70  # data around the session's start
GIB = 1 << 30


@dataclass(frozen=True)
class ModuleGroup:
    vendor: str
    model: str
    driver: str
    firmware: str
    listed: bool | None  # in the node's matrix; None: no matrix configured there
    devices: int
    memory_bytes: float
    source: str


GROUPS = {
    # nvidia-smi -q -x of an A100-SXM4-80GB (telegraf's testdata): driver and VBIOS as read
    "a100": ModuleGroup("nvidia", "NVIDIA A100-SXM4-80GB", "535.54.03", "92.00.36.00.02", True,
                        8, 80 * GIB, "dcgm-exporter"),
    # the same cards on the 470 branch: below the CUDA 12 minimum (525), not in the matrix
    "a100-old": ModuleGroup("nvidia", "NVIDIA A100-SXM4-80GB", "470.57.02", "92.00.36.00.02",
                            False, 8, 80 * GIB, "dcgm-exporter"),
    # Ascend's install guide pairs 910b driver 23.0.3 with firmware 7.1.0.5.220
    "910b": ModuleGroup("huawei", "910B", "23.0.3", "7.1.0.5.220", True, 8, 64 * GIB,
                        "npu-exporter"),
    # the same driver on nodes without a matrix configured
    "910b-nomatrix": ModuleGroup("huawei", "910B", "23.0.3", "7.1.0.5.220", None, 8,
                                 64 * GIB, "npu-smi"),
}


@dataclass
class Node:
    instance: str
    group: str | None  # a key of GROUPS; None: no module
    rack: str
    devices: list[dict] = field(default_factory=list)  # device -> its values


def plan(nodes: int = 320) -> list[Node]:
    """Which node carries what: a fifth without modules, then the groups in turn with a
    known share each (37 nodes on the unlisted driver, as the issue's example reads)."""
    shares = [("a100", 0.40), ("a100-old", None), ("910b", 0.20), ("910b-nomatrix", 0.10)]
    old = 37
    counts = {name: int(nodes * share) for name, share in shares if share}
    counts["a100-old"] = old
    order = [name for name, _ in shares for _ in range(counts[name])]
    out = []
    for index in range(nodes):
        group = order[index] if index < len(order) else None
        node = Node(f"gpu-{index:04d}:9105", group, f"r{index // 32:02d}")
        if group:
            spec = GROUPS[group]
            for device in range(spec.devices):
                util = ((index * 7 + device * 3) % 10) / 10
                node.devices.append({
                    "device": str(device), "util": util,
                    "used": spec.memory_bytes * (0.3 + 0.05 * ((index + device) % 10)),
                    "total": spec.memory_bytes, "temperature": 40.0 + device,
                    "power": 200.0 + 10 * device,
                    "ecc_uncorrected": 2.0 if (index, device) == (1, 3) else 0.0,
                    "xid": 79.0 if (index, device) == (1, 3) else 0.0})
        out.append(node)
    return out


def expected_groups(fleet: list[Node]) -> dict[tuple[str, str, str, str], dict]:
    """(vendor, model, driver, firmware) -> nodes, devices and matrix counts, from the plan."""
    out: dict[tuple[str, str, str, str], dict] = {}
    for node in fleet:
        if not node.group:
            continue
        spec = GROUPS[node.group]
        entry = out.setdefault((spec.vendor, spec.model, spec.driver, spec.firmware),
                               {"nodes": 0, "devices": 0, "nodes_listed": 0,
                                "nodes_not_listed": 0})
        entry["nodes"] += 1
        entry["devices"] += len(node.devices)
        if spec.listed is True:
            entry["nodes_listed"] += 1
        elif spec.listed is False:
            entry["nodes_not_listed"] += 1
    return out


def node_series(node: Node) -> list[tuple[str, dict[str, str], float]]:
    """(metric, labels, value) of every series the node exports (values constant)."""
    target = {"instance": node.instance, "job": "fleetscope"}
    out = [("fleetscope_exporter_build_info", {**target, "version": "test"}, 1.0),
           ("fleetscope_cpu_info", {**target, "arch": "aarch64", "model_name":
                                    "HiSilicon Kunpeng 920", "variant": "0x1",
                                    "revision": "1", "rack": node.rack,
                                    "node_pool": "inference" if node.group else "cpu"}, 1.0)]
    if not node.group:
        return out
    spec = GROUPS[node.group]
    for device in node.devices:
        labels = {**target, "vendor": spec.vendor, "device": device["device"]}
        identity = {**labels, "model": spec.model, "driver": spec.driver,
                    "firmware": spec.firmware}
        out.append(("fleetscope_accelerator_info", {**identity, "source": spec.source}, 1.0))
        if spec.listed is not None:
            out.append(("fleetscope_accelerator_matrix_listed", identity, float(spec.listed)))
        out += [("fleetscope_accelerator_utilization_ratio", labels, device["util"]),
                ("fleetscope_accelerator_memory_used_bytes", labels, device["used"]),
                ("fleetscope_accelerator_memory_total_bytes", labels, device["total"]),
                ("fleetscope_accelerator_temperature_celsius", labels, device["temperature"]),
                ("fleetscope_accelerator_power_watts", labels, device["power"])]
        if spec.vendor == "nvidia":
            out += [("fleetscope_accelerator_ecc_uncorrected_errors", labels,
                     device["ecc_uncorrected"]),
                    ("fleetscope_accelerator_last_xid", labels, device["xid"])]
        else:
            out += [("fleetscope_accelerator_error_codes", labels, 0.0),
                    ("fleetscope_accelerator_healthy", labels, 1.0)]
    return out


def write(path: Path, fleet: list[Node], start_s: int, points: int, openmetrics: bool) -> None:
    """The fleet's samples, grouped by family: OpenMetrics (seconds) for promtool, else the
    Prometheus text format (milliseconds) VictoriaMetrics imports."""
    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    for node in fleet:
        for name, labels, value in node_series(node):
            by_name.setdefault(name, []).append((labels, value))
    stamps = [str(start_s + k * STEP_S) if openmetrics else str((start_s + k * STEP_S) * 1000)
              for k in range(points)]
    with open(path, "w", buffering=1 << 20) as out:
        for name, members in sorted(by_name.items()):
            if openmetrics:
                out.write(f"# TYPE {name} gauge\n")
            for labels, value in members:
                text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                out.write("".join(f"{name}{{{text}}} {value!r} {stamp}\n" for stamp in stamps))
        if openmetrics:
            out.write("# EOF\n")


def build(workdir: Path, nodes: int = 320) -> tuple[list[Node], Path, Path]:
    """The plan and its samples for both engines, from BEFORE_MINUTES ago to AHEAD_MINUTES on."""
    fleet = plan(nodes)
    points = (BEFORE_MINUTES + AHEAD_MINUTES) * 60 // STEP_S + 1
    start_s = int(time.time() // STEP_S * STEP_S) - BEFORE_MINUTES * 60
    openmetrics, text = workdir / "modules.om", workdir / "modules.prom"
    write(openmetrics, fleet, start_s, points, True)
    write(text, fleet, start_s, points, False)
    return fleet, openmetrics, text
