"""Collector `memory`: processes the OOM killer killed, and memory pressure before the kill
(the evidence of the `oom-kill` and `memory-pressure` rules).

Sources, each optional on its own (formats: collectors/parsers/oom.py):
- the kernel log: `... out of memory: Killed process <pid> (<comm>) ...` reports, global or
  memory-cgroup. Live: /dev/kmsg, read incrementally from the start of the ring (as the
  cpu_features collector reads SIGILLs); a bundle or fixture tree: dmesg.txt at the root.
  Each kill's Unix time is /proc/stat btime plus the log's seconds since boot.
- /proc/vmstat: `oom_kill` (every OOM kill since boot, global and memcg), reclaim scans and
  steals (`pgscan_kswapd`, `pgscan_direct`, `pgsteal_*`) and `allocstall_*` (allocations
  that had to reclaim memory themselves: direct reclaim, the stall an application feels).
- each pool's memory cgroup, found from /proc/<pid>/cgroup's own hierarchy line: v1
  `N:memory:/path` under the v1 memory mount (memory.oom_control, memory.failcnt,
  memory.limit_in_bytes, memory.usage_in_bytes), v2 `0::/path` under the cgroup2 mount
  (memory.events, memory.current, memory.max, memory.pressure). Mount points come from
  /proc/self/mountinfo on a live host, else the usual places (sys/fs/cgroup/memory for v1,
  sys/fs/cgroup and sys/fs/cgroup/unified for v2). Each distinct cgroup is read once per
  scrape. A pool's cgroup stays read for a while after its last process left it (the worker
  the OOM killer just killed is not there to point at it).

Per-pool counters stay monotonic across processes that die and cgroups that are recreated
(collectors/pools.py MonotonicSums): a pool whose workers are killed and restarted keeps
counting its kills.

Whether a logged kill still acts: each kill's memory cgroup (the one at its limit,
`oom_memcg=`, else the task's) is looked up at every scrape. The latest kill whose cgroup is
still there (a global kill: always) is `fleetscope_oom_kill_existing_cgroup_last_timestamp_
seconds`; a kill in a cgroup since removed (a job deleted, a test's cgroup gone) is history.
A kill in a cgroup of a pool (the same path, or one above or below it: a pod's container under
the pod cgroup that holds the limit) is that pool's, `fleetscope_pool_oom_kill_last_timestamp_
seconds{pool}`, so an alert names the pool whose workers died.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator

from fleetscope.core.exposition import Family, counter, gauge, labels
from fleetscope.core.units import TIME_UNIT

from .base import Collector, Evidence, NotAvailable, Scrape, Signal
from .cpu_features import DMESG, KMSG, _Kmsg, read_kernel_log, read_kmsg
from .parsers import ParseError
from .parsers.kmsg import LogClock, log_clock
from .parsers.oom import (
    OomKill,
    memory_cgroup_path,
    parse_bytes_or_max,
    parse_flat_keyed,
    scan_oom_kills,
)
from .parsers.procfs import parse_pressure
from .pools import GONE_TTL_SECONDS, MonotonicSums, _top_cgroups, _usable_cgroup
from .processes import _CgroupCache, pool_processes
from .shared import proc_stat
from .tasks import read_proc

CONSTRAINTS = ("global", "memcg")  # always exported; cpuset/mempolicy kills when they happen
MAX_KILL_CGROUPS = 64  # cgroups whose latest kill is kept: the most recently killed in
V1_MOUNTS = ("sys/fs/cgroup/memory",)
V2_MOUNTS = ("sys/fs/cgroup", "sys/fs/cgroup/unified")
MOUNTS_REREAD_S = 60.0
CGROUP_REREAD_S = 30.0  # a pool process's cgroup line is read again after this long
RECLAIM_MODES = ("kswapd", "direct", "khugepaged", "proactive")
# allocstall_<zone> since 4.10 (mm/vmstat.c vmstat_text); a kernel without a zone omits it
_VMSTAT_KEYS = ("oom_kill", *(f"{kind}_{mode}" for kind in ("pgscan", "pgsteal")
                              for mode in RECLAIM_MODES),
                *(f"allocstall_{zone}" for zone in ("dma", "dma32", "normal", "movable",
                                                    "device")))
_MODE_LABELS = tuple((mode, labels(mode=mode)) for mode in RECLAIM_MODES)
MEMCG_FILES = ("memory.oom_control", "memory.failcnt", "memory.limit_in_bytes",
               "memory.usage_in_bytes", "memory.events", "memory.current", "memory.max",
               "memory.pressure")
CGROUP_HINT = (
    "no pool process is in a memory cgroup below the root (v1 memory controller or cgroup2) "
    "visible under /sys/fs/cgroup"
)


def _boot_time(scrape: Scrape) -> float | None:
    """/proc/stat btime, from the parse the cpu and pressure collectors share."""
    try:
        btime = proc_stat(scrape).scalars.get("btime")
    except (NotAvailable, ParseError):
        return None
    return float(btime) if btime is not None else None


def _mounts_from_mountinfo(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(v1 memory mount points, cgroup2 mount points) relative to the root, from
    /proc/self/mountinfo (`36 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory`).
    Mounts of a cgroup subtree (root field other than "/") are left out: their paths do not
    join onto /proc/<pid>/cgroup's."""
    v1, v2 = [], []
    for line in text.splitlines():
        head, _, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if len(fields) < 5 or len(after) < 3 or fields[3] != "/":
            continue
        point = fields[4].lstrip("/")
        if after[0] == "cgroup2":
            v2.append(point)
        elif after[0] == "cgroup" and "memory" in after[2].split(","):
            v1.append(point)
    return tuple(v1), tuple(v2)


