"""oom-kill: processes killed by the OOM killer, at a memory cgroup's limit or node-wide.

Condition (critical, ongoing): an OOM kill in the kernel log in the last 5 minutes whose
memory cgroup still exists, per pool where the kill was in a pool's cgroup (the alert names
the pool whose workers died), or /proc/vmstat oom_kill rising (the kernel log unreadable).
A kill inside the 15-minute look-back that no longer acts (its cgroup removed since, or none
for 5 minutes) is a warning of the ended phase ("ended"), explaining no harm of now; older
kills are an `info` tier. Enrichment: one finding per node naming every killed process (pid,
command), its cgroup (and whether it is gone), the cgroup's limit and usage at the kill, and
the pool it belonged to.
"""

from __future__ import annotations

import time
from dataclasses import replace

from fleetscope.collectors.shared import PROC_STAT, process_file
from fleetscope.core import units

from ..fleet import Events, FleetFault, Noisy, Set
from ..model import ENDED, EXPLAINS_POOL, NODE, ONGOING, Case, Evidence, Panel, Proof, Rule, Tier
from ..promql import (
    EVENT_LOOKBACK_SECONDS,
    EVENT_ONGOING_SECONDS,
    Max,
    Rate,
    Recent,
    Selector,
    Sum,
    Time,
)
from ..signals import POOL

RANK = 0.5  # a cause: ties with equally severe findings go to it
OOM_WINDOW = EVENT_LOOKBACK_SECONDS  # kills this recent are the incident, in every mode
MAX_SUBJECTS = 10

_LOGGED = Selector("fleetscope_oom_kills_logged_total")
_OOM_AGE = Time() - Max(Selector("fleetscope_oom_kill_last_timestamp_seconds"), by=NODE)
# Kills that still act: in a cgroup that is still there, the pool's where it is one of its
_STANDING_AGE = Time() - Max(
    Selector("fleetscope_oom_kill_existing_cgroup_last_timestamp_seconds"), by=NODE)
_POOL_KILL_AGE = Time() - Max(Selector("fleetscope_pool_oom_kill_last_timestamp_seconds"),
                              by=POOL)
# Counted kills over a minute, as every rate here: a kill that old reads alike on a query
# engine and in-process (whose look-back is the samples at hand); the kernel log's kill
# time (Recent) is what holds a single kill for the whole look-back.
KILL_RATE_SECONDS = 60
_VMSTAT_KILLS = Sum(Rate(Selector("fleetscope_vmstat_oom_kills_total"), KILL_RATE_SECONDS,
                         increase=True), by=NODE)
_POOL_KILLS = Rate(Selector("fleetscope_pool_memory_oom_kills_total"), KILL_RATE_SECONDS,
                   increase=True)


