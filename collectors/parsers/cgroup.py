"""Parsers for the cgroup v2 CPU controller files (Documentation/admin-guide/cgroup-v2.rst).

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
