"""The kernel-log corpus (tests/fixtures/kmsg/corpus/): excerpts users pasted in public issues,
one file a case, and `cases.json`, which names each case's kind, kernel, arch, log form and
origin and the events read off the text by hand.

`read_case()` reads a case's file the way the collectors and the rules read a node's kernel
log (the parsers' entry points, on the file's text, on the clock of the node's boot time and
the time the log was read); `table()` is docs/kernel-log-corpus.md:

    python -m tests.kernel_log_corpus --table > docs/kernel-log-corpus.md

Times in cases.json: a number is seconds since boot (the kernel's stamp), a string the
wall-clock stamp as the log wrote it, taken as UTC ("YYYY-MM-DD HH:MM:SS", the year from the
case's `clock.read` where the stamp prints none), null when the line carries no time the
kernel's clock can be had from.
"""

from __future__ import annotations

import calendar
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

from fleetscope.collectors.parsers.kmsg import log_clock, scan_kernel_log
from fleetscope.collectors.parsers.oom import scan_oom_kills
from fleetscope.collectors.parsers.pids_log import fork_rejections
from fleetscope.collectors.parsers.stall_log import HUNG_TASK, SOFT_LOCKUP, scan_stalls
from fleetscope.collectors.parsers.syn_flood import syn_floods
from fleetscope.collectors.parsers.xid import xid_errors

CORPUS = Path(__file__).parent / "fixtures" / "kmsg" / "corpus"
MANIFEST = CORPUS / "cases.json"
# A case whose stamps carry no wall-clock time is read on this clock (any will do).
DEFAULT_CLOCK = {"boot": "2000-01-01 00:00:00", "read": "2000-01-02 00:00:00"}
KINDS = ("sigill", "segfault-or-trap", "oom-kill", "pid-exhaustion", "hung-task",
         "soft-lockup", "rcu-stall", "xid", "syn-flood", "negative")
EVENTS = ("sigill", "fault", "oom_kill", "fork_rejected", "hung_task", "soft_lockup",
          "rcu_stall", "xid", "syn_flood")


def utc(stamp: str) -> float:
    """Unix time of "YYYY-MM-DD HH:MM:SS[.ffffff]" taken as UTC."""
    whole, _, fraction = stamp.partition(".")
    seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%d %H:%M:%S"))
    return seconds + (float("0." + fraction) if fraction else 0.0)


def cases() -> list[dict]:
    return json.loads(MANIFEST.read_text())


def clock_of(case: dict) -> tuple[float, float]:
    """(boot time, time the log was read) of a case, Unix seconds."""
    clock = case.get("clock", DEFAULT_CLOCK)
    return utc(clock["boot"]), utc(clock["read"])


def read_case(case: dict) -> list[dict]:
    """Every event the parsers read in the case's file, in the fields of cases.json; `time`
    is seconds since boot as read (None when the line gave none)."""
    text = (CORPUS / case["file"]).read_text()
    boot, now = clock_of(case)
    clock = log_clock(boot, now)
    scan = scan_kernel_log(text, clock=clock)
    events = [{"event": "sigill", "task": c.comm, "pid": c.pid, "binary": c.binary,
               "time": c.seconds} for c in scan.crashes]
    events += [{"event": "fault", "task": f.comm, "pid": f.pid, "binary": f.binary,
                "time": f.seconds} for f in scan.faults]
    events += [{"event": "oom_kill", "task": k.comm, "pid": k.pid, "cgroup": k.memcg,
                "constraint": k.constraint, "time": k.seconds}
               for k in scan_oom_kills(text, clock=clock)]
    events += [{"event": "fork_rejected", "cgroup": path, "time": seconds}
               for path, seconds in fork_rejections(text, clock)]
    for stall in scan_stalls(text, clock=clock).stalls:
        if stall.kind == HUNG_TASK:
            events.append({"event": "hung_task", "task": stall.comm, "pid": stall.pid,
                           "time": stall.seconds})
        elif stall.kind == SOFT_LOCKUP:
            events.append({"event": "soft_lockup", "task": stall.comm, "pid": stall.pid,
                           "cpu": stall.cpu, "time": stall.seconds})
        else:
            events.append({"event": "rcu_stall", "cpu": stall.cpu, "time": stall.seconds})
    events += [{"event": "xid", "device": e.device, "code": e.code, "pid": e.pid,
                "task": e.name, "time": e.seconds} for e in xid_errors(text, clock)]
    events += [{"event": "syn_flood", "port": f.port, "time": f.seconds}
               for f in syn_floods(text, clock)]
    order = {name: index for index, name in enumerate(EVENTS)}
    return sorted(events, key=lambda event: order[event["event"]])  # log order within a kind


