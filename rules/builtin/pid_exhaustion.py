"""pid-exhaustion: a pool's processes cannot start threads or processes: fork() and
pthread_create() fail with EAGAIN at a task limit.

Condition, per pool: its cgroups refused forks in the window (pids.events `max` rising, v1
or v2), or a cgroup of the pool holds more than 90 % of its pids.max, or its threads reach
90 % of its processes' RLIMIT_NPROC (a per-user count: the pool's own threads are a lower
bound of it). Evidence beside: the node's threads against kernel.threads-max and
kernel.pid_max (every thread takes a pid). Enrichment: the cgroup, its limit and count, and
the kernel's `cgroup: fork rejected by pids controller in <path>` line (kernel/cgroup/
pids.c pids_event(), printed once per cgroup, at its first refusal), inside the look-back
or earlier. That line alone (a cgroup no pool names) is a warning inside the look-back while
the cgroup exists, of the ended phase once it is gone (its forks refuse nothing any more),
and information after the look-back, as SIGILLs are for isa-mismatch.
"""

from __future__ import annotations

import time

from fleetscope.collectors.cgroups import process_cgroups
from fleetscope.collectors.parsers.cgroup import parse_pids
from fleetscope.collectors.parsers.pids_log import fork_rejections
from fleetscope.collectors.shared import PROC_STAT
from fleetscope.core import units

from ..fleet import FleetFault, Set
from ..model import ENDED, EXPLAINS_POOL, NODE, WINDOW, Evidence, Panel, Proof, Rule, Tier
from ..promql import EVENT_LOOKBACK_SECONDS, Max, Min, Rate, Recent, Selector, Sum, Time
from ..signals import POOL

RANK = 2.5  # beside fd-exhaustion, the other per-process limit
TASKS_SHARE = 0.9  # of pids.max or RLIMIT_NPROC: the next burst of threads fails
FORK_LOG_LOOKBACK = EVENT_LOOKBACK_SECONDS  # a refusal logged this recent is the incident
MAX_SUBJECTS = 5

_REFUSED = Sum(Rate(Selector("fleetscope_pool_cgroup_pids_limit_hits_total"), WINDOW,
                    increase=True), by=POOL)
_PIDS_SHARE = Max(Selector("fleetscope_pool_cgroup_pids_usage_ratio"), by=POOL)
_NPROC_SHARE = (Max(Selector("fleetscope_pool_threads"), by=POOL)
                / Min(Selector("fleetscope_pool_nproc_limit"), by=POOL))
_NODE_THREADS = Max(Selector("fleetscope_threads"), by=NODE)
# The kernel's line for a cgroup no pool names (or a node without pools): an event, bounded
# in time as SIGILLs are (isa-mismatch): a warning inside the look-back, information after.
_FORK_LOG_AGE = Time() - Max(
    Selector("fleetscope_pids_fork_rejected_last_timestamp_seconds"), by=(*NODE, "cgroup"))
_CGROUP_EXISTS = Max(Selector("fleetscope_pids_fork_rejected_cgroup_exists"),
                     by=(*NODE, "cgroup")) > 0


def _node_share(sysctl: str):
    return _NODE_THREADS / Min(Selector("fleetscope_sysctl", {"name": sysctl}), by=NODE)


def _boot_time(ctx) -> float | None:
    from fleetscope.collectors.parsers.kmsg import boot_time

    return ctx.read(ctx.last, PROC_STAT, boot_time)


