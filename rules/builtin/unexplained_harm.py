"""unexplained-harm: a pool's users are hurting and no rule of the catalog says why.

Condition, per pool: any harm signal over the pool's target (rules/harm.py: online sessions'
P99, sessions failing or stuck in flight, tool calls failing, online processes waiting for a
CPU, cgroups throttled, a growing queue, online processes replaced as they die, connections
waiting or retransmitting), `unless on (instance, pool)` an ongoing alert at warning or worse
of a rule about that pool, `unless on (instance)` one about the whole node (Rule.explains). An
alert about another pool, or an event that ended, explains nothing here. Evaluated after every
other rule (in Prometheus: last in the group; the engine adds the other findings as ALERTS);
its `for:` outlasts theirs, so a cause still pending never leaves it firing. Never `ok` while
a pool hurts: this finding is what a blind spot of the catalog looks like. Enrichment: the
harm, and the signals that moved furthest from their normal (where session time goes, stage
by stage, and time no stage accounts for).
"""

from __future__ import annotations

import math
from dataclasses import replace

from fleetscope.core import units

from ..fleet import Add, FleetFault
from ..harm import (
    HARM_SIGNALS,
    POOL_HARM,
    STAGE_PER_SESSION,
    UNACCOUNTED,
    pool_target,
    target,
    unexplained,
)
from ..model import EXPLAINS_NOTHING, NODE, ONGOING, WINDOW, Case, Evidence, Panel, Proof, Rule
from ..promql import AvgOverTime, Max, Selector
from ..signals import PSI_CPU, busy_ratio

RANK = 99  # last: it is about the others
MAX_DEVIATIONS = 3
_STAGE_PER_SESSION = Max(STAGE_PER_SESSION, by=NODE)
_UNACCOUNTED = Max(UNACCOUNTED, by=NODE)
# Threads of a pool taking turns in futex waits (collector pools): a lead, never a cause alone
# (the kernel cannot tell a lock from a wait for work).
_LOCK_WAITS = Max(AvgOverTime(Selector("fleetscope_pool_lock_wait_threads"), WINDOW),
                  by=(*NODE, "pool"))
LOCK_WAITS_NOTED = 1.0  # threads on average over the window


def _at_last(ctx, finding, expr) -> list[tuple[dict, float]]:
    """expr at the window's last sample on the finding's node and pool: (labels, value), no
    NaN."""
    series = ctx.series
    stamps = series.timestamps() if series is not None else []
    if not stamps:
        return []
    node = {k: v for k, v in finding.labels.items() if k in (*NODE, "pool")}
    out = []
    for labels, value in expr.evaluate(series, stamps[-1]).items():
        labels = dict(labels)
        if not math.isnan(value) and all(labels.get(k, v) == v for k, v in node.items()):
            out.append((labels, value))
    return out


def _harm(ctx, finding, signal) -> tuple[float, float, str] | None:
    """(value, target, pool) of the pool furthest over (or nearest to) its target."""
    node_goal = max((v for _, v in _at_last(ctx, finding, target(signal.target_key))),
                    default=signal.default)
    own = {labels.get("pool"): v for labels, v in _at_last(ctx, finding,
                                                             pool_target(signal.target_key))}
    worst = None
    for labels, value in _at_last(ctx, finding, signal.value):
        pool = labels.get("pool", "")
        goal = own.get(pool, node_goal)
        if worst is None or value / goal > worst[0] / worst[1]:
            worst = (value, goal, pool)
    return worst


