"""One source of truth: for every scenario bundle, Prometheus (promtool test rules) fires
exactly the alerts the Python engine finds, on the series the exporter produces from the
bundle's samples.

Rules that read ALERTS (unexplained-harm: harm no other rule explains) come last in the
group, so in each evaluation they see the alerts the others fired at that step; the
in-process side feeds them the same ALERTS.

The exported rule file is used as written, except that `for:` and annotations are dropped
in this test's copy: `for:` is Prometheus's flap guard over time (a bundle is a minute long),
and annotations only render text. The conditions - what the engine evaluates - are untouched,
and compared at every step of the bundle that has the rules' windows behind it, for every
severity tier. The engine's persistence (a condition holding at most steps of the window) is
a function of those per-step results, tested in tests/test_engine.py. Event times (kills,
crashes, refused forks) are moved onto promtool's clock, so an event's age, and with it its
phase (ongoing, ended, older), is compared too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from fleetscope.bundle.read import open_bundle
from fleetscope.diagnose.engine import evaluate, reads_alerts
from fleetscope.diagnose.evidence import bundle_series
from fleetscope.rules.catalog import CATALOG, WINDOW
from fleetscope.rules.export import rule_file
from fleetscope.rules.promql import Series, strip_name
from tests.conftest import SCENARIOS, require_tool
from tests.fixture_trees import scenario_cases, scenario_names

SCENARIO_NAMES = scenario_names()  # from the manifest: known at collection, before generation
CASES = scenario_cases()
# promtool's clock starts at 0 (its eval_time), the bundle's at its first sample: event times
# go onto promtool's clock, so `time() - <event time>` is the same age on both sides.
EVENT_TIME = "_timestamp_seconds"


def test_every_rule_has_a_scenario_and_there_are_healthy_ones():
    assert {rule.id for rule in CATALOG} <= set(SCENARIO_NAMES)
    assert {"healthy-idle", "healthy-busy"} <= set(SCENARIO_NAMES)


def _label_text(labels: dict) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _promtool_case(bundle_path: Path):
    with open_bundle(str(bundle_path)) as bundle:
        series = bundle_series(bundle, bundle.config())
        times = [round(s.time * 1000) for s in bundle.samples]
        interval_ms = round(bundle.interval_s * 1000)
        hostname = bundle.hostname
    assert all(b - a == interval_ms for a, b in zip(times, times[1:], strict=False)), \
        "scenario samples must be evenly spaced to replay in promtool"
    input_series = []
    for name, by_labels in sorted(series.by_name.items()):
        shift = times[0] / 1000 if name.endswith(EVENT_TIME) else 0.0
        for labels, points in sorted(by_labels.items()):
            values = dict(points)
            text = " ".join(repr(values[t] - shift) if t in values else "_" for t in times)
            input_series.append({"series": name + _label_text(dict(labels)), "values": text})
    findings, _ = evaluate(series, hostname)  # the engine, with its persistence
    # Every step with the rules' full windows behind it: each tier's condition, evaluated
    # in-process with Prometheus's own windows, is exactly what promtool fires there.
    series.max_window_ms = series.max_lookback_ms = None
    tests = []
    for at_ms in times:
        if at_ms - times[0] < WINDOW * 1000:
            continue
        expected: dict[str, list[dict]] = {rule.alert_name: [] for rule in CATALOG}
        firing = Series()  # ALERTS at this step, for the rules that read them (evaluated last)
        firing.by_name = dict(series.by_name)
        for rule in sorted(CATALOG, key=reads_alerts):
            for level in rule.levels():
                for labels in sorted(level.condition.evaluate(firing, at_ms)):
                    alert = dict(strip_name(labels))
                    alert.update(rule.alert_labels(level))
                    expected[rule.alert_name].append({"exp_labels": alert})
                    firing.add("ALERTS", {**alert, "alertname": rule.alert_name,
                                          "alertstate": "firing"}, at_ms, 1.0)
        tests += [{"alertname": name, "eval_time": f"{(at_ms - times[0]) // 1000}s",
                   "exp_alerts": alerts} for name, alerts in expected.items()]
    assert tests, "the bundle is shorter than the rules' windows"
    return {"interval": f"{interval_ms // 1000}s", "input_series": input_series,
            "alert_rule_test": tests}, findings


def write_rules(directory: Path) -> None:
    """The exported rule file as this test uses it (no `for:`, no annotations) in
    `directory`/rules.yml."""
    rules = rule_file()
    for rule in rules["groups"][0]["rules"]:
        rule.pop("for", None)
        rule.pop("annotations", None)
    rules["groups"][0]["interval"] = "10s"
    (directory / "rules.yml").write_text(yaml.safe_dump(rules))


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_promtool_fires_exactly_what_the_engine_finds(tmp_path, scenario):
    promtool = require_tool("promtool")
    write_rules(tmp_path)
    case, findings = _promtool_case(SCENARIOS / scenario)
    # the test can fail both ways: the engine's answer is the scenario's ground truth
    if scenario in CASES:
        assert [(f.rule.id, f.severity, f.phase) for f in findings] == [
            expected[:3] for expected in CASES[scenario].findings]
    elif not scenario.startswith("healthy"):
        assert findings and findings[0].rule.id == scenario
    test_file = tmp_path / "test.yml"
    test_file.write_text(yaml.safe_dump({
        "rule_files": ["rules.yml"], "evaluation_interval": case["interval"], "tests": [case],
    }))
    result = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