def enrich(ctx, finding) -> None:
    """The pool's pids cgroup nearest its limit (path, pids.current / pids.max, refusals),
    its processes, and the kernel's fork-rejected lines for the pool's cgroups."""
    members = [p.pid for p in ctx.pool_members(ctx.last, finding.labels.get("pool"))]
    finding.subjects["pids"] = members[:MAX_SUBJECTS]
    worst = None
    for location in process_cgroups(ctx.last, members, "pids").values():
        directory = location.directory
        try:
            reading = parse_pids(ctx.last.read_text(f"{directory}/pids.current"),
                                 ctx.last.read_text(f"{directory}/pids.max"),
                                 ctx.last.read_text(f"{directory}/pids.events"))
        except Exception:  # noqa: BLE001 (removed since, or a kernel without pids.events)
            continue
        share = reading.current / reading.limit if reading.limit else 0.0
        if worst is None or share > worst[0]:
            worst = (share, location, reading)
    parts = []
    if worst is not None:
        _, location, reading = worst
        finding.subjects["cgroups"] = [location.path]
        limit = "max" if reading.limit is None else reading.limit
        parts.append(f"cgroup {location.path} (v{location.version}): pids.current "
                     f"{reading.current} of pids.max {limit}, "
                     f"{_refusals(finding, reading.limit_hits or 0)}")
    text = ctx.kernel_log()
    if text:
        boot, now = _boot_time(ctx), ctx.now()
        paths = set(finding.subjects["cgroups"])
        from fleetscope.collectors.parsers.kmsg import log_clock

        clock = log_clock(boot, ctx.last.time)  # for lines stamped with the wall clock
        for path, seconds in fork_rejections(text, clock)[-20:]:
            if paths and path not in paths:
                continue
            when = boot + seconds if boot is not None and seconds is not None else None
            recent = when is not None and now - when <= FORK_LOG_LOOKBACK
            stamp = "" if when is None else time.strftime(" at %H:%M:%S UTC", time.gmtime(when))
            age = "" if when is None else f", {units.duration(max(0.0, now - when))} ago"
            finding.evidence.append({
                "signal": f"kernel: fork rejected by pids controller in {path}{stamp}"
                          f"{age} ({'within' if recent else 'before'} the "
                          f"{FORK_LOG_LOOKBACK // 60} min look-back)",
                "value": 1, "threshold": 0, "unit": "lines"})
    if parts:
        finding.extra_summary = "; ".join(parts)


def _refusals(finding, so_far: int) -> str:
    """The cgroup's refusals since it was made (pids.events max) beside the window's, as
    the finding's evidence row reads them: one number alone read as the other."""
    rows = {item.signal: item.unit for item in RULE.evidence if item.expr is _REFUSED}
    window = [units.format_value(row["value"], rows[row["signal"]])
              for row in finding.evidence if row["signal"] in rows]
    since = "since the cgroup was made (pids.events max)"
    if not window:
        return f"{units.count(so_far, 'fork')} refused {since}"
    return f"{window[0]} refused in the window, {so_far} {since}"


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.kp_scenario(
        "pid-exhaustion", "agent-kp-09",
        "the chat workers' pods run with a pids limit of 256 (podPidsLimit) and a tool "
        "client that starts a thread per request and never joins it",
        "the online cgroup at 256 of 256 tasks (pids.current / pids.max), pids.events max "
        "rising by ~30 a minute, tool calls failing with 'can't start new thread'",
        uptime_days=2.4, procs=k.daemons(k.KUNPENG) + k.workers(
            k.KUNPENG, k.ONLINE_KP, 0.9, threads=(64, 64, 64, 64)),
        background=k.background(k.KUNPENG, 0.1, 0.03),
        cgroups={k.ONLINE_CG: {"pressure": 1.2, "pids": (
            [231, 256, 256, 256, 256, 256, 256, 256], 256,
            [0, 4, 9, 15, 20, 24, 31, 35])}},
        agent=k.AgentPlan(sessions=12.0, errors=0.05))


