"""isa-mismatch: a binary built for a newer instruction set than this CPU dies with SIGILL.

Condition: a SIGILL crash in the kernel log in the last 5 minutes (critical: still
crashing); inside the 15-minute look-back but none since then, the crashes ended (a warning
of the ended phase, explaining no harm of now); older crashes are an `info` tier, in every
mode. Per pool where the crashing binary is one a pool's processes run (the alert names whose
workers die). Enrichment: one finding per node naming every binary that died, its pids,
crash times and the instruction that faulted (fleetscope/tools/isa_fault.py).
"""

from __future__ import annotations

import json

from fleetscope.collectors.base import NotAvailable
from fleetscope.collectors.cpu_features import CPUINFO
from fleetscope.collectors.shared import PROC_STAT
from fleetscope.core import units

from ..fleet import Events, FleetFault, Noisy
from ..model import ENDED, EXPLAINS_POOL, NODE, Evidence, Panel, Proof, Rule, Tier
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

RANK = 0  # ties between equally severe, equally confident findings: causes first
# Crashes this recent are the incident, older ones "earlier" (information), in every mode.
SIGILL_LOOKBACK = EVENT_LOOKBACK_SECONDS
MAX_SUBJECTS = 5

_SIGILL = Selector("fleetscope_sigill_crashes_total")
_PER_BINARY = Max(_SIGILL, by=(*NODE, "binary"))
_SIGILL_AGE = Time() - Max(Selector("fleetscope_sigill_last_crash_timestamp_seconds"), by=NODE)
# The same, per pool whose processes run the crashing binary (collectors/fatal_traps.py)
_POOL_SIGILL_AGE = Time() - Max(
    Selector("fleetscope_pool_sigill_last_crash_timestamp_seconds"), by=POOL)


def enrich(ctx, finding) -> None:
    """One finding per node: every binary the kernel log saw die of SIGILL, its pids,
    crash times, and the instruction that faulted with its extension
    (fleetscope/tools/isa_fault.py: the kernel's file offset, ip minus the mapping base, an
    arm64 Code: word; bytes `bundle record` kept when the binary is not here), else the
    whole-binary `isa check` as a last resort."""
    from fleetscope.collectors.parsers.cpuinfo import parse_cpuinfo
    from fleetscope.collectors.parsers.kmsg import boot_time, log_clock, scan_kernel_log
    from fleetscope.tools.isa_fault import crashed_binaries

    text = ctx.kernel_log()
    if text is None:
        return
    boot = ctx.read(ctx.last, PROC_STAT, boot_time)
    crashes = scan_kernel_log(text, clock=log_clock(boot, ctx.last.time)).crashes
    labelled = finding.labels.get("binary")
    if labelled:  # a per-binary finding describes its own binary only
        crashes = tuple(c for c in crashes if c.binary == labelled)
    if not crashes:
        return
    cpu = ctx.read(ctx.last, CPUINFO, parse_cpuinfo)
    try:
        captures = json.loads(ctx.last.read_text("cmd/sigill-faults.json"))
    except (NotAvailable, ValueError):
        captures = []
    now = ctx.now()
    locate = ctx.locate_binary if ctx.live else None
    binaries = crashed_binaries(
        crashes, boot, now, SIGILL_LOOKBACK, captures=captures if isinstance(
            captures, list) else [], locate=locate, read=ctx.isa_budget.capture,
        cpu_flags=cpu.features if cpu else frozenset(), cpu_arch=cpu.model.arch if cpu
        else "")
    # Every binary the log saw die, as the exporter's series name them all; the latest few
    # described in detail (decoding each costs).
    detailed = [b.binary for b in binaries]
    finding.subjects["binaries"] = detailed + [
        name for name in dict.fromkeys(c.binary for c in reversed(crashes))
        if name not in detailed]
    finding.subjects["pids"] = list(dict.fromkeys(
        pid for b in binaries for pid in b.pids))[:MAX_SUBJECTS * 4]
    parts, earlier = [], []
    scans = 3  # a whole-binary check of a big library costs seconds: the latest few only
    for crashed in binaries:
        if crashed.fault is None and scans and (crashed.recent or crashed.last_time is None):
            scans -= 1
            crashed.scan_missing = ctx.isa_check_missing(crashed.binary)
        finding.evidence.extend(_crash_evidence(crashed, now))
        (parts if crashed.recent or crashed.last_time is None else earlier).append(crashed)
    summary = [_crash_summary(c, now) for c in parts[:3]]
    if earlier:
        last = max(c.last_time for c in earlier)
        summary.append(f"earlier SIGILL crashes of {', '.join(c.binary for c in earlier[:3])}"
                       f"{' and others' if len(earlier) > 3 else ''}, last at "
                       f"{_utc(last)}")
    if ctx.live and ctx.isa_budget.reason():
        summary.append(ctx.isa_budget.reason())
    finding.extra_summary = "; ".join(summary)
    main = parts[0] if parts else binaries[0]
    if main.fault is None:  # the verdict rests on a whole-binary scan at best
        finding.confidence = min(finding.confidence, 0.6)


