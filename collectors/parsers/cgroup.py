"""Parsers for the cgroup CPU and pids controller files, v2 (Documentation/admin-guide/
cgroup-v2.rst) and v1 (Documentation/scheduler/sched-bwc.rst, cgroup-v1/pids.rst).

    sys/fs/cgroup/<path>/cpu.stat   usage_usec 97113019        (flat keyed, microseconds)
                                    user_usec 67578052
                                    system_usec 29534966
                                    nr_periods 123456           (only with the cpu controller
                                    nr_throttled 4567            enabled on the cgroup)
                                    throttled_usec 89234567
    sys/fs/cgroup/<path>/cpu.max    max 100000                 ($MAX $PERIOD; max = no limit)
                                    200000 100000              (2 CPUs of quota per 100 ms)

cpu.pressure is a PSI file: `procfs.parse_pressure` reads it.
"""

from __future__ import annotations

from typing import NamedTuple

from . import ParseError, parse_int


def parse_cpu_stat(text: str, what: str = "cpu.stat") -> dict[str, int]:
    """Parse a cgroup v2 `cpu.stat` into {key: value}.

    Printed by kernel/cgroup/rstat.c cgroup_base_stat_cputime_show() (usage_usec, user_usec,
    system_usec; nice_usec since 6.7; core_sched.force_idle_usec with CONFIG_SCHED_CORE) and
    kernel/sched/core.c cpu_extra_stat_show() (nr_periods, nr_throttled, throttled_usec,
    nr_bursts, burst_usec). Keys are kept as the kernel names them, so a field added by a
    later kernel passes through; collectors pick the ones they know.

    >>> parse_cpu_stat("usage_usec 97113019\\nuser_usec 67578052\\nsystem_usec 29534966\\n"
    ...                "nr_periods 123456\\nnr_throttled 4567\\nthrottled_usec 89234567\\n")
    ... # doctest: +NORMALIZE_WHITESPACE
    {'usage_usec': 97113019, 'user_usec': 67578052, 'system_usec': 29534966,
     'nr_periods': 123456, 'nr_throttled': 4567, 'throttled_usec': 89234567}
    """
    values: dict[str, int] = {}
    for line in text.splitlines():
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[0].isascii() or not parts[0].isprintable():
            raise ParseError(f"{what}: expected 'key value', got {line[:40]!r}")
        values[parts[0]] = parse_int(parts[1], f"{what} {parts[0]}")
    if not values:
        raise ParseError(f"{what}: empty")
    return values


class CpuMax(NamedTuple):
    quota_us: int | None  # None: "max", no limit
    period_us: int

    @property
    def cpus(self) -> float:
        """The quota in CPUs (quota / period); +Inf without a limit."""
        return float("inf") if self.quota_us is None else self.quota_us / self.period_us


def parse_cpu_max(text: str, what: str = "cpu.max") -> CpuMax:
    """Parse a cgroup v2 `cpu.max`: "$MAX $PERIOD" in microseconds, $MAX "max" for no limit.

    Printed by kernel/sched/core.c cpu_period_quota_print(): "max" or "%ld" for the quota,
    then " %ld\\n" for the period (at least 1000 us, the kernel refuses less).

    >>> parse_cpu_max("max 100000\\n")
    CpuMax(quota_us=None, period_us=100000)
    >>> parse_cpu_max("200000 100000\\n").cpus
    2.0
    """
    parts = text.split()
    if len(parts) != 2:
        raise ParseError(f"{what}: expected '$MAX $PERIOD', got {text[:40]!r}")
    period = parse_int(parts[1], f"{what} period")
    if period == 0:
        raise ParseError(f"{what}: period 0")
    quota = None if parts[0] == "max" else parse_int(parts[0], f"{what} quota")
    return CpuMax(quota, period)


def parse_cfs_quota(quota_text: str, period_text: str, what: str = "cpu.cfs_quota_us") -> CpuMax:
    """The v1 CFS limit: cpu.cfs_quota_us ("-1": no limit) and cpu.cfs_period_us, both one
    "%lld\\n" (kernel/sched/core.c cpu_cfs_quota_read_s64(), cpu_cfs_period_read_u64()).

    >>> parse_cfs_quota("10000\\n", "100000\\n").cpus
    0.1
    >>> parse_cfs_quota("-1\\n", "100000\\n").quota_us is None
    True
    """
    quota = quota_text.strip()
    period = parse_int(period_text.strip(), f"{what} period")
    if period == 0:
        raise ParseError(f"{what}: period 0")
    if quota == "-1":
        return CpuMax(None, period)
    return CpuMax(parse_int(quota, what), period)


def v1_cpu_stat(cpu_stat: dict[str, int], usage_ns: int | None) -> dict[str, int]:
    """A v1 cpu.stat (nr_periods, nr_throttled, throttled_time in ns: kernel/sched/core.c
    cpu_cfs_stat_show()) and cpuacct.usage (ns) under the v2 cpu.stat keys, in microseconds.

    >>> v1_cpu_stat({"nr_periods": 137, "nr_throttled": 135, "throttled_time": 8400000000},
    ...             97113019000)
    {'nr_periods': 137, 'nr_throttled': 135, 'throttled_usec': 8400000, 'usage_usec': 97113019}
    """
    values = {key: cpu_stat[key] for key in ("nr_periods", "nr_throttled") if key in cpu_stat}
    if "throttled_time" in cpu_stat:
        values["throttled_usec"] = cpu_stat["throttled_time"] // 1000
    if usage_ns is not None:
        values["usage_usec"] = usage_ns // 1000
    return values


class PidsReading(NamedTuple):
    current: int
    limit: int | None  # None: "max", no limit of its own
    limit_hits: int | None  # pids.events "max": forks refused at this limit


def parse_pids(current: str, limit: str, events: str | None,
               what: str = "pids") -> PidsReading:
    """The pids controller's files, alike in v1 and v2 (kernel/cgroup/pids.c):
    pids.current "%lld\\n", pids.max "max\\n" or "%lld\\n", pids.events "max %lld\\n".

    >>> parse_pids("40\\n", "40\\n", "max 161\\n")
    PidsReading(current=40, limit=40, limit_hits=161)
    >>> parse_pids("7\\n", "max\\n", None).limit is None
    True
    """
    now = parse_int(current.strip(), f"{what}.current")
    bound = limit.strip()
    cap = None if bound == "max" else parse_int(bound, f"{what}.max")
    hits = None
    if events is not None:
        hits = parse_cpu_stat(events, f"{what}.events").get("max")
    return PidsReading(now, cap, hits)


def parse_hierarchies(text: str) -> list[tuple[str, tuple[str, ...], str]]:
    """(hierarchy id, controllers, path) per line of /proc/<pid>/cgroup.

    >>> parse_hierarchies("4:cpu,cpuacct:/batch\\n1:name=systemd:/init.scope\\n0::/\\n")
    [('4', ('cpu', 'cpuacct'), '/batch'), ('1', ('name=systemd',), '/init.scope'), ('0', (), '/')]
    """
    lines = []
    for line in text.splitlines():
        if not line:
            continue
        parts = line.split(":", 2)
        if len(parts) != 3:
            raise ParseError(f"/proc/<pid>/cgroup: malformed line {line[:40]!r}")
        hierarchy, controllers, path = parts
        lines.append((hierarchy, tuple(c for c in controllers.split(",") if c), path))
    if not lines:
        raise ParseError("/proc/<pid>/cgroup: empty")
    return lines