def _utc(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


def _size(kib: int) -> str:
    return units.format_value(kib * 1024, "bytes")


def _member_cgroups(ctx) -> dict[str, str]:
    """memory cgroup path -> pool, from the pool members' /proc/<pid>/cgroup."""
    from fleetscope.collectors.parsers.oom import memory_cgroup_path

    found: dict[str, str] = {}
    for process in ctx.pool_members(ctx.last):
        line = ctx.read(ctx.last, process_file(process.pid, "cgroup"), memory_cgroup_path)
        if line is not None:
            found.setdefault(line[1], process.pool.name)
    return found


def _pools_with_kills(ctx) -> list[str]:
    """Pools whose memory cgroups counted an OOM kill in the look-back."""
    series = getattr(ctx, "series", None)
    timestamps = series.timestamps() if series is not None else []
    if not timestamps:
        return []
    return sorted({dict(key).get("pool", "") for at_ms in timestamps
                   for key, value in _POOL_KILLS.evaluate(series, at_ms).items() if value > 0}
                  - {""})


def _pool_of(cgroup: str, pools: dict[str, str]) -> str | None:
    """The pool whose members live in `cgroup` or below it (a pod's container cgroup under
    the pod cgroup the limit is set on)."""
    for path, pool in pools.items():
        if cgroup and (path == cgroup or path.startswith(cgroup.rstrip("/") + "/")
                       or cgroup.startswith(path.rstrip("/") + "/")):
            return pool
    return None


def _describe(kill, boot: float | None, pools: dict[str, str]) -> tuple[str, dict]:
    """One kill as a phrase and an evidence row."""
    when = boot + kill.seconds if boot is not None and kill.seconds is not None else None
    where = kill.memcg or kill.oom_memcg
    pool = _pool_of(where, pools)
    phrase = f"{kill.comm} (pid {kill.pid}"
    phrase += f", pool {pool})" if pool else ")"
    if kill.constraint == "memcg":
        phrase += f" in memory cgroup {where or '?'}"
        if kill.limit_kb is not None:
            phrase += (f" at its limit: usage {_size(kill.usage_kb)} of "
                       f"{_size(kill.limit_kb)}")
    else:
        phrase += f" node-wide ({kill.constraint} OOM)" + (f", cgroup {where}" if where else "")
    phrase += f", rss {_size(kill.anon_rss_kb + kill.file_rss_kb)}"
    row = {"signal": f"OOM kill of {kill.comm} (pid {kill.pid}), {kill.constraint}"
                     + (f", cgroup {where}" if where else "")
                     + (f", limit {_size(kill.limit_kb)}" if kill.limit_kb else "")
                     + (f" at {_utc(when)}" if when else ""),
           "value": kill.anon_rss_kb + kill.file_rss_kb, "threshold": 0,
           "unit": "KiB resident when killed"}
    return phrase, row


def enrich(ctx, finding) -> None:
    """Every kill the kernel logged (latest first): the process, its cgroup, the cgroup's limit
    and usage at the kill (the report's `memory: usage` line), and its pool."""
    from fleetscope.collectors.parsers.kmsg import boot_time, log_clock
    from fleetscope.collectors.parsers.oom import scan_oom_kills

    text = ctx.kernel_log()
    if text is None:
        return
    boot = ctx.read(ctx.last, PROC_STAT, boot_time)
    try:
        kills = scan_oom_kills(text, clock=log_clock(boot, ctx.last.time))
    except ValueError:
        return
    if not kills:
        return
    now = ctx.now()
    recent = [k for k in kills if boot is None or k.seconds is None
              or boot + k.seconds >= now - OOM_WINDOW]
    shown = list(reversed(recent or kills[-3:]))
    pools = _member_cgroups(ctx)
    killed_in = _pools_with_kills(ctx)
    if len(killed_in) == 1:  # the killed worker is gone: its pool's cgroup counted the kill
        for kill in shown:
            where = kill.memcg or kill.oom_memcg
            if kill.constraint == "memcg" and where and _pool_of(where, pools) is None:
                pools.setdefault(where, killed_in[0])
    phrases = []
    for kill in shown[:MAX_SUBJECTS]:
        phrase, row = _describe(kill, boot, pools)
        phrases.append(phrase)
        finding.evidence.append(row)
    finding.subjects["pids"] = list(dict.fromkeys(k.pid for k in shown))[:MAX_SUBJECTS]
    finding.subjects["binaries"] = list(dict.fromkeys(k.comm for k in shown))[:MAX_SUBJECTS]
    finding.subjects["cgroups"] = list(dict.fromkeys(
        k.memcg or k.oom_memcg for k in shown if k.memcg or k.oom_memcg))[:MAX_SUBJECTS]
    count = _kill_count(len(recent), _logged(finding, len(kills)))
    others = [k.pid for k in shown[1:]]
    finding.extra_summary = f"{count}, latest {phrases[0]}" + (
        f"; before it pid{'s' if len(others) > 1 else ''} "
        f"{', '.join(map(str, others[:5]))}{' ...' if len(others) > 5 else ''}"
        if others else "")


def _logged(finding, scanned: int) -> int:
    """The kernel log's kills as the finding's evidence row counts them (the exporter's
    count), else as scanned here: the summary says what the row beside it says."""
    rows = {item.signal for item in RULE.evidence if _LOGGED.name in item.expr.metrics()}
    counted = [row["value"] for row in finding.evidence if row["signal"] in rows]
    return int(max(counted)) if counted else scanned


def _kill_count(recent: int, logged: int) -> str:
    """'3 kills' (every logged kill in the look-back), '1 kill in the look-back, 5 in the
    kernel log', '2 kills in the kernel log, none in the look-back'."""
    if recent >= logged:
        return units.count(recent, "kill")
    if recent:
        return f"{units.count(recent, 'kill')} in the look-back, {logged} in the kernel log"
    return f"{units.count(logged, 'kill')} in the kernel log, none in the look-back"


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.kp_scenario(
        "oom-kill", "agent-kp-06",
        "a tool worker leaks its parsed documents; its pod cgroup has a 2 GiB memory limit, so "
        "the kernel kills it at the limit and the kubelet restarts it, three times in a minute",
        "three `Memory cgroup out of memory: Killed process ... (agent-tool)` reports with "
        "`oom-kill:constraint=CONSTRAINT_MEMCG` summaries in the kernel log, /proc/vmstat "
        "oom_kill +3, the pod cgroup's memory.events oom_kill 3 and max rising",
        uptime_days=9.4, procs=k.daemons(k.KUNPENG) + k.workers(k.KUNPENG, k.ONLINE_KP, 1.1,
                                                           threads=(6, 6, 6, 6)),
        background=k.background(k.KUNPENG, 0.1, 0.03),
        memory=k.MemoryPlan(oom_kills=3, limit_bytes=2 << 30))


# A one-off job's pod cgroup, deleted with the job after its kill: in no pool, no sample has it
REMOVED_JOB_CG = "/kubepods.slice/kubepods-burstable.slice/offline/reindex-job-28411"


def ended_beside_preemption(k):
    """A kill in a cgroup since removed, 3 minutes before the window (inside the 5 minutes a
    kill still acts in: only the removal ends it), beside offline-preemption's live fault."""
    from .offline_preemption import scenario as preemption

    scn = preemption(k)
    return replace(
        scn, name="oom-kill-ended-beside-preemption", hostname="agent-kp-07",
        injects=scn.injects + "; before the window a one-off reindex job reached its pod's "
                              "4 GiB memory limit, was OOM-killed, and was deleted with its pod",
        shows=scn.shows + "; one `Memory cgroup out of memory: Killed process ... (reindex)` "
                          "report 3 min before the window in a memory cgroup no sample holds",
        memory=k.MemoryPlan(oom_kills=1, limit_bytes=4 << 30, killed="reindex",
                            kill_cgroup=REMOVED_JOB_CG, first_kill=-190.0))


RULE = Rule(
    id="oom-kill",
    severity="critical",
    # the pool whose memory cgroup counted the kill; a kill in no pool's cgroup explains none
    explains=EXPLAINS_POOL,
    symptom="agent workers die with exit -9 (SIGKILL) and restart; sessions on them fail",
    cause="the OOM killer killed them: their memory cgroup reached its limit (memory.max / "
          "memory.limit_in_bytes), or the node ran out of memory",
    action="find what grew (the killed process's RSS against its cgroup's limit): fix the "
           "leak or raise the limit to the measured peak plus headroom; never let a node "
           "overcommit its pods' memory limits",
    summary="processes killed by the OOM killer within the look-back",
    # Kills that still act, from the kernel log (naming the process, per pool where it was
    # a pool's) or, where the log cannot be read, from /proc/vmstat oom_kill rising. Kills
    # that ended inside the look-back are said so; older ones are information.
    condition=(Recent(_POOL_KILL_AGE, EVENT_ONGOING_SECONDS)
               | Recent(_STANDING_AGE, EVENT_ONGOING_SECONDS) | (_VMSTAT_KILLS > 0)),
    tiers=(Tier("warning", Recent(_OOM_AGE, OOM_WINDOW),
                "OOM kills ended: the last {value:duration} before the window's end, none "
                "since in a cgroup that still exists", ENDED),
           Tier("info", _OOM_AGE >= 0,
                "earlier OOM kills, the last {value:duration} before the window's end",
                ENDED)),
    evidence=(
        Evidence("OOM kills in the kernel log", Sum(_LOGGED, by=NODE), 0, "kills"),
        Evidence("seconds since the last OOM kill in the kernel log", _OOM_AGE, OOM_WINDOW,
                 "s", pick="min"),
        Evidence("seconds since the last OOM kill in a cgroup that still exists",
                 _STANDING_AGE, EVENT_ONGOING_SECONDS, "s", pick="min"),
        Evidence("OOM kills in the last minute (/proc/vmstat oom_kill)", _VMSTAT_KILLS, 0,
                 "kills"),
        Evidence("OOM kills in pools' memory cgroups in the last minute",
                 Sum(_POOL_KILLS, by=NODE), 0, "kills"),
    ),
    confidence=0.95,
    for_seconds=0,  # an event: one kill in the look-back is the finding
    present_if=("fleetscope_oom_kills_logged_total", "fleetscope_vmstat_oom_kills_total"),
    enrich=enrich,
    views=(
        Panel("OOM kills per minute (kernel log), by constraint",
              Sum(Rate(_LOGGED, 60, increase=True), by=(*NODE, "constraint")), "kills", 0.0,
              narrow=False),
        Panel("OOM kills per minute in each pool's memory cgroups",
              Max(Rate(Selector("fleetscope_pool_memory_oom_kills_total"), 60, increase=True),
                  by=(*NODE, "pool")), "kills", 0.0, narrow=False),
        Panel("Memory usage over limit of each pool's fullest cgroup",
              Max(Selector("fleetscope_pool_memory_usage_ratio"), by=(*NODE, "pool")), "ratio",
              1.0, narrow=False),
    ),
    fleet=FleetFault(("codegen",), 9, 20, effects=(
        # a leaking worker killed at its cgroup's limit about every two minutes
        Set("oom_kill_rate", 1 / 120),
        Events(None, "fleetscope_oom_kill_last_timestamp_seconds", {"constraint": "memcg"},
               ago=Noisy(10, 100, stream=91, per_minute=False)),
        # the worker's cgroup stays (its supervisor restarts it there): the kills still act
        Events(None, "fleetscope_oom_kill_existing_cgroup_last_timestamp_seconds",
               {"constraint": "memcg"}, ago=Noisy(10, 100, stream=91, per_minute=False)),
    )),
    proof=Proof(scenario,
                summary=r"processes killed by the OOM killer within the look-back; 3 kills, "
                        r"latest agent-tool \(pid \d+, pool chat-online\) in memory cgroup "
                        r"\S+ at its limit: usage 2(\.0)? GiB of 2(\.0)? GiB",
                subjects=("binaries", ["agent-tool"]),
                # a kill in a cgroup since removed ended: it explains no harm of now and
                # ranks after the live cause that does
                cases=(Case("oom-kill-ended-beside-preemption", ended_beside_preemption,
                            findings=(("offline-preemption", "warning", ONGOING, "chat-online"),
                                      ("oom-kill", "warning", ENDED, "")),
                            harm=(("chat-online", ("offline-preemption",)),)),)),
)
