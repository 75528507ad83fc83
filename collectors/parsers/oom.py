"""Parsers for out-of-memory evidence: the OOM killer's kernel-log report and the memory
cgroup files (v1 and v2).

Kernel log (mm/oom_kill.c, 5.x/6.x; each report is several records, these three matter):

    memory: usage 65536kB, limit 65536kB, failcnt 201          (memcg OOM only,
                                                                 mem_cgroup_print_oom_meminfo)
    oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,
        oom_memcg=/h-oom-probe,task_memcg=/h-oom-probe,task=python3,pid=8953,uid=0
                                                                (dump_oom_summary, one record)
    Memory cgroup out of memory: Killed process 8953 (python3) total-vm:78092kB,
        anon-rss:65152kB, file-rss:6640kB, shmem-rss:0kB, UID:0 pgtables:200kB
        oom_score_adj:0                                         (__oom_kill_process, one record)

The kill line's prefix is the reason oom_kill_process() was given: "Out of memory" (the whole
machine), "Memory cgroup out of memory" (a memcg limit), "Out of memory
(oom_kill_allocating_task)". 4.x kernels print `Killed process 1234 (java) total-vm:...`
after a separate `Out of memory: Kill process 1234 (java) score 912 or sacrifice child`, whose
reason is the kill's even when a child of that task is the one killed; a memcg OOM there names
its cgroups in `Task in /a killed as a result of limit of /b`. The lines above were read
from this machine's 6.18 kernel after a real kill in a 64 MiB v1 cgroup. The `Killed process`
record is the kill; the summary and meminfo records before it (same pid) add the cgroup, the
limit and the usage.

Memory cgroup files:
- v1 (Documentation/admin-guide/cgroup-v1/memory.rst): memory.oom_control is flat keyed
  (`oom_kill_disable 0`, `under_oom 0`, `oom_kill 1`; oom_kill since 4.13), memory.failcnt,
  memory.limit_in_bytes, memory.usage_in_bytes are one number each.
- v2 (Documentation/admin-guide/cgroup-v2.rst): memory.events is flat keyed (`low`, `high`,
  `max`, `oom`, `oom_kill`, `oom_group_kill` since 5.18), memory.current one number,
  memory.max a number or `max`, memory.pressure a PSI file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import ParseError, parse_int
from .cgroup import parse_cpu_stat
from .kmsg import LogClock, _message

_KILLED = re.compile(
    r"(?:(?P<reason>[A-Za-z ()_]{1,64}): )?Killed process (?P<pid>[0-9]{1,10})"
    # RHEL 6 "Killed process N, UID U, (comm) total-vm:", RHEL 7 "(comm), UID U, total-vm:"
    r"(?:, UID [0-9]{1,10},)? \((?P<comm>[^\n]{0,64})\)(?:, UID [0-9]{1,10},)? "
    r"total-vm:(?P<vm>[0-9]{1,20})kB, anon-rss:(?P<anon>[0-9]{1,20})kB, "
    r"file-rss:(?P<file>[0-9]{1,20})kB.*", re.ASCII)
_OLD_KILL = re.compile(r"(?P<reason>[A-Za-z ()_]{1,64}): Kill process (?P<pid>[0-9]{1,10}) .*",
                       re.ASCII)
# mm/memcontrol.c mem_cgroup_print_oom_info() up to 4.18: the killed task's cgroup and the one
# whose limit was hit, before the "memory: usage" line (dump_oom_summary took its place in 4.19)
_TASK_IN = re.compile(r"Task in (?P<task>/\S{0,4096}) killed as a result of limit of "
                      r"(?P<limit>/\S{0,4096})", re.ASCII)
_SUMMARY = re.compile(r"oom-kill:constraint=CONSTRAINT_(?P<constraint>[A-Z_]{1,32}),(?P<rest>.*)",
                      re.ASCII)
_USAGE = re.compile(r"memory: usage (?P<usage>[0-9]{1,20})kB, limit (?P<limit>[0-9]{1,20})kB, "
                    r"failcnt (?P<failcnt>[0-9]{1,20})", re.ASCII)
_STAMP = re.compile(r"\[\s*([0-9]{1,12}\.[0-9]{1,9})\] ?", re.ASCII)
_CONSTRAINTS = {"NONE": "global", "MEMCG": "memcg", "CPUSET": "cpuset",
                "MEMORY_POLICY": "mempolicy"}
NO_LIMIT_KB = 1 << 50  # "limit 9007199254740988kB" is PAGE_COUNTER_MAX: no limit


@dataclass(frozen=True, slots=True)
class OomKill:
    """One process the OOM killer killed, as the kernel logged it."""

    pid: int
    comm: str
    constraint: str  # global | memcg | cpuset | mempolicy
    seconds: float | None  # kernel timestamp, seconds since boot
    anon_rss_kb: int
    file_rss_kb: int
    total_vm_kb: int
    memcg: str = ""  # task_memcg: the cgroup the killed task was in ("" when not printed)
    oom_memcg: str = ""  # the cgroup whose limit was hit (memcg OOM)
    usage_kb: int | None = None  # the memcg's usage and limit at the OOM (memcg OOM only)
    limit_kb: int | None = None
    failcnt: int | None = None


def _summary_fields(rest: str) -> dict[str, str]:
    """`nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/a,task_memcg=/a,task=x,pid=1,uid=0`;
    cgroup paths may hold commas, so fields are found by their names."""
    fields: dict[str, str] = {}
    for name, pattern in (("oom_memcg", r"oom_memcg=(.*?),task_memcg="),
                          ("task_memcg", r"task_memcg=(.*?),task="),
                          ("pid", r",pid=([0-9]{1,10}),uid=")):
        match = re.search(pattern, rest)
        if match:
            fields[name] = match.group(1)
    return fields


def scan_oom_kills(text: str, what: str = "kernel log",
                   clock: LogClock | None = None) -> list[OomKill]:
    """Every OOM kill in `dmesg` text or /dev/kmsg records, in log order (`clock` times the
    lines that carry a wall-clock stamp).

    >>> kill = scan_oom_kills(
    ...     "[  461.746414] memory: usage 65536kB, limit 65536kB, failcnt 201\\n"
    ...     "[  461.746573] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
    ...     "mems_allowed=0,oom_memcg=/w,task_memcg=/w,task=python3,pid=8953,uid=0\\n"
    ...     "[  461.746599] Memory cgroup out of memory: Killed process 8953 (python3) "
    ...     "total-vm:78092kB, anon-rss:65152kB, file-rss:6640kB, shmem-rss:0kB, UID:0 "
    ...     "pgtables:200kB oom_score_adj:0\\n")[0]
    >>> kill.pid, kill.comm, kill.constraint, kill.memcg, kill.limit_kb
    (8953, 'python3', 'memcg', '/w', 65536)
    """
    if "\x00" in text:
        raise ParseError(f"{what}: NUL bytes (not kernel log text)")
    kills: list[OomKill] = []
    usage: re.Match | None = None
    summary: tuple[str, dict[str, str]] | None = None
    old_reason: tuple[int, str] | None = None  # the last "Kill process" line's pid, reason
    for line in text.splitlines():
        parsed = _message(line, clock)
        if parsed is None:
            continue
        message, seconds = parsed
        message = message.rstrip()
        if message.startswith("["):  # syslog / journald: "kernel: [  518.050606] Out of ..."
            stamp = _STAMP.match(message)
            if stamp:
                seconds = seconds if seconds is not None else float(stamp.group(1))
                message = message[stamp.end():]
        if message.startswith("memory: usage "):
            usage = _USAGE.match(message)
            continue
        if message.startswith("Task in "):
            match = _TASK_IN.fullmatch(message)
            if match:
                summary = ("memcg", {"task_memcg": match.group("task"),
                                     "oom_memcg": match.group("limit")})
            continue
        if message.startswith("oom-kill:"):
            match = _SUMMARY.fullmatch(message)
            if match:
                summary = (_CONSTRAINTS.get(match.group("constraint"), "global"),
                           _summary_fields(match.group("rest")))
            continue
        if "Kill process " in message:
            match = _OLD_KILL.fullmatch(message)
            if match:
                old_reason = (int(match.group("pid")), match.group("reason"))
            continue
        if "Killed process " not in message:
            continue
        match = _KILLED.fullmatch(message)
        if not match:
            continue
        pid = int(match.group("pid"))
        # "Kill process A ... or sacrifice child" may be followed by the kill of A's child B:
        # the reason given for A is the reason B died
        reason = match.group("reason") or (old_reason[1] if old_reason else "")
        constraint = "memcg" if reason.startswith("Memory cgroup") else "global"
        fields: dict[str, str] = {}
        if summary is not None and summary[1].get("pid", str(pid)) == str(pid):
            constraint, fields = summary[0], summary[1]
        memcg_usage = usage if constraint == "memcg" else None
        limit = int(memcg_usage.group("limit")) if memcg_usage else None
        kills.append(OomKill(
            pid=pid, comm=match.group("comm"), constraint=constraint, seconds=seconds,
            anon_rss_kb=int(match.group("anon")), file_rss_kb=int(match.group("file")),
            total_vm_kb=int(match.group("vm")), memcg=fields.get("task_memcg", ""),
            oom_memcg=fields.get("oom_memcg", ""),
            usage_kb=int(memcg_usage.group("usage")) if memcg_usage else None,
            limit_kb=limit if limit is None or limit < NO_LIMIT_KB else None,
            failcnt=int(memcg_usage.group("failcnt")) if memcg_usage else None))
        usage = summary = old_reason = None
    return kills


# A cgroup flat-keyed file (`key value` lines: memory.events, memory.oom_control, and
# /proc/vmstat) parses as cpu.stat does.
parse_flat_keyed = parse_cpu_stat


def parse_bytes_or_max(text: str, what: str) -> int | None:
    """memory.max / memory.limit_in_bytes / memory.current: bytes, None for no limit (`max`
    on v2; v1 prints PAGE_COUNTER_MAX pages in bytes, 9223372036854771712 on 4 KiB pages)."""
    value = text.strip()
    if value == "max":
        return None
    number = parse_int(value, what)
    return None if number >= 1 << 62 else number


def memory_cgroup_path(text: str) -> tuple[str, str] | None:
    """(hierarchy, path) of the process's memory cgroup from /proc/<pid>/cgroup: the v1
    `N:...memory...:/path` line ("v1") when there is one, else the v2 `0::/path` line ("v2");
    None when neither is there.

    >>> memory_cgroup_path("4:memory:/w\\n0::/\\n")
    ('v1', '/w')
    >>> memory_cgroup_path("0::/kubepods.slice/chat\\n")
    ('v2', '/kubepods.slice/chat')
    """
    v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if "memory" in controllers.split(","):
            return "v1", path
        if hierarchy == "0" and controllers == "":
            v2 = path
    return ("v2", v2) if v2 is not None else None
