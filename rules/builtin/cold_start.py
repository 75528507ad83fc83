"""cold-start: the model is loaded cold on the first request after a (re)start.

Condition: the model-load stage averaged more than 5 s over the last 5 minutes (an event:
no `for:`). Enrichment: the pool's processes that started in those 5 minutes.
"""

from __future__ import annotations

import os

from fleetscope.collectors.parsers.process import parse_pid_stat
from fleetscope.collectors.parsers.procfs import parse_proc_stat
from fleetscope.collectors.shared import PROC_STAT, process_file
from fleetscope.core import units

from ..fleet import FleetFault, Noisy, Set
from ..model import EXPLAINS_POOL, NODE, Evidence, Panel, Proof, Rule
from ..promql import Rate, Selector, Sum

RANK = 12
MODEL_LOAD_SECONDS = 5.0  # average model-load stage time
MAX_SUBJECTS = 5

_BY_POOL = (*NODE, "pool")
_LOAD = (Sum(Rate(Selector("agent_stage_duration_seconds_sum", {"stage": "model_load"}),
                  300, increase=True), by=_BY_POOL)
         / Sum(Rate(Selector("agent_stage_duration_seconds_count", {"stage": "model_load"}),
                    300, increase=True), by=_BY_POOL))


def enrich(ctx, finding) -> None:
    """The pool's processes that started in the last five minutes of the window: the ones
    that loaded their model cold."""
    stat = ctx.read(ctx.last, PROC_STAT, parse_proc_stat)
    boot = (stat.scalars.get("btime") if stat else None)
    if not boot:
        return
    hz = os.sysconf("SC_CLK_TCK")
    end = ctx.now()
    young = []
    for process in ctx.pool_members(ctx.last, finding.labels.get("pool")):
        pid_stat = ctx.read(ctx.last, process_file(process.pid, "stat"), parse_pid_stat)
        if pid_stat is None:
            continue
        age = end - (boot + pid_stat.starttime_ticks / hz)
        if 0 <= age <= 300:
            young.append((age, process.pid))
    young.sort()
    finding.subjects["pids"] = [pid for _, pid in young[:MAX_SUBJECTS]]
    if young:
        finding.extra_summary = "started in the last 5 minutes: " + ", ".join(
            f"{ctx.who(pid)} ({units.duration(age)} ago)" for age, pid in young[:3])


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    procs = k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, (1.5, 1.5, 1.2, 1.2))
    for w, start in ((procs[7], 14.2), (procs[8], 17.6)):  # scaled out during the bundle
        w.age = -start
        w.cores = k.per_interval([1.1, 1.1, 1.1, 1.1, 1.1, 1.15, 1.3, 1.3])
        w.state = ["D", "D", "D", "R", "D", "R", "S", "R"]
        w.lead_run = k.per_interval(0.7)
        w.vcs = k.per_interval([300.0] * 6 + [600.0, 600.0])
        w.minflt_rate = 25000.0
        w.majflt = 61044
        w.anon_mb = 2600.0
        w.growth = k.per_interval(4000)
    return k.x86_scenario(
        "cold-start", "agent-x86-08",
        "a scale-out starts two workers during the bundle; each loads its 7B model cold "
        "(page cache empty, from network storage) on its first request, taking 42-44 s",
        "model_load stage 43 s on average over the window (two loads), two first sessions "
        "of 47-50 s, new worker processes with heavy page faults",
        uptime_days=2.2, procs=procs, background=k.background(k.X86, 0.45, 0.02),
        agent=k.AgentPlan(sessions=18.0, workers_loaded=2, load_seconds=39.0,
                        runtime_age=3 * 3600.0, loads={6: [41.8], 7: [44.3]},
                        slow_sessions={6: [47.2], 7: [49.5]},
                        queue=[4, 5, 7, 9, 12, 14, 11, 8],
                        heartbeat=[0.5, 0.8, 0.6, 14.2, 24.3, 34.1, 0.9, 0.6]))


RULE = Rule(
    id="cold-start",
    severity="warning",
    explains=EXPLAINS_POOL,  # its model loads
    symptom="first request after a restart is very slow",
    cause="the model is loaded cold on the first request",
    action="keep warm instances; preload models at start (readiness only after the load)",
    summary="pool {pool}: model loads take {value:duration} on average",
    condition=_LOAD > MODEL_LOAD_SECONDS,
    evidence=(Evidence("average model-load stage", _LOAD, MODEL_LOAD_SECONDS, "s"),),
    confidence=0.65,
    for_seconds=0,  # an event: a slow load in the last 5 minutes is the finding
    enrich=enrich,
    views=(Panel("Average model-load stage per pool (5 min)", _LOAD, "s", MODEL_LOAD_SECONDS),),
    fleet=FleetFault(("codegen",), 8, 4, effects=(
        # the model loads again for new sessions: a load every 20 s, 20-28 s each
        Set("model_load_rate", 0.05),
        Set("model_load_seconds", Noisy(20, 8, stream=70)),
    )),
    proof=Proof(scenario, summary=r"pool chat-online: model loads take 4\d(\.\d+)? s on average"),
)
