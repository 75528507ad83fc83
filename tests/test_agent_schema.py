"""The agent metric schema (fleetscope/agent_runtime/schema.py, docs/metrics-and-rules.md) is
the one copy: the runtime helpers emit it, and the agent collector, the simulated fleet and the
scenario generator read their names, stages and buckets from it. The generator and the fleet
report healthy sessions unless told otherwise, and the generator plants failed and stuck ones
when asked."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetscope.agent_runtime import schema
from tests.fixture_trees import load_generator

# docs/metrics-and-rules.md, Agent signals, spelled out here on purpose: the schema must match it.
DOCUMENTED = {
    "agent_queue_depth": ("gauge", {"pool", "queue"}),
    "agent_session_duration_seconds": ("histogram", {"pool", "class"}),
    "agent_stage_duration_seconds": ("histogram", {"pool", "stage"}),
    "agent_tool_calls_total": ("counter", {"pool", "tool", "model", "outcome"}),
    "agent_task_heartbeat_age_seconds": ("gauge", {"pool"}),
    "agent_session_migrations_total": ("counter", {"pool"}),
    "agent_module_queue_depth": ("gauge", {"pool", "module"}),
    "agent_sessions_total": ("counter", {"pool", "class", "outcome"}),
    "agent_sessions_in_flight": ("gauge", {"pool", "class"}),
    "agent_session_oldest_in_flight_seconds": ("gauge", {"pool", "class"}),
}


def test_schema_is_the_contract():
    assert {m.name: (m.type, set(m.labels)) for m in schema.METRICS} == DOCUMENTED
    assert schema.STAGES == ("queue_wait", "context_assembly", "inference", "tool_call",
                             "state_io", "model_load", "other")
    assert schema.OUTCOMES == ("ok", "timeout", "bad_arguments", "error")
    assert schema.SESSION_OUTCOMES == ("ok", "error", "timeout")
    assert schema.CLASSES == ("online", "offline")
    for metric in schema.METRICS:
        assert bool(metric.buckets) == (metric.type == "histogram"), metric.name
        assert list(metric.buckets) == sorted(metric.buckets), metric.name


def test_the_simulator_and_the_collector_use_the_schema_not_a_copy():
    from fleetscope.collectors import agent
    from fleetscope.dashboard import fleet_sim

    assert fleet_sim.STAGES is schema.STAGES
    assert fleet_sim.SESSION_BUCKETS is schema.SESSION_BUCKETS
    assert agent.STAGE_FAMILY == schema.STAGE_DURATION.name
    assert agent.QUEUE_FAMILY == schema.QUEUE_DEPTH.name
    assert agent.MODULE_QUEUE_FAMILY == schema.MODULE_QUEUE_DEPTH.name
    assert agent.GENAI_OPERATION == schema.GENAI_OPERATION_DURATION


def test_the_scenario_generator_uses_the_schema_not_a_copy():
    module = load_generator("scenarios", "make_scenarios_probe")
    for name in ("SESSION_BUCKETS", "STAGE_BUCKETS", "GENAI_DURATION_BUCKETS",
                 "GENAI_TOKEN_BUCKETS"):
        assert getattr(module, name) is getattr(schema, name), name
    assert set(module.STAGE_ORDER) <= set(schema.STAGES)


def test_the_runtime_emits_the_schema():
    from fleetscope.agent_signals import AgentSignals

    signals = AgentSignals("chat-online")
    with signals.session():
        for stage in schema.STAGES:
            signals.record_stage(stage, 0.01)
    signals.set_queue_depth("tasks:chat", 3)
    signals.set_module_queue_depth("gpu0", 2)
    signals.record_tool_call("search", "m", "ok", seconds=0.1)
    signals.session_migrated()
    text = signals.exposition().decode()
    signals.shutdown()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for metric in schema.METRICS:
        name = metric.name.removesuffix("_total") if metric.type == "counter" else metric.name
        family = families[name]
        assert (family.type, family.documentation) == (metric.type, metric.help), name
        if metric.buckets:
            bounds = sorted({float(s.labels["le"]) for s in family.samples
                             if s.name.endswith("_bucket")})
            assert bounds == [*map(float, metric.buckets), float("inf")], name


def test_the_schema_loads_no_opentelemetry():
    code = ("import sys, fleetscope.agent_runtime.schema, fleetscope.collectors.agent; "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'opentelemetry']; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _parsed(text: str) -> dict:
    """name{sorted labels} -> value, as the agent collector parses the exposition."""
    from fleetscope.collectors.agent import parse_agent_exposition

    return {f"{name}{sorted(labels.items())}": value
            for family in parse_agent_exposition(text) for name, labels, value in family.samples}


def test_the_scenario_kit_plants_failed_and_stuck_sessions():
    import random

    kit = load_generator("scenarios", "make_scenarios_harm_probe")
    online = [("class", "online"), ("pool", "chat-online")]
    failing = [0.0, 0.0, 0.0, 0.0, 0.2, 0.2, 0.2, 0.2]
    stuck = [0.0, 0.0, 0.0, 12.0, 22.0, 32.0, 42.0, 52.0]
    runs = {}
    for name, plan in (("healthy", kit.AgentPlan()),
                       ("hurt", kit.AgentPlan(session_errors=failing, oldest_in_flight=stuck))):
        texts = kit.agent_samples(plan, "chat-online", random.Random("harm-probe"))
        runs[name] = [_parsed(text) for text in texts]

    def value(sample: dict, name: str, **extra) -> float:
        return sample[f"{name}{sorted([*online, *extra.items()])}"]

    for i, (healthy, hurt) in enumerate(zip(runs["healthy"], runs["hurt"], strict=True)):
        finished = value(healthy, "agent_session_duration_seconds_count")
        assert value(healthy, "agent_sessions_total", outcome="ok") == finished  # all ok
        assert value(healthy, "agent_sessions_total", outcome="error") == 0
        assert value(healthy, "agent_sessions_in_flight") >= 1  # 20 sessions/s keep some busy
        assert 0 < value(healthy, "agent_session_oldest_in_flight_seconds") < 1.0
        assert value(hurt, "agent_session_oldest_in_flight_seconds") == max(
            stuck[i], value(healthy, "agent_session_oldest_in_flight_seconds"))
        assert value(hurt, "agent_sessions_in_flight") >= 1
    # the error share of what finished in the planted intervals, against the counters' deltas
    first, last = runs["hurt"][3], runs["hurt"][7]
    errors = (value(last, "agent_sessions_total", outcome="error")
              - value(first, "agent_sessions_total", outcome="error"))
    finished = (value(last, "agent_session_duration_seconds_count")
                - value(first, "agent_session_duration_seconds_count"))
    assert errors / finished == pytest.approx(0.2, abs=0.005)


def test_the_simulated_fleet_reports_healthy_sessions_where_no_fault_is():
    from fleetscope.dashboard.fleet_sim import DEMO_HARM_TARGETS, Fleet

    fleet = Fleet(nodes=128, cores=16)
    series = fleet.series()
    faulty = {fleet.instances[i] for nodes in fleet.faults.values() for i in nodes}
    oldest = series.by_name["agent_session_oldest_in_flight_seconds"]
    online = 0
    for key, points in oldest.items():
        labels = dict(key)
        if labels["instance"] in faulty or labels["class"] != "online":
            continue
        online += 1
        target = {**DEMO_HARM_TARGETS.node, **DEMO_HARM_TARGETS.pools.get(labels["pool"], {})}
        assert 0 < points[-1][1] < target["online_session_p99_seconds"], labels
    assert online > 10
    for key, points in series.by_name["agent_sessions_total"].items():
        labels = dict(key)
        if labels["instance"] not in faulty and labels["outcome"] != "ok":
            assert points[-1][1] == points[0][1] == 0, labels  # no session fails
