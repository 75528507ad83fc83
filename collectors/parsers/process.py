"""Parsers for per-process files under /proc/<pid>/ (fs/proc/array.c, fs/proc/base.c).

    /proc/<pid>/stat       1234 (python3) S 1 1234 ... (52 fields; comm may hold spaces and ')')
    /proc/<pid>/status     Threads:\t64 / Cpus_allowed_list:\t64-95 / voluntary_ctxt_switches: ...
    /proc/<pid>/schedstat  84886 2950931 2   (ns on CPU, ns waiting on a run queue, timeslices)
    /proc/<pid>/cgroup     0::/kubepods.slice/online/agent-chat   (v2; v1 lines are N:ctrl:/path)
    /proc/<pid>/cmdline    python3\\0-m\\0agent.worker\\0
    /proc/<pid>/limits     Max open files            1024                 1048576              files
    /proc/<pid>/numa_maps  7f45.. default anon=2 dirty=2 N0=2 kernelpagesize_kB=4
    /proc/<pid>/task/<tid>/syscall  45 0x4 0x7f22bfb78a40 0xa 0x0 0x0 0x0 0x7f22bf97da10 0x7f22..
                           (nr, six args, sp, pc; "-1 sp pc" outside a syscall; "running")
    /proc/<pid>/task/<tid>/wchan    wait_woken   (where it sleeps in the kernel; "0" if running)
    /proc/<pid>/fd/<n>     a symlink: socket:[22523], pipe:[22505], /dev/null, ...
"""

from __future__ import annotations

from typing import NamedTuple

from . import ParseError, parse_int
from .cgroup import parse_hierarchies


class ProcStat(NamedTuple):
    comm: str
    state: str
    utime_ticks: int  # field 14, USER_HZ
    stime_ticks: int  # field 15
    num_threads: int  # field 20
    starttime_ticks: int  # field 22, since boot
    processor: int  # field 39: CPU it last ran on


def parse_pid_stat(text: str) -> ProcStat:
    """Parse /proc/<pid>/stat. comm sits in parentheses and may itself contain ') ', so the
    fields start after the LAST ')' (as procps does).

    >>> parse_pid_stat("42 (my (odd) name) R 1 42 42 0 -1 4194304 0 0 0 0 150 30 0 0 20 0 "
    ...                "3 0 1000 0 0 0 0 0 0 0 0 0 0 0 0 0 0 7 0 0 0 0 0").utime_ticks
    150
    """
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        raise ParseError("/proc/<pid>/stat: no (comm)")
    fields = text[close_paren + 1:].split()
    # fields[0] is field 3 (state); field N is fields[N - 3]
    if len(fields) < 37:
        raise ParseError(f"/proc/<pid>/stat: {len(fields) + 2} fields, expected at least 39")
    what = "/proc/<pid>/stat"
    return ProcStat(
        text[open_paren + 1:close_paren],
        fields[0],
        parse_int(fields[11], what),
        parse_int(fields[12], what),
        parse_int(fields[17], what),
        parse_int(fields[19], what),
        parse_int(fields[36], what),
    )


