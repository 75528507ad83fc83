"""The agent metric schema (docs/metrics-and-rules.md, Agent signals): names, label values
and histogram buckets.

    # TYPE agent_stage_duration_seconds histogram
    agent_stage_duration_seconds_bucket{pool="chat-online",stage="inference",le="0.5"} 41
    agent_tool_calls_total{model="qwen2.5-7b",outcome="ok",pool="chat-online",tool="search"} 9
    agent_sessions_total{class="online",outcome="error",pool="chat-online"} 3.0
    agent_session_oldest_in_flight_seconds{class="online",pool="chat-online"} 0.412

One place for what the agent runtime emits and every reader expects: the runtime helpers
(signals.py) create their instruments from it, the exporter's `agent` collector, the
simulated fleet (dashboard/fleet_sim.py) and the scenario generator
(tests/fixtures/make_scenarios.py) import it. Standard library only, no OpenTelemetry: the
node side imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

STAGES = ("queue_wait", "context_assembly", "inference", "tool_call", "state_io", "model_load",
          "other")
OUTCOMES = ("ok", "timeout", "bad_arguments", "error")
# How a whole session ended: answered, failed (it raised, or the runtime marked it failed), or
# failed on a timeout. What a user feels, where tool-call outcomes are what a model did.
SESSION_OUTCOMES = ("ok", "error", "timeout")
CLASSES = ("online", "offline")

# Seconds. Sessions of online agents last from tens of milliseconds to minutes; stages from
# a millisecond (state I/O) to minutes (a cold model load).
SESSION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                 60, 120, 300)
# Advised by the GenAI semantic conventions (gen-ai-metrics.md).
GENAI_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                          20.48, 40.96, 81.92)
GENAI_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                       16777216, 67108864)


@dataclass(frozen=True)
class Metric:
    """One agent signal: its Prometheus name, type, labels (besides `le`), OpenTelemetry unit
    and description (the HELP text), and its bucket bounds if it is a histogram."""

    name: str
    type: str  # gauge, counter or histogram
    labels: tuple[str, ...]
    unit: str
    help: str
    buckets: tuple[float, ...] = ()


QUEUE_DEPTH = Metric("agent_queue_depth", "gauge", ("pool", "queue"), "{task}",
                     "Tasks waiting in a queue of this pool.")
# Beside it, issue 26: requests waiting on the inference module's side (the serving engine's
# waiting queue, e.g. vLLM's num_requests_waiting), per module the pool sends work to.
MODULE_QUEUE_DEPTH = Metric("agent_module_queue_depth", "gauge", ("pool", "module"), "{request}",
                            "Requests waiting on the inference module's side.")
SESSION_DURATION = Metric("agent_session_duration_seconds", "histogram", ("pool", "class"), "s",
                          "Duration of agent sessions, by workload class.", SESSION_BUCKETS)
STAGE_DURATION = Metric("agent_stage_duration_seconds", "histogram", ("pool", "stage"), "s",
                        "Time agent sessions spend in each stage.", STAGE_BUCKETS)
TOOL_CALLS = Metric("agent_tool_calls_total", "counter", ("pool", "tool", "model", "outcome"),
                    "{call}", "Tool calls by tool, model and outcome.")
HEARTBEAT_AGE = Metric("agent_task_heartbeat_age_seconds", "gauge", ("pool",), "s",
                       "Age of the oldest heartbeat among in-flight tasks (0: none in flight).")
SESSION_MIGRATIONS = Metric("agent_session_migrations_total", "counter", ("pool",),
                            "{session}", "Sessions that arrived here from another worker or node.")
# Beside them, issue 35: the harm a user feels that no latency histogram holds. A session that
# fails still counts in the duration histogram, but only its outcome says it failed; a session
# that never finishes never reaches the histogram at all, only the in-flight gauges show it.
# Both gauges count from the session's arrival (the proxy's X-Request-Start, else its start).
SESSIONS = Metric("agent_sessions_total", "counter", ("pool", "class", "outcome"), "{session}",
                  "Agent sessions finished, by workload class and outcome.")
SESSIONS_IN_FLIGHT = Metric("agent_sessions_in_flight", "gauge", ("pool", "class"), "{session}",
                            "Agent sessions arrived and not finished.")
OLDEST_IN_FLIGHT = Metric("agent_session_oldest_in_flight_seconds", "gauge", ("pool", "class"),
                          "s", "Age since arrival of the oldest session still in flight "
                               "(0: none in flight).")
METRICS = (QUEUE_DEPTH, SESSION_DURATION, STAGE_DURATION, TOOL_CALLS, HEARTBEAT_AGE,
           SESSION_MIGRATIONS, MODULE_QUEUE_DEPTH, SESSIONS, SESSIONS_IN_FLIGHT, OLDEST_IN_FLIGHT)

# OpenTelemetry GenAI conventions: the instrument names the runtime records, and the
# Prometheus names they are exported under (dots become underscores, the unit a suffix).
GENAI_OPERATION = "gen_ai.client.operation.duration"
GENAI_OPERATION_DURATION = "gen_ai_client_operation_duration_seconds"
GENAI_TOKENS = "gen_ai.client.token.usage"
GENAI_TOOL_DURATION = "gen_ai_execute_tool_duration_seconds"  # a draft: read, never emitted
