"""slow-dependency: sessions are slow because a dependency answers slowly, not the node.

Condition: a pool's online sessions over the node's P99 target (harm_targets), with most of
their time (over half) in one dependency stage (tool_call: a tool or API; state_io: Redis or
the state store), `unless` the pool's threads waited for a CPU half as long as the stage
took (then the node, not the dependency, is slow: offline-preemption, cpu-saturation; a busy
node beside a slow tool is both) or its tool calls time out (a
dependency that hangs: worker-blocked-external-call). Enrichment: the tools the pool
calls (agent_tool_calls_total) with their outcomes, or the state store's address.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..fleet import Add, FleetFault
from ..harm import BY_POOL, SESSION_P99, SESSION_SECONDS, over_target, per_session, stage_seconds
from ..model import EXPLAINS_POOL, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Arith, Compare, Rate, Selector, Sum
from ..signals import ONLINE_RUN_DELAY, online_delay

RANK = 21
DEPENDENCY_STAGES = ("tool_call", "state_io")
# Share of session time in one dependency stage: the field notes put inference at 30-40 %
# of end-to-end time and spread the rest over queueing, messaging, state sync and tools.
STAGE_SHARE = 0.5
MAX_TOOLS = 3

_BY_STAGE = (*BY_POOL, "stage")
_SHARE = Arith("/", stage_seconds(DEPENDENCY_STAGES), SESSION_SECONDS, on=BY_POOL,
               group_left=True)
_PER_SESSION = per_session(stage_seconds(DEPENDENCY_STAGES))
_SLOW = over_target(SESSION_P99, "online_session_p99_seconds")
# CPU wait of all the pool's threads per session: when it is a good part of the stage's
# time, the stage is slow because the node is (a CPU-bound tool, a saturated node).
_CPU_WAIT = per_session(Sum(Rate(Selector("fleetscope_pool_thread_run_delay_seconds_total",
                                          {"class": "online"}), WINDOW), by=BY_POOL))
CPU_WAIT_SHARE = 0.5  # of the stage's time per session
_CPU_BOUND = Compare("<", CPU_WAIT_SHARE * _PER_SESSION, _CPU_WAIT, on=BY_POOL, group_left=True)
# Calls that do not answer at all (timeouts) are a dependency that hangs, the warning and
# critical tiers of worker-blocked-external-call; this rule is about slow answers.
TIMEOUT_SHARE = 0.05
_TIMEOUTS = (Sum(Rate(Selector("agent_tool_calls_total", {"outcome": "timeout"}), WINDOW),
                 by=BY_POOL)
             / Sum(Rate(Selector("agent_tool_calls_total"), WINDOW), by=BY_POOL))
_TOOLS = Sum(Rate(Selector("agent_tool_calls_total"), WINDOW), by=(*BY_POOL, "tool", "outcome"))


def enrich(ctx, finding) -> None:
    """The tools the pool called over the window, with the share that was not ok (tool_call),
    or the state store the config names (state_io)."""
    stage = finding.labels.get("stage")
    if stage == "state_io":
        if ctx.config.redis_url:
            where = urlsplit(ctx.config.redis_url)
            finding.extra_summary = f"state store {where.hostname}:{where.port or 6379}"
        return
    series = ctx.series
    stamps = series.timestamps() if series is not None else []
    if not stamps:
        return
    calls: dict[str, dict[str, float]] = {}
    for labels, rate in _TOOLS.evaluate(series, stamps[-1]).items():
        labels = dict(labels)
        if labels.get("pool") != finding.labels.get("pool") or not rate > 0:
            continue
        calls.setdefault(labels.get("tool", "?"), {})[labels.get("outcome", "?")] = rate
    ranked = sorted(calls.items(), key=lambda item: -sum(item[1].values()))
    described = []
    for tool, outcomes in ranked[:MAX_TOOLS]:
        total = sum(outcomes.values())
        failing = 1 - outcomes.get("ok", 0.0) / total
        described.append(f"{tool} ({total:.2g} calls/s, {failing:.0%} not ok)")
    if described:
        finding.extra_summary = "tools called: " + ", ".join(described)


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "slow-dependency", "agent-x86-11",
        "the search API the agents call as a tool degraded: every call still answers "
        "correctly, after ~1.1 s instead of 90 ms",
        "tool_call stage ~1.1 s a call, sessions' median 2.2 s (P99 over 5 s); the workers "
        "mostly wait on sockets, CPUs ~25 % busy, no run-queue delay, tool calls all ok",
        uptime_days=6.4, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 0.5),
        background=k.background(k.X86, 0.25, 0.02),
        agent=k.AgentPlan(sessions=8.0, session_median=2.2, session_sigma=0.3,
                          tool_median=1.1, timeouts=0.0, errors=0.0,
                          tools={"web_search": 1.0}))


RULE = Rule(
    id="slow-dependency",
    severity="warning",
    explains=EXPLAINS_POOL,  # its sessions' tool or state calls
    symptom="sessions slow while the node is idle",
    cause="a dependency the sessions wait on (a tool or API, the state store) answers slowly",
    action="look at the named tool's or store's own latency and its recent changes; give the "
           "call a timeout below the session target and a circuit breaker; cache or hedge "
           "the call; more CPU on this node will not help",
    summary="pool {pool}: sessions slow, {value:.0%} of their time in stage {stage}",
    condition=(_SHARE > STAGE_SHARE).and_on(_SLOW, BY_POOL).unless(_CPU_BOUND, _BY_STAGE)
    .unless(_TIMEOUTS > TIMEOUT_SHARE, BY_POOL),
    evidence=(
        Evidence("share of session time in the stage", _SHARE, STAGE_SHARE, "ratio"),
        Evidence("online sessions' P99", SESSION_P99, 1.0, "s"),
        Evidence("time in the stage per session", _PER_SESSION, 0, "s"),
        Evidence("the pool's threads' wait for a CPU per session", _CPU_WAIT, 0, "s",
                 pick="min"),
        Evidence("online processes' wait for a CPU", online_delay(BY_POOL), ONLINE_RUN_DELAY,
                 "s/s", pick="min"),
    ),
    confidence=0.7,
    subject_labels={},
    enrich=enrich,
    views=(
        Panel("Share of session time per dependency stage", _SHARE, "ratio", STAGE_SHARE),
        Panel("Online sessions' P99 per pool", SESSION_P99, "s", 1.0),
        Panel("Online processes' wait for a CPU", online_delay(BY_POOL), "s/s",
              ONLINE_RUN_DELAY, pick="min"),
    ),
    fleet=FleetFault(("chat",), 6, 25, effects=(
        Add("tool_call_stretch", 12),
    )),
    proof=Proof(scenario, summary=r"pool chat-online: sessions slow, \d+% of their time in "
                                  r"stage tool_call; tools called: web_search"),
)
