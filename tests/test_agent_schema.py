"""The agent metric schema (fleetscope/agent_runtime/schema.py, docs/metrics-and-rules.md) is
the one copy: the runtime helpers emit it, and the agent collector, the simulated fleet and the
scenario generator read their names, stages and buckets from it."""

from __future__ import annotations

import subprocess
import sys

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