def _utc(when: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


def _crash_summary(crashed, now: float) -> str:
    fault = crashed.fault
    pids = ", ".join(str(p) for p in crashed.pids[:3])
    head = f"{crashed.binary} (pid {pids}" + (
        f", {units.duration(max(0, now - crashed.last_time))} ago)" if crashed.last_time else ")")
    if fault is not None and fault.text:
        verdict = ", ".join(f"{name} {'absent' if state == 'missing' else state} on this CPU"
                            for name, state in crashed.on_cpu.items()) or fault.note
        return f"{head} faulted on {fault.text}" + (f": {verdict}" if verdict else "") + \
            f" [{fault.source}]"
    if fault is not None:
        return f"{head}: {fault.note} [{fault.source}]"
    if crashed.scan_missing:
        return f"{head}: it uses {', '.join(crashed.scan_missing)}, which this CPU lacks " \
               "[whole-binary scan; the faulting instruction is unknown]"
    return f"{head}: faulting instruction unknown (the binary is not here and no bytes of " \
           "it were recorded)"


def _crash_evidence(crashed, now: float) -> list[dict]:
    """Evidence rows (the contract's four fields) for one crashed binary: its crashes with
    pids and latest time against the look-back, and the faulting instruction's verdict."""
    pids = ", ".join(str(p) for p in crashed.pids[:10])
    rows = [{"signal": f"SIGILL crashes of {crashed.binary} (pids {pids})",
             "value": crashed.crashes, "threshold": 0, "unit": "crashes"}]
    if crashed.last_time is not None:
        rows.append({"signal": f"latest SIGILL of {crashed.binary} at {_utc(crashed.last_time)} "
                               f"({'within' if crashed.recent else 'before'} the "
                               f"{SIGILL_LOOKBACK // 60} min look-back)",
                     "value": round(crashed.last_time, 3),
                     "threshold": round(now - SIGILL_LOOKBACK, 3), "unit": "unix seconds"})
    fault = crashed.fault
    if fault is not None:
        absent = [n for n, state in crashed.on_cpu.items() if state == "missing"]
        needs = f" needing {', '.join(fault.extensions)}" if fault.extensions else ""
        where = f" at file offset {fault.file_offset:#x}" if fault.file_offset is not None \
            else ""
        rows.append({"signal": f"faulting instruction of {crashed.binary}: "
                               f"{fault.text or 'undecodable bytes'}{needs}{where} "
                               f"(verdict from the {fault.source}, confidence "
                               f"{fault.confidence:.2f})" + (f"; {fault.note}" if fault.note
                                                             else ""),
                     "value": len(absent), "threshold": 0,
                     "unit": "extensions absent on this CPU"})
    elif crashed.scan_missing:
        rows.append({"signal": f"extensions {crashed.binary} uses that this CPU lacks: "
                               f"{', '.join(crashed.scan_missing)} (whole-binary scan, "
                               "confidence 0.50: the faulting instruction is unknown)",
                     "value": len(crashed.scan_missing), "threshold": 0, "unit": "extensions"})
    return rows


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.kp_scenario(
        "isa-mismatch", "agent-kp-04",
        "a new agent-runtime build was compiled with -march=native on a Kunpeng 930 (SVE) "
        "build host; on this Kunpeng 920 (TaiShan v110, no SVE) it dies with SIGILL as soon "
        "as it starts a task, and the kubelet restarts it",
        "four `agent-runtime[pid]: unhandled exception: undefined instruction in "
        "libagentcore.so` reports in the kernel log within three minutes, each with a new PID",
        uptime_days=11.9, procs=k.daemons(k.KUNPENG) + k.workers(k.KUNPENG, k.ONLINE_KP, 1.2,
                                                           threads=(6, 6, 6, 6)),
        background=k.background(k.KUNPENG, 0.1, 0.03), sigill=4)


RULE = Rule(
    id="isa-mismatch",
    severity="critical",
    # the pool whose processes run the crashing binary; a binary no pool runs explains none
    explains=EXPLAINS_POOL,
    symptom="some nodes crash as soon as a task starts",
    cause="a binary built for a newer instruction set than this node's CPU (e.g. "
          "-march=native on a newer stepping) dies with SIGILL",
    action="rebuild for the fleet's common baseline (no -march=native; x86-64-v2/v3 or "
           "armv8.2-a as the oldest stepping allows) and redeploy; fleetscope isa check BINARY "
           "names the missing extension",
    summary="SIGILL (illegal instruction) crashes, the last {value:duration} before the "
            "window's end",
    # Crashes still happening (the last 5 minutes, in every mode: see Recent), one finding
    # per node naming every crashing binary (enrichment; from Prometheus, the series'
    # `binary` labels). Crashes that stopped are said as ended; older ones are only
    # information: a node that once ran a bad build is not sick now.
    condition=(Recent(_SIGILL_AGE, EVENT_ONGOING_SECONDS)
               | Recent(_POOL_SIGILL_AGE, EVENT_ONGOING_SECONDS)),
    tiers=(Tier("warning", Recent(_SIGILL_AGE, SIGILL_LOOKBACK),
                "SIGILL crashes ended: the last {value:duration} before the window's end, "
                "none since", ENDED),
           Tier("info", _SIGILL_AGE >= 0,
                "earlier SIGILL crashes, the last {value:duration} before the window's end",
                ENDED)),
    evidence=(
        Evidence("SIGILL crashes in the kernel log", Sum(Max(_SIGILL, by=(*NODE, "binary")),
                                                         by=NODE), 0, "crashes"),
        Evidence("seconds since the last SIGILL crash", _SIGILL_AGE, EVENT_ONGOING_SECONDS, "s",
                 pick="min"),
        Evidence("SIGILL crashes of the binary that crashed most", _PER_BINARY, 0, "crashes",
                 names=("binaries", "binary")),
    ),
    confidence=0.9,
    for_seconds=0,  # an event: one crash in the window is the finding
    present_if=("fleetscope_sigill_reports_suppressed_total",),
    enrich=enrich,
    views=(
        Panel("SIGILL crashes in the kernel log so far, per binary",
              Max(_SIGILL, by=(*NODE, "binary")), "crashes", narrow=False),
        Panel("New SIGILL crashes per minute, per binary",
              Max(Rate(_SIGILL, 60, increase=True), by=(*NODE, "binary")), "crashes", 0.0,
              narrow=False),
    ),
    fleet=FleetFault(
        ("codegen",), "rack", 25,
        # llama-server built with -march=native on a Kunpeng 920B (SVE everywhere) crashes on
        # the steppings without SVE, restarted by the scheduler every minute
        cpu_models=("kp920-r1p0", "kp920-r1p1"),
        effects=(Events("fleetscope_sigill_crashes_total",
                        "fleetscope_sigill_last_crash_timestamp_seconds",
                        {"binary": "llama-server"}, every_s=60,
                        ago=Noisy(5, 40, stream=90, per_minute=False)),)),
    proof=Proof(scenario,
                summary=r"SIGILL \(illegal instruction\) crashes, the last [\d.]+ (ms|s|min) "
                        r"before the window's end; libagentcore\.so \(pid .*\) faulted on "
                        r"ptrue p0\.s: SVE absent",
                subjects=("binaries", ["libagentcore.so"])),
)
