"""Fleet findings: the attribute value that separates a rule's firing nodes from the rest."""

from __future__ import annotations

from fleetscope.diagnose.fleet_findings import (
    arm_stepping,
    best_factor,
    cpu_name,
    fleet_findings,
    nic_family,
    node_attributes,
)

KUNPENG = {"model_name": "HiSilicon Kunpeng 920", "variant": "0x1", "implementer": "0x48"}


def _fleet(nodes: int = 4096, old_every: int = 128) -> dict[str, dict[str, str]]:
    cpu_info = []
    for index in range(nodes):
        revision = "0" if index % old_every == 0 else "1"
        cpu_info.append({**KUNPENG, "revision": revision, "instance": f"n{index}",
                         "rack": f"r{index // 32:03d}", "node_pool": f"p{index % 2}"})
    return node_attributes(cpu_info)


def _finding(rule: str, node: str, severity: str = "warning", binaries=()) -> dict:
    return {"rule": rule, "node": node, "severity": severity,
            "subjects": {"binaries": list(binaries)}}


def test_names_the_stepping_all_sick_nodes_share():
    attributes = _fleet()
    old = [n for n, a in attributes.items() if a["cpu"].endswith("r1p0")]
    findings = [_finding("isa-mismatch", n, "critical", ["agentd"]) for n in old]
    [entry] = fleet_findings(findings, attributes)
    assert entry["factor"]["value"] == "HiSilicon Kunpeng 920 stepping r1p0"
    assert entry["summary"] == ("isa-mismatch on 32 nodes, all HiSilicon Kunpeng 920 stepping "
                                "r1p0 (32 of 32 such nodes); 0 of 4,064 others; "
                                "binaries: agentd")
    assert entry["severity"] == "critical" and entry["binaries"] == ["agentd"]


def test_names_the_rack_when_most_of_its_nodes_are_sick():
    attributes = _fleet()
    rack = sorted(n for n, a in attributes.items() if a["rack"] == "r121")
    findings = [_finding("roce-congestion", n) for n in rack[:29]]
    [entry] = fleet_findings(findings, attributes)
    assert entry["factor"]["attribute"] == "rack"
    assert entry["summary"] == "roce-congestion on 29 nodes, all rack r121 (29 of 32 such " \
                               "nodes); 0 of 4,064 others"
    # Three sick nodes elsewhere: said as such.
    elsewhere = [n for n in attributes if attributes[n]["rack"] == "r007"][:3]
    [entry] = fleet_findings(findings + [_finding("roce-congestion", n) for n in elsewhere],
                             attributes)
    assert entry["summary"] == "roce-congestion on 29 of 32 nodes of rack r121, 3 elsewhere"


def test_scattered_nodes_share_nothing_and_one_node_is_no_pattern():
    attributes = _fleet()
    scattered = [_finding("fd-exhaustion", f"n{i}") for i in (5, 700, 1400, 2900)]
    [entry] = fleet_findings(scattered + [_finding("cold-start", "n9")], attributes)
    assert entry["rule"] == "fd-exhaustion" and entry["factor"] is None
    assert entry["summary"] == "fd-exhaustion on 4 nodes of 4,096; no node attribute " \
                               "separates them"


def test_a_value_the_whole_fleet_has_separates_nothing():
    attributes = {f"n{i}": {"cpu": "same", "rack": "r1" if i < 4 else "r2"} for i in range(8)}
    firing = {"n0", "n1", "n2", "n3"}
    assert best_factor(firing, attributes) == ("rack", "r1", firing)
    assert best_factor({"n0", "n5"}, attributes) is None


def test_most_severe_and_widest_first():
    attributes = _fleet(256)
    findings = [_finding("core-imbalance", f"n{i}") for i in range(10)]
    findings += [_finding("fd-exhaustion", f"n{i}", "critical") for i in range(2)]
    assert [e["rule"] for e in fleet_findings(findings, attributes)] == ["fd-exhaustion",
                                                                         "core-imbalance"]


def test_attributes_from_the_info_metrics():
    attributes = node_attributes(
        [{**KUNPENG, "revision": "2", "instance": "a", "rack": "r1"},
         {"model_name": "AMD EPYC 9654", "family": "25", "model": "17", "stepping": "1",
          "instance": "b"}, {"model_name": "no node label"}],
        uname_info=[{"instance": "a", "release": "6.1.0-18-arm64"}],
        rdma_info=[{"instance": "b", "device": "mlx5_0"}, {"instance": "b", "device": "mlx5_1"}])
    assert attributes == {
        "a": {"cpu": "HiSilicon Kunpeng 920 stepping r1p2", "rack": "r1",
              "kernel": "6.1.0-18-arm64"},
        "b": {"cpu": "AMD EPYC 9654 (family 25 model 17) stepping 1", "nic": "mlx5"}}
    assert arm_stepping("0x1", "0") == "r1p0"
    assert arm_stepping("bad", "0") == "variant bad revision 0"
    assert cpu_name({}) == "unknown CPU"
    assert nic_family("hns_2") == "hns"
