"""Harm: what a node shows when its workloads hurt, whatever the cause.

    HARM_SIGNALS   one HarmSignal per kind of hurt: its value per node (the worst pool) and
                   the config target it is judged against (fleetscope_harm_target{signal})
    HARM           `a > target or b > target or ...`: a node hurting on any of them
    OtherFindings  ALERTS of every other registered rule at warning or worse: what `unless`
                   takes away, so "harm that no rule explains" is one PromQL expression

The list is data: a signal whose metrics a node lacks (no agent runtime, no cgroup CPU limit)
is left out of the `or`, never a reason the rest goes unjudged (Rule.alternatives).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetscope.agent_runtime.schema import STAGES
from fleetscope.core.harm_targets import BY_KEY

from .model import NODE, WINDOW
from .promql import (
    Arith,
    Compare,
    Delta,
    Expr,
    HistogramQuantile,
    Max,
    Rate,
    Selector,
    Sum,
)
from .signals import online_delay

TARGET_METRIC = "fleetscope_harm_target"
BY_POOL = (*NODE, "pool")
# Stages a session's own time is spent in (model_load happens at start, outside sessions).
SESSION_STAGES = tuple(stage for stage in STAGES if stage != "model_load")


def target(key: str) -> Expr:
    """The node's target for a harm signal (collector `harm`, from the config)."""
    return Max(Selector(TARGET_METRIC, {"pool": "", "signal": key}), by=NODE)


def pool_target(key: str) -> Expr:
    """The targets pools set for themselves (config harm_targets.pools)."""
    return Max(Selector(TARGET_METRIC, {"pool": "~.+", "signal": key}), by=BY_POOL)


def over_target(value: Expr, key: str) -> Expr:
    """A pool's value over the pool's own target, else over the node's:
    `v > on (instance, pool) pool_target or (v unless on (instance, pool) pool_target)
    > on (instance) group_left target`."""
    own = Compare(">", value, pool_target(key), on=BY_POOL)
    rest = Compare(">", value.unless(pool_target(key), BY_POOL), target(key), on=NODE,
                   group_left=True)
    return own | rest


def _online(name: str, by: tuple[str, ...] = BY_POOL) -> Expr:
    return Sum(Rate(Selector(name, {"class": "online"}), WINDOW), by=by)


# Online sessions' P99 per pool (the console's latency tile reads the same per node).
SESSION_P99 = HistogramQuantile(0.99, _online("agent_session_duration_seconds_bucket",
                                              (*BY_POOL, "le")))
SESSIONS = _online("agent_session_duration_seconds_count")
SESSION_SECONDS = _online("agent_session_duration_seconds_sum")


def stage_seconds(stages: tuple[str, ...], by: tuple[str, ...] = (*BY_POOL, "stage")) -> Expr:
    return Sum(Rate(Selector("agent_stage_duration_seconds_sum",
                             {"stage": "~" + "|".join(stages)}), WINDOW), by=by)


def per_session(value: Expr) -> Expr:
    """A pool's seconds per second (per stage) over its online sessions per second."""
    return Arith("/", value, SESSIONS, on=BY_POOL, group_left=True)


# Session time per session that no stage accounts for (an uninstrumented step).
UNACCOUNTED = (SESSION_SECONDS - stage_seconds(SESSION_STAGES, BY_POOL)) / SESSIONS
STAGE_PER_SESSION = per_session(stage_seconds(SESSION_STAGES))

_TOOL_CALLS = Selector("agent_tool_calls_total")
_TOOL_ERRORS = Selector("agent_tool_calls_total", {"outcome": "~timeout|bad_arguments|error"})
_QUEUE = (*BY_POOL, "queue")
_THROTTLED = (Sum(Rate(Selector("fleetscope_pool_cgroup_cpu_throttled_periods_total"), WINDOW),
                  by=BY_POOL)
              / Sum(Rate(Selector("fleetscope_pool_cgroup_cpu_periods_total"), WINDOW),
                    by=BY_POOL))


@dataclass(frozen=True)
class HarmSignal:
    key: str  # its target in fleetscope/core/harm_targets.py
    value: Expr  # per pool (a queue: its pool's worst)
    unit: str

    @property
    def title(self) -> str:
        return BY_KEY[self.key].what

    @property
    def default(self) -> float:
        return BY_KEY[self.key].default

    @property
    def normal(self) -> float:
        return BY_KEY[self.key].normal

    def harm(self) -> Expr:
        """The node, where one of its pools is over its target (the worst pool's value)."""
        return Max(over_target(self.value, self.key), by=NODE)


HARM_SIGNALS = (
    HarmSignal("online_session_p99_seconds", SESSION_P99, "s"),
    HarmSignal("tool_error_ratio", Sum(Rate(_TOOL_ERRORS, WINDOW), by=BY_POOL)
               / Sum(Rate(_TOOL_CALLS, WINDOW), by=BY_POOL), "ratio"),
    HarmSignal("online_run_delay_ratio", online_delay(BY_POOL), "s/s"),
    HarmSignal("pool_throttled_ratio", _THROTTLED, "ratio"),
    # Tasks waiting: a queue over its target that still grows.
    HarmSignal("queue_depth_tasks", Max(Max(Selector("agent_queue_depth"), by=_QUEUE).and_on(
        Max(Delta(Selector("agent_queue_depth"), WINDOW), by=_QUEUE) > 0, _QUEUE), by=BY_POOL),
        "tasks"),
    # Processes dying: an online pool's processes replaced by new ones (a worker that exits,
    # is killed or aborts, restarted by its supervisor), whatever killed it.
    HarmSignal("online_process_starts_per_minute",
               Sum(Rate(Selector("fleetscope_pool_process_starts_total", {"class": "online"}),
                        WINDOW), by=BY_POOL) * 60, "1/min"),
)


def harm() -> Expr:
    """A node hurting on any harm signal (the first that holds gives the value)."""
    condition = HARM_SIGNALS[0].harm()
    for signal in HARM_SIGNALS[1:]:
        condition = condition | signal.harm()
    return condition


HARM = harm()


@dataclass(eq=False)
class OtherFindings(Expr):
    """`ALERTS{alertstate="firing", severity=~"warning|critical", fleetscope_rule=~"..."}`
    of every registered rule but those that read ALERTS themselves, read from the registry
    each time: a rule registered later (another module, a test) is a cause too."""

    def selector(self) -> Selector:
        from .catalog import CATALOG  # the catalog imports this module's users

        ids = [rule.id for rule in CATALOG if "ALERTS" not in rule.condition.metrics()]
        return Selector("ALERTS", {"alertstate": "firing",
                                   "fleetscope_rule": "~" + "|".join(sorted(ids)),
                                   "severity": "~warning|critical"})

    def promql(self) -> str:
        return self.selector().promql()

    def _evaluate(self, series, at_ms):
        return self.selector().evaluate(series, at_ms)

    def metrics(self):
        return {"ALERTS"}


def unexplained(condition: Expr) -> Expr:
    """`condition unless on (instance) <any other rule's alert on the node>`."""
    return condition.unless(OtherFindings(), NODE)