def enrich(ctx, finding) -> None:
    """Names the harm against the node's own targets, then the strongest deviations: the
    other harm signals furthest over their normal and where session time went."""
    harmed, moved = [], []
    for signal in HARM_SIGNALS:
        worst = _harm(ctx, finding, signal)
        if worst is None:
            continue
        value, goal, pool = worst
        for item in finding.evidence:  # the target that applies, not the default
            if item["signal"] == signal.title:
                item["threshold"] = goal
        text = (f"{signal.title} {units.format_value(value, signal.unit)}"
                + (f" in pool {pool}" if pool else ""))
        if value > goal:
            harmed.append(f"{text} (target {units.format_value(goal, signal.unit)})")
        elif value > signal.normal:  # moved, short of its target: a lead
            moved.append((value / signal.normal,
                          f"{text} (normal {units.format_value(signal.normal, signal.unit)})"))
    per_stage = {labels.get("stage"): value
                 for labels, value in _at_last(ctx, finding, STAGE_PER_SESSION)}
    unaccounted = max((v for _, v in _at_last(ctx, finding, UNACCOUNTED)), default=0.0)
    if unaccounted > 0:
        per_stage["outside any stage"] = unaccounted
    for labels, value in _at_last(ctx, finding, _LOCK_WAITS):
        if value >= LOCK_WAITS_NOTED:
            moved.append((value / LOCK_WAITS_NOTED,
                          f"{value:.1f} threads of pool {labels.get('pool', '')} taking turns "
                          f"in futex waits (a lock: fleetscope stacks PID shows which)"))
    moved = [text for _, text in sorted(moved, key=lambda item: -item[0])]
    total = sum(v for v in per_stage.values() if v > 0)
    if total > 0:  # where the sessions' time goes leads: it is where to look first
        where, seconds = max(per_stage.items(), key=lambda item: item[1])
        stage = where if where == "outside any stage" else f"in stage {where}"
        moved.insert(0, f"{seconds / total:.0%} of session time {stage} "
                        f"({units.duration(seconds)} a session)")
    parts = []
    if harmed:
        parts.append("harm: " + "; ".join(harmed))
    if moved:
        parts.append("strongest deviations: " + "; ".join(moved[:MAX_DEVIATIONS]))
    finding.extra_summary = ". ".join(parts)


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "unexplained-harm", "agent-x86-12",
        "a release added a synchronous audit step to every session, outside any instrumented "
        "stage: each session now waits ~1.3 s on it; the node and its dependencies are fine",
        "online sessions' median 1.5 s (P99 over 3 s) while every stage keeps its usual time: "
        "the session time no stage accounts for; CPUs ~40 % busy, queue flat",
        uptime_days=5.1, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 1.2),
        background=k.background(k.X86, 0.4, 0.02),
        agent=k.AgentPlan(sessions=9.0, session_median=1.5, session_sigma=0.35))


def beside_another_pool(k):
    """The same slow sessions, and the batch pool at its open-file limit: a cause about
    another pool, which explains nothing of chat-online's harm."""
    scn = scenario(k)
    fds = [996, 998, 1001, 1003, 1006, 1008, 1011, 1014]  # an fd leaked per partition read
    return replace(
        scn, name="unexplained-harm-beside-another-pool", hostname="agent-x86-13",
        injects=scn.injects + "; unrelated, the offline ETL job leaks a file descriptor per "
                              "partition it reads and holds 1,014 of its 1,024",
        shows=scn.shows + "; the batch pool's ETL process at 99 % of its RLIMIT_NOFILE",
        procs=scn.procs + [k.etl(k.X86, range(16), 2.2, fds=fds, nofile=(1024, 4096))])


RULE = Rule(
    id="unexplained-harm",
    severity="warning",
    explains=EXPLAINS_NOTHING,  # it is the harm itself
    symptom="workloads are hurting (sessions over target, errors, waits) and no known cause "
            "shows",
    cause="a fault outside the catalog: an uninstrumented step, a dependency or kernel "
          "limit fleetscope does not watch, a change in the application",
    action="start from the strongest deviations named here; compare with the last good "
           "release and config change; look at the pool's stacks (fleetscope stacks PID) "
           "and the application's own logs",
    summary="pool {pool}: users hurting and no rule explains it",
    condition=unexplained(POOL_HARM),
    evidence=(
        *(Evidence(signal.title, signal.value, signal.default, signal.unit)
          for signal in HARM_SIGNALS),
        Evidence("session time outside any stage, per session", _UNACCOUNTED, 0, "s"),
        Evidence("largest stage time per session", _STAGE_PER_SESSION, 0, "s"),
        Evidence("CPU pressure (PSI cpu some)", PSI_CPU, 0, "ratio"),
        Evidence("median core busy", busy_ratio("p50"), 0, "ratio"),
    ),
    confidence=0.5,
    for_seconds=300,  # longer than any cause's `for:` (2 m): a pending cause resets it
    kind="symptom",
    enrich=enrich,
    views=(
        Panel("Online sessions' P99 per pool", HARM_SIGNALS[0].value, "s",
              HARM_SIGNALS[0].default, narrow=False),
        Panel("Session time outside any stage, per session", _UNACCOUNTED, "s"),
        Panel("Stage time per session", STAGE_PER_SESSION, "s", narrow=False),
    ),
    fleet=FleetFault(("chat",), 4, 15, effects=(
        # a step no stage measures: 1.5 s of each session outside every stage
        Add("unexplained_session_seconds", 1.5),
    )),
    proof=Proof(scenario, summary=r"pool chat-online: users hurting and no rule explains it; "
                                  r"harm: online sessions' P99 \d",
                # per pool: a cause about another pool leaves this one's harm unexplained,
                # and the harm leads the risk however severe
                cases=(Case("unexplained-harm-beside-another-pool", beside_another_pool,
                            findings=(("unexplained-harm", "warning", ONGOING, "chat-online"),
                                      ("fd-exhaustion", "critical", ONGOING, "batch")),
                            harm=(("chat-online", ()),)),)),
)
