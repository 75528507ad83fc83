"""Collector `cpu`: per-core time by mode from /proc/stat, per NUMA node, and the spread of
per-core busy fraction over the last interval.

Input (/proc/stat, USER_HZ ticks):

    cpu  2693 0 1863 312790 314 0 50 116 0 0
    cpu0 837 0 674 157344 6 0 8 45 0 0

Two shapes, chosen by `per_core` in the config:
- `full`: every core's 8 modes as counters, as node_exporter does (2,048 series on 256 cores).
- `summary` (default): per-NUMA-node counters by mode, plus the distribution of per-core busy
  fraction over the last interval (min, p50, p90, max, the busiest core, cores above the
  saturation ratio) and of per-core steal. Tens of series, and imbalance and steal stay visible.

Guest time is already inside user (and guest_nice inside nice): kernel/sched/cputime.c
account_guest_time() adds it to both. So `user` is exported as the kernel reports it, guest
separately, and busy/total never add guest again.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator

from fleetscope.core.bundle_format import MIB
from fleetscope.core.exposition import Family, LabelSet, counter, gauge, labels

from .base import Collector, Evidence, Scrape, Signal
from .parsers.procfs import CPU_STAT_FIELDS
from .shared import NODE_DIR, PROC_STAT, numa_node_of_cpus, proc_stat

MODES = CPU_STAT_FIELDS[:8]  # user .. steal: they add up to the CPU's wall time
IDLE, IOWAIT, STEAL, GUEST, GUEST_NICE = 3, 4, 7, 8, 9
# The spread across cores, as a `stat` label: promtool reserves `quantile` for summaries.
STATS = (("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("max", 1.0))


def quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile: always one of the observed values (p90 of 2 cores is the max)."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


class CoreInterval:
    """Per-core busy and steal fractions between two /proc/stat snapshots."""

    __slots__ = ("seconds", "busy", "steal")

    def __init__(self, seconds: float, busy: dict[int, float], steal: dict[int, float]):
        self.seconds = seconds
        self.busy = busy
        self.steal = steal

    @classmethod
    def between(cls, seconds: float, before: dict, after: dict) -> CoreInterval | None:
        busy: dict[int, float] = {}
        steal: dict[int, float] = {}
        for cpu, (busy_now, total_now, steal_now) in after.items():
            if cpu not in before:
                continue  # came online during the interval
            busy_then, total_then, steal_then = before[cpu]
            elapsed = total_now - total_then
            if elapsed <= 0:
                continue  # no tick elapsed, or counters reset (CPU hotplug)
            busy[cpu] = min(1.0, max(0.0, (busy_now - busy_then) / elapsed))
            steal[cpu] = min(1.0, max(0.0, (steal_now - steal_then) / elapsed))
        return cls(seconds, busy, steal) if busy else None


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_cpu_core_busy_ratio", "cores' busy share (distribution)", "ratio"),
    Signal("fleetscope_cpu_core_steal_ratio", "cores' steal share (distribution)", "ratio"),
    Signal("fleetscope_cpu_numa_node_cpus", "online CPUs of a NUMA node", "cpus"),
    Signal("fleetscope_cpu_numa_node_seconds_total",
           "CPU time of a NUMA node's CPUs, by mode", "s"),
    Signal("fleetscope_cpu_saturated_cores", "saturated cores", "cores"),
)


class CpuCollector(Collector):
    name = "cpu"
    evidence = Evidence(signals=SIGNALS,

        sampled=(PROC_STAT,), described=((PROC_STAT, "per-core CPU time"),),
        read_limits={PROC_STAT: 8 * MIB})  # a line a CPU: 4,096 CPUs are ~600 KiB

    def __init__(self, config):
        super().__init__(config)
        self.full = config.per_core == "full"
        self.ticks_per_second = os.sysconf("SC_CLK_TCK")
        self._lock = threading.Lock()
        self._previous: tuple[float, dict] | None = None
        self._interval: CoreInterval | None = None
        self._label_sets: dict[int, tuple[tuple[LabelSet, ...], tuple[LabelSet, ...]]] = {}

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        stat = proc_stat(scrape)
        hz = self.ticks_per_second
        if self.full:
            yield from self._per_core(stat.cpus, hz)
        node_of = None
        with scrape.source(self.name, NODE_DIR):
            node_of = numa_node_of_cpus(scrape, stat.cpus)
        # Without the topology the summary still carries the CPU time, on numa_node="unknown".
        yield from self._per_numa_node(node_of if node_of is not None else
                                       dict.fromkeys(stat.cpus, "unknown"), stat.cpus, hz)
        interval = self._advance(scrape.time, stat.cpus)
        if interval is not None:
            yield from self._distribution(interval)

    def _per_core(self, cpus: dict, hz: int) -> Iterator[Family]:
        # With USER_HZ 100 (every Linux arch fleetscope runs on) seconds have exactly two
        # decimals, and "%.2f" prints them faster than repr finds the shortest form.
        value_format = "%.2f" if hz == 100 else "%r"
        seconds = Family(
            "fleetscope_cpu_seconds_total", "counter",
            "Seconds each CPU spent in each mode (/proc/stat; user includes guest).",
            value_format,
        )
        guest = Family(
            "fleetscope_cpu_guest_seconds_total", "counter",
            "Seconds each CPU spent running guests; already counted in user/nice.",
            value_format,
        )
        # Thousands of samples on a big node: each CPU's label sets are made once, and the
        # families render in one % operation (exposition.render with a value_format). This
        # is the bulk of a full-mode scrape's CPU time, and most of that is turning floats
        # into text.
        label_sets = self._label_sets
        add_modes, add_guest = seconds.samples.extend, guest.samples.extend
        for cpu, ticks in cpus.items():
            sets = label_sets.get(cpu)
            if sets is None:
                sets = label_sets[cpu] = (
                    tuple(labels(cpu=cpu, mode=mode) for mode in MODES),
                    (labels(cpu=cpu, mode="user"), labels(cpu=cpu, mode="nice")))
            add_modes(zip(sets[0], [t / hz for t in ticks[:8]], strict=True))
            add_guest(zip(sets[1], (ticks[GUEST] / hz, ticks[GUEST_NICE] / hz), strict=True))
        yield seconds
        yield guest

    def _per_numa_node(self, node_of: dict[int, str], cpus: dict, hz: int) -> Iterator[Family]:
        rows_by_node: dict[str, list[tuple[int, ...]]] = {}
        for cpu, ticks in cpus.items():
            rows_by_node.setdefault(node_of[cpu], []).append(ticks)
        sums = {
            node: [sum(column) for column in zip(*rows, strict=True)]
            for node, rows in rows_by_node.items()
        }
        counts = {node: len(rows) for node, rows in rows_by_node.items()}
        seconds = counter(
            "fleetscope_cpu_numa_node_seconds_total",
            "Seconds the CPUs of each NUMA node spent in each mode (sum over its online CPUs).",
        )
        guest = counter(
            "fleetscope_cpu_numa_node_guest_seconds_total",
            "Seconds the CPUs of each NUMA node spent running guests; already in user/nice.",
        )
        online = gauge("fleetscope_cpu_numa_node_cpus", "Online CPUs of each NUMA node.")
        for node in sorted(sums, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0)):
            acc = sums[node]
            for mode, value in zip(MODES, acc[:8], strict=True):
                seconds.add(value / hz, labels(numa_node=node, mode=mode))
            guest.add(acc[GUEST] / hz, labels(numa_node=node, mode="user"))
            guest.add(acc[GUEST_NICE] / hz, labels(numa_node=node, mode="nice"))
            online.add(counts[node], labels(numa_node=node))
        yield seconds
        yield guest
        yield online

    def _advance(self, now: float, cpus: dict) -> CoreInterval | None:
        """Take a snapshot when at least `busy_interval_min_seconds` passed since the last one,
        and return the interval between the last two snapshots.

        Scrapes closer together than that (two Prometheus replicas, a curl by hand) see the
        same interval, so the distribution never degenerates to a few ticks.
        """
        snapshot = {}
        for cpu, t in cpus.items():
            total = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7]
            snapshot[cpu] = (total - t[IDLE] - t[IOWAIT], total, t[STEAL])
        with self._lock:
            previous = self._previous
            if previous is None or now < previous[0]:  # first scrape, or a replay restarted
                self._previous, self._interval = (now, snapshot), None
            elif now - previous[0] >= self.config.busy_interval_min_seconds:
                self._interval = CoreInterval.between(now - previous[0], previous[1], snapshot)
                self._previous = (now, snapshot)
            return self._interval

    def _distribution(self, interval: CoreInterval) -> Iterator[Family]:
        busy_sorted = sorted(interval.busy.values())
        steal_sorted = sorted(interval.steal.values())
        busy = gauge(
            "fleetscope_cpu_core_busy_ratio",
            "Distribution over cores of each core's busy fraction (not idle, not iowait; "
            "steal counts as busy) in the last interval: min, p50, p90 and max over cores.",
        )
        steal = gauge(
            "fleetscope_cpu_core_steal_ratio",
            "Distribution over cores of each core's steal fraction in the last interval.",
        )
        for stat, q in STATS:
            busy.add(round(quantile(busy_sorted, q), 6), labels(stat=stat))
            steal.add(round(quantile(steal_sorted, q), 6), labels(stat=stat))
        threshold = self.config.saturated_core_busy_ratio
        saturated = gauge(
            "fleetscope_cpu_saturated_cores",
            f"Cores busier than {threshold:g} (saturated_core_busy_ratio) in the last interval.",
        ).add(sum(1 for b in busy_sorted if b > threshold))
        busiest_cpu = max(interval.busy, key=lambda cpu: (interval.busy[cpu], -cpu))
        busiest = gauge(
            "fleetscope_cpu_busiest_core",
            "Number of the busiest core in the last interval (the lowest number on a tie).",
        ).add(busiest_cpu)
        seconds = gauge(
            "fleetscope_cpu_core_interval_seconds",
            "Length of the interval the per-core distributions cover.",
        ).add(round(interval.seconds, 3))
        yield from (busy, steal, saturated, busiest, seconds)
