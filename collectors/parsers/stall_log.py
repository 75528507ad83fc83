"""Parser for the kernel's stall reports: hung tasks, soft lockups and RCU CPU stalls (what the
`hung-task` rule reads from the kernel log).

Hung tasks: kernel/hung_task.c check_hung_task(), run by khungtaskd every
hung_task_timeout_secs (120 by default), reports a task that stayed in TASK_UNINTERRUPTIBLE
(not killable) without being scheduled for that long, at most hung_task_warnings times (10):

    [26825.855448] INFO: task kworker/2:1:5747 blocked for more than 120 seconds.
    [26825.860651]       Tainted: G        W   E     4.19.0-6-amd64 #1 Debian 4.19.67-2+deb10u2
    [26825.866477] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.
    [34315.142345] task:jbd2/sda1-8     state:D stack:    0 pid:  161 ppid:     2 ...

`"INFO: task %s:%d blocked for more than %ld seconds."` (comm, pid; the comm may hold ':'
itself, as kworker names do, so the pid is after the last one), the same words from 2.6 to
6.x; then the taint line, the hint, sched_show_task()'s line and the stack, none of them a
report of its own. 6.14+ (CONFIG_DETECT_HUNG_TASK_BLOCKER) names the lock's owner after the
stack: `"INFO: task %s:%d is blocked on a mutex likely owned by task %s:%d."` (and "on a
semaphore likely last held by", "on an rw-semaphore likely owned by"). When the warnings
are spent: "Future hung task reports are suppressed, see sysctl kernel.hung_task_warnings".

Soft lockups: kernel/watchdog.c watchdog_timer_fn(): a CPU that did not schedule its
watchdog task for 2 * watchdog_thresh seconds (20), the task running on it in brackets:

    BUG: soft lockup - CPU#0 stuck for 67s! [java:1234]                         (3.10)
    NMI watchdog: BUG: soft lockup - CPU#2 stuck for 22s! [SimpleCacheWork:8140]   (4.0-4.14)
    watchdog: BUG: soft lockup - CPU#3 stuck for 27s! [swapper/3:0]             (4.15+)

(`"BUG: soft lockup - CPU#%d stuck for %us! [%s:%d]"`, pr_fmt before it by version; pid 0
is the CPU's idle task: the CPU was stuck in an interrupt, no process's doing.)

RCU CPU stalls (kernel/rcu/tree_stall.h): a CPU that did not pass through a quiescent state
for rcu_cpu_stall_timeout (21 s on most kernels), found by itself or by another CPU; the
stalled CPU on the same line (3.x) or the next record (4.x+: "\\t3-...: (5249 ticks ...)"):

    INFO: rcu_sched self-detected stall on CPU { 3}  (t=60000 jiffies g=... c=... q=...)
    rcu: INFO: rcu_preempt self-detected stall on CPU
    rcu:         0-....: (1 GPs behind) idle=3514/0/0x3 softirq=671080/671080 fqs=3762
    rcu: INFO: rcu_sched detected stalls on CPUs/tasks:
    rcu:    1-...!: (0 ticks this GP) idle=cf8/0/0x0 softirq=20/20 fqs=0

Lines are read through the kernel-log reader of parsers/kmsg.py (boot stamps, /dev/kmsg
records, syslog and journal prefixes; a LogClock times wall-clock stamps).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from . import ParseError
from .kmsg import MAX_NAME, LogClock, _message

HUNG_TASK, SOFT_LOCKUP, RCU_STALL = "hung_task", "soft_lockup", "rcu_stall"
KINDS = (HUNG_TASK, SOFT_LOCKUP, RCU_STALL)

_HUNG = re.compile(r"(?:INFO: )?task (?P<comm>.{1,64}):(?P<pid>[0-9]{1,10}) blocked for more "
                   r"than (?P<stuck>[0-9]{1,10}) seconds\.?", re.ASCII)
_BLOCKER = re.compile(r"(?:INFO: )?task (?P<comm>.{1,64}):(?P<pid>[0-9]{1,10}) is blocked on "
                      r"(?P<lock>an? [a-z-]{1,20}),? (?:likely (?:owned|last held) by task "
                      r"(?P<owner>.{1,64}):(?P<owner_pid>[0-9]{1,10})|but .{0,80})\.?",
                      re.ASCII)
_SOFT = re.compile(r"(?:(?:NMI )?watchdog: )?BUG: soft lockup - CPU#(?P<cpu>[0-9]{1,5}) stuck "
                   r"for (?P<stuck>[0-9]{1,10})s! \[(?P<comm>.{1,64}):(?P<pid>[0-9]{1,10})\]",
                   re.ASCII)
_RCU = re.compile(r"(?:rcu: )?INFO: (?P<flavor>rcu_[a-z_]{1,20}) (?:self-detected stall on CPU"
                  r"|detected stalls? on CPUs?/?(?:tasks)?:?)(?P<rest>.{0,200})", re.ASCII)
# the stalled CPU: "{ 3}" (3.x self-detected), "on CPU 0 (t=" (2.6/3.0), or the next record's
# "\t3-...: (5249 ticks this GP)" (4.x+, after "rcu: " on 5.x+)
_RCU_BRACE = re.compile(r"\{\s*([0-9]{1,5})[ }]", re.ASCII)
_RCU_OLD_CPU = re.compile(r"^\s*([0-9]{1,5}) \(t=", re.ASCII)
_RCU_CPU_LINE = re.compile(r"(?:rcu: )?\s*([0-9]{1,5})-[.0-9A-Za-z!]{1,8}: \(", re.ASCII)
_SUPPRESSED = "Future hung task reports are suppressed"
_WORDS = ("blocked", "soft lockup", "rcu_", _SUPPRESSED)


@dataclass(frozen=True, slots=True)
class Stall:
    """One stall report of the kernel."""

    kind: str  # HUNG_TASK, SOFT_LOCKUP or RCU_STALL
    comm: str  # the task named ("" for an RCU stall)
    pid: int | None
    cpu: int | None  # the stuck CPU (soft lockup, RCU stall)
    stuck: float | None  # seconds blocked (hung task) or stuck (soft lockup), as printed
    seconds: float | None  # when: seconds since boot, when the line carries a time
    blocker: str = ""  # hung task, 6.14+: "mutex owned by task X:PID"


@dataclass(frozen=True, slots=True)
class StallScan:
    stalls: tuple[Stall, ...]
    suppressed: bool  # hung_task_warnings ran out: later hung tasks go unreported
    lines: int


def scan_stalls(text: str, what: str = "kernel log", clock: LogClock | None = None
                ) -> StallScan:
    """Hung tasks, soft lockups and RCU stalls in `dmesg` text or /dev/kmsg records, in log
    order (`clock` times the lines that carry a wall-clock stamp).

    >>> scan = scan_stalls("[26825.855448] INFO: task kworker/2:1:5747 blocked for more "
    ...                    "than 120 seconds.\\n")
    >>> stall = scan.stalls[0]
    >>> stall.kind, stall.comm, stall.pid, stall.stuck, stall.seconds
    ('hung_task', 'kworker/2:1', 5747, 120.0, 26825.855448)
    """
    if "\x00" in text:
        raise ParseError(f"{what}: NUL bytes (not kernel log text)")
    stalls: list[Stall] = []
    suppressed = False
    lines = 0
    rcu_pending: int | None = None  # an RCU stall whose CPU the next record may name
    for line in text.splitlines():
        lines += 1
        if rcu_pending is None and not any(word in line for word in _WORDS):
            continue  # the cheap test first: most of a log is none of these
        parsed = _message(line, clock)
        if parsed is None:
            continue
        message, seconds = parsed
        message = message.strip()
        pending, rcu_pending = rcu_pending, None
        if pending is not None:
            cpu = _RCU_CPU_LINE.match(message)
            if cpu:
                stalls[pending] = replace(stalls[pending], cpu=int(cpu.group(1)))
                continue
        if "blocked for more than" in message:
            match = _HUNG.fullmatch(message)
            if match:
                stalls.append(Stall(HUNG_TASK, match.group("comm")[:MAX_NAME],
                                    int(match.group("pid")), None,
                                    float(match.group("stuck")), seconds))
            continue
        if " is blocked on " in message:
            match = _BLOCKER.fullmatch(message)
            if match and match.group("owner"):
                _blocked_by(stalls, int(match.group("pid")),
                            f"{match.group('lock').split(' ', 1)[1]} owned by task "
                            f"{match.group('owner')[:MAX_NAME]}:{match.group('owner_pid')}")
            continue
        if "soft lockup - CPU#" in message:
            match = _SOFT.fullmatch(message)
            if match:
                stalls.append(Stall(SOFT_LOCKUP, match.group("comm")[:MAX_NAME],
                                    int(match.group("pid")), int(match.group("cpu")),
                                    float(match.group("stuck")), seconds))
            continue
        if "rcu_" in message and "stall" in message:
            match = _RCU.fullmatch(message)
            if match:
                rest = match.group("rest")
                brace = _RCU_BRACE.search(rest) or _RCU_OLD_CPU.match(rest)
                stalls.append(Stall(RCU_STALL, "", None, int(brace.group(1)) if brace else None,
                                    None, seconds))
                if brace is None:
                    rcu_pending = len(stalls) - 1
            continue
        if message.startswith(_SUPPRESSED):
            suppressed = True
    return StallScan(tuple(stalls), suppressed, lines)


def _blocked_by(stalls: list[Stall], pid: int, blocker: str) -> None:
    """The latest hung-task report of `pid` learns what it waits for (printed after its
    stack)."""
    for index in range(len(stalls) - 1, max(-1, len(stalls) - 64), -1):
        if stalls[index].kind == HUNG_TASK and stalls[index].pid == pid:
            stalls[index] = replace(stalls[index], blocker=blocker)
            return