def read_mount_points(scrape: Scrape) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(v1 memory mounts, cgroup2 mounts) relative to the root: the live host's own from
    /proc/self/mountinfo, else the usual places (a bundle keeps files at those paths)."""
    if not scrape.evidence.live:
        return V1_MOUNTS, V2_MOUNTS
    try:
        v1, v2 = _mounts_from_mountinfo(scrape.read_text("proc/self/mountinfo"))
    except (NotAvailable, ParseError):
        v1, v2 = (), ()
    return v1 or V1_MOUNTS, v2 or V2_MOUNTS


def memory_cgroup_dirs(scrape: Scrape, members) -> list[str]:
    """The existing memory cgroup directories (relative to the root) of these pool members."""
    v1_mounts, v2_mounts = read_mount_points(scrape)
    found: set[str] = set()
    for process in members:
        try:
            line = memory_cgroup_path(read_proc(scrape, f"proc/{process.pid}/cgroup", True))
        except (NotAvailable, ParseError):
            continue
        if line is None or not _usable_cgroup(line[1]):
            continue
        for mount in v1_mounts if line[0] == "v1" else v2_mounts:
            directory = f"{mount}{line[1]}"
            if os.path.isdir(scrape.path(directory)):
                found.add(directory)
                break
    return sorted(found)


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_memory_allocation_stalls_total",
           "allocations stalled in direct reclaim", "stalls"),
    Signal("fleetscope_memory_reclaim_scanned_pages_total", "pages scanned for reclaim", "pages"),
    Signal("fleetscope_oom_kill_existing_cgroup_last_timestamp_seconds",
           "latest OOM kill in a cgroup that still exists", TIME_UNIT),
    Signal("fleetscope_oom_kill_last_timestamp_seconds",
           "latest OOM kill in the kernel log", TIME_UNIT),
    Signal("fleetscope_oom_kills_logged_total", "OOM kills the kernel logged", "kills"),
    Signal("fleetscope_pool_memory_high_events_total",
           "times a pool's cgroups went over memory.high", "events"),
    Signal("fleetscope_pool_memory_limit_hits_total",
           "times a pool's memory cgroups hit their limit", "hits"),
    Signal("fleetscope_pool_memory_oom_kills_total",
           "OOM kills in a pool's memory cgroups", "kills"),
    Signal("fleetscope_pool_memory_usage_ratio",
           "a pool's fullest memory cgroup, usage over limit", "ratio"),
    Signal("fleetscope_pool_oom_kill_last_timestamp_seconds",
           "latest OOM kill in a pool's memory cgroups", TIME_UNIT),
    Signal("fleetscope_vmstat_oom_kills_total", "OOM kills since boot (/proc/vmstat)", "kills"),
)


class MemoryCollector(Collector):
    name = "memory"
    evidence = Evidence(signals=SIGNALS,
                        sampled=("proc/meminfo", "proc/vmstat"))

    def __init__(self, config):
        super().__init__(config)
        self._lock = threading.Lock()
        self._kmsg: _Kmsg | None = None
        self._kills: Counter[str] = Counter()  # live kernel log: kills since the start
        self._last: dict[str, float] = {}  # constraint -> latest kill time
        # (constraint, cgroup) -> latest kill time ("" for a kill without a cgroup)
        self._kill_cgroups: dict[tuple[str, str], float] = {}
        self._dmesg: tuple[str, LogClock | None, list[OomKill]] | None = None
        self._mounts: tuple[float, tuple, tuple[tuple[str, ...], tuple[str, ...]]] | None = None
        self._member_cgroups = _CgroupCache()  # pid -> (v1|v2, path), as the matcher keeps
        self._known: dict[tuple[str, str, str], float] = {}  # (pool, v1|v2, path) -> seen
        self._oom_kills = MonotonicSums(True)
        self._limit_hits = MonotonicSums(True)
        self._high = MonotonicSums(True)
        self._stall = {kind: MonotonicSums(True) for kind in ("some", "full")}

    def close(self) -> None:
        with self._lock:
            kmsg, self._kmsg = self._kmsg, None
        if kmsg is not None:
            kmsg.close()

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        with self._lock:
            kill_cgroups: dict[tuple[str, str], float] | None = {}
            families = list(self._kernel_log(scrape, kill_cgroups))
            if not families:
                kill_cgroups = None  # the kernel log was not read: nothing to say of its kills
            with scrape.source(self.name, "proc/vmstat"):
                families.extend(self._vmstat(scrape))
            if self.config.pools:
                families.extend(self._pools(scrape))
            if kill_cgroups is not None:
                families.extend(self._kills_standing(scrape, kill_cgroups))
        yield from families

    # -- the kernel log ---------------------------------------------------------------------

    def _kernel_log(self, scrape: Scrape, kill_cgroups: dict[tuple[str, str], float]
                    ) -> Iterator[Family]:
        """The kernel log's kills (families), and each killed-in cgroup's latest kill time
        into `kill_cgroups`."""
        boot = _boot_time(scrape)
        try:
            source, (kills, last, cgroups) = read_kernel_log(scrape, {
                KMSG: lambda: self._read_kmsg(scrape, boot),
                DMESG: lambda: self._read_dmesg(scrape, boot)})
        except NotAvailable as err:
            scrape.sources[(self.name, KMSG)] = (False, str(err))
            return
        except ParseError as err:
            scrape.sources[(self.name, err.kernel_log)] = (False, str(err))
            scrape.errors.setdefault(self.name, str(err))
            return
        scrape.sources[(self.name, source)] = (True, "")
        kill_cgroups.update(cgroups)
        logged = counter(
            "fleetscope_oom_kills_logged_total",
            "Processes the OOM killer killed, as the kernel logged them ('Killed process'), by "
            "constraint: global (the machine ran out) or memcg (a memory cgroup's limit).")
        for constraint in sorted(set(CONSTRAINTS) | set(kills)):
            logged.add(kills.get(constraint, 0), labels(constraint=constraint))
        yield logged
        latest = gauge(
            "fleetscope_oom_kill_last_timestamp_seconds",
            "Unix time of the latest OOM kill in the kernel log, by constraint (boot time from "
            "/proc/stat btime plus the log's seconds since boot).")
        for constraint in sorted(last):
            latest.add(round(last[constraint], 3), labels(constraint=constraint))
        yield latest

    def _read_kmsg(self, scrape: Scrape, boot: float | None) -> tuple[dict, dict, dict]:
        try:
            self._kmsg, text = read_kmsg(self._kmsg, scrape)
        except NotAvailable:
            self._kmsg = None
            raise
        _account(self._kills, self._last, self._kill_cgroups,
                 scan_oom_kills(text, f"/{KMSG}"), boot)
        return dict(self._kills), dict(self._last), dict(self._kill_cgroups)

    def _read_dmesg(self, scrape: Scrape, boot: float | None) -> tuple[dict, dict, dict]:
        text = scrape.read_text(DMESG)
        clock = log_clock(boot, scrape.time)  # for lines stamped with the wall clock
        cached = self._dmesg
        if cached is None or cached[:2] != (text, clock):
            cached = self._dmesg = (text, clock, scan_oom_kills(text, f"/{DMESG}", clock))
        kills: Counter[str] = Counter()
        last: dict[str, float] = {}
        cgroups: dict[tuple[str, str], float] = {}
        _account(kills, last, cgroups, cached[2], boot)
        return dict(kills), last, cgroups

    def _kills_standing(self, scrape: Scrape, kill_cgroups: dict[tuple[str, str], float]
                        ) -> Iterator[Family]:
        """The latest kill whose cgroup is still there, per constraint; and per pool, the
        latest kill in one of its memory cgroups."""
        v1_mounts, v2_mounts = self._mount_points(scrape)
        standing = gauge(
            "fleetscope_oom_kill_existing_cgroup_last_timestamp_seconds",
            "Unix time of the latest OOM kill in the kernel log whose memory cgroup still "
            "exists (a global kill counts always), by constraint: a kill in a cgroup since "
            "removed no longer acts.")
        latest: dict[str, float] = {}
        for (constraint, path), when in kill_cgroups.items():
            if when <= latest.get(constraint, 0.0):
                continue
            if not path or _memcg_exists(scrape, path, v1_mounts, v2_mounts):
                latest[constraint] = when
        for constraint in sorted(latest):
            standing.add(round(latest[constraint], 3), labels(constraint=constraint))
        yield standing
        if not self.config.pools:
            return
        pool_of = {pool.name: pool for pool in self.config.pools}
        by_pool: dict[str, float] = {}
        for pool_name, _hierarchy, pool_path in self._known:
            for (_, path), when in kill_cgroups.items():
                if path and _related(path, pool_path) and when > by_pool.get(pool_name, 0.0):
                    by_pool[pool_name] = when
        family = gauge(
            "fleetscope_pool_oom_kill_last_timestamp_seconds",
            "Unix time of the latest OOM kill in the kernel log in one of the pool's memory "
            "cgroups (the same path, or one above or below it).")
        for name, when in sorted(by_pool.items()):
            if name in pool_of:
                family.add(round(when, 3), labels(
                    pool=name, **{"class": pool_of[name].workload_class}))
        yield family

    # -- /proc/vmstat -----------------------------------------------------------------------

    def _vmstat(self, scrape: Scrape) -> Iterator[Family]:
        # Only the keys used, found by name: the ~180 other lines are not parsed.
        text = "\n" + scrape.read_text("proc/vmstat")
        values: dict[str, int] = {}
        for key in _VMSTAT_KEYS:
            start = text.find(f"\n{key} ")
            if start < 0:
                continue
            start += len(key) + 2
            end = text.find("\n", start)
            value = text[start:end if end >= 0 else len(text)]
            if not (value.isdigit() and value.isascii()):
                raise ParseError(f"/proc/vmstat: {key}: expected a count, got {value[:20]!r}")
            values[key] = int(value)
        if "oom_kill" in values:  # 4.13+
            yield counter(
                "fleetscope_vmstat_oom_kills_total",
                "Processes killed by the OOM killer since boot, global and memcg "
                "(/proc/vmstat oom_kill).").add(values["oom_kill"])
        scanned = counter(
            "fleetscope_memory_reclaim_scanned_pages_total",
            "Pages scanned for reclaim (/proc/vmstat pgscan_<mode>): kswapd in the background, "
            "direct by the allocating task itself.")
        stolen = counter(
            "fleetscope_memory_reclaim_stolen_pages_total",
            "Pages reclaimed (/proc/vmstat pgsteal_<mode>).")
        for mode, mode_labels in _MODE_LABELS:
            if f"pgscan_{mode}" in values:
                scanned.add(values[f"pgscan_{mode}"], mode_labels)
            if f"pgsteal_{mode}" in values:
                stolen.add(values[f"pgsteal_{mode}"], mode_labels)
        if scanned.samples:
            yield scanned
        if stolen.samples:
            yield stolen
        stalls = [value for key, value in values.items() if key.startswith("allocstall")]
        if stalls:
            yield counter(
                "fleetscope_memory_allocation_stalls_total",
                "Allocations that entered direct reclaim (/proc/vmstat allocstall_*, all "
                "zones): a task stalled to free memory before it could go on.").add(sum(stalls))

    # -- the pools' memory cgroups ----------------------------------------------------------

    def _mount_points(self, scrape: Scrape) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if not scrape.evidence.live:
            return V1_MOUNTS, V2_MOUNTS
        cached = self._mounts
        if cached is not None and cached[1] == scrape.roots and \
                0 <= time.monotonic() - cached[0] < MOUNTS_REREAD_S:
            return cached[2]
        mounts = read_mount_points(scrape)
        self._mounts = (time.monotonic(), scrape.roots, mounts)
        return mounts

    def _member_cgroup(self, scrape: Scrape, process) -> tuple[str, str] | None:
        """(v1|v2, path) of a pool process's memory cgroup; cached a while on a live host once
        two reads agree (a worker its supervisor moves into its cgroup after starting it is
        first seen in its parent's)."""
        key = (scrape.roots, str(process.pid))
        live = scrape.evidence.live
        cached = self._member_cgroups.get(key, process.cmdline, scrape.time) if live else None
        if cached is not None:
            return cached
        found = memory_cgroup_path(read_proc(scrape, f"proc/{process.pid}/cgroup", True))
        if live:
            self._member_cgroups.put(key, process.cmdline, found, scrape.time)
        return found

    def _pools(self, scrape: Scrape) -> Iterator[Family]:
        now = scrape.time
        pools = self.config.pools
        live_pids = set()
        for process in pool_processes(scrape, pools):
            live_pids.add(str(process.pid))
            try:
                found = self._member_cgroup(scrape, process)
            except (NotAvailable, ParseError):
                continue
            if found is not None and _usable_cgroup(found[1]):
                self._known[(process.pool.name, *found)] = now
        self._member_cgroups.keep(scrape.roots, live_pids)
        for key in [k for k, seen in self._known.items() if now - seen > GONE_TTL_SECONDS]:
            del self._known[key]
        v1_mounts, v2_mounts = self._mount_points(scrape)
        readings: dict[tuple[str, str], dict | None] = {}
        by_pool: dict[str, list[tuple[str, str]]] = {}
        for pool_name, hierarchy, path in sorted(self._known):
            by_pool.setdefault(pool_name, []).append((hierarchy, path))
        oom, hits, high = {}, {}, {}
        stall: dict[str, dict] = {"some": {}, "full": {}}
        fullest: dict[str, tuple[float, int, int | None, int]] = {}
        usage_sum: dict[str, int] = {}
        read_any = False
        for pool_name, members in by_pool.items():
            for hierarchy in ("v1", "v2"):
                paths = _top_cgroups({p for h, p in members if h == hierarchy})
                for path in paths:
                    if (hierarchy, path) not in readings:
                        readings[(hierarchy, path)] = _read_memcg(
                            scrape, hierarchy, path, v1_mounts if hierarchy == "v1"
                            else v2_mounts)
                    reading = readings[(hierarchy, path)]
                    if reading is None:
                        self._known.pop((pool_name, hierarchy, path), None)
                        continue
                    read_any = True
                    key = (hierarchy, path)
                    oom[key] = (pool_name, reading["oom_kill"])
                    hits[key] = (pool_name, reading["limit_hits"])
                    if "high" in reading:
                        high[key] = (pool_name, reading["high"])
                    for kind in ("some", "full"):
                        if kind in reading.get("stall_us", {}):
                            stall[kind][key] = (pool_name, reading["stall_us"][kind])
                    usage, limit = reading["usage"], reading["limit"]
                    usage_sum[pool_name] = usage_sum.get(pool_name, 0) + usage
                    ratio = usage / limit if limit else 0.0
                    candidate = (ratio, usage, limit, reading["under_oom"])
                    if pool_name not in fullest or candidate[:2] > fullest[pool_name][:2]:
                        fullest[pool_name] = candidate
        scrape.sources[(self.name, "sys/fs/cgroup/<memory cgroup>")] = (
            (True, "") if read_any else (False, CGROUP_HINT))
        pool_labels = {pool.name: labels(pool=pool.name, **{"class": pool.workload_class})
                       for pool in pools}
        for sums, current, metric, help_text in (
                (self._oom_kills, oom, "fleetscope_pool_memory_oom_kills_total",
                 "Processes of the pool's memory cgroups killed by the OOM killer (v1 "
                 "memory.oom_control oom_kill, v2 memory.events oom_kill); kept across "
                 "recreated cgroups."),
                (self._limit_hits, hits, "fleetscope_pool_memory_limit_hits_total",
                 "Times the pool's memory cgroups hit their limit (v1 memory.failcnt, v2 "
                 "memory.events max): each is reclaim or an OOM kill ahead."),
                (self._high, high, "fleetscope_pool_memory_high_events_total",
                 "Times the pool's cgroups went over memory.high and were throttled into "
                 "reclaim (v2 memory.events high).")):
            totals = sums.update(current, now)
            family = counter(metric, help_text)
            for pool in pools:
                if pool.name in totals:
                    family.add(totals.get(pool.name, 0), pool_labels[pool.name])
            if family.samples:
                yield family
        stalled = counter(
            "fleetscope_pool_memory_stall_seconds_total",
            "Seconds some (or all, stall=full) tasks of the pool's cgroups stalled on memory "
            "(v2 memory.pressure, PSI); v1 has no per-cgroup pressure.")
        for kind in ("some", "full"):
            totals = self._stall[kind].update(stall[kind], now)
            for name, value in sorted(totals.items()):
                if name in pool_labels:
                    stalled.add(value / 1e6, pool_labels[name].plus(stall=kind))
        if stalled.samples:
            yield stalled
        usage_family = gauge(
            "fleetscope_pool_memory_usage_bytes",
            "Memory charged to the pool's memory cgroups (v1 memory.usage_in_bytes, v2 "
            "memory.current), summed over its top cgroups.")
        limit_family = gauge(
            "fleetscope_pool_memory_limit_bytes",
            "Memory limit of the pool's fullest cgroup (v1 memory.limit_in_bytes, v2 "
            "memory.max); absent without a limit.")
        ratio_family = gauge(
            "fleetscope_pool_memory_usage_ratio",
            "Usage over limit of the pool's fullest memory cgroup (0 without a limit).")
        under_family = gauge(
            "fleetscope_pool_memory_under_oom",
            "1 while the pool's fullest cgroup is under OOM (v1 memory.oom_control under_oom).")
        for name, (ratio, _usage, limit, under) in sorted(fullest.items()):
            base = pool_labels[name]
            usage_family.add(usage_sum[name], base)
            ratio_family.add(round(ratio, 6), base)
            under_family.add(under, base)
            if limit is not None:
                limit_family.add(limit, base)
        for family in (usage_family, limit_family, ratio_family, under_family):
            if family.samples:
                yield family


def _read_memcg(scrape: Scrape, hierarchy: str, path: str, mounts: tuple[str, ...]
                ) -> dict | None:
    """One memory cgroup's counters, or None when it is not there (removed, or the
    controller is not enabled on it)."""
    for mount in mounts:
        base = f"{mount}{path}"
        try:
            if hierarchy == "v1":
                control = parse_flat_keyed(scrape.read_text(f"{base}/memory.oom_control"),
                                           f"/{base}/memory.oom_control")
                reading = {
                    "oom_kill": control.get("oom_kill", 0),
                    "under_oom": control.get("under_oom", 0),
                    "limit_hits": parse_bytes_or_max(
                        scrape.read_text(f"{base}/memory.failcnt"), "memory.failcnt") or 0,
                    "usage": parse_bytes_or_max(scrape.read_text(
                        f"{base}/memory.usage_in_bytes"), "memory.usage_in_bytes") or 0,
                    "limit": parse_bytes_or_max(scrape.read_text(
                        f"{base}/memory.limit_in_bytes"), "memory.limit_in_bytes"),
                }
                return reading
            events = parse_flat_keyed(scrape.read_text(f"{base}/memory.events"),
                                      f"/{base}/memory.events")
            reading = {
                "oom_kill": events.get("oom_kill", 0), "under_oom": 0,
                "limit_hits": events.get("max", 0), "high": events.get("high", 0),
                "usage": parse_bytes_or_max(scrape.read_text(f"{base}/memory.current"),
                                            "memory.current") or 0,
                "limit": parse_bytes_or_max(scrape.read_text(f"{base}/memory.max"),
                                            "memory.max"),
            }
            try:
                lines = parse_pressure(scrape.read_text(f"{base}/memory.pressure"),
                                       f"/{base}/memory.pressure")
                reading["stall_us"] = {kind: lines[kind].total_us for kind in lines}
            except (NotAvailable, ParseError):
                pass
            return reading
        except NotAvailable:
            continue
        except ParseError:
            return None
    return None


def _account(kills: Counter[str], last: dict[str, float],
             cgroups: dict[tuple[str, str], float], found: list[OomKill],
             boot: float | None) -> None:
    for kill in found:
        kills[kill.constraint] += 1
        if boot is not None and kill.seconds is not None:
            when = boot + kill.seconds
            if when > last.get(kill.constraint, 0.0):
                last[kill.constraint] = when
            key = (kill.constraint, kill_cgroup(kill))
            cgroups[key] = max(when, cgroups.get(key, 0.0))
    if len(cgroups) > MAX_KILL_CGROUPS:  # the most recently killed in are kept
        for key, _ in sorted(cgroups.items(), key=lambda item: item[1])[:-MAX_KILL_CGROUPS]:
            del cgroups[key]


def killed_in_cgroups(text: str) -> set[str]:
    """The memory cgroups the kernel log's OOM kills were about (kill_cgroup), the global
    ones left out: what a bundle records the existence of."""
    try:
        kills = scan_oom_kills(text)
    except ParseError:
        return set()
    return {path for path in map(kill_cgroup, kills[-MAX_KILL_CGROUPS:]) if path}


def kill_cgroup(kill: OomKill) -> str:
    """The memory cgroup a kill is about: the one at its limit, else the killed task's;
    "" for a global kill (the node ran out) or a kernel that names none."""
    if kill.constraint != "memcg" and not kill.oom_memcg:
        return ""
    path = kill.oom_memcg or kill.memcg
    return path if _usable_cgroup(path) else ""


def _related(path: str, other: str) -> bool:
    """The same cgroup, or one inside the other."""
    return path == other or path.startswith(other.rstrip("/") + "/") \
        or other.startswith(path.rstrip("/") + "/")


# The file each hierarchy's memory cgroup directory always holds: present, the cgroup is.
_MEMCG_MARKER = {"v1": "memory.oom_control", "v2": "memory.events"}


def memcg_marker_files(path: str, v1_mounts: tuple[str, ...], v2_mounts: tuple[str, ...]
                       ) -> list[str]:
    """Where a memory cgroup's marker file would be, under each mount (relative to the
    root)."""
    return [f"{mount}{path}/{_MEMCG_MARKER[hierarchy]}"
            for hierarchy, mounts in (("v1", v1_mounts), ("v2", v2_mounts))
            for mount in mounts]


def _memcg_exists(scrape: Scrape, path: str, v1_mounts: tuple[str, ...],
                  v2_mounts: tuple[str, ...]) -> bool:
    for marker in memcg_marker_files(path, v1_mounts, v2_mounts):
        try:
            if scrape.reader.read_head(marker, 64) is not None:
                return True
        except NotAvailable:  # a path the reader refuses (a ".." in it)
            return False
    return False
