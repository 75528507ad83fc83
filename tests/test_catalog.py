"""The catalog keeps the contract: every rule id, a runbook per rule and a rule per runbook."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from fleetscope import cli
from fleetscope.rules.catalog import (
    CATALOG,
    KEPT_RULE_IDS,
    RULE_IDS,
    Evidence,
    FleetFault,
    Panel,
    Proof,
    Rule,
    builtin_modules,
)
from fleetscope.rules.export import markdown_table
from fleetscope.rules.promql import Max, Selector
from tests.diagnosis_schema import diagnosis_schema
from tests.fixture_trees import load_generator

RUNBOOKS = Path(__file__).resolve().parent.parent / "runbooks"
SECTIONS = ("## What it means", "## Confirm by hand", "## Fix", "## Verify the fix")


def test_every_contract_rule_is_in_the_catalog_once():
    ids = [rule.id for rule in CATALOG]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(RULE_IDS)
    assert set(KEPT_RULE_IDS) <= set(ids)


def test_every_rule_has_a_runbook_and_every_runbook_a_rule():
    runbooks = {path.stem for path in RUNBOOKS.glob("*.md") if path.stem != "README"}
    assert runbooks == set(RULE_IDS)
    for rule_id in RULE_IDS:
        text = (RUNBOOKS / f"{rule_id}.md").read_text()
        assert text.startswith(f"# {rule_id}\n")
        for section in SECTIONS:
            assert section in text, (rule_id, section)
        for link in re.findall(r"\]\(([a-z-]+\.md)\)", text):
            assert (RUNBOOKS / link).exists(), (rule_id, link)


def test_rules_have_what_an_on_call_engineer_needs():
    for rule in CATALOG:
        assert rule.severity in ("critical", "warning", "info")
        assert rule.symptom and rule.cause and rule.action and rule.summary
        assert rule.evidence, rule.id
        assert 0 < rule.confidence < 1
        assert rule.condition.metrics(), rule.id


def _throwaway_scenario(k):
    """A healthy node under the throwaway rule's name (the kit is make_scenarios.py)."""
    healthy = k.healthy_idle()
    healthy.name = "throwaway-test-rule"
    return healthy


def _throwaway_rule() -> Rule:
    busy = Max(Selector("fleetscope_cpu_core_busy_ratio", {"stat": "p50"}), by=("instance",))
    return Rule(id="throwaway-test-rule", severity="warning", symptom="a symptom only a test has",
                cause="c", action="a", summary="median core {value:.0%} busy",
                condition=busy > 0.9, evidence=(Evidence("median core busy", busy, 0.9,
                                                         "ratio"),),
                views=(Panel("Median core busy (throwaway)", busy, "ratio", 0.9),),
                fleet=FleetFault(("chat",), 3, 10),
                proof=Proof(_throwaway_scenario, summary="median core"))


def _cli(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(list(argv)) == 0
    return out.getvalue()


def _finding(rule_id: str) -> dict:
    return {"format": "fleetscope-diagnosis/1", "source": "bundle", "nodes": ["n"],
            "window": {"start": 0.0, "end": 1.0}, "status": "warning",
            "findings": [{"rule": rule_id, "severity": "warning", "node": "n", "confidence": 0.5,
                          "summary": "s", "cause": "c", "action": "a",
                          "runbook": f"runbooks/{rule_id}.md", "evidence": [],
                          "subjects": {k: [] for k in ("pids", "cgroups", "cpus", "numa_nodes",
                                                       "interfaces", "devices", "binaries",
                                                       "pods")}}],
            "not_evaluated": []}


def test_a_rule_registered_in_a_test_appears_everywhere_with_no_other_file_touched(tmp_path):
    """One registration: `rules list` (both formats), `rules export`, the schema, the
    console's rule list and evidence views, the simulated fleet's faults and the scenario
    generator all see the rule, and none of them once it is gone."""
    pytest.importorskip("pandas")
    from fleetscope.dashboard import evidence_views, rulebook
    from fleetscope.dashboard.fleet_sim import Fleet

    rule = _throwaway_rule()
    before = len(CATALOG)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_finding(rule.id), diagnosis_schema())
    with CATALOG.registered(rule):
        assert len(CATALOG) == before + 1 and rule.id in RULE_IDS
        listed = {line.split()[0]: line for line in _cli("rules", "list").splitlines()}
        assert rule.id in listed and "a symptom only a test has" in listed[rule.id]
        exported = tmp_path / "rules.yml"
        _cli("rules", "export", "-o", str(exported))
        alerts = {a["labels"]["fleetscope_rule"]: a
                  for g in yaml.safe_load(exported.read_text())["groups"] for a in g["rules"]
                  if "alert" in a}
        assert alerts[rule.id]["alert"] == "FleetscopeThrowawayTestRule"
        assert alerts[rule.id]["expr"] == rule.condition.promql()
        assert alerts[rule.id]["annotations"]["runbook_url"].endswith(f"/{rule.id}.md")
        jsonschema.validate(_finding(rule.id), diagnosis_schema())
        table = rulebook.rule_table()
        assert rule.id in set(table["rule"]) and len(table) == before + 1
        assert f"| [{rule.id}]({rule.id}.md) | warning | a symptom only a test has |" in \
            _cli("rules", "list", "--format", "markdown")
        assert [p.title for p in evidence_views.views_for(rule.id)] == [
            "Median core busy (throwaway)"]
        fleet = Fleet(nodes=64)
        assert len(fleet.expected_findings()[rule.id]) == 1  # 3 of 4,096 nodes: at least one
        kit = load_generator("scenarios", "make_scenarios_catalog_probe")
        assert rule.id in [make().name for make in kit.rule_scenarios()]
    assert rule.id not in RULE_IDS and len(CATALOG) == before
    assert rule.id not in Fleet(nodes=64).expected_findings()
    assert rule.id not in _cli("rules", "list")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_finding(rule.id), diagnosis_schema())


def test_a_rule_id_registers_once():
    with pytest.raises(ValueError, match="registered already"):
        CATALOG.register(CATALOG[0])


def test_the_runbooks_readme_table_is_the_generated_one():
    text = (RUNBOOKS / "README.md").read_text()
    assert markdown_table() in text, ("runbooks/README.md's table is stale: regenerate it with "
                                      "`fleetscope rules list --format markdown`")
    rows = re.findall(r"^\| \[([a-z-]+)\]\(([a-z-]+)\.md\) \|", text, flags=re.M)
    assert [name for name, _ in rows] == list(RULE_IDS)


def test_each_rule_is_one_module_with_everything_about_it():
    """rules/builtin/<id>.py: the rule, its rank, and what proves it; the module's name is
    the rule id."""
    modules = builtin_modules()
    assert sorted(m.RULE.id for m in modules) == sorted(RULE_IDS)
    for module in modules:
        rule = module.RULE
        assert module.__name__.rsplit(".", 1)[1] == rule.id.replace("-", "_")
        assert rule.proof is not None and rule.proof.summary, rule.id
        assert rule.views and rule.fleet is not None, rule.id
    ranks = [m.RANK for m in sorted(modules, key=lambda m: m.RANK)]
    assert len(set(ranks)) == len(ranks)