def expected(case: dict) -> list[dict]:
    """The case's events read by hand, grouped as read_case() lists them (by event kind, in
    log order within each), each time in seconds since boot on the case's clock."""
    boot, _ = clock_of(case)
    order = {name: index for index, name in enumerate(EVENTS)}
    events = []
    for event in sorted(case["events"], key=lambda e: order[e["event"]]):
        when = event["time"]
        events.append({**event, "time": utc(when) - boot if isinstance(when, str) else when})
    return events


def kernel_version(case: dict) -> tuple[int, int] | None:
    """(major, minor) of the case's kernel, None where the log and its issue name none."""
    match = re.match(r"([0-9]+)\.([0-9]+)", case["kernel"])
    return (int(match.group(1)), int(match.group(2))) if match else None


def _when(event: dict, boot: float, stamped: bool) -> str:
    """The time read: seconds since boot, or for a line the log stamped with the wall clock,
    that time again from the boot clock (so a wrong year or zone shows)."""
    seconds = event["time"]
    if seconds is None:
        return "-"
    if stamped:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(round(boot + seconds)))
    return f"{seconds:.6f} s"


def _fields(event: dict) -> str:
    shown = []
    for name in ("task", "pid", "binary", "cgroup", "constraint", "cpu", "device", "code",
                 "port"):
        if name in event and event[name] not in ("", None):
            shown.append(f"{name} `{event[name]}`")
    return ", ".join(shown)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table() -> str:
    """docs/kernel-log-corpus.md: every case as the parsers read it, by kind, kernel, arch."""
    def key(case: dict):
        version = kernel_version(case) or (99, 99)
        return KINDS.index(case["kind"]), version, case["arch"], case["file"]

    all_cases = sorted(cases(), key=key)
    out = [
        "# The kernel-log corpus",
        "",
        "Kernel-log excerpts as fleets write them, copied verbatim from public issues (only "
        "the lines kept), one file a case in `tests/fixtures/kmsg/corpus/`, with the events "
        "read off each by hand in `cases.json`. `tests/test_kernel_log_corpus.py` reads every "
        "file through the parsers the collectors and rules use and checks each field against "
        "that truth; negatives (kernel oopses, BUGs that are no process's crash) must yield "
        "no event. Generated by `python -m tests.kernel_log_corpus --table`: the rows below "
        "are what the parsers read now.",
        "",
        "Times: seconds since boot where the kernel's stamp gives them; a line stamped with the "
        "wall clock only (journal, syslog, `dmesg -T`) is put on the kernel's clock from the "
        "node's boot time, and shown here as the wall-clock time that gives back (stamps "
        "without a zone taken as UTC, without a year in the year the log was read). `-`: no "
        "time in the line (none printed, or `dmesg -H` deltas).",
        "",
        "## Cases by kind and arch",
        "",
    ]
    counts = Counter((case["kind"], case["arch"]) for case in all_cases)
    arches = sorted({case["arch"] for case in all_cases})
    out.append("| kind | " + " | ".join(arches) + " | total |")
    out.append("|---|" + "---|" * (len(arches) + 1))
    for kind in KINDS:
        row = [counts[(kind, arch)] for arch in arches]
        out.append(f"| {kind} | " + " | ".join(str(n) for n in row) + f" | {sum(row)} |")
    out.append("| all | " + " | ".join(str(sum(counts[(k, arch)] for k in KINDS))
                                        for arch in arches) + f" | {len(all_cases)} |")
    out += ["", "## Every case, as read", ""]
    out.append("| kind | kernel | arch | log form | file | events as read | origin |")
    out.append("|---|---|---|---|---|---|---|")
    for case in all_cases:
        boot, _ = clock_of(case)
        events = read_case(case)
        truths = sorted(case["events"], key=lambda e: EVENTS.index(e["event"]))
        stamped = [isinstance(t["time"], str) for t in truths] + [False] * len(events)
        shown = "<br>".join(f"{e['event']}: {_fields(e)}, time {_when(e, boot, wall)}"
                            for e, wall in zip(events, stamped, strict=False)) or "none"
        out.append("| " + " | ".join(_cell(cell) for cell in (
            case["kind"], case["kernel"], case["arch"], case["form"], f"`{case['file']}`",
            shown, case["origin"])) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--table"]:
        sys.exit("usage: python -m tests.kernel_log_corpus --table")
    sys.stdout.write(table())
