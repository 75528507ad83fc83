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
from fleetscope.rules.harm import POOL_HARM, ExplainingAlerts
from fleetscope.rules.model import EXPLAINS_NODE, EXPLAINS_POOL
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


def _throwaway_cause(explains: str) -> Rule:
    return Rule(id="throwaway-cause", severity="warning", symptom="s", cause="c", action="a",
                summary="a cause", condition=Max(Selector("test_cause_gauge"), by=NODE) > 1,
                evidence=(Evidence("gauge", Max(Selector("test_cause_gauge"), by=NODE), 1,
                                   "ratio"),),
                views=(Panel("gauge", Max(Selector("test_cause_gauge"), by=NODE), "ratio"),),
                fleet=FleetFault(("chat",), 1, 5), proof=Proof(lambda k: None, "a cause"),
                explains=explains)


def test_any_registered_rule_explains_the_harm_one_registered_later_too():
    """The causes are read from the registry: a rule about the whole node registered after
    the harm rule (as a merged branch's module, or a test's throwaway) silences it on the
    node it fires on; a rule that does not say what it is about explains nothing."""
    slow = _sessions(2.0, extra=_cause_metric)
    assert "throwaway-cause" not in ExplainingAlerts(EXPLAINS_NODE).promql()
    with CATALOG.registered(_throwaway_cause(EXPLAINS_NODE), rank=1000):
        assert 'throwaway-cause' in ExplainingAlerts(EXPLAINS_NODE).promql()
        assert set(_found(slow)) == {"throwaway-cause"}
    with CATALOG.registered(_throwaway_cause(""), rank=1000):
        assert set(_found(_sessions(2.0, extra=_cause_metric))) == {"throwaway-cause",
                                                                     "unexplained-harm"}
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


def test_the_exported_harm_alert_excludes_the_alerts_about_its_pool_or_its_node():
    text = CATALOG[-1].condition.promql() if CATALOG[-1].id == "unexplained-harm" else ""
    assert text.startswith("(") and POOL_HARM.promql() in text
    about_pool, about_node = text.split(" unless on (instance, pool) ALERTS{")[1].split(
        " unless on (instance) ALERTS{")
    for alerts in (about_pool, about_node):
        assert 'alertstate="firing"' in alerts and 'severity=~"warning|critical"' in alerts
        assert 'fleetscope_phase="ongoing"' in alerts  # an event that ended explains nothing
    pool_ids = set(about_pool.split('fleetscope_rule=~"')[1].split('"')[0].split("|"))
    node_ids = set(about_node.split('fleetscope_rule=~"')[1].split('"')[0].split("|"))
    assert pool_ids == {r.id for r in CATALOG if r.explains == EXPLAINS_POOL}
    assert node_ids == {r.id for r in CATALOG if r.explains == EXPLAINS_NODE}
    assert pool_ids | node_ids == set(CATALOG.ids()) - {"unexplained-harm"}
    assert {"offline-preemption", "oom-kill", "lock-contention"} <= pool_ids
    assert {"cpu-saturation", "memory-bandwidth-saturation"} <= node_ids


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
    no ALERTS: a pool's harm that a finding about that pool (or its node) explains is
    dropped afterwards; another pool's, or one beside an event that ended, stays."""
    from fleetscope.diagnose.engine import Finding, drop_explained
    from fleetscope.rules.catalog import by_id
    from fleetscope.rules.model import ENDED

    harm, cause = by_id("unexplained-harm"), by_id("slow-dependency")
    old, busy = by_id("isa-mismatch"), by_id("cpu-saturation")

    def at(node: str, pool: str | None = None) -> dict:
        return {"instance": node, **({"pool": pool} if pool else {})}

    findings = [Finding(harm, "a:9105", at("a:9105", "chat"), 2.0, 0.5),
                Finding(cause, "a:9105", at("a:9105", "chat"), 0.9, 0.7),
                Finding(harm, "b:9105", at("b:9105", "chat"), 2.0, 0.5),
                Finding(cause, "b:9105", at("b:9105", "batch"), 0.9, 0.7),
                Finding(harm, "c:9105", at("c:9105", "chat"), 2.0, 0.5),
                Finding(old, "c:9105", at("c:9105"), 1.0, 0.9, severity="warning",
                        phase=ENDED),
                Finding(harm, "d:9105", at("d:9105", "chat"), 2.0, 0.5),
                Finding(busy, "d:9105", at("d:9105"), 1.0, 0.9)]
    kept = [(f.rule.id, f.node) for f in drop_explained(findings)]
    assert kept == [("slow-dependency", "a:9105"), ("unexplained-harm", "b:9105"),
                    ("slow-dependency", "b:9105"), ("unexplained-harm", "c:9105"),
                    ("isa-mismatch", "c:9105"), ("cpu-saturation", "d:9105")]


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
    import re
    from concurrent.futures import ThreadPoolExecutor

    from fleetscope.diagnose import remote, terms
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
    # Batched (diagnose/terms.py): each query holds tagged parts, one evidence expression
    # for one chunk of nodes each.
    tag = re.compile(r', "' + terms.TERM_LABEL + r'", "\d+", "", ""\)(?: or )?')
    parts = [part for q in asked for part in tag.split(q) if part]
    assert len(parts) > len(rule.evidence)  # split
    for node in nodes:
        assert sum(f"{node}|" in p or f'{node}"' in p for p in parts) == len(rule.evidence)


