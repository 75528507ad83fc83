"""The rule scenario bundles (written by tests/fixtures/make_scenarios.py into the session's
generated directory, see tests/conftest.py, each built by its rule's module): each rule's
bundle gives that rule as the primary finding of `fleetscope diagnose`, as its proof says,
the healthy bundles give status ok, and each further case of a rule (Proof.cases) gives
exactly the findings and harm it plants. That the generator is
deterministic is checked against the committed manifest (tests/test_fixture_trees.py).

Every bundle is diagnosed once, through the CLI in a subprocess, as a user would run it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jsonschema
import pytest

from fleetscope.rules.catalog import CATALOG, by_id
from tests.conftest import SCENARIOS
from tests.diagnosis_schema import diagnosis_schema
from tests.fixture_trees import scenario_cases, scenario_names

# healthy-idle and healthy-busy, and the rules' healthy look-alikes (Proof.lookalikes, and
# the cases of a healthy node a rule says only information of)
HEALTHY = tuple(name for name in scenario_names() if name.startswith("healthy-"))
CASES = scenario_cases()
RULE_IDS = sorted(rule.id for rule in CATALOG)
EXIT = {"critical": 2, "warning": 1}
SEVERITIES = ("critical", "warning", "info")

# Signals the bundles lack on purpose: none (a kernel log without SIGILL gives no
# fleetscope_sigill_crashes_total series, but the collector's always-present
# fleetscope_sigill_reports_suppressed_total shows the log was read: evaluated, not found),
# except the inference-module rules on a node without modules (most scenarios: CPU nodes),
# and the matrix where the node's source names no firmware (npu-smi info): not evaluated,
# and the reason says so (the collectors' missing_hints).
MODULE_RULES = {rule.id for rule in CATALOG
                if any(name.startswith("fleetscope_accelerator_") for name in rule.requires())}
NO_MODULE = "no inference module on this node"
NO_MATRIX = "no compatibility matrix configured (accelerator_matrix)"


def unevaluated_for_want_of_modules(document: dict) -> bool:
    """Every rule not evaluated is a module rule that says why: no module data on the node,
    or no matrix verdict for its driver/firmware pair."""
    return all(item["rule"] in MODULE_RULES and (NO_MODULE in item["reason"]
                                                  or NO_MATRIX in item["reason"])
               for item in document["not_evaluated"])

_results: dict[str, tuple[int, dict, str]] = {}


def diagnose(name: str) -> tuple[int, dict, str]:
    """(exit code, diagnosis JSON, stderr) of `fleetscope diagnose --bundle <name> --json`,
    run once per bundle."""
    if name not in _results:
        result = subprocess.run(
            [sys.executable, "-m", "fleetscope", "diagnose", "--bundle", str(SCENARIOS / name),
             "--json"], capture_output=True, text=True, timeout=300)
        assert result.stdout, result.stderr
        _results[name] = (result.returncode, json.loads(result.stdout), result.stderr)
    return _results[name]


def test_one_bundle_per_rule_and_the_healthy_ones():
    names = sorted(p.name for p in SCENARIOS.iterdir() if (p / "meta.json").is_file())
    assert names == sorted(set(RULE_IDS) | set(HEALTHY) | set(CASES))
    assert all(rule.proof is not None for rule in CATALOG)
    assert {"healthy-idle", "healthy-busy"} < set(HEALTHY)
    assert not set(CASES) & set(RULE_IDS)


@pytest.mark.parametrize("rule_id", RULE_IDS)
def test_rule_scenario_gives_that_rule_first(rule_id):
    code, document, stderr = diagnose(rule_id)
    jsonschema.validate(document, diagnosis_schema())
    assert document["source"] == "bundle" and document["nodes"]
    findings = document["findings"]
    assert findings, f"{rule_id}: no finding ({document['not_evaluated']})"
    primary = findings[0]
    assert primary["rule"] == rule_id, [f["rule"] for f in findings]
    rule = by_id(rule_id)
    assert primary["severity"] == rule.severity
    assert primary["runbook"] == f"runbooks/{rule_id}.md"
    assert primary["node"] == document["nodes"][0]
    # exit code: 2 when the primary (the worst) is critical, 1 when it is a warning
    assert code == EXIT[primary["severity"]], (code, stderr)
    assert document["status"] == primary["severity"]
    # evidence: the rule's first signal, with a value past its threshold
    evidence = primary["evidence"]
    assert evidence, primary
    first = evidence[0]
    assert first["signal"] == rule.evidence[0].signal
    assert first["value"] > first["threshold"]
    assert all(isinstance(e["value"], (int, float)) and e["unit"] for e in evidence)
    # a summary with the finding's own labels filled in, never the "?" of a missing one
    summary = primary["summary"]
    assert "?" not in summary and "{" not in summary
    # what the rule's proof (rules/builtin/<rule>.py) says its finding must hold: words of
    # the summary (the pool, queue, model, binary...) and the subjects it names
    assert re.search(rule.proof.summary, summary), summary
    assert 0.0 < primary["confidence"] <= 1.0
    if rule.proof.subjects is not None:
        kind, expected = rule.proof.subjects
        assert primary["subjects"][kind], primary["subjects"]
        if expected is not None:
            assert primary["subjects"][kind] == expected
    # everything else was evaluated: the bundles carry every signal (but modules where the
    # node has none)
    assert unevaluated_for_want_of_modules(document), document["not_evaluated"]


@pytest.mark.parametrize("rule_id", RULE_IDS)
def test_rule_scenario_is_clean(rule_id):
    """Only the injected cause fires, so the exported alerts replayed by promtool agree
    with the engine on a single rule per bundle."""
    _, document, _ = diagnose(rule_id)
    found = {f["rule"] for f in document["findings"]}
    # A cause may bring its symptom along (hundreds of runnable threads saturate the CPU):
    # symptom rules may accompany it, never lead, never another cause.
    symptoms = {rule.id for rule in CATALOG if rule.kind == "symptom"}
    assert rule_id in found and found - {rule_id} <= symptoms, found
    assert document["findings"][0]["rule"] == rule_id


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_scenario_is_ok(name):
    code, document, stderr = diagnose(name)
    jsonschema.validate(document, diagnosis_schema())
    assert document["status"] == "ok", document["findings"]
    assert code == 0, stderr
    assert not [f for f in document["findings"] if f["severity"] in ("warning", "critical")]
    assert unevaluated_for_want_of_modules(document), document["not_evaluated"]


def _pools_of(name: str) -> list[tuple[str, str, str, list[str]]]:
    """(rule, severity, phase, pools of its label sets) of each finding, ranked, from the
    engine in-process on the bundle: the labels the CLI's document does not carry."""
    from fleetscope.bundle.read import open_bundle
    from fleetscope.diagnose.engine import assess
    from fleetscope.diagnose.evidence import bundle_series

    with open_bundle(str(SCENARIOS / name)) as bundle:
        verdict = assess(bundle_series(bundle, bundle.config()), bundle.hostname)
    return [(f.rule.id, f.severity, f.phase,
             sorted({labels.get("pool", "") for labels in f.label_sets}))
            for f in verdict.findings]


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_scenario_gives_exactly_the_findings_and_harm_it_plants(name):
    case = CASES[name]
    code, document, stderr = diagnose(name)
    jsonschema.validate(document, diagnosis_schema())
    findings = document["findings"]
    # the findings, most important first, each in the severity and phase planted
    assert [(f["rule"], f["severity"], f["phase"]) for f in findings] == [
        expected[:3] for expected in case.findings]
    worst = min((f["severity"] for f in findings), key=SEVERITIES.index, default="info")
    assert document["status"] == ("ok" if worst == "info" else worst)
    assert code == EXIT.get(worst, 0), (code, stderr)
    # each about the pool planted (one label set each: a pool's finding names no other)
    assert _pools_of(name) == [(rule, severity, phase, [pool])
                               for rule, severity, phase, pool in case.findings]
    # the harm: each hurting pool, on every signal, explained by exactly the rules planted
    harm: dict[str, set[str]] = {}
    for item in document["harm"]:
        harm.setdefault(item["pool"], set()).update(item["explained_by"])
        assert item["value"] > item["target"], item
    assert harm == {pool: set(rules) for pool, rules in case.harm}
    for item in document["harm"]:
        assert sorted(item["explained_by"]) == sorted(dict(case.harm)[item["pool"]])
    # ...and each finding names the pools whose harm it explains
    for finding in findings:
        assert finding["explains"] == [pool for pool, rules in case.harm
                                       if finding["rule"] in rules], finding
        assert "?" not in finding["summary"] and "{" not in finding["summary"]
    assert unevaluated_for_want_of_modules(document), document["not_evaluated"]


