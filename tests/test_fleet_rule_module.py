"""A rule's module says how its fault moves the simulated fleet: a throwaway rule module
(tests/fixtures/throwaway_rule.py: condition, runbook and physics in one file), registered
for a test, is found everywhere and fired by the demo fleet on exactly its nodes, with no
other file changed."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from fleetscope import cli
from fleetscope.diagnose import engine
from fleetscope.rules.catalog import CATALOG, RULE_IDS
from fleetscope.rules.fleet import FleetFault, Set

pytest.importorskip("numpy")

from fleetscope.dashboard import data  # noqa: E402  (numpy first)
from fleetscope.dashboard.fleet_sim import SIGNALS, Fleet  # noqa: E402

MODULE = Path(__file__).resolve().parent / "fixtures" / "throwaway_rule.py"
SECTIONS = ("## What it means", "## Confirm by hand", "## Fix", "## Verify the fix")


@pytest.fixture(scope="module")
def throwaway():
    spec = importlib.util.spec_from_file_location("throwaway_rule", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cli(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(list(argv)) == 0
    return out.getvalue()


def _fired(findings: list[dict], rule_id: str) -> set[str]:
    return {f["node"] for f in findings if f["rule"] == rule_id}


def test_a_rule_module_with_its_physics_is_found_everywhere_and_fires_on_its_nodes(
        throwaway, tmp_path):
    rule = throwaway.RULE
    assert throwaway.RUNBOOK.startswith(f"# {rule.id}\n")
    assert all(section in throwaway.RUNBOOK for section in SECTIONS)
    with CATALOG.registered(rule, throwaway.RANK):
        assert rule.id in RULE_IDS
        listed = {line.split()[0]: line for line in _cli("rules", "list").splitlines()}
        assert rule.symptom in listed[rule.id]
        exported = tmp_path / "rules.yml"
        _cli("rules", "export", "-o", str(exported))
        alerts = {a["labels"]["fleetscope_rule"]: a
                  for g in yaml.safe_load(exported.read_text())["groups"] for a in g["rules"]
                  if "alert" in a}
        assert alerts[rule.id]["expr"] == rule.condition.promql()

        # the demo source, as the console loads it (one process: a worker process would
        # run the catalog without the throwaway rule)
        snapshot = data.load_demo(nodes=64, cores=16, processes=1)
        placed = Fleet(nodes=64, cores=16).expected_findings()[rule.id]
        assert len(placed) > 1  # several nodes, so that exactly these means something
        assert _fired(snapshot.findings, rule.id) == placed
        # and the engine alone, over the whole fleet at once
        fleet = Fleet(nodes=64, cores=16, end_s=int(snapshot.window[1]))
        found, _ = engine.evaluate(fleet.series(), "?")
        assert {f.node for f in found if f.rule.id == rule.id} == placed
        # the fault moves the metric from its onset on, as the module says
        node = sorted(placed)[0]
        history = fleet.node_series(node, 60, per_core=False)
        limits = {labels: [v for _, v in points] for labels, points in
                  history.by_name["fleetscope_pool_nproc_limit"].items()}
        processes = {labels: points[-1][1] for labels, points in
                     history.by_name["fleetscope_pool_processes"].items()}
        for labels, values in limits.items():
            assert values[0] == 65535  # an hour ago: before the onset
            assert values[-1] == processes[labels] * throwaway.TASKS_PER_PROCESS
    assert rule.id not in RULE_IDS
    assert rule.id not in Fleet(nodes=64, cores=16).expected_findings()


def test_an_effect_on_a_signal_the_simulator_lacks_is_refused(throwaway):
    assert "nproc_limit" in SIGNALS
    rule = throwaway.RULE
    fault = FleetFault(("batch",), 4, 20, effects=(Set("no_such_signal", 1.0),))
    with CATALOG.registered(replace(rule, fleet=fault), throwaway.RANK):
        with pytest.raises(ValueError, match="no_such_signal"):
            Fleet(nodes=64, cores=16)


def _probe(throwaway, effects) -> Fleet:
    """A 64-node fleet with a probe fault on a few codegen nodes (online workers and inference
    modules)."""
    probe = FleetFault(("codegen",), 256, 30, effects=effects)
    with CATALOG.registered(replace(throwaway.RULE, fleet=probe), throwaway.RANK):
        return Fleet(nodes=64, cores=16)


@pytest.mark.parametrize("signal", sorted(SIGNALS))
def test_every_signal_of_the_vocabulary_moves_what_the_exporter_shows(throwaway, signal):
    """An effect on any signal of fleet_sim.SIGNALS changes the fleet's series (or a node's
    per-core ones): the vocabulary names nothing the simulator leaves unused."""
    value = "probe-model" if signal == "tool_model" else 7.0
    moved, still = _probe(throwaway, (Set(signal, value),)), _probe(throwaway, ())
    node = moved.instances[moved.faults[throwaway.RULE.id][0]]
    assert (moved.series().by_name != still.series().by_name
            or moved.node_series(node, 2).by_name != still.node_series(node, 2).by_name)


def test_the_console_holds_no_rule_id():
    # The simulator and the pages take every rule from the registry: none is written in.
    folder = Path(data.__file__).parent
    sources = {path: path.read_text(encoding="utf-8") for path in folder.rglob("*")
               if path.suffix in (".py", ".md") and path.is_file()}
    assert folder / "fleet_sim.py" in sources and folder / "views" / "node.py" in sources
    written = sorted(f"{path.relative_to(folder)}: {rule_id}" for rule_id in RULE_IDS
                     for path, text in sources.items()
                     if re.search(rf"\b{re.escape(rule_id)}\b", text))
    assert written == []
