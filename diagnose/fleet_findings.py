"""Fleet findings for `fleetscope diagnose --fleet`: what the sick nodes share.

Each rule's firing nodes are grouped by the attributes every node carries (CPU model and
stepping from `fleetscope_cpu_info`, the `rack` and `node_pool` target labels, the kernel
release from node_exporter's `node_uname_info`, the RDMA NIC family) and the attribute value
that best separates them from the rest of the fleet is named:

    isa-mismatch on 32 nodes, all HiSilicon Kunpeng 920 stepping r1p0 (32 of 32 such
    nodes); 0 of 4,064 others
    roce-congestion on 29 of 32 nodes of rack r121, 0 elsewhere

Pure: findings (diagnosis JSON) and node attributes in, `fleet_findings` JSON out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Attribute name -> how a value reads in a sentence. Order breaks ties: the CPU first (it
# explains crashes and counters), then where a node stands, then what it runs.
ATTRIBUTES = {
    "cpu": "{}",
    "rack": "rack {}",
    "node_pool": "node pool {}",
    "kernel": "kernel {}",
    "nic": "NIC {}",
}
MIN_NODES = 2  # one sick node is a node finding, not a fleet pattern
# How well a value must match the firing set (shared / either) to be named as its factor.
MIN_OVERLAP = 0.5
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


def arm_stepping(variant: str, revision: str) -> str:
    """Arm's rNpM from MIDR variant and revision ("0x1", "0" -> "r1p0")."""
    try:
        return f"r{int(variant, 0)}p{int(revision, 0)}"
    except ValueError:
        return f"variant {variant} revision {revision}"


def cpu_name(labels: dict[str, str]) -> str:
    """`fleetscope_cpu_info` labels as one value: the model and its stepping."""
    model = labels.get("model_name") or labels.get("vendor") or "unknown CPU"
    if "variant" in labels or "revision" in labels:
        stepping = arm_stepping(labels.get("variant", "0"), labels.get("revision", "0"))
        return f"{model} stepping {stepping}"
    if "stepping" in labels:
        return (f"{model} (family {labels.get('family', '?')} model {labels.get('model', '?')}) "
                f"stepping {labels['stepping']}")
    return model


def nic_family(device: str) -> str:
    """An RDMA device name without its index (mlx5_0 -> mlx5, hns_1 -> hns)."""
    return re.sub(r"_?\d+$", "", device) or device


def node_attributes(cpu_info: Iterable[dict[str, str]],
                    uname_info: Iterable[dict[str, str]] = (),
                    rdma_info: Iterable[dict[str, str]] = (),
                    node_label: str = "instance") -> dict[str, dict[str, str]]:
    """node -> {attribute: value} from the label sets of the info metrics."""
    nodes: dict[str, dict[str, str]] = {}
    for labels in cpu_info:
        node = labels.get(node_label)
        if not node:
            continue
        attrs = nodes.setdefault(node, {})
        attrs["cpu"] = cpu_name(labels)
        for target_label in ("rack", "node_pool"):
            if labels.get(target_label):
                attrs[target_label] = labels[target_label]
    for labels in uname_info:
        if labels.get(node_label) in nodes and labels.get("release"):
            nodes[labels[node_label]]["kernel"] = labels["release"]
    for labels in rdma_info:
        if labels.get(node_label) in nodes and labels.get("device"):
            nodes[labels[node_label]].setdefault("nic", nic_family(labels["device"]))
    return nodes


def _count(n: int) -> str:
    return f"{n:,}"


def _nodes(n: int) -> str:
    return f"{_count(n)} node" + ("" if n == 1 else "s")


def best_factor(firing: set[str], attributes: dict[str, dict[str, str]]
                ) -> tuple[str, str, set[str]] | None:
    """(attribute, value, nodes with it) whose nodes overlap the firing set most (shared
    over either: a value every node has, or few sick nodes have, separates nothing)."""
    fleet = set(attributes) | firing
    best = None
    best_score = MIN_OVERLAP
    for attribute in ATTRIBUTES:
        groups: dict[str, set[str]] = {}
        for node, attrs in attributes.items():
            if attribute in attrs:
                groups.setdefault(attrs[attribute], set()).add(node)
        for value, group in sorted(groups.items()):
            if group >= fleet:
                continue  # the whole fleet has it
            shared = len(group & firing)
            score = shared / len(group | firing)
            if score > best_score:
                best, best_score = (attribute, value, group), score
    return best


def fleet_findings(findings: list[dict], attributes: dict[str, dict[str, str]],
                   min_nodes: int = MIN_NODES) -> list[dict]:
    """One entry per rule firing on at least `min_nodes` nodes: how many, and the factor
    that separates them (None when no attribute does), most severe and widest first."""
    by_rule: dict[str, list[dict]] = {}
    for finding in findings:
        by_rule.setdefault(finding["rule"], []).append(finding)
    fleet_size = len(set(attributes) | {f["node"] for f in findings})
    out = []
    for rule, same in by_rule.items():
        firing = {f["node"] for f in same}
        if len(firing) < min_nodes:
            continue
        severity = min((f["severity"] for f in same), key=SEVERITY_RANK.__getitem__)
        binaries = sorted({b for f in same for b in f.get("subjects", {}).get("binaries", [])})
        entry = {"rule": rule, "severity": severity, "nodes": len(firing),
                 "fleet_nodes": fleet_size, "factor": None, "binaries": binaries}
        factor = best_factor(firing, attributes)
        if factor is None:
            entry["summary"] = (f"{rule} on {_nodes(len(firing))} of {_count(fleet_size)}; "
                                "no node attribute separates them")
        else:
            attribute, value, group = factor
            shared = len(group & firing)
            elsewhere = len(firing - group)
            others = fleet_size - len(group)
            text = ATTRIBUTES[attribute].format(value)
            entry["factor"] = {"attribute": attribute, "value": value, "label": text,
                               "nodes_with_it": len(group), "firing_with_it": shared,
                               "firing_elsewhere": elsewhere, "others": others}
            if elsewhere == 0:
                entry["summary"] = (f"{rule} on {_nodes(len(firing))}, all {text} "
                                    f"({_count(shared)} of {_count(len(group))} such nodes); "
                                    f"{_count(elsewhere)} of {_count(others)} others")
            else:
                entry["summary"] = (f"{rule} on {_count(shared)} of {_nodes(len(group))} of "
                                    f"{text}, {_count(elsewhere)} elsewhere")
        if binaries:
            entry["summary"] += f"; binaries: {', '.join(binaries)}"
        out.append(entry)
    out.sort(key=lambda e: (SEVERITY_RANK[e["severity"]], -e["nodes"], e["rule"]))
    return out
