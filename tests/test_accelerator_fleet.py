"""The fleet's inference modules on a real Prometheus and a real VictoriaMetrics:
`diagnose --fleet` groups nodes by module model and driver/firmware pair (counted by the
engine), and the console's heatmap and node page draw the modules.

The fleet (tests/module_fleet.py: 320 nodes, 37 of them on a driver their matrix does not
list, a group half without a matrix, a fifth of the nodes without modules) is the ground
truth every count here is checked against. The console is also checked on the demo fleet
(its module nodes against dashboard/fleet_sim.py's plan) and on scenario bundles (their
node's table against the recorded dcgm-exporter scrape and npu-smi table).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetscope.diagnose import accelerator_fleet, remote
from tests import module_fleet
from tests.conftest import SCENARIOS, fleet_bench, require_tool

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


# -- the console ---------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_the_heatmap_signals_are_each_nodes_mean_utilisation_and_fullest_module(modules,
                                                                                  engine):
    from fleetscope.dashboard import data, fleet_frames

    signals = fleet_frames.node_signals(data.load_prometheus(modules["urls"][engine]))
    for node in modules["fleet"]:
        if not node.devices:
            assert node.instance not in signals.index or \
                signals.loc[node.instance, ["module utilisation", "module memory (fullest)"]] \
                .isna().all()
            continue
        utilisation = sum(d["util"] for d in node.devices) / len(node.devices)
        fullest = max(d["used"] / d["total"] for d in node.devices)
        assert signals.loc[node.instance, "module utilisation"] == pytest.approx(utilisation)
        assert signals.loc[node.instance, "module memory (fullest)"] == pytest.approx(fullest)


def _app(monkeypatch, source: str, page: str, query: dict | None = None):
    pytest.importorskip("streamlit")
    from tests.test_dashboard_app import run_app

    return run_app(monkeypatch, source, page, query)


def _console(monkeypatch, url: str, page: str, query: dict | None = None):
    return _app(monkeypatch, f"prometheus:{url}", page, query)


def _module_table(app):
    """The node page's module table as it reads (its Markdown escapes taken out)."""
    tables = [frame.value for frame in app.table
              if "matrix listed" in getattr(frame.value, "columns", [])]
    return tables[0].replace(r"\\(.)", r"\1", regex=True) if tables else None


def test_a_node_page_lists_the_nodes_modules_as_loaded(monkeypatch, modules):
    from fleetscope.core import units

    node = modules["fleet"][1]  # an A100 node: device 3 with XID 79 and 2 uncorrected ECC
    spec = module_fleet.GROUPS[node.group]
    app = _console(monkeypatch, modules["urls"]["prometheus"], "node", {"node": node.instance})
    assert app.selectbox(key="node_choice").value == node.instance
    table = _module_table(app)
    assert table is not None, "no module table on the node page"
    assert table["device"].tolist() == [d["device"] for d in node.devices]
    assert set(table["model"]) == {spec.model}
    assert set(table["driver / firmware"]) == {f"{spec.driver} / VBIOS {spec.firmware}"}
    assert table["utilisation"].tolist() == [units.format_value(d["util"], "ratio")
                                             for d in node.devices]
    assert table["memory used / total"].tolist() == [
        f"{units.format_value(d['used'], 'bytes')} / {units.format_value(d['total'], 'bytes')}"
        for d in node.devices]
    errors = dict(zip(table["device"], table["errors"], strict=True))
    assert errors.pop("3") == "XID 79, 2 uncorrected ECC errors in total"
    assert set(errors.values()) == {"none"}
    assert set(table["matrix listed"]) == {"yes"}
    assert not any("No inference module" in i.value for i in app.info)


def test_a_node_page_without_modules_says_so(monkeypatch, modules):
    bare = next(n for n in modules["fleet"] if not n.devices)
    unmatrixed = next(n for n in modules["fleet"] if n.group == "910b-nomatrix")
    app = _console(monkeypatch, modules["urls"]["prometheus"], "node", {"node": bare.instance})
    assert app.selectbox(key="node_choice").value == bare.instance
    assert _module_table(app) is None
    assert any("No inference module reported" in i.value for i in app.info)
    # an Ascend node without a matrix: its chips, and no matrix to list them in
    app = _console(monkeypatch, modules["urls"]["prometheus"], "node",
                   {"node": unmatrixed.instance})
    table = _module_table(app)
    assert len(table) == len(unmatrixed.devices)
    assert set(table["model"]) == {"Ascend 910B"}
    assert set(table["matrix listed"]) == {"not checked"}
    assert set(table["errors"]) == {"none"}


