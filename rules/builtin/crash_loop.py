"""crash-loop: a binary keeps dying of a fatal trap (segfault, general protection fault,
divide error, int3, an arm64 data abort ...) and its supervisor keeps restarting it.

Condition: a fatal trap other than SIGILL (isa-mismatch keeps those) in the kernel log in
the last 5 minutes (critical: still crashing); inside the 15-minute look-back with none since
then, the loop stopped (a warning of the ended phase, explaining no harm of now); older
crashes are an `info` tier, in every mode, as isa-mismatch reads SIGILLs; per pool where the
crashing binary is one a pool's processes run. Enrichment: one
finding per node naming each crashing binary, its pids, how many times it crashed, when
last, and where (the faulting data address of a segfault, the instruction pointer and its
file offset in the binary).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fleetscope.collectors.shared import PROC_STAT
from fleetscope.core import units

from ..fleet import Events, FleetFault, Noisy, Set
from ..model import ENDED, EXPLAINS_POOL, NODE, WINDOW, Evidence, Panel, Proof, Rule, Tier
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

RANK = 0.7  # a cause, after isa-mismatch and oom-kill
CRASH_WINDOW = EVENT_LOOKBACK_SECONDS  # crashes this recent are the incident, in every mode
MAX_SUBJECTS = 5

_CRASHES = Selector("fleetscope_fatal_trap_crashes_total")
_AGE = Time() - Max(Selector("fleetscope_fatal_trap_last_crash_timestamp_seconds"), by=NODE)
# The same, per pool whose processes run the crashing binary (collectors/fatal_traps.py)
_POOL_AGE = Time() - Max(
    Selector("fleetscope_pool_fatal_trap_last_crash_timestamp_seconds"), by=POOL)
# Beside the kernel's word: pool processes replaced by new ones (a supervisor restarting a
# worker that lives long enough to be seen). Not a condition: short-lived tool processes
# churn the same way by design.
_RESTARTS = Sum(Rate(Selector("fleetscope_pool_process_starts_total"), WINDOW), by=NODE) * 60


@dataclass
class _Crashed:
    binary: str
    pids: list[int] = field(default_factory=list)  # latest first
    crashes: int = 0
    last_time: float | None = None
    last: object = None  # the latest crash record (parsers/kmsg.py)
    times: list[float] = field(default_factory=list)  # wall-clock times of the crashes

    def since(self, start: float) -> int:
        return sum(when >= start for when in self.times)


def _look_back_start(ctx, now: float) -> float:
    """Where 'recent' begins: the shared event look-back, as Recent reads the condition."""
    return now - CRASH_WINDOW


def crashed_binaries(faults, boot: float | None) -> list[_Crashed]:
    """Per binary: its crashes, pids and latest crash, most recently crashed first."""
    from fleetscope.collectors.parsers.kmsg import wall_clock

    by_binary: dict[str, _Crashed] = {}
    for fault in faults:  # log order: later lines are later crashes
        crashed = by_binary.setdefault(fault.binary, _Crashed(fault.binary))
        crashed.crashes += 1
        if fault.pid in crashed.pids:
            crashed.pids.remove(fault.pid)
        crashed.pids.insert(0, fault.pid)
        crashed.last = fault
        crashed.last_time = wall_clock(fault, boot)
        if crashed.last_time is not None:
            crashed.times.append(crashed.last_time)
    return sorted(by_binary.values(), key=lambda c: (-(c.last_time or 0), -c.crashes, c.binary))


def where(fault) -> str:
    """'segfault at 0 ip 55b0cf3c7139 (file offset 0x1139)' for a person and `addr2line`."""
    text = fault.description
    if fault.address:
        text = f"segfault at {fault.address}" + text.removeprefix("segfault")
    if fault.ip:
        text += f" ip {fault.ip.lstrip('0') or '0'}"
    if fault.offset is not None:
        text += f" (file offset {fault.offset:#x})"
    elif fault.mapping_delta is not None:
        text += f" ({fault.mapping_delta:#x} into the mapping)"
    return text


def enrich(ctx, finding) -> None:
    """Every binary the kernel log saw die of a fatal trap: pids, count, last time and the
    faulting address, crashes inside the look-back first."""
    from fleetscope.collectors.parsers.kmsg import boot_time, log_clock, scan_kernel_log

    text = ctx.kernel_log()
    if text is None:
        return
    boot = ctx.read(ctx.last, PROC_STAT, boot_time)
    faults = scan_kernel_log(text, clock=log_clock(boot, ctx.last.time)).faults
    if not faults:
        return
    now = ctx.now()
    start = _look_back_start(ctx, now)
    binaries = crashed_binaries(faults, boot)
    recent = [c for c in binaries if c.last_time is not None and c.last_time >= start]
    shown = (recent or binaries)[:MAX_SUBJECTS]
    finding.subjects["binaries"] = [c.binary for c in shown]
    finding.subjects["pids"] = [pid for c in shown for pid in c.pids[:4]][:MAX_SUBJECTS * 4]
    for crashed in shown:
        pids = ", ".join(str(p) for p in crashed.pids[:10])
        finding.evidence.append({
            "signal": f"fatal traps of {crashed.binary} (pids {pids}), the last: "
                      f"{where(crashed.last)}",
            "value": crashed.crashes, "threshold": 0, "unit": "crashes"})
        if crashed.last_time is not None:
            finding.evidence.append({
                "signal": f"latest fatal trap of {crashed.binary} at {_utc(crashed.last_time)} "
                          f"({'within' if crashed.last_time >= start else 'before'} the "
                          "look-back)",
                "value": round(crashed.last_time, 3), "threshold": round(start, 3),
                "unit": "unix seconds"})
    parts = []
    for crashed in shown[:3]:
        pids = ", ".join(str(p) for p in crashed.pids[:3])
        ago = f", last {units.duration(max(0.0, now - crashed.last_time))} ago" \
            if crashed.last_time is not None else ""
        # the look-back's crashes, and beside them all the log's, as the evidence row counts
        inside = crashed.since(start)
        count = units.count(crashed.crashes, "time")
        if inside:
            count = f"{units.count(inside, 'time')} in the look-back" + (
                f" ({crashed.crashes} in the kernel log)" if inside < crashed.crashes else "")
        parts.append(f"{crashed.binary} crashed {count} (pid {pids}{ago}): "
                     f"{where(crashed.last)}")
    finding.extra_summary = "; ".join(parts)


def _utc(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "crash-loop", "agent-x86-09",
        "a new build of the tool-runner dereferences a NULL config pointer as soon as it "
        "starts; its supervisor restarts it every few seconds",
        "five `tool-runner[pid]: segfault at 0 ip ... error 4 in tool-runner[...]` kernel "
        "lines inside the window, each with a new pid",
        uptime_days=3.1, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 1.1),
        background=k.background(k.X86, 0.3, 0.02), segfaults=5)


RULE = Rule(
    id="crash-loop",
    severity="critical",
    # the pool whose processes run the crashing binary; a binary no pool runs explains none
    explains=EXPLAINS_POOL,
    symptom="a worker keeps restarting; tasks fail or are retried elsewhere",
    cause="a binary dies of a fatal trap (segfault, general protection fault, divide error, "
          "int3, a data abort on arm64) as soon as it runs, and its supervisor restarts it",
    action="roll back the build or config that started it; the faulting address and file "
           "offset (addr2line -f -e BINARY OFFSET) name the function; keep a core dump "
           "(systemd-coredump, ulimit -c) of one crash",
    summary="fatal traps (segfault and the like) in the kernel log, the last {value:duration} "
            "before the window's end",
    # As isa-mismatch reads SIGILLs: crashes still happening (the last 5 minutes), one
    # finding per node naming every crashing binary; crashes that stopped are said as ended,
    # older ones are only information: a node that once ran a bad build is not sick now.
    condition=Recent(_AGE, EVENT_ONGOING_SECONDS) | Recent(_POOL_AGE, EVENT_ONGOING_SECONDS),
    tiers=(Tier("warning", Recent(_AGE, CRASH_WINDOW),
                "fatal traps ended: the last {value:duration} before the window's end, none "
                "since", ENDED),
           Tier("info", _AGE >= 0,
                "earlier fatal traps, the last {value:duration} before the window's end",
                ENDED)),
    evidence=(
        Evidence("fatal traps (not SIGILL) in the kernel log",
                 Sum(Max(_CRASHES, by=(*NODE, "binary")), by=NODE), 0, "crashes"),
        Evidence("seconds since the last fatal trap", _AGE, EVENT_ONGOING_SECONDS, "s",
                 pick="min"),
        Evidence("pool processes replaced (new pid and start time) per minute", _RESTARTS, 0,
                 "1/min"),
    ),
    confidence=0.85,
    for_seconds=0,  # an event: a crash in the window is the finding
    # The kernel log was read (the same reader exports the SIGILL families, always present).
    present_if=("fleetscope_sigill_reports_suppressed_total",),
    enrich=enrich,
    views=(
        Panel("Fatal traps in the kernel log so far, per binary",
              Max(_CRASHES, by=(*NODE, "binary")), "crashes", narrow=False),
        Panel("Pool processes replaced per minute, per pool",
              Sum(Rate(Selector("fleetscope_pool_process_starts_total"), WINDOW),
                  by=(*NODE, "pool")) * 60, "1/min", narrow=False),
        Panel("New fatal traps per minute, per binary",
              Max(Rate(_CRASHES, 60, increase=True), by=(*NODE, "binary")), "crashes", 0.0,
              narrow=False),
    ),
    fleet=FleetFault(("chat",), 6, 12, effects=(
        # a new tool-runner build dies at start, restarted by its supervisor every ~20 s
        Set("process_start_rate", 0.05),
        Events("fleetscope_fatal_trap_crashes_total",
               "fleetscope_fatal_trap_last_crash_timestamp_seconds",
               {"binary": "tool-runner"}, every_s=20, ago=Noisy(1, 18, stream=91,
                                                                 per_minute=False)),
        # the pool restarting it runs tool-runner: the exporter writes its latest crash as
        # that pool's too (collectors/fatal_traps.py), the same moment
        Events(None, "fleetscope_pool_fatal_trap_last_crash_timestamp_seconds", pools="first",
               ago=Noisy(1, 18, stream=91, per_minute=False)),
    )),
    proof=Proof(scenario,
                summary=r"fatal traps \(segfault and the like\) in the kernel log, the last "
                        r"[\d.]+ (ms|s|min) before the window's end; tool-runner crashed 5 "
                        r"times in the look-back \(pid .*\): segfault at 0 \(error 4\) ip",
                subjects=("binaries", ["tool-runner"])),
)
