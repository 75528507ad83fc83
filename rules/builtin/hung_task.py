"""hung-task: the kernel's own watchdogs say a task or a CPU is stuck: a task blocked in
uninterruptible sleep past hung_task_timeout_secs ("INFO: task X:PID blocked for more than
120 seconds."), a CPU that did not schedule for 2 * watchdog_thresh seconds ("BUG: soft
lockup - CPU#N stuck for 22s! [X:PID]"), or an RCU CPU stall (parsers/stall_log.py).

Condition (critical): a soft lockup or an RCU stall in the last 5 minutes (a CPU ran nothing
else for tens of seconds: every task queued on it waited that long), or a hung task reported
twice in the last 5 minutes (one task still blocked a whole timeout later, or several
tasks: the kernel is holding them, not one slow request). One hung-task report in the last
5 minutes is a warning: a task waited over two minutes for I/O or a lock, and may be waiting
still. Inside the 15-minute look-back with none since, the stalls ended (a warning of the
ended phase); older ones are information, as the other kernel-log rules read their events.
Enrichment names each task, its pid, the stuck CPU, how long, and a hung task's lock owner
(6.14+ kernels print it).
"""

from __future__ import annotations

import time

from fleetscope.collectors.shared import PROC_STAT
from fleetscope.core import units

from ..fleet import Events, FleetFault, Noisy
from ..model import ENDED, EXPLAINS_NODE, NODE, Evidence, Panel, Proof, Rule, Tier
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

RANK = 0.65  # a cause, before crash-loop: the kernel says a CPU or a task is stuck
MAX_SUBJECTS = 5
# kernel/watchdog.c: a soft lockup is reported after 2 * watchdog_thresh (10 s by default)
SOFT_LOCKUP_SECONDS = 20
HUNG_TASK_SECONDS = 120  # kernel/hung_task.c: hung_task_timeout_secs' default

_REPORTS = "fleetscope_kernel_stall_reports_total"
_LAST = "fleetscope_kernel_stall_last_timestamp_seconds"
_PREVIOUS = "fleetscope_kernel_stall_previous_timestamp_seconds"
_STUCK = "fleetscope_kernel_stall_last_stuck_seconds"


def _age(metric: str, kind: str | None = None):
    """Seconds since the latest (or the one before: _PREVIOUS) report of `kind` (any)."""
    return Time() - Max(Selector(metric, {"kind": kind} if kind else {}), by=NODE)


_SOFT_AGE = _age(_LAST, "soft_lockup")
_RCU_AGE = _age(_LAST, "rcu_stall")
_HUNG_AGE = _age(_LAST, "hung_task")
_HUNG_AGAIN_AGE = _age(_PREVIOUS, "hung_task")  # the report before the latest
_ANY_AGE = _age(_LAST)


def _reports(kind: str):
    return Sum(Max(Selector(_REPORTS, {"kind": kind}), by=NODE), by=NODE)


def _utc(when: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(when))


def _quoted(name: str) -> str:
    """A task name from the node, as data: quoted, with what a terminal would act on
    escaped."""
    return '"' + units.printable(name).replace('"', '\\"') + '"'


def describe(stall) -> str:
    """One report as a person reads it: 'soft lockup: CPU 3 stuck for 22 s running
    "python3" (pid 4567)'."""
    task = f'{_quoted(stall.comm)} (pid {stall.pid})' if stall.comm else ""
    stuck = "" if stall.stuck is None else f" for {units.duration(stall.stuck)}"
    if stall.kind == "soft_lockup":
        idle = " (its idle task: stuck in interrupts)" if stall.pid == 0 else ""
        return f"soft lockup: CPU {stall.cpu} stuck{stuck} running {task}{idle}"
    if stall.kind == "rcu_stall":
        where = f" on CPU {stall.cpu}" if stall.cpu is not None else ""
        return f"RCU CPU stall{where}"
    blocker = f", waiting on a {stall.blocker}" if stall.blocker else ""
    return f"hung task: {task} blocked{stuck} in uninterruptible sleep{blocker}"