def test_the_fleet_heatmap_draws_module_utilisation(monkeypatch, modules):
    app = _console(monkeypatch, modules["urls"]["prometheus"], "fleet")
    app.selectbox(key="fleet_signal").select("module utilisation").run()
    assert not app.exception
    heat = json.loads(app.get("plotly_chart")[-1].proto.spec)
    from tests.test_dashboard_app import plotted

    drawn = {round(float(v), 6) for row in heat["data"][0]["z"]
             for v in (plotted(row) if isinstance(row, dict) else row)
             if v is not None and v == v}
    loaded = {round(sum(d["util"] for d in n.devices) / len(n.devices), 6)
              for n in modules["fleet"] if n.devices}
    assert drawn == loaded


def test_the_node_pages_in_chromium(modules, tmp_path):
    """`fleetscope console --source prometheus:URL` in headless Chromium: a module node's page
    shows a row for each of its modules, a node without any says so."""
    from tests.e2e.test_console_browser import (
        chromium,
        free_port,
        shoot,
        stop,
        wait_for,
        wait_healthy,
    )

    node = modules["fleet"][1]
    bare = next(n for n in modules["fleet"] if not n.devices)
    spec = module_fleet.GROUPS[node.group]
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with open(tmp_path / "console.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "fleetscope", "console", "--source",
                                 f"prometheus:{modules['urls']['prometheus']}", "--port",
                                 str(port)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_healthy(url, proc)
        with chromium() as driver:
            driver.get(f"{url}node?node={node.instance}")
            text = wait_for(driver, lambda t: "matrix listed" in t and "XID 79" in t,
                            "the module table")
            shoot(driver, tmp_path, "node-modules")
            rows = [line for line in text.splitlines()
                    if f"{spec.driver} / VBIOS {spec.firmware}" in line]
            assert len(rows) == len(node.devices), text[:3000]
            driver.get(f"{url}node?node={bare.instance}")
            wait_for(driver, lambda t: "No inference module reported" in t and
                     bare.instance in t, "the line saying the node reports no module")
    finally:
        stop(proc)


# -- the demo fleet (dashboard/fleet_sim.py) -----------------------------------------------
DEMO_NODES = 256


def _demo_nodes():
    import numpy as np

    from fleetscope.dashboard.fleet_sim import Fleet

    fleet = Fleet(nodes=DEMO_NODES)
    faulty = {int(i) for placed in fleet.faults.values() for i in placed}
    every = np.arange(len(fleet.instances))
    carries = fleet.has_modules(every)
    return fleet, [int(i) for i in every[carries] if i not in faulty], \
        [int(i) for i in every[~carries] if i not in faulty], int(carries.sum())


def test_the_demo_node_pages_show_the_modules_or_say_there_are_none(monkeypatch):
    from fleetscope.dashboard.fleet_sim import CPU_MODELS, MODULE_MODELS, MODULES_PER_NODE
    from fleetscope.diagnose.accelerator_fleet import FIRMWARE_WORD, module_name

    fleet, with_modules, without, _ = _demo_nodes()
    index = with_modules[0]
    kind = MODULE_MODELS[CPU_MODELS[fleet.model[index]].arch]
    app = _app(monkeypatch, f"demo:{DEMO_NODES}", "node", {"node": fleet.instances[index]})
    table = _module_table(app)
    assert table is not None, "no module table on a module node's page"
    assert table["device"].tolist() == [str(d) for d in range(MODULES_PER_NODE)]
    assert set(table["model"]) == {module_name(kind.vendor, kind.model)}
    driver, firmware = kind.pairs[0]  # a healthy node runs the pair its matrix lists
    assert set(table["driver / firmware"]) == {
        f"{driver} / {FIRMWARE_WORD.get(kind.vendor, 'firmware')} {firmware}"}
    assert set(table["matrix listed"]) == {"yes"}
    app = _app(monkeypatch, f"demo:{DEMO_NODES}", "node", {"node": fleet.instances[without[0]]})
    assert _module_table(app) is None
    assert any("No inference module reported" in i.value for i in app.info)


def test_the_demo_heatmap_draws_module_memory_on_the_module_nodes_alone(monkeypatch):
    from tests.test_dashboard_app import plotted

    _, _, _, carrying = _demo_nodes()
    app = _app(monkeypatch, f"demo:{DEMO_NODES}", "fleet")
    app.selectbox(key="fleet_signal").select("module memory (fullest)").run()
    assert not app.exception
    heat = json.loads(app.get("plotly_chart")[-1].proto.spec)
    drawn = [float(v) for row in heat["data"][0]["z"]
             for v in (plotted(row) if isinstance(row, dict) else row)
             if v is not None and v == v]
    assert len(drawn) == carrying
    assert all(0 < v <= 1 for v in drawn)


# -- a bundle (the scenario bundles of tests/fixtures/make_scenarios.py) --------------------
def _last_sample(bundle: Path) -> Path:
    meta = json.loads((bundle / "meta.json").read_text())
    return bundle / meta["samples"][-1]["dir"]


def test_a_bundle_node_page_lists_what_its_dcgm_exporter_scrape_holds(monkeypatch):
    """The accelerator-errors scenario: dcgm-exporter's /metrics recorded in each sample. The
    table is read against the last scrape itself: its GPUs, their model, driver, VBIOS and
    last XID."""
    bundle = SCENARIOS / "accelerator-errors"
    scrape = (_last_sample(bundle) / "cmd" / "accelerator-exporter-0.prom").read_text()
    util = re.findall(r'^DCGM_FI_DEV_GPU_UTIL\{gpu="(\d+)".*modelName="([^"]+)".*'
                      r'DCGM_FI_DRIVER_VERSION="([^"]+)",DCGM_FI_DEV_VBIOS_VERSION="([^"]+)"'
                      r'.* (\d+)$', scrape, re.M)
    xids = dict(re.findall(r'^DCGM_FI_DEV_XID_ERRORS\{gpu="(\d+)".* (\d+)$', scrape, re.M))
    assert util and any(int(x) for x in xids.values())  # the scenario's fault is in the file
    app = _app(monkeypatch, f"bundle:{bundle}", "node")
    table = _module_table(app)
    assert table is not None, "no module table for the bundle's node"
    assert table["device"].tolist() == [gpu for gpu, *_ in util]
    assert table["model"].tolist() == [model for _, model, *_ in util]
    assert table["driver / firmware"].tolist() == [f"{driver} / VBIOS {vbios}"
                                                   for _, _, driver, vbios, _ in util]
    assert table["utilisation"].tolist() == [f"{int(busy)} %" for *_, busy in util]
    errors = dict(zip(table["device"], table["errors"], strict=True))
    assert errors == {gpu: f"XID {xid}" if int(xid) else "none" for gpu, xid in xids.items()}
    # the recorded matrix (static/accelerator-matrix.yaml) judged the pair
    assert set(table["matrix listed"]) <= {"yes", "no"}


def test_a_bundle_node_page_lists_the_npus_of_its_npu_smi_table(monkeypatch):
    bundle = SCENARIOS / "cpu-bound-module-idle"
    text = (_last_sample(bundle) / "cmd" / "npu-smi-info.txt").read_text()
    npus = re.findall(r"^\| (\d+)\s+(\S+)\s+\| (\w+)", text, re.M)
    assert npus
    app = _app(monkeypatch, f"bundle:{bundle}", "node")
    table = _module_table(app)
    assert table is not None, "no module table for the bundle's node"
    assert len(table) == len(npus)
    assert [d.split("/")[0] for d in table["device"]] == [npu for npu, *_ in npus]
    assert set(table["model"]) == {f"Ascend {name}" for _, name, _ in npus}
    assert set(table["matrix listed"]) == {"not checked"}  # npu-smi scenarios run without one
