"""Collector `pools`: what each workload pool of the config uses and waits for, per pool
(labels `pool`, `class`), never per process.

Inputs, per process of a pool (collectors/processes.py decides membership):

    proc/<pid>/stat        4242 (python3) S 1 ... 150 30 ... 8 0 91234 ...  (utime, stime in
                           USER_HZ ticks, fields 14-15, whole thread group; threads, field 20)
    proc/<pid>/status      voluntary_ctxt_switches:\t2 / nonvoluntary_ctxt_switches:\t1
    proc/<pid>/schedstat   84886 2950931 2   (field 2: ns runnable but waiting for a CPU)
    proc/<pid>/limits      Max open files            1024                 1048576    files
    proc/<pid>/fd_count    57   (bundles) or the entries of proc/<pid>/fd (a live host)
    proc/<pid>/cgroup      0::/kubepods.slice/online/agent-chat
    proc/<pid>/task/<tid>/{status,schedstat,syscall}, fd links, net/tcp: collectors/tasks.py
    proc/<pid>/net/tcp{,6} once per network namespace, and where it has a row with something
    waiting, the fd links proc/<pid>/fd/<n> -> socket:[73410] (a bundle: proc/<pid>/fd_sockets)
and per pool, the cgroup directories its processes live in, v1 or v2 alike (collectors/
cgroups.py finds them from /proc/<pid>/cgroup and the mounts; each read once a scrape):
    v2 sys/fs/cgroup/<path>/cpu.stat       usage_usec 97113019 / nr_periods 123456 / ...
       sys/fs/cgroup/<path>/cpu.max        200000 100000
       sys/fs/cgroup/<path>/cpu.pressure   some avg10=1.65 avg60=0.50 avg300=0.33 total=4410972
    v1 sys/fs/cgroup/cpu,cpuacct/<path>/cpu.stat  nr_periods 137 / nr_throttled 135 /
                                                  throttled_time 8400000000 (ns)
       .../cpu.cfs_quota_us 10000, .../cpu.cfs_period_us 100000, cpuacct.usage (ns)
       (v1 has no cpu.pressure)
    pids.current / pids.max / pids.events (`max 161`), in the v1 pids hierarchy or the v2
    directory; and RLIMIT_NPROC ("Max processes") from proc/<pid>/limits.
and the CPU topology (sys/devices/system/cpu/cpu*/topology/) for threads per physical core.

Per thread or per process? /proc/<pid>/stat CPU time covers the whole thread group
(fs/proc/array.c do_task_stat(..., whole=1)), but /proc/<pid>/status context switches
(task_context_switch_counts() prints p->nvcsw, p->nivcsw of that task) and /proc/<pid>/schedstat
(fs/proc/base.c proc_pid_schedstat(), that task's sched_info) are the thread-group leader's
only; verified on 6.18: a process whose 4 worker threads switched 4,437 times showed 21 in its
top-level status, and 400 busy threads on 2 cores switched ~1,100 times/s while the leader
showed 0-3/s. So the context switches, runnable threads, thread run delay and network waits
are read from every thread, /proc/<pid>/task/<tid>/{status,schedstat,syscall} (collectors/
tasks.py), cheapest first and at most TASKS_READ_PER_POOL threads a pool per scrape
(`fleetscope_pool_threads_read` says how many were); a single-threaded process costs no
task/ read at all. `fleetscope_pool_run_delay_seconds_total` stays the main thread's (the
event loop of an async worker); `fleetscope_pool_thread_run_delay_seconds_total` sums them
all. The cgroup's cpu.pressure covers every thread of the cgroup.

Network waits: a thread parked in a recv/poll/connect on a connected TCP socket is tracked
across scrapes while it stays in the same call (same syscall and arguments, no CPU time used);
`fleetscope_pool_blocked_network_threads` counts those parked longer than the config's
`blocked_call_seconds`, so the exported alert and the engine use one threshold. A wait on a
`work_queue_peers` address (the redis_url's among them) is a worker waiting for its next task
(BLPOP, XREADGROUP BLOCK): not a network wait. A wait first
seen counts from when its connection went silent (tcp_info, collectors/tasks.py). A thread
that has not run since the last scrape is still in the same call, so its syscall is not read
again. A bundle replayed sample by sample through one collector gives the same durations.

Connections that wait for the pool, read from the kernel alone (collectors/tasks.py): the
pool's sockets are the socket inodes of its processes' fds, counted once a pool however many
of its processes share one (a pre-fork server's listener); their rows of the TCP table say
what waits (parsers/net_tcp.py). `fleetscope_pool_connections_waiting{queue="accept"}` sums
the accept queues of the pool's listeners (connections the kernel completed that the process
has not accepted), `{queue="unread"}` counts its established connections holding received
bytes the process has not read; `fleetscope_pool_connections_retransmitting{state}` counts
its sockets with a retransmission outstanding: `syn_sent` a connect() whose SYNs go
unanswered, `established` data the peer does not acknowledge (other states as they come).
A namespace whose table has no such row costs no fd read (every pool in it reads 0); else at
most FD_LINKS_READ_PER_POOL fd links a pool are read (processes by pid, fds in order), and
none more in a namespace once every waiting socket of it is found to be the pool's.

Counters summed over processes would fall when a process exits, and Prometheus takes any fall
for a reset to zero: rate() would add the whole pre-fall sum, a spike of thousands of CPU
seconds. So each pool's counters are kept monotonic here, as a cgroup's usage_usec keeps the
time of exited tasks: a process that leaves keeps its last reading in the pool's total (what it
did between its last scrape and its exit is not counted), a process that reappears (a racing
listing) takes it back. The same holds for the cgroup counters when a pool's cgroup goes away
or is recreated (a fall in a cgroup's own counter is a new cgroup: its old total is kept).
These totals restart when the exporter restarts, which Prometheus handles as any reset.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Hashable, Iterator
from typing import NamedTuple

from fleetscope.core.bundle_format import KIB, MIB
from fleetscope.core.exposition import Family, counter, gauge, labels

from .base import Collector, Evidence, NotAvailable, Scrape, Signal
from .cgroups import Location, cgroup_mounts, locate, parse_hierarchies
from .parsers import ParseError, parse_int
from .parsers.cgroup import (
    PidsReading,
    parse_cfs_quota,
    parse_cpu_max,
    parse_cpu_stat,
    parse_pids,
    v1_cpu_stat,
)
from .parsers.process import (
    parse_limits,
    parse_pid_schedstat,
    parse_pid_stat,
    status_int,
)
from .parsers.procfs import parse_pressure
from .processes import CGROUP_REREAD_S, pool_processes, process_status
from .shared import proc_stat
from .tasks import (
    FD_LINKS_READ_PER_POOL,
    LOCK_WAIT,
    SLEEPING,
    TASKS_READ_PER_POOL,
    NetworkWait,
    PoolSockets,
    WaitTracker,
    network_namespace,
    pool_sockets,
    read_proc,
    read_task,
    socket_wait,
    task_ids,
)

CPU_DIR = "sys/devices/system/cpu"
CPU_ONLINE = f"{CPU_DIR}/online"
CGROUP_DIR = "sys/fs/cgroup"
# A process that left a pool is remembered this long in case a racing listing missed it.
GONE_TTL_SECONDS = 600.0
GONE_MAX = 65536
CGROUP_HINT = (
    "the pool's processes are in no cgroup directory visible under /sys/fs/cgroup (the "
    "exporter runs in its own cgroup namespace, or the cpu controller is not enabled)"
)


def _topology_id(text: str, what: str) -> int:
    # physical_package_id and core_id print "%d"; -1 means the firmware did not say.
    value = text.strip()
    digits = value[1:] if value.startswith("-") else value
    if not (digits.isdigit() and digits.isascii()):
        raise ParseError(f"{what}: expected an integer, got {value[:40]!r}")
    return int(value)


def _read_physical_cores(scrape: Scrape) -> int:
    cores: set[tuple[int, int | None, int]] = set()
    for name in scrape.listdir(CPU_DIR):
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        base = f"{CPU_DIR}/{name}/topology"
        try:
            package = _topology_id(scrape.read_text(f"{base}/physical_package_id"), base)
            core = _topology_id(scrape.read_text(f"{base}/core_id"), base)
        except NotAvailable:
            continue  # an offline CPU has no topology directory
        try:  # x86 numbers cores within a die on multi-die packages
            die: int | None = _topology_id(scrape.read_text(f"{base}/die_id"), base)
        except NotAvailable:
            die = None
        cores.add((package, die, core))
    if not cores:
        raise NotAvailable(f"/{CPU_DIR}/cpu*/topology does not exist")
    return len(cores)


def physical_cores(scrape: Scrape) -> int:
    """Physical cores of the node: distinct (package, die, core) of the online CPUs."""
    return scrape.memo("physical_cores", lambda: _read_physical_cores(scrape))


def open_fds(scrape: Scrape, pid: int) -> int:
    """Open file descriptors of a process.

    On a live host: the size Linux 6.2+ reports for proc/<pid>/fd (fs/proc/fd.c
    proc_fd_getattr(): the number of open fds, one stat() instead of a listing), else the
    listing's length (older kernels report size 0, and so does a process without fds). A
    recording's fd/ (a fixture tree) is listed: its size is the directory's. A bundle has no
    fd directory but proc/<pid>/fd_count (docs/bundle-format.md); it is looked up when fd/ is
    absent, which spares a live scrape a failed open per process.
    """
    live = scrape.evidence.live  # a live host's proc/ is procfs; a recording's is not
    for root in scrape.roots:
        path = os.path.join(root, f"proc/{pid}/fd")
        try:
            if live:
                size = os.stat(path).st_size
                if size > 0:
                    return size
            return len(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as err:
            raise NotAvailable(f"/proc/{pid}/fd: {err.strerror or err}") from None
    return parse_int(scrape.read_text(f"proc/{pid}/fd_count").strip(), f"/proc/{pid}/fd_count")


NOFILE, NPROC = "Max open files", "Max processes"


def nofile_soft_limit(text: str) -> int | None:
    """The soft RLIMIT_NOFILE from /proc/<pid>/limits text (None: unlimited)."""
    limits = soft_limits(text, (NOFILE,))
    if NOFILE not in limits:
        raise ParseError(f"/proc/<pid>/limits: no well-formed {NOFILE!r} row")
    return limits[NOFILE]


def soft_limits(text: str, rows: tuple[str, ...]) -> dict[str, int | None]:
    """The soft limits of `rows` found in /proc/<pid>/limits text (None: unlimited); only
    the header and those rows go through the parser, in one call."""
    kept = [text[: text.find("\n")]]
    for row in rows:
        start = text.find(f"\n{row}")
        if start >= 0:
            end = text.find("\n", start + 1)
            kept.append(text[start + 1: end if end >= 0 else len(text)])
    if len(kept) == 1:
        return {}
    limits = parse_limits("\n".join(kept))
    return {row: limits[row][0] for row in rows if row in limits}


class MonotonicSums:
    """Per-pool sums of per-member counters that never fall (see the module docstring).

    `update({member: (pool, value)})` returns {pool: total}. Members are processes
    ((pid, starttime): a pid reused by a new process is a new member) or cgroup directories.
    """

    def __init__(self, new_on_decrease: bool):
        # True: a member's counter that falls is a new incarnation (a recreated cgroup);
        # False: it is held at its highest value (a per-process counter never falls, except
        # the leader's context switches after a non-leader thread exec()s).
        self.new_on_decrease = new_on_decrease
        self._alive: dict[Hashable, tuple[str, int]] = {}
        self._gone: dict[Hashable, tuple[str, int, float]] = {}
        self._carry: dict[str, int] = {}

    def update(self, current: dict[Hashable, tuple[str, int]], now: float) -> dict[str, int]:
        carry, alive, gone = self._carry, self._alive, self._gone
        seen: dict[Hashable, tuple[str, int]] = {}
        for key, (pool, value) in current.items():
            previous = alive.pop(key, None)
            if previous is None and key in gone:
                old_pool, old_value, _ = gone.pop(key)
                carry[old_pool] -= old_value  # it was only missed: it takes its total back
                previous = (old_pool, old_value)
            if previous is not None:
                old_pool, old_value = previous
                if old_pool != pool:  # moved: its past stays with the pool it left
                    carry[old_pool] = carry.get(old_pool, 0) + old_value
                elif value < old_value:
                    if self.new_on_decrease:
                        carry[pool] = carry.get(pool, 0) + old_value
                    else:
                        value = old_value
            seen[key] = (pool, value)
        for key, (pool, value) in alive.items():  # not seen this scrape: exited or left
            carry[pool] = carry.get(pool, 0) + value
            gone[key] = (pool, value, now)
        self._alive = seen
        if gone:
            expired = [k for k, (_, _, at) in gone.items() if now - at > GONE_TTL_SECONDS]
            for key in expired:
                del gone[key]
            while len(gone) > GONE_MAX:
                del gone[next(iter(gone))]
        totals = dict(carry)
        for pool, value in seen.values():
            totals[pool] = totals.get(pool, 0) + value
        return totals


class SourceTally:
    """How one source fared over all processes: readable once is enough to be available."""

    __slots__ = ("ok", "error")

    def __init__(self) -> None:
        self.ok = 0
        self.error: Exception | None = None

    def fail(self, err: Exception) -> None:
        if self.error is None or isinstance(err, ParseError):
            self.error = err

    def report(self, scrape: Scrape, collector: str, source: str, hint: str = "") -> None:
        if not self.ok and self.error is None:
            return  # nothing to read (no process, no cgroup): no verdict
        if not self.ok:
            # Per-process records: a bad one costs its own metrics (the source says why),
            # never the collector's, even when it is the only one.
            hint = f": {hint}" if hint and not isinstance(self.error, ParseError) else ""
            scrape.sources[(collector, source)] = (False, f"{self.error}{hint}")
            return
        scrape.sources[(collector, source)] = (True, "")


class _PoolState:
    __slots__ = ("processes", "threads", "worst_fd", "nofile_min", "cgroups", "threads_read",
                 "task_budget", "runnable", "network_waits", "longest_wait", "blocked",
                 "pids_cgroups", "nproc_min", "lock_waits", "members", "sockets")

    def __init__(self) -> None:
        self.processes = 0
        self.threads = 0
        self.threads_read = 0
        self.task_budget = TASKS_READ_PER_POOL  # non-leader threads still to read
        self.runnable = 0
        self.network_waits = 0
        self.lock_waits = 0  # threads in a futex wait that ran since the last scrape
        self.longest_wait = 0.0
        self.blocked = 0
        self.worst_fd: tuple[float, int, int | None] | None = None  # ratio, fds, limit
        self.nofile_min: float | None = None
        self.nproc_min: float | None = None
        # cpu directory -> (its location, the v1 cpuacct directory or None)
        self.cgroups: dict[str, tuple[Location, str | None]] = {}
        self.pids_cgroups: dict[str, Location] = {}
        self.members: list[tuple[int, str]] = []  # (pid, network namespace) in order
        self.sockets: PoolSockets | None = None


class _CgroupReading(NamedTuple):
    stat: dict[str, int] | None
    quota_cpus: float | None
    stall_us: dict[str, int]  # some/full -> total


# cpu.stat keys summed per pool: (key, metric, help); *_usec are exported in seconds.
CGROUP_COUNTERS = (
    ("usage_usec", "fleetscope_pool_cgroup_cpu_usage_seconds_total",
     "CPU seconds used by the pool's cgroups (cpu.stat usage_usec), exited tasks included."),
    ("nr_periods", "fleetscope_pool_cgroup_cpu_periods_total",
     "Enforcement periods of the pool's cgroups with a cpu.max limit (cpu.stat nr_periods)."),
    ("nr_throttled", "fleetscope_pool_cgroup_cpu_throttled_periods_total",
     "Periods in which the pool's cgroups were throttled by cpu.max (cpu.stat nr_throttled); "
     "over periods it is the throttle ratio."),
    ("throttled_usec", "fleetscope_pool_cgroup_cpu_throttled_seconds_total",
     "Seconds the pool's cgroups were throttled by cpu.max (cpu.stat throttled_usec)."),
)


def _top_cgroups(paths: set[str]) -> list[str]:
    """The paths that have no ancestor in the set: a parent's cpu.stat already includes its
    children, so summing both would count them twice."""
    kept: set[str] = set()
    for path in sorted(paths, key=lambda p: (p.count("/"), p)):
        parts = path.split("/")
        if not any("/".join(parts[:i]) in kept for i in range(2, len(parts))):
            kept.add(path)
    return sorted(kept)


def _usable_cgroup(path: str) -> bool:
    # "" (not read), "/" (the root: the whole machine), and paths outside the exporter's
    # cgroup namespace ("/../kubepods/...") say nothing about the pool.
    return path.startswith("/") and path != "/" and "/../" not in path + "/" and "\n" not in path


# Pools configured (their series are there) but a family of them absent.
POOL_FAMILY_ABSENT = ("pools configured, but none of their processes gave these series: no "
                      "process matched them (fleetscope_pool_processes 0), or their files "
                      "were not read (a bundle recorded without them, a collector left out of "
                      "`collectors:`)")


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_pool_blocked_network_threads",
           "pool threads blocked on the network", "threads"),
    Signal("fleetscope_pool_network_wait_longest_seconds", "a pool's longest network wait", "s"),
    Signal("fleetscope_pool_cgroup_cpu_periods_total",
           "CPU quota periods of a pool's cgroups", "periods"),
    Signal("fleetscope_pool_cgroup_cpu_pressure_stall_seconds_total",
           "CPU pressure stall of a pool's cgroups", "s"),
    Signal("fleetscope_pool_cgroup_cpu_quota_cpus", "CPU limit of a pool's cgroups", "cpus"),
    Signal("fleetscope_pool_cgroup_cpu_throttled_periods_total",
           "throttled periods of a pool's cgroups", "periods"),
    Signal("fleetscope_pool_cgroup_cpu_throttled_seconds_total",
           "time a pool's cgroups were throttled", "s"),
    Signal("fleetscope_pool_cgroup_cpu_usage_seconds_total", "CPU time of a pool's cgroups", "s"),
    Signal("fleetscope_pool_cgroup_pids_current", "tasks in a pool's fullest pids cgroup", "tasks"),
    Signal("fleetscope_pool_cgroup_pids_limit",
           "pids.max of a pool's fullest pids cgroup", "tasks"),
    Signal("fleetscope_pool_cgroup_pids_limit_hits_total",
           "forks refused by a pool cgroup's pids.max", "forks"),
    Signal("fleetscope_pool_cgroup_pids_usage_ratio",
           "a pool's fullest pids cgroup, tasks over limit", "ratio"),
    Signal("fleetscope_pool_connections_retransmitting",
           "pool sockets with a retransmission outstanding", "connections"),
    Signal("fleetscope_pool_connections_waiting",
           "connections waiting for a pool's processes", "connections"),
    Signal("fleetscope_pool_context_switches_total",
           "context switches of a pool's threads", "switches"),
    Signal("fleetscope_pool_cpu_seconds_total", "CPU time of a pool's processes", "s"),
    Signal("fleetscope_pool_fd_usage_limit_fds", "fd limit of a pool's fullest process", "fds"),
    Signal("fleetscope_pool_fd_usage_open_fds", "open fds of a pool's fullest process", "fds"),
    Signal("fleetscope_pool_fd_usage_ratio",
           "a pool's fullest process, open fds over limit", "ratio"),
    Signal("fleetscope_pool_nproc_limit", "lowest RLIMIT_NPROC of a pool's processes", "tasks"),
    Signal("fleetscope_pool_process_starts_total", "processes that joined a pool", "processes"),
    Signal("fleetscope_pool_processes", "processes in a pool", "processes"),
    Signal("fleetscope_pool_run_delay_seconds_total",
           "run-queue wait of a pool's main threads", "s"),
    Signal("fleetscope_pool_runnable_threads", "runnable threads of a pool", "threads"),
    Signal("fleetscope_pool_thread_run_delay_seconds_total",
           "run-queue wait of a pool's threads", "s"),
    Signal("fleetscope_pool_threads", "threads of a pool's processes", "threads"),
    Signal("fleetscope_pool_threads_per_core", "a pool's threads per physical core", "threads"),
    Signal("fleetscope_pool_threads_read", "pool threads read this scrape", "threads"),
)


class PoolsCollector(Collector):
    name = "pools"
    evidence = Evidence(signals=SIGNALS,

        once=(CPU_ONLINE, f"{CPU_DIR}/cpu*/topology/*"),
        sampled=("sys/fs/cgroup/cgroup.controllers",
                 "proc/sys/net/ipv4/tcp_syn_linear_timeouts"),  # a SYN_SENT wait's age
        # never "environ": it holds every secret the process was started with
        per_process=("stat", "status", "schedstat", "cgroup", "cmdline", "limits"),
        per_cgroup={("cpu", 2): ("cpu.stat", "cpu.pressure", "cpu.max"),
                    ("cpu", 1): ("cpu.stat", "cpu.cfs_quota_us", "cpu.cfs_period_us"),
                    ("cpuacct", 1): ("cpuacct.usage",)},
        read_limits={"stat": 64 * KIB, "status": 64 * KIB, "schedstat": 4 * KIB,
                     "cgroup": 64 * KIB, "limits": 64 * KIB, "cmdline": 4 * MIB,
                     "fd_count": 4 * KIB, "cpu.stat": 64 * KIB, "cpu.max": 4 * KIB,
                     "cpu.pressure": 4 * KIB, "cpu.cfs_quota_us": 4 * KIB,
                     "cpu.cfs_period_us": 4 * KIB, "cpuacct.usage": 4 * KIB})
    missing_hints = (
        ("fleetscope_pool_", "no workload pools in the config: add `pools:` to it, each pool "
                             "with the `match:` its processes pass (docs/exporter.md; "
                             "on Kubernetes docs/kubernetes.md)"),
        ("fleetscope_pool_blocked_network", "threads' syscall files not readable (needs root "
                                            "or CAP_SYS_PTRACE), or a bundle recorded without "
                                            "them"),
        ("fleetscope_pool_connections_", "the pool processes' TCP tables (/proc/<pid>/net/tcp) "
                                         "or fd links not readable (another user's fd links "
                                         "need root), or a bundle recorded without them"),
    )

    @classmethod
    def why_missing(cls, prefix: str, present: set[str],
                    unavailable: frozenset[str] = frozenset()) -> str:
        if not any(name.startswith("fleetscope_pool_") for name in present):
            # No pool series at all: no pool is configured (a configured pool that matches
            # nothing still has fleetscope_pool_processes 0), whatever the narrower family's
            # usual reason.
            prefix = "fleetscope_pool_"
        elif prefix == "fleetscope_pool_":
            return POOL_FAMILY_ABSENT
        return super().why_missing(prefix, present, unavailable)

    def __init__(self, config):
        super().__init__(config)
        self.ticks_per_second = os.sysconf("SC_CLK_TCK")
        self._lock = threading.Lock()
        self._cpu = MonotonicSums(False)
        self._voluntary = MonotonicSums(False)
        self._nonvoluntary = MonotonicSums(False)
        self._run_delay = MonotonicSums(False)
        self._thread_delay = MonotonicSums(False)
        self._waits = WaitTracker()
        # thread key -> (CPU ns, its network wait or None) as of the last scrape
        self._parked: dict[Hashable, tuple[int | None, object]] = {}
        self._parked_next: dict[Hashable, tuple[int | None, object]] = {}
        # thread key -> its last TaskReading (a thread that has not run is not re-read)
        self._tasks: dict[Hashable, object] = {}
        self._tasks_next: dict[Hashable, object] = {}
        self._cgroup = {key: MonotonicSums(True) for key, _, _ in CGROUP_COUNTERS}
        self._stall = {kind: MonotonicSums(True) for kind in ("some", "full")}
        self._pid_hits = MonotonicSums(True)
        # (pid, starttime) -> (when read, its cpu and pids locations): live hosts only
        self._located: dict[Hashable, tuple] = {}
        self._located_next: dict[Hashable, tuple] = {}
        # (pid, starttime) -> (when read, its network namespace): live hosts only
        self._netns: dict[Hashable, tuple[float, str]] = {}
        self._netns_next: dict[Hashable, tuple[float, str]] = {}
        self._cores: tuple[tuple, int] | None = None  # (roots and online CPUs, cores)
        # (pid, start time) of the processes seen in the last two scrapes, and per pool the
        # processes that joined since the first: a pool whose pids keep changing restarts
        self._members: tuple[set, set] | None = None
        self._starts: dict[str, int] = {}

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        pools = self.config.pools
        if not pools:
            return
        processes = pool_processes(scrape, pools)  # the required source: the process list
        # Reading and updating the running totals together keeps them in reading order when
        # two scrapes overlap (two Prometheus replicas).
        with self._lock:
            families = self._collect(scrape, processes)
        yield from families

    def _collect(self, scrape: Scrape, processes) -> list[Family]:
        pools = self.config.pools
        state = {pool.name: _PoolState() for pool in pools}
        cpu: dict[Hashable, tuple[str, int]] = {}
        voluntary: dict[Hashable, tuple[str, int]] = {}
        nonvoluntary: dict[Hashable, tuple[str, int]] = {}
        run_delay: dict[Hashable, tuple[str, int]] = {}
        thread_delay: dict[Hashable, tuple[str, int]] = {}
        waits: dict[Hashable, tuple[tuple, int | None]] = {}
        wait_pool: dict[Hashable, str] = {}
        t_stat, t_status, t_sched, t_limits, t_fd, t_cgroup = (SourceTally() for _ in range(6))
        t_task, t_syscall = SourceTally(), SourceTally()
        t_table, t_links = SourceTally(), SourceTally()
        for process in processes:
            pid, pool = process.pid, process.pool.name
            base = f"proc/{pid}"
            try:
                stat = parse_pid_stat(read_proc(scrape, f"{base}/stat", True))
            except (NotAvailable, ParseError) as err:
                t_stat.fail(err)
                continue  # exited since the listing: not counted at all
            t_stat.ok += 1
            key = (pid, stat.starttime_ticks)
            acc = state[pool]
            acc.processes += 1
            acc.threads += stat.num_threads
            cpu[key] = (pool, stat.utime_ticks + stat.stime_ticks)
            # The leader is the first task: its files are the process's own.
            leader = key + (pid,)
            acc.threads_read += 1
            acc.runnable += stat.state == "R"
            try:
                status = process_status(scrape, pid)
                voluntary[leader] = (pool, status_int(status, "voluntary_ctxt_switches"))
                nonvoluntary[leader] = (pool, status_int(status, "nonvoluntary_ctxt_switches"))
                t_status.ok += 1
            except (NotAvailable, ParseError) as err:
                t_status.fail(err)
            runtime = None
            try:
                runtime, delay, _ = parse_pid_schedstat(
                    read_proc(scrape, f"{base}/schedstat", True))
                run_delay[key] = thread_delay[leader] = (pool, delay)
                t_sched.ok += 1
            except (NotAvailable, ParseError) as err:
                t_sched.fail(err)
            if stat.state in SLEEPING:
                acc.lock_waits += self._wait(scrape, pid, pid, leader, runtime, pool, waits,
                                             wait_pool, t_syscall)
            if stat.num_threads > 1 and acc.task_budget > 0:
                self._threads(scrape, pid, key, pool, acc, voluntary, nonvoluntary,
                              thread_delay, waits, wait_pool, t_task, t_syscall)
            try:
                limits = soft_limits(read_proc(scrape, f"{base}/limits", True),
                                     (NOFILE, NPROC))
                if NOFILE not in limits:
                    raise ParseError(f"/proc/{pid}/limits: no well-formed {NOFILE!r} row")
            except (NotAvailable, ParseError) as err:
                t_limits.fail(err)
            else:
                t_limits.ok += 1
                limit = limits[NOFILE]
                if NPROC in limits:
                    nproc = limits[NPROC]
                    nproc_bound = float("inf") if nproc is None else float(nproc)
                    if acc.nproc_min is None or nproc_bound < acc.nproc_min:
                        acc.nproc_min = nproc_bound
                bound = float("inf") if limit is None else float(limit)
                if acc.nofile_min is None or bound < acc.nofile_min:
                    acc.nofile_min = bound
                try:
                    fds = open_fds(scrape, pid)
                    t_fd.ok += 1
                except (NotAvailable, ParseError) as err:
                    t_fd.fail(err)
                else:
                    ratio = 0.0 if limit is None else fds / max(limit, 1)
                    worst = acc.worst_fd
                    if worst is None or (ratio, fds) > (worst[0], worst[1]):
                        acc.worst_fd = (ratio, fds, limit)
            self._locate_cgroups(scrape, process, key, acc, t_cgroup)
            acc.members.append((pid, self._namespace(scrape, pid, key)))
        self._parked, self._parked_next = self._parked_next, {}
        self._tasks, self._tasks_next = self._tasks_next, {}
        self._located, self._located_next = self._located_next, {}
        self._netns, self._netns_next = self._netns_next, {}
        for acc in state.values():
            acc.sockets = pool_sockets(scrape, acc.members, FD_LINKS_READ_PER_POOL, t_table,
                                       t_links)
        waited = self._waits.observe(waits, scrape.time)
        for thread, seconds in waited.items():
            acc = state[wait_pool[thread]]
            acc.network_waits += 1
            acc.longest_wait = max(acc.longest_wait, seconds)
            acc.blocked += seconds > self.config.blocked_call_seconds
        name = self.name
        t_stat.report(scrape, name, "proc/<pid>/stat")
        t_status.report(scrape, name, "proc/<pid>/status")
        t_sched.report(scrape, name, "proc/<pid>/schedstat",
                       "the kernel was built without CONFIG_SCHED_INFO")
        t_limits.report(scrape, name, "proc/<pid>/limits")
        t_fd.report(scrape, name, "proc/<pid>/fd", "reading other users' fds needs root")
        t_cgroup.report(scrape, name, "proc/<pid>/cgroup")
        t_task.report(scrape, name, "proc/<pid>/task/<tid>/status")
        t_syscall.report(scrape, name, "proc/<pid>/task/<tid>/syscall",
                         "reading another process's syscall and wchan needs root or "
                         "CAP_SYS_PTRACE")
        t_table.report(scrape, name, "proc/<pid>/net/tcp")
        t_links.report(scrape, name, "proc/<pid>/fd/<n>",
                       "reading another user's fd links needs root")

        now = scrape.time
        families: list[Family] = []
        pool_labels = {
            pool.name: labels(pool=pool.name, **{"class": pool.workload_class}) for pool in pools
        }
        families.extend(self._gauges(scrape, state, pool_labels))
        families.extend(self._thread_gauges(state, pool_labels, t_syscall))
        families.extend(self._connection_gauges(state, pool_labels))
        hz = self.ticks_per_second
        none_read = not processes
        counters = (
            (self._cpu, cpu, t_stat, "fleetscope_pool_cpu_seconds_total",
             "CPU seconds (user + system, /proc/<pid>/stat) of the pool's processes, all "
             "threads; processes that exited keep their last reading in the total.", hz, ""),
            (self._run_delay, run_delay, t_sched, "fleetscope_pool_run_delay_seconds_total",
             "Seconds the main thread of the pool's processes was runnable but waiting for a "
             "CPU (/proc/<pid>/schedstat field 2: the thread-group leader only).", 1e9, ""),
            (self._thread_delay, thread_delay, t_sched,
             "fleetscope_pool_thread_run_delay_seconds_total",
             "Seconds the threads of the pool's processes were runnable but waiting for a CPU, "
             "summed over every thread read (task/<tid>/schedstat field 2; see "
             "fleetscope_pool_threads_read).", 1e9, ""),
            (self._voluntary, voluntary, t_status, "fleetscope_pool_context_switches_total",
             "Context switches of the pool's threads, summed over every thread read "
             "(/proc/<pid>/task/<tid>/status; see fleetscope_pool_threads_read): voluntary "
             "(blocked) and nonvoluntary (preempted); threads that exited keep their last "
             "reading in the total.", 1, "voluntary"),
            (self._nonvoluntary, nonvoluntary, t_status, "fleetscope_pool_context_switches_total",
             "", 1, "nonvoluntary"),
        )
        by_name: dict[str, Family] = {}
        for sums, current, tally, metric, help_text, divisor, kind in counters:
            totals = sums.update(current, now)
            if not (tally.ok or none_read):
                continue
            family = by_name.get(metric)
            if family is None:
                family = by_name[metric] = counter(metric, help_text)
                families.append(family)
            for pool in pools:
                value = totals.get(pool.name, 0)
                value = value / divisor if divisor != 1 else value
                base = pool_labels[pool.name]
                family.add(value, base.plus(kind=kind) if kind else base)
        families.extend(self._cgroups(scrape, state, pool_labels, now))
        families.append(self._process_starts(cpu, pool_labels))
        return families

    def _locate_cgroups(self, scrape: Scrape, process, key: tuple, acc: _PoolState,
                        tally: SourceTally) -> None:
        """The process's cpu (and v1 cpuacct) and pids directories, v1 or v2; on a live
        host kept for CGROUP_REREAD_S once two reads agree, as the matcher keeps its cgroup path."""
        live = scrape.evidence.live
        cached = self._located.get(key) if live else None
        if cached is not None and cached[3] and 0 <= scrape.time - cached[0] < CGROUP_REREAD_S:
            tally.ok += 1
            _, cpu, pids, _ = cached
        else:
            mounts = cgroup_mounts(scrape)
            if process.cgroup and not mounts.v1:  # v2 only: the matcher's path is the one
                hierarchies = [("0", (), process.cgroup)]
            else:
                try:
                    hierarchies = parse_hierarchies(
                        read_proc(scrape, f"proc/{process.pid}/cgroup", True))
                    tally.ok += 1
                except (NotAvailable, ParseError) as err:
                    tally.fail(err)
                    return
            cpu = locate(mounts, hierarchies, "cpu")
            if cpu is not None and _usable_cgroup(cpu.path):
                cpuacct = locate(mounts, hierarchies, "cpuacct") if cpu.version == 1 else None
                cpu = (cpu, cpuacct.directory if cpuacct else None)
            else:
                cpu = None
            pids = locate(mounts, hierarchies, "pids")
            if pids is not None and not _usable_cgroup(pids.path):
                pids = None
            # kept once two reads agree: a worker moved into its cgroup just after it started
            # is first seen in its parent's
            settled = cached is not None and cached[1:3] == (cpu, pids)
            cached = (scrape.time, cpu, pids, settled)
        if live:
            self._located_next[key] = cached
        if cpu is not None:
            acc.cgroups.setdefault(cpu[0].directory, cpu)
        if pids is not None:
            acc.pids_cgroups.setdefault(pids.directory, pids)

    def _process_starts(self, members: dict, pool_labels: dict) -> Family:
        if self._members is not None:
            recent = self._members[0] | self._members[1]  # one missed listing is no restart
            for key, (pool, _) in members.items():
                if key not in recent:
                    self._starts[pool] = self._starts.get(pool, 0) + 1
        self._members = (self._members[1] if self._members else set(), set(members))
        starts = counter(
            "fleetscope_pool_process_starts_total",
            "Processes that joined the pool (a pid and start time not seen in the previous two "
            "scrapes) since the exporter's first scrape: a pool whose processes keep being "
            "replaced is restarting.")
        for pool, pool_label in pool_labels.items():
            starts.add(self._starts.get(pool, 0), pool_label)
        return starts

    def _wait(self, scrape: Scrape, pid: int, tid: int, key: Hashable, runtime: int | None,
              pool: str, waits: dict, wait_pool: dict, tally: SourceTally) -> bool:
        """Notes a sleeping thread's network wait; True when it sleeps in a futex wait and
        ran since the last scrape (taking turns on a lock; a thread parked on a condition
        variable for work does not run)."""
        # A thread that has not run since the last scrape (the same CPU time to the ns) is
        # still in the same call: its syscall is not read again, so a node of parked threads
        # costs no syscall reads after the first scrape.
        cached = self._parked.get(key)
        cycling = False
        if runtime is not None and cached is not None and cached[0] == runtime:
            wait = cached[1]
            tally.ok += 1
        else:
            try:
                found = socket_wait(scrape, pid, tid)
                tally.ok += 1
            except (NotAvailable, ParseError) as err:
                tally.fail(err)
                return False
            cycling = found == LOCK_WAIT and cached is not None
            wait = found if isinstance(found, NetworkWait) else None
            if wait is not None and wait.peer in self.config.work_queue_peers:
                wait = None  # waiting on the work queue for the next task: idle
        self._parked_next[key] = (runtime, wait)
        if wait is not None:
            waits[key] = (wait.signature, runtime, wait.idle_seconds)
            wait_pool[key] = pool
        return cycling

    def _threads(self, scrape: Scrape, pid: int, key: tuple, pool: str, acc: _PoolState,
                 voluntary: dict, nonvoluntary: dict, thread_delay: dict, waits: dict,
                 wait_pool: dict, t_task: SourceTally, t_syscall: SourceTally) -> None:
        """The non-leader threads of a process, within the pool's budget of threads read."""
        for tid in task_ids(scrape, pid):
            if tid == pid:
                continue
            if acc.task_budget <= 0:
                break
            acc.task_budget -= 1
            thread = key + (tid,)
            try:
                task = read_task(scrape, pid, tid, self._tasks.get(thread))
            except (NotAvailable, ParseError) as err:
                t_task.fail(err)
                continue  # exited since the listing
            t_task.ok += 1
            self._tasks_next[thread] = task
            acc.threads_read += 1
            acc.runnable += task.state == "R"
            voluntary[thread] = (pool, task.voluntary)
            nonvoluntary[thread] = (pool, task.nonvoluntary)
            if task.run_delay_ns is not None:
                thread_delay[thread] = (pool, task.run_delay_ns)
            if task.state in SLEEPING:
                acc.lock_waits += self._wait(scrape, pid, tid, thread, task.runtime_ns, pool,
                                             waits, wait_pool, t_syscall)

    def _namespace(self, scrape: Scrape, pid: int, key: Hashable) -> str:
        """The process's network namespace; on a live host kept CGROUP_REREAD_S, as its
        cgroup is: a process seldom changes namespace, and the link would otherwise be read
        for every process at every scrape."""
        cached = self._netns.get(key) if scrape.evidence.live else None
        if cached is None or not 0 <= scrape.time - cached[0] < CGROUP_REREAD_S:
            cached = (scrape.time, network_namespace(scrape, pid))
        if scrape.evidence.live:
            self._netns_next[key] = cached
        return cached[1]

    @staticmethod
    def _connection_gauges(state: dict, pool_labels: dict) -> list[Family]:
        waiting = gauge(
            "fleetscope_pool_connections_waiting",
            "Connections waiting for the pool's processes, from the kernel's TCP tables: "
            "queue=accept, completed by the kernel in the accept queue of the pool's "
            "listening sockets, not yet accepted (LISTEN rx_queue); queue=unread, the pool's "
            "established connections holding received bytes no process has read (rx_queue "
            f"> 0). Over the first {FD_LINKS_READ_PER_POOL} fds of the pool's processes.")
        retransmitting = gauge(
            "fleetscope_pool_connections_retransmitting",
            "The pool's TCP sockets with a retransmission outstanding (/proc/net/tcp "
            "retrnsmt > 0: timeouts in a row without an acknowledgement), by kernel state: "
            "syn_sent, a connect() whose SYNs go unanswered; established, data the peer "
            "does not acknowledge; others as they come.")
        for name, acc in state.items():
            if not (acc.sockets.known or acc.processes == 0):
                continue  # no process's sockets could be read: unknown, not 0
            base = pool_labels[name]
            rows = acc.sockets.waiting.values()
            waiting.add(sum(r.rx_queue for r in rows if r.state == "LISTEN"),
                        base.plus(queue="accept"))
            waiting.add(sum(1 for r in rows if r.state == "ESTABLISHED" and r.rx_queue),
                        base.plus(queue="unread"))
            states = {"syn_sent": 0, "established": 0}
            for row in rows:
                if row.retransmits:
                    kind = row.state.lower()
                    states[kind] = states.get(kind, 0) + 1
            for kind, count in states.items():
                retransmitting.add(count, base.plus(state=kind))
        return [family for family in (waiting, retransmitting) if family.samples]

    def _thread_gauges(self, state: dict, pool_labels: dict,
                       t_syscall: SourceTally) -> list[Family]:
        read = gauge("fleetscope_pool_threads_read",
                     "Threads of the pool's processes whose files were read this scrape "
                     "(every thread, up to fleetscope_pool_threads_read_limit a pool; a "
                     "bundle without task/ directories has the main threads only).")
        limit = gauge("fleetscope_pool_threads_read_limit",
                      "Most threads a pool has read per scrape (the cost bound).")
        runnable = gauge("fleetscope_pool_runnable_threads",
                         "Threads of the pool's processes in state R (running or waiting for "
                         "a CPU) at the scrape, over the threads read.")
        families = [read, limit, runnable]
        waiting = gauge("fleetscope_pool_network_wait_threads",
                        "Threads of the pool parked in a network call now (a sleeping "
                        "recv/read/poll/connect/send on a connected TCP socket, from "
                        "task/<tid>/syscall and the fd's socket).")
        longest = gauge("fleetscope_pool_network_wait_longest_seconds",
                        "Longest time a thread of the pool has stayed in the same network "
                        "call (same syscall and arguments, no CPU time used), counted from "
                        "the first scrape that saw it; 0 when none waits.")
        blocked = gauge("fleetscope_pool_blocked_network_threads",
                        "Threads of the pool parked in a network call for longer than the "
                        "config's blocked_call_seconds.")
        locked = gauge("fleetscope_pool_lock_wait_threads",
                       "Threads of the pool asleep in a futex wait (a mutex, semaphore or "
                       "condition variable) that ran since the previous scrape: taking turns "
                       "on a lock, or picking up work between waits.")
        if t_syscall.ok:  # unreadable syscall files (not root): no verdict, not 0
            families.extend((waiting, longest, blocked, locked))
        for name, acc in state.items():
            labels_ = pool_labels[name]
            read.add(acc.threads_read, labels_)
            limit.add(TASKS_READ_PER_POOL, labels_)
            runnable.add(acc.runnable, labels_)
            waiting.add(acc.network_waits, labels_)
            longest.add(round(acc.longest_wait, 3), labels_)
            blocked.add(acc.blocked, labels_)
            locked.add(acc.lock_waits, labels_)
        return families

    def _gauges(self, scrape: Scrape, state: dict, pool_labels: dict) -> list[Family]:
        processes = gauge("fleetscope_pool_processes", "Processes in the pool.")
        threads = gauge("fleetscope_pool_threads",
                        "Threads of the pool's processes (/proc/<pid>/stat num_threads).")
        per_core = gauge(
            "fleetscope_pool_threads_per_core",
            "Threads of the pool's processes per physical core of the node (distinct "
            "package/die/core of sys/devices/system/cpu/cpu*/topology; the online CPU count "
            "without topology). All threads, runnable or sleeping.",
        )
        cores = None
        with scrape.source(self.name, f"{CPU_DIR}/cpu*/topology"):
            cores = self._physical_cores(scrape)
        if cores is None:  # without topology every online CPU counts as a core
            try:
                cores = len(proc_stat(scrape).cpus) or None
            except (NotAvailable, ParseError):
                pass
        ratio = gauge(
            "fleetscope_pool_fd_usage_ratio",
            "Highest open fds / RLIMIT_NOFILE soft limit among the pool's processes (0 when "
            "unlimited); 'Too many open files' at 1.",
        )
        open_fd = gauge("fleetscope_pool_fd_usage_open_fds",
                        "Open fds of the pool's process with the highest fd usage ratio.")
        limit_fd = gauge(
            "fleetscope_pool_fd_usage_limit_fds",
            "RLIMIT_NOFILE soft limit of the pool's process with the highest fd usage ratio "
            "(+Inf: unlimited).",
        )
        nofile = gauge(
            "fleetscope_pool_nofile_limit",
            "Lowest RLIMIT_NOFILE soft limit among the pool's processes (/proc/<pid>/limits "
            "Max open files); the troubleshooting guide wants at least 65535.",
        )
        for name, acc in state.items():
            pool_label = pool_labels[name]
            processes.add(acc.processes, pool_label)
            threads.add(acc.threads, pool_label)
            if cores:
                per_core.add(round(acc.threads / cores, 6), pool_label)
            if acc.worst_fd is not None:
                worst_ratio, fds, limit = acc.worst_fd
                ratio.add(round(worst_ratio, 6), pool_label)
                open_fd.add(fds, pool_label)
                limit_fd.add(float("inf") if limit is None else limit, pool_label)
            if acc.nofile_min is not None:
                bound = acc.nofile_min
                nofile.add(int(bound) if bound != float("inf") else bound, pool_label)
        return [f for f in (processes, threads, per_core, ratio, open_fd, limit_fd, nofile)
                if f.samples]

    def _physical_cores(self, scrape: Scrape) -> int:
        """physical_cores(), re-read only when the online CPUs change: the topology of a CPU
        does not change while it is online, and reading it costs three files per CPU (some
        6 ms a scrape on 256 CPUs)."""
        try:
            key: tuple | None = (scrape.roots, scrape.read_text(CPU_ONLINE))
        except NotAvailable:
            key = None
        cached = self._cores
        if key is not None and cached is not None and cached[0] == key:
            return cached[1]
        cores = physical_cores(scrape)
        self._cores = (key, cores) if key is not None else None
        return cores

    @staticmethod
    def _read_cgroup(scrape: Scrape, where: tuple[Location, str | None],
                     tallies: dict) -> _CgroupReading:
        location, cpuacct = where
        directory = location.directory
        stat = quota = None
        stall: dict[str, int] = {}
        try:
            stat = parse_cpu_stat(scrape.read_text(f"{directory}/cpu.stat"),
                                  f"{directory}/cpu.stat")
            if location.version == 1:
                usage = None
                if cpuacct is not None:
                    with contextlib.suppress(NotAvailable, ParseError):
                        usage = parse_int(scrape.read_text(f"{cpuacct}/cpuacct.usage").strip(),
                                          f"{cpuacct}/cpuacct.usage")
                stat = v1_cpu_stat(stat, usage)
            tallies["cpu.stat"].ok += 1
        except (NotAvailable, ParseError) as err:
            tallies["cpu.stat"].fail(err)
        try:
            if location.version == 1:
                quota = parse_cfs_quota(scrape.read_text(f"{directory}/cpu.cfs_quota_us"),
                                        scrape.read_text(f"{directory}/cpu.cfs_period_us"),
                                        f"{directory}/cpu.cfs_quota_us").cpus
            else:
                quota = parse_cpu_max(scrape.read_text(f"{directory}/cpu.max"),
                                      f"{directory}/cpu.max").cpus
            tallies["cpu.max"].ok += 1
        except (NotAvailable, ParseError) as err:
            tallies["cpu.max"].fail(err)
        if location.version == 2:  # v1 has no per-cgroup pressure
            try:
                lines = parse_pressure(scrape.read_text(f"{directory}/cpu.pressure"),
                                       f"{directory}/cpu.pressure")
                stall = {kind: line.total_us for kind, line in lines.items()}
                tallies["cpu.pressure"].ok += 1
            except (NotAvailable, ParseError) as err:
                tallies["cpu.pressure"].fail(err)
        return _CgroupReading(stat, quota, stall)

    @staticmethod
    def _read_pids(scrape: Scrape, directory: str, tally: SourceTally) -> PidsReading | None:
        try:
            current = scrape.read_text(f"{directory}/pids.current")  # absent: no controller
            try:
                events = scrape.read_text(f"{directory}/pids.events")
            except NotAvailable:
                events = None  # kernels before 4.6 (and some bundles) have no pids.events
            reading = parse_pids(current, scrape.read_text(f"{directory}/pids.max"), events,
                                 f"{directory}/pids")
        except (NotAvailable, ParseError) as err:
            tally.fail(err)
            return None
        tally.ok += 1
        return reading

    def _cgroups(self, scrape: Scrape, state: dict, pool_labels: dict, now: float):
        tallies = {name: SourceTally() for name in ("cpu.stat", "cpu.max", "cpu.pressure")}
        readings: dict[str, _CgroupReading] = {}
        per_pool: dict[str, list[str]] = {}
        for name, acc in state.items():
            per_pool[name] = _top_cgroups(acc.cgroups)
            for path in per_pool[name]:
                if path not in readings:
                    readings[path] = self._read_cgroup(scrape, acc.cgroups[path], tallies)
        for file_name, tally in tallies.items():
            hint = CGROUP_HINT if file_name == "cpu.stat" else (
                "cpu.max and cpu.pressure need the cpu controller enabled in the parent's "
                "cgroup.subtree_control; cpu.pressure needs PSI")
            tally.report(scrape, self.name, f"{CGROUP_DIR}/<path>/{file_name}", hint)

        count = gauge("fleetscope_pool_cgroups",
                      "cgroup directories of the cpu controller (v1 or v2) the pool's "
                      "processes live in (outermost only) whose files the pool_cgroup "
                      "metrics sum.")
        quota = gauge(
            "fleetscope_pool_cgroup_cpu_quota_cpus",
            "CPU limit of the pool's cgroups in CPUs (cpu.max quota / period; v1 "
            "cpu.cfs_quota_us / cpu.cfs_period_us), summed over its cgroups; +Inf when one of "
            "them has no limit ('max', -1).",
        )
        families: list[Family] = [count, quota]
        counter_input: dict[str, dict] = {key: {} for key, _, _ in CGROUP_COUNTERS}
        stall_input: dict[str, dict] = {"some": {}, "full": {}}
        for name, paths in per_pool.items():
            count.add(len(paths), pool_labels[name])
            quotas = [readings[p].quota_cpus for p in paths if readings[p].quota_cpus is not None]
            if quotas:
                quota.add(sum(quotas), pool_labels[name])
            for path in paths:
                reading = readings[path]
                for key in counter_input:
                    if reading.stat is not None and key in reading.stat:
                        counter_input[key][(name, path)] = (name, reading.stat[key])
                for kind, total in reading.stall_us.items():
                    stall_input[kind][(name, path)] = (name, total)
        for key, metric, help_text in CGROUP_COUNTERS:
            totals = self._cgroup[key].update(counter_input[key], now)
            family = counter(metric, help_text)
            for name, total in totals.items():
                family.add(total / 1e6 if key.endswith("_usec") else total, pool_labels[name])
            families.append(family)
        stalled = counter(
            "fleetscope_pool_cgroup_cpu_pressure_stall_seconds_total",
            "Seconds in which some (stall=full: all) runnable tasks of the pool's cgroups "
            "waited for a CPU (cpu.pressure, PSI; v2 only): every thread, not only main "
            "threads.",
        )
        for kind in ("some", "full"):
            totals = self._stall[kind].update(stall_input[kind], now)
            for name, total in totals.items():
                stalled.add(total / 1e6, pool_labels[name].plus(stall=kind))
        families.append(stalled)
        families.extend(self._pids(scrape, state, pool_labels, now))
        return [f for f in families if f.samples]

    def _pids(self, scrape: Scrape, state: dict, pool_labels: dict, now: float):
        """Per pool: the cgroup closest to its pids.max (the fork that fails is refused by
        the first limit it meets), the forks refused at a limit (pids.events max), and the
        lowest RLIMIT_NPROC of its processes."""
        tally = SourceTally()
        readings: dict[str, PidsReading | None] = {}
        ratio = gauge("fleetscope_pool_cgroup_pids_usage_ratio",
                      "Highest pids.current / pids.max among the pool's cgroups (tasks: "
                      "processes and threads; 0 when none has a limit of its own); fork() "
                      "and pthread_create() fail with EAGAIN at 1.")
        current = gauge("fleetscope_pool_cgroup_pids_current",
                        "Tasks (processes and threads) in the pool's cgroup with the highest "
                        "pids usage ratio (pids.current).")
        limit = gauge("fleetscope_pool_cgroup_pids_limit",
                      "pids.max of that cgroup (+Inf: 'max', no limit of its own).")
        hits_input: dict[Hashable, tuple[str, int]] = {}
        nproc = gauge("fleetscope_pool_nproc_limit",
                      "Lowest RLIMIT_NPROC soft limit among the pool's processes "
                      "(/proc/<pid>/limits Max processes: tasks of the same user); +Inf when "
                      "unlimited.")
        for name, acc in state.items():
            if acc.nproc_min is not None:
                bound = acc.nproc_min
                nproc.add(int(bound) if bound != float("inf") else bound, pool_labels[name])
            worst = None
            for directory in _top_cgroups(acc.pids_cgroups):
                if directory not in readings:
                    readings[directory] = self._read_pids(scrape, directory, tally)
                reading = readings[directory]
                if reading is None:
                    continue
                if reading.limit_hits is not None:
                    hits_input[(name, directory)] = (name, reading.limit_hits)
                share = reading.current / max(reading.limit, 1) if reading.limit is not None \
                    else 0.0
                if worst is None or (share, reading.current) > worst[:2]:
                    worst = (share, reading.current, reading.limit)
            if worst is not None:
                ratio.add(round(worst[0], 6), pool_labels[name])
                current.add(worst[1], pool_labels[name])
                limit.add(float("inf") if worst[2] is None else worst[2], pool_labels[name])
        tally.report(scrape, self.name, f"{CGROUP_DIR}/<path>/pids.current",
                     "the pids controller is not mounted (v1) or not enabled in the parent's "
                     "cgroup.subtree_control (v2)")
        hits = counter("fleetscope_pool_cgroup_pids_limit_hits_total",
                       "Forks and thread creations refused by a pids.max, from the pool's "
                       "cgroups' pids.events max (v1 counts them in the cgroup of the task "
                       "that tried; v2 in the cgroup whose limit refused, and its parents).")
        for name, total in self._pid_hits.update(hits_input, now).items():
            hits.add(total, pool_labels[name])
        return [ratio, current, limit, hits, nproc]
