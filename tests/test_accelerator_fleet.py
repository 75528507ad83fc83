"""The fleet's inference modules on a real Prometheus and a real VictoriaMetrics:
`diagnose --fleet` groups nodes by module model and driver/firmware pair (counted by the
engine), and the console's heatmap and node page draw the modules.

The fleet (tests/module_fleet.py: 320 nodes, 37 of them on a driver their matrix does not
list, a group half without a matrix, a fifth of the nodes without modules) is the ground
truth every count here is checked against.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from fleetscope.diagnose import accelerator_fleet, remote
from tests import module_fleet
from tests.conftest import fleet_bench, require_tool

ENGINES = ["prometheus", "victoriametrics"]


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    require_tool("promtool")
    require_tool("prometheus")
    require_tool("victoria-metrics")
    bench = fleet_bench()
    workdir = tmp_path_factory.mktemp("module-fleet")
    fleet, openmetrics, text = module_fleet.build(workdir)
    engines = {}
    try:
        engines["prometheus"] = bench.start_prometheus(openmetrics, workdir)
        engines["victoriametrics"] = bench.start_victoria(text, workdir / "vm")
        yield {"fleet": fleet, "urls": {name: e.url for name, e in engines.items()}}
    finally:
        for engine in engines.values():
            engine.stop()


def _diagnose(url: str, *extra: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--prometheus",
                             url, "--fleet", *extra], capture_output=True, text=True,
                            timeout=300)
    # 3 as well: a fleet of modules alone leaves most rules without their signals (unknown)
    assert result.returncode in (0, 1, 2, 3) and result.stdout, result.stderr
    return result


def _counted(groups: list[dict]) -> dict[tuple[str, str, str, str], dict]:
    return {(g["vendor"], g["model"], g["driver"], g["firmware"]):
            {k: g[k] for k in ("nodes", "devices", "nodes_listed", "nodes_not_listed")}
            for g in groups}


@pytest.mark.parametrize("engine", ENGINES)
def test_diagnose_fleet_counts_the_nodes_of_each_model_and_driver_firmware_pair(modules,
                                                                                 engine):
    document = json.loads(_diagnose(modules["urls"][engine], "--json").stdout)
    expected = module_fleet.expected_groups(modules["fleet"])
    assert _counted(document["accelerator_groups"]) == expected
    # the contract's fields are all there, unchanged beside the addition
    assert document["format"] == "fleetscope-diagnosis/1"
    assert document["source"] == "prometheus"
    assert len(document["nodes"]) == len(modules["fleet"])
    # the pair not in the matrix leads, said as the issue reads it
    first = document["accelerator_groups"][0]
    old = module_fleet.GROUPS["a100-old"]
    assert (first["driver"], first["matrix"]) == (old.driver, "not listed")
    nodes = expected[(old.vendor, old.model, old.driver, old.firmware)]["nodes"]
    assert first["summary"] == (f"nodes with {old.model}, driver {old.driver}, VBIOS "
                                f"{old.firmware}: {nodes}, not in the matrix")
    statuses = {g["driver"]: g["matrix"] for g in document["accelerator_groups"]}
    ascend = module_fleet.GROUPS["910b"]
    assert statuses[ascend.driver] == "partly checked"  # half its nodes have no matrix
    assert statuses[module_fleet.GROUPS["a100"].driver] == "listed"


def test_the_report_names_each_group_and_the_local_evaluation_counts_the_same(modules):
    url = modules["urls"]["prometheus"]
    report = _diagnose(url).stdout
    document = json.loads(_diagnose(url, "--json").stdout)
    for group in document["accelerator_groups"]:
        assert f"modules: {group['summary']}" in report.replace("\n", " ").replace("  ", " ")
    local = json.loads(_diagnose(url, "--json", "--evaluate", "local").stdout)
    assert local["accelerator_groups"] == document["accelerator_groups"]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_engine_answers_one_series_per_group_not_per_node(modules, engine):
    client = remote.QueryClient(modules["urls"][engine], 60)
    groups = accelerator_fleet.accelerator_groups(client, time.time() - 60)
    module_nodes = [n for n in modules["fleet"] if n.devices]
    assert sum(g["nodes"] for g in groups) == len(module_nodes)
    assert client.stats.queries == len(accelerator_fleet.QUERIES)
    # every answer holds at most one series per group: well under what one series of each
    # device (2,088 here) would take
    per_series = max(len(json.dumps(g)) for g in groups)
    assert client.stats.bytes_received < len(accelerator_fleet.QUERIES) * len(groups) * \
        per_series * 2