def _pool_gauge(name: str, pool: str, value: float, klass: str = "online"):
    def add(series: Series, at_ms: int, step: int) -> None:
        series.add(name, {"pool": pool, "class": klass}, at_ms, value)
    return add


def _pool_cause(rule_id: str, severity: str = "warning", tiers=()) -> Rule:
    """A rule about a pool: `test_pool_cause` above 1 in that pool."""
    from fleetscope.rules.signals import POOL

    value = Max(Selector("test_pool_cause"), by=POOL)
    return Rule(id=rule_id, severity=severity, symptom="s", cause="c", action="a",
                summary="pool {pool}: a cause", condition=value > 1,
                evidence=(Evidence("gauge", value, 1, "ratio"),), explains=EXPLAINS_POOL,
                tiers=tiers)


def test_a_cause_about_another_pool_leaves_this_pools_harm_unexplained():
    """The batch pool's own trouble does not explain why chat-online's sessions crawl: the
    harm rule fires for chat-online beside it, and the harm names no explanation."""
    from fleetscope.diagnose.engine import assess

    slow = _sessions(2.0, extra=_pool_gauge("test_pool_cause", "batch", 5.0))
    with CATALOG.registered(_pool_cause("throwaway-pool-cause"), rank=1000):
        verdict = assess(slow, "node-1")
        assert [(f.rule.id, f.labels.get("pool")) for f in verdict.findings] == [
            ("unexplained-harm", "chat-online"), ("throwaway-pool-cause", "batch")]
        assert [(h.pool, h.signal.name, h.explained_by) for h in verdict.harm] == [
            ("chat-online", "online_session_p99_seconds", [])]
        # the same cause in the hurting pool explains it, and leads
        here = _sessions(2.0, extra=_pool_gauge("test_pool_cause", "chat-online", 5.0))
        verdict = assess(here, "node-1")
        assert [f.rule.id for f in verdict.findings] == ["throwaway-pool-cause"]
        assert verdict.findings[0].explains == ["chat-online"]
        assert verdict.harm[0].explained_by == ["throwaway-pool-cause"]


def test_an_event_that_ended_explains_nothing_and_ranks_after_the_harm():
    """A critical event of the ended phase (a kill whose cgroup is gone) in the hurting pool
    is history: the harm stays unexplained and leads, the event comes after it."""
    from fleetscope.diagnose.engine import assess
    from fleetscope.rules.model import ENDED, Tier

    from_the_log = Max(Selector("test_old_event"), by=(*NODE, "pool", "class")) > 0
    event = _pool_cause("throwaway-event", "critical",
                        tiers=(Tier("critical", from_the_log, "pool {pool}: it ended", ENDED),))
    old = _sessions(2.0, extra=_pool_gauge("test_old_event", "chat-online", 1.0))
    with CATALOG.registered(event, rank=1000):
        verdict = assess(old, "node-1")
    found = [(f.rule.id, f.severity, f.phase) for f in verdict.findings]
    assert found == [("unexplained-harm", "warning", "ongoing"),
                     ("throwaway-event", "critical", "ended")]
    document = diagnosis("live", ["node-1"], (0.0, 20.0), verdict.findings,
                         verdict.not_evaluated, len(CATALOG), verdict.harm)
    assert document["status"] == "critical"  # the worst severity, as the contract says
    assert document["findings"][0]["rule"] == "unexplained-harm"
    assert document["findings"][1]["phase"] == "ended"


def test_the_harm_section_says_the_pool_signal_target_and_since():
    from fleetscope.diagnose.engine import assess

    series = _sessions(2.0)
    verdict = assess(series, "node-1")
    document = diagnosis("live", ["node-1"], (0.0, 20.0), verdict.findings,
                         verdict.not_evaluated, len(CATALOG), verdict.harm)
    (harm,) = document["harm"]
    first_step = series.timestamps()[0] / 1000
    assert harm["pool"] == "chat-online" and harm["signal"] == "online_session_p99_seconds"
    assert harm["target"] == 1.0 and harm["value"] > 1.0 and harm["explained_by"] == []
    # held from the first step with a rate window behind it to the end
    assert first_step < harm["since"] < first_step + 10


@pytest.mark.parametrize("config, harmed", [
    ({}, False),  # an offline pool at its quota: what its limit is for
    ({"harm_targets": {"pools": {"batch": {"pool_throttled_ratio": 0.5}}}}, True),
])
def test_an_offline_pool_is_judged_only_against_targets_it_is_given(config, harmed):
    """A batch pool throttled in every CFS period while the online pool is fine: no harm by
    default; with a target its operator gave it, harm of that pool."""
    from fleetscope.diagnose.engine import assess

    def throttled(series: Series, at_ms: int, step: int) -> None:
        labels = {"pool": "batch", "class": "offline"}
        series.add("fleetscope_pool_cgroup_cpu_periods_total", labels, at_ms, 10.0 * step)
        series.add("fleetscope_pool_cgroup_cpu_throttled_periods_total", labels, at_ms,
                   10.0 * step)
        series.add("fleetscope_pool_processes", labels, at_ms, 4)

    verdict = assess(_sessions(0.05, config=config, extra=throttled), "node-1")
    assert [(h.pool, h.signal.name) for h in verdict.harm] == (
        [("batch", "pool_throttled_ratio")] if harmed else [])
    serious = [f.rule.id for f in verdict.findings if f.severity != "info"]
    assert serious == (["unexplained-harm"] if harmed else [])
    assert [(f.rule.id, f.severity) for f in verdict.findings if f.severity == "info"] == [
        ("cpu-throttling", "info")]  # it says what the limit does, whoever minds