def enrich(ctx, finding) -> None:
    """Each stall report of the kernel log: the task, its pid, the stuck CPU, how long and
    when; those inside the look-back first, the latest first."""
    from fleetscope.collectors.parsers.kmsg import boot_time, log_clock
    from fleetscope.collectors.parsers.stall_log import scan_stalls

    text = ctx.kernel_log()
    if text is None:
        return
    boot = ctx.read(ctx.last, PROC_STAT, boot_time)
    try:
        scan = scan_stalls(text, clock=log_clock(boot, ctx.last.time))
    except Exception:  # noqa: BLE001 (a log the collector already said it could not read)
        return
    if not scan.stalls:
        return
    now = ctx.now()
    start = now - EVENT_LOOKBACK_SECONDS

    def when(stall) -> float | None:
        return None if boot is None or stall.seconds is None else boot + stall.seconds

    latest_first = list(reversed(scan.stalls))
    recent = [s for s in latest_first if (when(s) or 0.0) >= start]
    # harm first: what is stuck now leads, CPUs before tasks; older reports only without one
    order = {"soft_lockup": 0, "rcu_stall": 1, "hung_task": 2}
    shown = sorted(recent, key=lambda s: order[s.kind])[:MAX_SUBJECTS] if recent else \
        latest_first[:MAX_SUBJECTS]
    pids = [s.pid for s in shown if s.pid]  # pid 0: a CPU's idle task, no process
    cpus = [s.cpu for s in shown if s.cpu is not None]
    finding.subjects["pids"] = list(dict.fromkeys(pids))
    finding.subjects["cpus"] = sorted(set(cpus))
    for stall in shown:
        at = when(stall)
        stamp = "" if at is None else (
            f" at {_utc(at)}, {units.duration(max(0.0, now - at))} ago "
            f"({'within' if at >= start else 'before'} the look-back)")
        finding.evidence.append({
            "signal": f"kernel: {describe(stall)}{stamp}",
            "value": stall.stuck if stall.stuck is not None else 1,
            "threshold": SOFT_LOCKUP_SECONDS if stall.kind == "soft_lockup" else (
                HUNG_TASK_SECONDS if stall.kind == "hung_task" else 0),
            "unit": "s" if stall.stuck is not None else "reports"})
    if scan.suppressed:
        finding.evidence.append({
            "signal": "kernel: further hung-task reports suppressed (kernel.hung_task_warnings "
                      "spent): tasks may be hung that the log no longer names",
            "value": 1, "threshold": 0, "unit": "lines"})
    parts = []
    for stall in shown[:3]:
        at = when(stall)
        ago = "" if at is None else f", {units.duration(max(0.0, now - at))} ago"
        parts.append(describe(stall) + ago)
    finding.extra_summary = "; ".join(parts)


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "hung-task", "agent-x86-12",
        "a chat worker's call into an out-of-tree storage driver spins in the kernel with "
        "preemption off; the CPU it runs on schedules nothing else, and the writeback of "
        "the model cache behind the driver's lock hangs",
        "two `watchdog: BUG: soft lockup - CPU#5 stuck for 22s! [python3:<pid>]` kernel "
        "lines inside the window (then 48 s), and an `INFO: task kworker/u32:3:<pid> blocked "
        "for more than 120 seconds.` report with its stack",
        uptime_days=5.3, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 1.2),
        background=k.background(k.X86, 0.3, 0.02), stalls=True)