def parse_status(text: str) -> dict[str, str]:
    """Parse /proc/<pid>/status into {key: value} with values stripped.

    >>> parse_status("Name:\\tpython3\\nThreads:\\t64\\nCpus_allowed_list:\\t64-95\\n")["Threads"]
    '64'
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if line.strip():
                raise ParseError(f"/proc/<pid>/status: line without ':' {line[:40]!r}")
            continue
        fields[key] = value.strip()
    if "Name" not in fields:
        raise ParseError("/proc/<pid>/status: no Name line (truncated or not a status file)")
    return fields


def status_int(status: dict[str, str], key: str) -> int:
    """An integer field of a parsed status file ('VmRSS' -> kB value without the unit)."""
    value = status.get(key)
    if value is None:
        raise ParseError(f"/proc/<pid>/status: no {key} line")
    return parse_int(value.split()[0] if value else value, f"/proc/<pid>/status {key}")


def parse_pid_schedstat(text: str) -> tuple[int, int, int]:
    """Parse /proc/<pid>/schedstat: (ns on CPU, ns runnable but waiting, timeslices).

    >>> parse_pid_schedstat("84886 2950931 2\\n")
    (84886, 2950931, 2)
    """
    parts = text.split()
    if len(parts) != 3:
        raise ParseError("/proc/<pid>/schedstat: expected 3 numbers")
    on_cpu, waiting, slices = (parse_int(p, "/proc/<pid>/schedstat") for p in parts)
    return on_cpu, waiting, slices


def parse_cgroup(text: str) -> str:
    """The process's cgroup path: the v2 line (`0::/path`), else v1's cpu controller path.
    A hybrid host's v2 line at the root ("0::/": controllers all in v1) says nothing of
    where the process is: its v1 cpu path is taken then, or, at the root too, its first
    other v1 cgroup below the root.

    >>> parse_cgroup("0::/kubepods.slice/online/agent-chat\\n")
    '/kubepods.slice/online/agent-chat'
    >>> parse_cgroup("12:cpu,cpuacct:/batch\\n1:name=systemd:/init.scope\\n0::/\\n")
    '/batch'
    """
    v1_cpu = v2 = None
    v1_other = []  # other v1 hierarchies: controllers first, then named ones (name=systemd)
    for hierarchy, controllers, path in parse_hierarchies(text):
        if hierarchy == "0" and not controllers:
            v2 = path
        elif "cpu" in controllers:
            v1_cpu = path
        elif path != "/":
            v1_other.append((not controllers or controllers[0].startswith("name="), path))
    if v2 is not None and v2 != "/":
        return v2
    if v1_cpu is not None and v1_cpu != "/":
        return v1_cpu
    if v1_other:  # e.g. a worker placed in a pids cgroup only
        return min(v1_other)[1]
    if v1_cpu is None and v2 is None:
        raise ParseError("/proc/<pid>/cgroup: no v2 or cpu controller line")
    return "/"


def parse_cmdline(raw: str) -> str:
    """NUL-separated argv as one space-separated string ('' for kernel threads)."""
    return raw.rstrip("\0").replace("\0", " ")


def parse_limits(text: str) -> dict[str, tuple[int | None, int | None]]:
    """Parse /proc/<pid>/limits into {limit name: (soft, hard)}; None means unlimited.

    The table is printed with fixed columns (fs/proc/base.c proc_pid_limits:
    "%-25s %-20s %-20s %-10s"); names contain spaces, so columns are cut by position.

    >>> header = "Limit".ljust(26) + "Soft Limit".ljust(21) + "Hard Limit".ljust(21) + "Units"
    >>> row = "Max open files".ljust(26) + "1024".ljust(21) + "1048576".ljust(21) + "files"
    >>> parse_limits(header + "\\n" + row + "\\n")
    {'Max open files': (1024, 1048576)}
    """
    lines = text.splitlines()
    if not lines or not lines[0].startswith("Limit"):
        raise ParseError("/proc/<pid>/limits: no header line")
    limits: dict[str, tuple[int | None, int | None]] = {}
    for line in lines[1:]:
        if not line.strip():
            continue
        name = line[:26].strip()
        values = line[26:].split()
        if not name or len(values) < 2:
            raise ParseError(f"/proc/<pid>/limits: malformed line {line[:40]!r}")

        soft, hard = (
            None if token == "unlimited" else parse_int(token, f"/proc/<pid>/limits {name}")
            for token in values[:2]
        )
        limits[name] = (soft, hard)
    return limits


def parse_numa_maps(text: str) -> dict[int, int]:
    """Resident bytes per NUMA node from /proc/<pid>/numa_maps (mm/mempolicy.c show_numa_map):
    sums `N<node>=<pages>` times the line's `kernelpagesize_kB`.

    >>> parse_numa_maps("7f45 default anon=2 dirty=2 N0=2 N1=1 kernelpagesize_kB=4\\n"
    ...                 "7f46 default file=/lib/x.so huge N1=1 kernelpagesize_kB=2048\\n")
    {0: 8192, 1: 2101248}
    """
    per_node: dict[int, int] = {}
    for line in text.splitlines():
        if not line:
            continue
        page_kb = None
        pages: list[tuple[int, int]] = []
        for token in line.split()[2:]:
            key, eq, value = token.partition("=")
            if not eq:
                continue  # bare words: heap, stack, huge
            if key == "kernelpagesize_kB":
                page_kb = parse_int(value, "/proc/<pid>/numa_maps page size")
            elif key[:1] == "N" and key[1:].isdigit():
                pages.append((int(key[1:]), parse_int(value, "/proc/<pid>/numa_maps pages")))
        if pages and page_kb is None:
            raise ParseError(f"/proc/<pid>/numa_maps: no kernelpagesize_kB in {line[:40]!r}")
        for node, count in pages:
            per_node[node] = per_node.get(node, 0) + count * page_kb * 1024
    return per_node


STATUS_KEYS = ("State", "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches",
               "Cpus_allowed_list")


def status_values(text: str, keys: tuple[str, ...] = STATUS_KEYS) -> dict[str, str]:
    """The named fields of a /proc/<pid>/status text ("Key:\\tvalue" lines), as
    parsers/process.parse_status gives them but found directly: parsing all ~57 lines costs
    a quarter of a 500-process scrape. Missing keys are left out.

    >>> status_values("Name:\\tpython3\\nThreads:\\t4\\nCpus_allowed_list:\\t0-3\\n")
    {'Cpus_allowed_list': '0-3'}
    """
    if not text.startswith("Name:"):
        # A capture with a leading blank line (one in prometheus/procfs testdata/fixtures.ttar)
        # is still that process's status.
        text = text.lstrip()
        if not text.startswith("Name:"):
            raise ParseError("/proc/<pid>/status: no Name line (truncated or not a status file)")
        text = "\n" + text
    values: dict[str, str] = {}
    for key in keys:
        start = text.find(f"\n{key}:")
        if start < 0:
            continue
        start += len(key) + 2
        end = text.find("\n", start)
        values[key] = text[start: end if end >= 0 else len(text)].strip()
    return values


def status_state(status: dict[str, str]) -> str:
    """The one-letter task state of a parsed status ("S (sleeping)" -> "S"), "" if absent."""
    return status.get("State", "")[:1]


class TaskSyscall(NamedTuple):
    nr: int  # the architecture's syscall number
    args: tuple[int, ...]  # its six arguments, raw register values

    @property
    def signature(self) -> tuple[int, ...]:
        """What stays the same for as long as the thread stays in the same call."""
        return (self.nr, *self.args)


def parse_task_syscall(text: str) -> TaskSyscall | None:
    """Parse /proc/<pid>/task/<tid>/syscall (fs/proc/base.c proc_pid_syscall()): the call a
    blocked thread is in; None when it is running or blocked outside a syscall ("-1 sp pc",
    e.g. a page fault).

    >>> parse_task_syscall("45 0x4 0x7f22bfb78a40 0xa 0x0 0x0 0x0 0x7f22bf97da10 0x7f22c012\\n")
    TaskSyscall(nr=45, args=(4, 139787222092352, 10, 0, 0, 0))
    >>> parse_task_syscall("running\\n") is None, parse_task_syscall("-1 0x7ffd 0x4011\\n")
    (True, None)
    """
    parts = text.split()
    if parts == ["running"] or (parts and parts[0] == "-1" and len(parts) == 3):
        return None
    if len(parts) != 9:
        raise ParseError(f"/proc/<pid>/task/<tid>/syscall: {len(parts)} fields, expected 9")
    try:
        args = tuple(int(token, 16) for token in parts[1:7])
    except ValueError:
        raise ParseError("/proc/<pid>/task/<tid>/syscall: arguments are not hex") from None
    return TaskSyscall(parse_int(parts[0], "/proc/<pid>/task/<tid>/syscall"), args)


def parse_wchan(text: str) -> str:
    """The kernel function a task sleeps in (fs/proc/base.c proc_pid_wchan(): the symbol, or
    "0" when it runs or the address is not a symbol), without the compiler's clone suffix.

    >>> parse_wchan("poll_schedule_timeout.constprop.0"), parse_wchan("0")
    ('poll_schedule_timeout', '')
    """
    name = text.strip()
    return "" if name == "0" else name.split(".", 1)[0]


def socket_inode(link: str) -> int | None:
    """The inode of an fd symlink's target when the fd is a socket (fs/proc/fd.c: sockets
    read "socket:[<inode>]"), else None.

    >>> socket_inode("socket:[22523]"), socket_inode("pipe:[22505]")
    (22523, None)
    """
    if link.startswith("socket:[") and link.endswith("]"):
        inode = link[8:-1]
        if inode.isdigit() and inode.isascii():
            return int(inode)
    return None


def parse_fd_sockets(text: str) -> dict[int, tuple[int, int | None]]:
    """A bundle's proc/<pid>/fd_sockets (written by `bundle record`, not the kernel): one
    "fd inode [idle_ms]" line per socket fd a waiting thread of the process was in; idle_ms,
    where known, is how long the TCP connection had been silent (tcp_info).

    >>> parse_fd_sockets("4 22523 91500\\n7 22530\\n")
    {4: (22523, 91500), 7: (22530, None)}
    """
    sockets: dict[int, tuple[int, int | None]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) not in (2, 3):
            raise ParseError(f"proc/<pid>/fd_sockets: expected 'fd inode [idle_ms]', got "
                             f"{line[:40]!r}")
        idle = parse_int(parts[2], "fd_sockets idle_ms") if len(parts) == 3 else None
        sockets[parse_int(parts[0], "fd_sockets fd")] = (
            parse_int(parts[1], "fd_sockets inode"), idle)
    return sockets
