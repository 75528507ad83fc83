"""Harm: what a pool shows when its users hurt, whatever the cause, and which findings explain it.

    HARM_SIGNALS   one HarmSignal per kind of hurt: its value per pool and the config target
                   it is judged against (fleetscope_harm_target{signal}, a pool's own first)
    POOL_HARM      `a > target or b > target or ...` by (instance, pool): the pools that hurt
    HARM           the same per node (the worst pool)
    explaining(scope)   ALERTS of the rules whose findings explain a pool's harm: those about
                   the pool (Rule.explains "pool", matched `on (instance, pool)`) and those
                   about the whole node ("node", matched `on (instance)`), ongoing, at warning
                   or worse; `unexplained()` takes both away, so "harm that no rule explains"
                   is one PromQL expression per pool

Online pools are judged against the node's targets by default; a pool the config names
offline only against targets the operator gives it (harm_targets.pools): a batch pool held at
its cpu.max is what its limit is for, not harm. A signal whose metrics a node lacks (no agent
runtime, no cgroup CPU limit) is left out of the `or`, never a reason the rest goes unjudged
(Rule.alternatives).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetscope.agent_runtime.schema import STAGES
from fleetscope.core.harm_targets import BY_KEY

from .model import EXPLAINS_NODE, EXPLAINS_POOL, NODE, ONGOING, WINDOW
from .promql import (
    Arith,
    AvgOverTime,
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


# Pools the node's config names offline (collector pools): judged against their own targets only.
OFFLINE_POOLS = Max(Selector("fleetscope_pool_processes", {"class": "offline"}), by=BY_POOL)


def over_target(value: Expr, key: str) -> Expr:
    """A pool's value over the pool's own target, else (a pool not configured offline) over
    the node's: `v > on (instance, pool) pool_target or (v unless on (instance, pool)
    pool_target unless on (instance, pool) offline pools) > on (instance) group_left target`."""
    own = Compare(">", value, pool_target(key), on=BY_POOL)
    rest = Compare(">", value.unless(pool_target(key), BY_POOL).unless(OFFLINE_POOLS, BY_POOL),
                   target(key), on=NODE, group_left=True)
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
    name: str  # the signal's id (the diagnosis JSON's harm[].signal)
    value: Expr  # per pool (a queue: its pool's worst)
    unit: str
    key: str = ""  # its target in fleetscope/core/harm_targets.py, if not its name
    what: str = ""  # how a person reads it, if not the target's words

    @property
    def target_key(self) -> str:
        return self.key or self.name

    @property
    def title(self) -> str:
        return self.what or BY_KEY[self.target_key].what

    @property
    def default(self) -> float:
        return BY_KEY[self.target_key].default

    @property
    def normal(self) -> float:
        return BY_KEY[self.target_key].normal

    def pool_harm(self) -> Expr:
        """The pools over their target, by (instance, pool), with the signal's value."""
        return over_target(self.value, self.target_key)

    def harm(self) -> Expr:
        """The node, where one of its pools is over its target (the worst pool's value)."""
        return Max(self.pool_harm(), by=NODE)


def _mean_over_window(name: str) -> Expr:
    """A pool gauge's mean over the window, summed over its other labels: a state that held,
    not one unlucky scrape."""
    return Sum(AvgOverTime(Selector(name), WINDOW), by=BY_POOL)


_SESSIONS_ENDED = Selector("agent_sessions_total", {"class": "online"})
_SESSIONS_FAILED = Selector("agent_sessions_total", {"class": "online",
                                                     "outcome": "~error|timeout"})

HARM_SIGNALS = (
    HarmSignal("online_session_p99_seconds", SESSION_P99, "s"),
    # Sessions that never finish never reach the duration histogram: the oldest one still in
    # flight, from its arrival, against the same target.
    HarmSignal("online_session_in_flight_seconds",
               Max(Selector("agent_session_oldest_in_flight_seconds", {"class": "online"}),
                   by=BY_POOL), "s", key="online_session_p99_seconds",
               what="oldest online session in flight"),
    # Sessions that fail are harm whatever their duration (a state store refusing writes).
    HarmSignal("online_session_error_ratio", Sum(Rate(_SESSIONS_FAILED, WINDOW), by=BY_POOL)
               / Sum(Rate(_SESSIONS_ENDED, WINDOW), by=BY_POOL), "ratio"),
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
    # From the kernel alone, no runtime needed: requests that arrived and wait (connections
    # not yet accepted, or received bytes nobody reads), and connections whose packets go
    # unanswered (a connect() in SYN retries, a peer that stopped acknowledging).
    HarmSignal("pool_connections_waiting",
               _mean_over_window("fleetscope_pool_connections_waiting"), "connections"),
    HarmSignal("pool_connections_retransmitting",
               _mean_over_window("fleetscope_pool_connections_retransmitting"), "connections"),
)
BY_NAME = {signal.name: signal for signal in HARM_SIGNALS}


# Each signal's pools over target: built once, so a pass evaluating the harm after the rules
# reads the vectors unexplained-harm's condition already computed (Series.memoized).
POOL_HARMS = tuple(signal.pool_harm() for signal in HARM_SIGNALS)


def pool_harm() -> Expr:
    """The pools hurting on any harm signal, by (instance, pool) (the first that holds gives
    the value)."""
    condition = POOL_HARMS[0]
    for signal_harm in POOL_HARMS[1:]:
        condition = condition | signal_harm
    return condition


def targets(signal: HarmSignal) -> Expr:
    """Every target a signal has on the nodes: the node's (pool="") and the pools' own."""
    return Max(Selector(TARGET_METRIC, {"signal": signal.target_key}), by=BY_POOL)


def pick_target(vector, signal: HarmSignal, labels: dict[str, str]) -> float:
    """From `targets(signal)`'s vector, the one a pool's signal is judged against: the
    pool's own, else its node's, else the default."""
    node = {k: v for k, v in labels.items() if k in NODE}
    own, nodes = [], []
    for key, value in vector.items():
        found = dict(key)
        if any(found.get(k, v) != v for k, v in node.items()):
            continue
        if found.get("pool", ""):
            if found["pool"] == labels.get("pool"):
                own.append(value)
        else:
            nodes.append(value)
    return own[0] if own else max(nodes, default=signal.default)


def target_at(series, at_ms: int, signal: HarmSignal, labels: dict[str, str]) -> float:
    """The target a pool's signal is judged against at `at_ms` (pick_target)."""
    return pick_target(targets(signal).evaluate(series, at_ms), signal, labels)


def harm() -> Expr:
    """A node hurting on any harm signal (the first that holds gives the value)."""
    condition = HARM_SIGNALS[0].harm()
    for signal in HARM_SIGNALS[1:]:
        condition = condition | signal.harm()
    return condition


POOL_HARM = pool_harm()
HARM = harm()


@dataclass(eq=False)
class ExplainingAlerts(Expr):
    """`ALERTS{alertstate="firing", fleetscope_phase="ongoing", severity=~"warning|critical",
    fleetscope_rule=~"..."}` of the rules whose findings explain harm at `scope` (a pool, or
    the whole node), read from the registry each time: a rule registered later (another
    module, a test) explains too. Rules that read ALERTS themselves explain nothing."""

    scope: str

    def rule_ids(self) -> list[str]:
        from .catalog import CATALOG  # the catalog imports this module's users

        return sorted(rule.id for rule in CATALOG if rule.explains == self.scope
                      and "ALERTS" not in rule.condition.metrics())

    def selector(self) -> Selector:
        # A rule id is kebab-case: "_" matches no alert when no rule has this scope.
        return Selector("ALERTS", {"alertstate": "firing", "fleetscope_phase": ONGOING,
                                   "fleetscope_rule": "~" + "|".join(self.rule_ids() or ["_"]),
                                   "severity": "~warning|critical"})

    def promql(self) -> str:
        return self.selector().promql()

    def _evaluate(self, series, at_ms):
        return self.selector().evaluate(series, at_ms)

    def metrics(self):
        return {"ALERTS"}


EXPLAINED_ON = {EXPLAINS_POOL: BY_POOL, EXPLAINS_NODE: NODE}


def unexplained(condition: Expr) -> Expr:
    """`condition unless on (instance, pool) <an alert about the pool> unless on (instance)
    <an alert about the whole node>`: a pool's harm that no finding explains."""
    for scope, on in EXPLAINED_ON.items():
        condition = condition.unless(ExplainingAlerts(scope), on)
    return condition