RULE = Rule(
    id="hung-task",
    severity="critical",
    # a CPU that schedules nothing, or tasks held in the kernel: every pool of the node
    explains=EXPLAINS_NODE,
    symptom="a worker stops answering and cannot be killed (state D), or a CPU freezes: "
            "requests on it time out, heartbeats go stale, the node feels hung",
    cause="the kernel holds a task in uninterruptible sleep (I/O to a dead NFS server or "
          "disk, a lock held by a stuck driver) or a CPU runs kernel code without "
          "scheduling (a spinning driver, a hypervisor that stole the vCPU)",
    action="read the stack after the report (dmesg): the function it waits in names the "
           "device or lock; fix or fence that storage or driver, drain the node if a CPU "
           "is stuck; a hung task ends only when its I/O does (kill -9 does not reach it)",
    summary="the kernel reports a stuck CPU or repeated hung tasks, the last "
            "{value:duration} before the window's end",
    condition=(Recent(_SOFT_AGE, EVENT_ONGOING_SECONDS) | Recent(_RCU_AGE, EVENT_ONGOING_SECONDS)
               | Recent(_HUNG_AGAIN_AGE, EVENT_ONGOING_SECONDS)),
    tiers=(Tier("warning", Recent(_HUNG_AGE, EVENT_ONGOING_SECONDS),
                "a task hung in the kernel (blocked past hung_task_timeout_secs), reported "
                "{value:duration} before the window's end"),
           Tier("warning", Recent(_ANY_AGE, EVENT_LOOKBACK_SECONDS),
                "kernel stalls ended: the last reported {value:duration} before the window's "
                "end, none since", ENDED),
           Tier("info", _ANY_AGE >= 0,
                "earlier kernel stalls (hung tasks, soft lockups), the last {value:duration} "
                "before the window's end", ENDED)),
    evidence=(
        Evidence("soft lockups in the kernel log", _reports("soft_lockup"), 0, "reports"),
        Evidence("RCU CPU stalls in the kernel log", _reports("rcu_stall"), 0, "reports"),
        Evidence("hung-task reports in the kernel log", _reports("hung_task"), 0, "reports"),
        Evidence("seconds since the latest stall report", _ANY_AGE, EVENT_ONGOING_SECONDS,
                 "s", pick="min"),
        Evidence("seconds the latest soft lockup's CPU was stuck",
                 Max(Selector(_STUCK, {"kind": "soft_lockup"}), by=NODE), SOFT_LOCKUP_SECONDS,
                 "s"),
        Evidence("seconds the latest hung task was blocked",
                 Max(Selector(_STUCK, {"kind": "hung_task"}), by=NODE), HUNG_TASK_SECONDS,
                 "s"),
    ),
    confidence=0.85,
    for_seconds=0,  # an event: the kernel's report is the finding
    # The kernel log was read: the reports counter is there (0) even when nothing stalled.
    present_if=(_REPORTS,),
    enrich=enrich,
    views=(
        Panel("Stall reports in the kernel log so far, per kind",
              Max(Selector(_REPORTS), by=(*NODE, "kind")), "reports", narrow=False),
        Panel("New stall reports per minute, per kind",
              Max(Rate(Selector(_REPORTS), 60, increase=True), by=(*NODE, "kind")), "reports",
              0.0, narrow=False),
        Panel("Seconds the latest report's task or CPU was stuck, per kind",
              Max(Selector(_STUCK), by=(*NODE, "kind")), "s", narrow=False),
    ),
    fleet=FleetFault(("chat",), 2, 8, effects=(
        # a storage driver spins with preemption off: the CPU's watchdog reports it every
        # ~30 s while it lasts
        Events(_REPORTS, _LAST, {"kind": "soft_lockup"}, every_s=30,
               ago=Noisy(1, 25, stream=109, per_minute=False)),
    )),
    proof=Proof(scenario,
                summary=r"the kernel reports a stuck CPU or repeated hung tasks, the last "
                        r"[\d.]+ (ms|s|min) before the window's end; soft lockup: CPU 5 stuck "
                        r"for 48 s running \"python3\" \(pid \d+\)",
                subjects=("cpus", [5])),
)
