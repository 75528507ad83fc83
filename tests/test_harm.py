"""Harm first: the config's harm targets, and the engine's "harm no rule explains" finding.

Series are built here sample by sample (an online pool's session histogram, the harm
targets the `harm` collector publishes); the expected outcome is what was put in: sessions of
2 s against a 1 s target hurt, sessions of 50 ms do not.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from fleetscope.collectors.harm import HarmCollector
from fleetscope.core.config import ConfigError, parse_config
from fleetscope.diagnose.engine import diagnosis, evaluate
from fleetscope.rules.catalog import CATALOG, NODE, Evidence, FleetFault, Panel, Proof, Rule
from fleetscope.rules.harm import HARM, OtherFindings
from fleetscope.rules.promql import Max, Selector, Series

BUCKETS = ("0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "+Inf")
STEPS = 21  # one sample a second


def _targets(series: Series, config: dict, at_ms: int) -> None:
    """What the `harm` collector publishes for this config, as one scrape."""
    for family in HarmCollector(parse_config(config)).collect(None):
        for name, labels, value in family:
            series.add(name, dict(zip(labels.names, labels.values, strict=True)), at_ms, value)


def _sessions(seconds: float, per_second: float = 5.0, pool: str = "chat-online",
              config: dict | None = None, extra=None) -> Series:
    """An online pool finishing `per_second` sessions a second, each `seconds` long."""
    series = Series()
    for step in range(STEPS):
        at_ms = 1_700_000_000_000 + step * 1000
        done = per_second * step
        for le in BUCKETS:
            under = le == "+Inf" or seconds <= float(le)
            series.add("agent_session_duration_seconds_bucket",
                       {"pool": pool, "class": "online", "le": le}, at_ms, done if under else 0)
        series.add("agent_session_duration_seconds_count", {"pool": pool, "class": "online"},
                   at_ms, done)
        series.add("agent_session_duration_seconds_sum", {"pool": pool, "class": "online"},
                   at_ms, done * seconds)
        _targets(series, config or {}, at_ms)
        if extra:
            extra(series, at_ms, step)
    return series


def _found(series: Series) -> dict[str, dict]:
    findings, not_evaluated = evaluate(series, "node-1")
    assert "unexplained-harm" not in {n["rule"] for n in not_evaluated}, not_evaluated
    return {f.rule.id: f.to_json() for f in findings}


def test_slow_sessions_with_no_known_cause_are_a_warning_never_ok():
    findings, not_evaluated = evaluate(_sessions(2.0), "node-1")
    found = {f.rule.id: f for f in findings}
    assert set(found) == {"unexplained-harm"}
    document = diagnosis("bundle", ["node-1"], (0.0, 20.0), findings, not_evaluated,
                         len(CATALOG))
    assert document["status"] == "warning"
    harm = found["unexplained-harm"].to_json()
    assert harm["severity"] == "warning"
    assert harm["evidence"][0]["signal"] == "online sessions' P99"
    assert harm["evidence"][0]["value"] > harm["evidence"][0]["threshold"] == 1.0


def test_fast_sessions_are_no_harm_and_the_node_is_ok():
    findings, not_evaluated = evaluate(_sessions(0.04), "node-1")
    assert findings == []
    document = diagnosis("bundle", ["node-1"], (0.0, 20.0), findings, not_evaluated,
                         len(CATALOG))
    assert document["status"] == "ok"
    assert document["not_evaluated"]  # what could not be judged stays beside the ok


def test_the_nodes_own_target_and_a_pools_own_target_decide():
    assert "unexplained-harm" not in _found(_sessions(2.0, config={
        "harm_targets": {"online_session_p99_seconds": 3}}))
    assert "unexplained-harm" not in _found(_sessions(2.0, config={
        "harm_targets": {"pools": {"chat-online": {"online_session_p99_seconds": 3}}}}))
    # another pool's own target does not apply to this one
    assert "unexplained-harm" in _found(_sessions(2.0, config={
        "harm_targets": {"pools": {"codegen-online": {"online_session_p99_seconds": 30}}}}))
    # a pool's own target lower than the node's applies to that pool
    assert "unexplained-harm" in _found(_sessions(0.4, config={
        "harm_targets": {"pools": {"chat-online": {"online_session_p99_seconds": 0.3}}}}))


def _cause_metric(series: Series, at_ms: int, step: int) -> None:
    series.add("test_cause_gauge", {}, at_ms, 5.0)


def test_any_registered_rule_explains_the_harm_one_registered_later_too():
    """The causes are read from the registry: a rule registered after the harm rule (as a
    merged branch's module, or a test's throwaway) silences it on the node it fires on."""
    cause = Rule(id="throwaway-cause", severity="warning", symptom="s", cause="c", action="a",
                 summary="a cause", condition=Max(Selector("test_cause_gauge"), by=NODE) > 1,
                 evidence=(Evidence("gauge", Max(Selector("test_cause_gauge"), by=NODE), 1,
                                    "ratio"),),
                 views=(Panel("gauge", Max(Selector("test_cause_gauge"), by=NODE), "ratio"),),
                 fleet=FleetFault(("chat",), 1, 5), proof=Proof(lambda k: None, "a cause"))
    slow = _sessions(2.0, extra=_cause_metric)
    assert "throwaway-cause" not in OtherFindings().promql()
    with CATALOG.registered(cause, rank=1000):
        assert 'throwaway-cause' in OtherFindings().promql()
        assert set(_found(slow)) == {"throwaway-cause"}
    assert set(_found(_sessions(2.0, extra=_cause_metric))) == {"unexplained-harm"}


def test_an_info_finding_explains_nothing():
    """An old crash (info) is not why sessions are slow now: the harm still shows."""
    info = Rule(id="throwaway-info", severity="info", symptom="s", cause="c", action="a",
                summary="old news", condition=Max(Selector("test_cause_gauge"), by=NODE) > 1,
                evidence=(), views=(), fleet=None)
    with CATALOG.registered(info, rank=1000):
        found = _found(_sessions(2.0, extra=_cause_metric))
    assert set(found) == {"throwaway-info", "unexplained-harm"}


def test_harm_is_judged_on_the_signals_a_node_has():
    """No agent runtime: the harm rule still judges the pools' run delay (no signal absent
    makes the others unjudged), and a pool waiting for a CPU is harm."""
    series = Series()
    for step in range(STEPS):
        at_ms = 1_700_000_000_000 + step * 1000
        labels = {"pool": "chat-online", "class": "online"}
        series.add("fleetscope_pool_run_delay_seconds_total", labels, at_ms, 0.3 * step)
        series.add("fleetscope_pool_processes", labels, at_ms, 2)
        _targets(series, {}, at_ms)
    findings, not_evaluated = evaluate(series, "node-1")
    assert "unexplained-harm" not in {n["rule"] for n in not_evaluated}
    harm = next(f for f in findings if f.rule.id == "unexplained-harm")
    assert harm.to_json()["evidence"][0]["signal"] == "online processes' wait for a CPU"


def test_the_exported_harm_alert_excludes_every_other_rules_alert():
    text = CATALOG[-1].condition.promql() if CATALOG[-1].id == "unexplained-harm" else ""
    assert text.startswith("(") and " unless on (instance) ALERTS{" in text
    assert 'alertstate="firing"' in text and 'severity=~"warning|critical"' in text
    ids = text.split('fleetscope_rule=~"')[1].split('"')[0].split("|")
    assert set(ids) == set(CATALOG.ids()) - {"unexplained-harm"}
    assert HARM.promql() in text


@pytest.mark.parametrize("targets, message", [
    ({"harm_targets": [1]}, "harm_targets must be a mapping"),
    ({"harm_targets": {"p99": 1}}, "harm_targets has unknown keys: p99 (known: "),
    ({"harm_targets": {"online_session_p99_seconds": 0}},
     "harm_targets.online_session_p99_seconds must be a number above 0"),
    ({"harm_targets": {"tool_error_ratio": "5%"}}, "harm_targets.tool_error_ratio must be"),
    ({"harm_targets": {"pools": ["chat"]}}, "harm_targets.pools must map pool names"),
    ({"harm_targets": {"pools": {"chat": {"online_session_p99_seconds": True}}}},
     "harm_targets.pools.chat.online_session_p99_seconds must be a number"),
])
def test_bad_harm_targets_are_one_clear_line(targets, message):
    with pytest.raises(ConfigError) as raised:
        parse_config(targets)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_a_bad_harm_target_stops_diagnose_with_exit_3_and_one_line(tmp_path):
    config = tmp_path / "node.yaml"
    config.write_text("harm_targets: {online_session_p99_seconds: -1}\n")
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--config",
                             str(config), "--seconds", "1"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "harm_targets.online_session_p99_seconds" in lines[0]


def test_a_query_engine_without_alerts_still_lets_a_cause_explain_the_harm():
    """diagnose --prometheus on a Prometheus that does not evaluate the exported rules has
    no ALERTS: the harm finding on a node with a cause finding is dropped afterwards."""
    from fleetscope.diagnose.engine import Finding, drop_explained
    from fleetscope.rules.catalog import by_id

    harm, cause, old = by_id("unexplained-harm"), by_id("slow-dependency"), by_id("isa-mismatch")
    findings = [Finding(harm, "a:9105", {"instance": "a:9105"}, 2.0, 0.5),
                Finding(cause, "a:9105", {"instance": "a:9105"}, 0.9, 0.7),
                Finding(harm, "b:9105", {"instance": "b:9105"}, 2.0, 0.5),
                Finding(old, "b:9105", {"instance": "b:9105"}, 1.0, 0.9, severity="info")]
    kept = [(f.rule.id, f.node) for f in drop_explained(findings)]
    assert kept == [("slow-dependency", "a:9105"), ("unexplained-harm", "b:9105"),
                    ("isa-mismatch", "b:9105")]


def test_a_long_condition_filtered_to_many_nodes_stays_under_the_query_limit():
    """Reproduced on VictoriaMetrics: unexplained-harm's condition with 64 nodes' instance
    filter in each of its selectors was 42 KB, over its 16 KiB -search.maxQueryLen (HTTP
    422). The nodes are split into smaller chunks instead; every node is still asked for."""
    from fleetscope.diagnose.remote import MAX_QUERY_CHARS, node_filtered
    from fleetscope.rules.catalog import by_id

    condition = by_id("unexplained-harm").condition
    nodes = [f"agentnode{i:05d}rack{i // 32:03d}:9105" for i in range(200)]
    queries = [q.promql() for q in node_filtered(condition, nodes)]
    assert len(queries) > 1 and all(len(q) <= MAX_QUERY_CHARS for q in queries)
    assert all(sum(f"{node}|" in q or f'{node}"' in q for q in queries) == 1 for node in nodes)
    short = by_id("fd-exhaustion").condition
    assert len(node_filtered(short, nodes)) == 1


@pytest.mark.parametrize("waiting", [3.0, 0.0])
def test_threads_taking_turns_on_a_lock_are_named_as_a_lead_of_the_harm(waiting):
    """A hurting pool whose threads keep waking in futex waits (collector pools): the
    unexplained-harm finding names them among the strongest deviations, and not when none
    wait. A lead, never a cause: the harm stays unexplained."""
    from types import SimpleNamespace

    def lock_waits(series: Series, at_ms: int, step: int) -> None:
        series.add("fleetscope_pool_lock_wait_threads",
                   {"pool": "chat-online", "class": "online"}, at_ms, waiting)

    series = _sessions(2.0, extra=lock_waits)
    findings, _ = evaluate(series, "node-1")
    assert [f.rule.id for f in findings] == ["unexplained-harm"]
    harm = findings[0]
    harm.rule.enrich(SimpleNamespace(series=series), harm)
    lead = "3.0 threads of pool chat-online taking turns in futex waits"
    assert (lead in harm.extra_summary) == (waiting > 0), harm.extra_summary


def test_evidence_of_many_firing_nodes_stays_under_the_query_limit():
    """Reproduced on VictoriaMetrics: accelerator-driver-mismatch firing on 37 nodes asked for
    its harm evidence (every selector filtered to the nodes) in one 27 KB query, HTTP 422.
    Evidence is split like the conditions; every firing node is still asked for, once per
    evidence expression."""
    from concurrent.futures import ThreadPoolExecutor

    from fleetscope.diagnose import remote
    from fleetscope.diagnose.engine import Finding
    from fleetscope.rules.catalog import CATALOG

    rule = max(CATALOG, key=lambda r: max(len(e.expr.promql()) for e in r.evidence))
    nodes = [f"agentnode{i:05d}rack{i // 32:03d}:9105" for i in range(200)]
    asked: list[str] = []

    class Client:
        def query(self, promql, at, tag=""):
            asked.append(promql)
            return []

    candidates = [remote._Candidate(Finding(rule, node, {"instance": node}, 1.0, 0.5), 0)
                  for node in nodes]
    with ThreadPoolExecutor(max_workers=2) as pool:
        remote._fetch_evidence(Client(), pool, candidates, {})
    assert asked and all(len(q) <= remote.MAX_QUERY_CHARS for q in asked)
    assert len(asked) > len(rule.evidence)  # split
    for node in nodes:
        assert sum(f"{node}|" in q or f'{node}"' in q for q in asked) == len(rule.evidence)