def test_a_node_without_modules_says_each_module_rule_was_not_evaluated_and_why():
    _, document, _ = diagnose("healthy-idle")  # a CPU node: no exporter, no vendor tool
    reasons = {item["rule"]: item["reason"] for item in document["not_evaluated"]}
    assert set(reasons) == MODULE_RULES and len(MODULE_RULES) == 6
    assert all(NO_MODULE in reason for reason in reasons.values()), reasons


@pytest.mark.parametrize("rule_id, mirror", [("cpu-bound-module-idle", "module-bound-cpu-idle"),
                                             ("module-bound-cpu-idle", "cpu-bound-module-idle")])
def test_cpu_versus_module_attribution_goes_both_ways(rule_id, mirror):
    """Each attribution fires on its own scenario and not on the other's, where both are
    evaluated (module data on the node)."""
    _, own, _ = diagnose(rule_id)
    _, other, _ = diagnose(mirror)
    assert own["findings"][0]["rule"] == rule_id
    assert rule_id not in {f["rule"] for f in other["findings"]}
    assert rule_id not in {item["rule"] for item in other["not_evaluated"]}


def test_scenario_bundles_follow_the_bundle_format():
    for root in sorted(p for p in SCENARIOS.iterdir() if (p / "meta.json").is_file()):
        meta = json.loads((root / "meta.json").read_text())
        assert meta["format"] == "fleetscope-bundle/1"
        assert meta["interval_s"] == 10.0
        times = [s["time"] for s in meta["samples"]]
        assert len(times) == 8
        assert all(b - a == 10.0 for a, b in zip(times, times[1:], strict=False))
        assert all((root / s["dir"]).is_dir() for s in meta["samples"])
        assert {p["name"] for p in meta["config"]["pools"]} == {"chat-online", "batch"}
        assert (root / "static" / "proc" / "cpuinfo").is_file()
        assert (root / "static" / "dmesg.txt").is_file()


def test_irq_overlap_needs_only_what_the_contract_bundle_carries(tmp_path):
    # docs/bundle-format.md lists /proc/interrupts, not /proc/irq/*/smp_affinity_list: where
    # the interrupts land is enough to diagnose; the masks only add evidence.
    import shutil

    copy = tmp_path / "irq"
    shutil.copytree(SCENARIOS / "irq-core-overlap", copy)
    for masks in copy.glob("samples/*/proc/irq"):
        shutil.rmtree(masks)
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                             str(copy), "--json"], capture_output=True, text=True, timeout=120)
    findings = json.loads(result.stdout)["findings"]
    assert findings[0]["rule"] == "irq-core-overlap"
    signals = [e["signal"] for e in findings[0]["evidence"]]
    assert not any("affinity" in s for s in signals)