RULE = Rule(
    id="pid-exhaustion",
    severity="critical",
    explains=EXPLAINS_POOL,  # its cgroup's or processes' task limit
    symptom="workers fail to start threads or processes (EAGAIN, \"can't start new thread\", "
            "\"fork: Resource temporarily unavailable\")",
    cause="a task limit is reached: the cgroup's pids.max (a Kubernetes pod pids limit, "
          "systemd TasksMax=), the user's RLIMIT_NPROC, or the node's kernel.threads-max / "
          "kernel.pid_max",
    action="find the thread leak (threads of the pool's processes growing without load) and "
           "fix it; raise the limit that refuses (pids.max, TasksMax=, podPidsLimit, ulimit "
           "-u / LimitNPROC=, kernel.pid_max) with 2-3x headroom over real concurrency",
    summary="pool {pool}: new threads and processes refused at a task limit",
    condition=(_REFUSED > 0) | (_PIDS_SHARE > TASKS_SHARE) | (_NPROC_SHARE > TASKS_SHARE),
    tiers=(Tier("warning", Recent(_FORK_LOG_AGE, FORK_LOG_LOOKBACK).and_on(
                    _CGROUP_EXISTS, (*NODE, "cgroup")),
                "the pids controller refused forks in cgroup {cgroup}, {value:duration} "
                "before the window's end (kernel log)"),
           Tier("warning", Recent(_FORK_LOG_AGE, FORK_LOG_LOOKBACK),
                "refused forks ended: cgroup {cgroup} is gone; the kernel logged its first "
                "refusal {value:duration} before the window's end", ENDED),
           Tier("info", _FORK_LOG_AGE >= 0,
                "earlier refused forks in cgroup {cgroup}, the last {value:duration} before "
                "the window's end (kernel log)", ENDED)),
    evidence=(
        Evidence("forks refused by the pool's pids.max in the window (pids.events max)",
                 _REFUSED, 0, "forks"),
        Evidence("tasks over pids.max (the pool's cgroup nearest its limit)", _PIDS_SHARE,
                 TASKS_SHARE, "ratio"),
        Evidence("tasks in that cgroup (pids.current)",
                 Max(Selector("fleetscope_pool_cgroup_pids_current"), by=POOL), 0, "tasks"),
        Evidence("its pids.max", Max(Selector("fleetscope_pool_cgroup_pids_limit"), by=POOL),
                 0, "tasks", pick="min"),
        Evidence("the pool's threads over its lowest RLIMIT_NPROC", _NPROC_SHARE, TASKS_SHARE,
                 "ratio"),
        Evidence("node threads over kernel.threads-max", _node_share("kernel.threads-max"),
                 TASKS_SHARE, "ratio"),
        Evidence("node threads over kernel.pid_max", _node_share("kernel.pid_max"),
                 TASKS_SHARE, "ratio"),
        Evidence("seconds since the kernel logged a refused fork", _FORK_LOG_AGE,
                 FORK_LOG_LOOKBACK, "s", pick="min"),
    ),
    confidence=0.9,
    for_seconds=0,  # refused forks are failures now, not a trend to wait for
    enrich=enrich,
    views=(
        Panel("Forks refused at pids.max per minute",
              Sum(Rate(Selector("fleetscope_pool_cgroup_pids_limit_hits_total"), 60,
                       increase=True), by=(*NODE, "pool")), "forks", 0.0, role="victim"),
        Panel("Tasks over pids.max (cgroup nearest its limit)",
              Max(Selector("fleetscope_pool_cgroup_pids_usage_ratio"), by=(*NODE, "pool")),
              "ratio", TASKS_SHARE),
        Panel("Threads per pool", Max(Selector("fleetscope_pool_threads"), by=(*NODE, "pool")),
              "threads"),
        Panel("Node threads over kernel.pid_max", _node_share("kernel.pid_max"), "ratio",
              TASKS_SHARE),
    ),
    fleet=FleetFault(("codegen",), 4, 30, effects=(
        # a thread leak fills the pool's pids.max; forks refused since
        Set("pids_limit", 256.0),
        Set("pids_current", 256.0),
        Set("pid_limit_hit_rate", 0.5),
    )),
    proof=Proof(scenario, summary=r"pool chat-online: new threads and processes refused at a "
                                  r"task limit; cgroup .* pids\.current 256 of pids\.max 256",
                subjects=("cgroups", None)),
)
