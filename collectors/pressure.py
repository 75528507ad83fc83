"""Collector `pressure`: how much work waits for a CPU (or memory, or I/O).

Sources, each optional on its own:
- PSI, /proc/pressure/{cpu,memory,io,irq}:  `some avg10=1.65 avg60=0.50 avg300=0.33 total=4410972`
  (Documentation/accounting/psi.rst; totals in microseconds). System-wide cpu `full` is
  undefined and printed as 0 since 5.13, so it is not exported.
- /proc/schedstat cpu lines: run-queue wait per CPU (`cpu0 ... 3035466036 858375615 67578`,
  fields 7-9: running ns, waiting ns, timeslices). Needs CONFIG_SCHEDSTATS.
- /proc/loadavg: `0.20 0.18 0.12 1/80 11206`.
- /proc/stat scalar lines: ctxt, processes, procs_running, procs_blocked, intr, btime.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator

from fleetscope.core.bundle_format import KIB, MIB
from fleetscope.core.exposition import Family, LabelSet, counter, gauge, labels, seconds_from_ns

from .base import Collector, Evidence, NotAvailable, Scrape, Signal
from .parsers import ParseError
from .parsers.procfs import parse_loadavg, parse_pressure, parse_schedstat
from .shared import NODE_DIR, numa_node_of_cpus, proc_stat

PSI_RESOURCES = ("cpu", "memory", "io", "irq")
PSI_HINT = (
    "PSI needs CONFIG_PSI and is off when booted with psi=0 (some distros default it off); "
    "/proc/pressure/irq also needs CONFIG_IRQ_TIME_ACCOUNTING"
)
WAIT_STATS = (("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("max", 1.0))
SCHEDSTAT_HINT = "the kernel was built without CONFIG_SCHEDSTATS"


def elapsed_ticks(scrape: Scrape) -> dict[int, int]:
    """cpu -> all its /proc/stat ticks (user .. steal): the CPU's elapsed time."""
    try:
        return {cpu: sum(ticks[:8]) for cpu, ticks in proc_stat(scrape).cpus.items()}
    except (NotAvailable, ParseError):
        return {}


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_pressure_stall_seconds_total",
           "pressure stall time (PSI), by resource", "s"),
    Signal("fleetscope_procs_running", "runnable tasks", "tasks"),
    Signal("fleetscope_schedstat_core_waiting_ratio",
           "run-queue wait per CPU (distribution)", "s/s"),
    Signal("fleetscope_threads", "threads on the node", "threads"),
)


class PressureCollector(Collector):
    name = "pressure"
    evidence = Evidence(signals=SIGNALS,

        sampled=("proc/loadavg", "proc/schedstat", "proc/pressure/cpu", "proc/pressure/memory",
                 "proc/pressure/io", "proc/pressure/irq"),
        # proc/schedstat has two lines a CPU, and a domain line per CPU and level
        described=(("proc/schedstat", "run-queue delay"), ("proc/pressure/cpu", "PSI")),
        read_limits={"proc/loadavg": 4 * KIB, "proc/pressure": 4 * KIB,
                     "proc/schedstat": 16 * MIB})

    def __init__(self, config):
        super().__init__(config)
        self.full = config.per_core == "full"
        self._cpu_labels: dict[int, LabelSet] = {}
        self.ticks_per_second = os.sysconf("SC_CLK_TCK")
        self._lock = threading.Lock()
        # (time, cpu -> (run-queue wait ns, the CPU's /proc/stat ticks))
        self._previous: tuple[float, dict[int, tuple[int, int | None]]] | None = None
        self._waiting: dict[int, float] | None = None  # cpu -> wait s/s, last interval

    def _advance(self, scrape: Scrape, now: float, cpus: dict) -> dict[int, float] | None:
        """Per-CPU run-queue wait per second over the last interval of at least
        busy_interval_min_seconds (as the cpu collector's busy distribution)."""
        # Each CPU's own clock from /proc/stat (all its ticks), so the ratio is exact for
        # a replayed sample whatever the wall time; wall time when /proc/stat is missing.
        ticks = elapsed_ticks(scrape)
        snapshot = {cpu: (stats.waiting_ns, ticks.get(cpu)) for cpu, stats in cpus.items()}
        with self._lock:
            previous = self._previous
            if previous is None or now <= previous[0]:
                self._previous, self._waiting = (now, snapshot), None
            elif now - previous[0] >= self.config.busy_interval_min_seconds:
                waiting = {}
                for cpu, (wait, tick) in snapshot.items():
                    if cpu not in previous[1]:
                        continue
                    old_wait, old_tick = previous[1][cpu]
                    seconds = now - previous[0]
                    if tick is not None and old_tick is not None and tick > old_tick:
                        seconds = (tick - old_tick) / self.ticks_per_second
                    waiting[cpu] = max(0, wait - old_wait) / 1e9 / seconds
                self._waiting = waiting
                self._previous = (now, snapshot)
            return self._waiting

    def _waiting_distribution(self, waiting: dict[int, float]) -> Family:
        ordered = sorted(waiting.values())
        family = gauge(
            "fleetscope_schedstat_core_waiting_ratio",
            "Distribution over CPUs of the time runnable tasks waited on each CPU's run "
            "queue per second in the last interval (/proc/schedstat): min, p50, p90, max. "
            "Tasks waiting on a busy CPU while others idle is core imbalance.",
        )
        for stat, q in WAIT_STATS:
            family.add(round(ordered[max(1, math.ceil(q * len(ordered))) - 1], 6),
                       labels(stat=stat))
        return family

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        yield from self._psi(scrape)
        with scrape.source(self.name, "proc/schedstat", SCHEDSTAT_HINT):
            yield from self._schedstat(scrape)
        with scrape.source(self.name, "proc/loadavg"):
            yield from self._loadavg(scrape)
        with scrape.source(self.name, "proc/stat"):
            yield from self._stat(scrape)

    def _psi(self, scrape: Scrape) -> Iterator[Family]:
        stalled = counter(
            "fleetscope_pressure_stall_seconds_total",
            "Seconds in which some (or all, stall=full) non-idle tasks were stalled on the "
            "resource (/proc/pressure, PSI).",
        )
        for resource in PSI_RESOURCES:
            source = f"proc/pressure/{resource}"
            with scrape.source(self.name, source, PSI_HINT):
                lines = parse_pressure(scrape.read_text(source), f"/{source}")
                for kind in ("some", "full"):
                    if kind in lines and not (resource == "cpu" and kind == "full"):
                        stalled.add(
                            lines[kind].total_us / 1e6, labels(resource=resource, stall=kind)
                        )
        if stalled.samples:
            yield stalled

    def _schedstat(self, scrape: Scrape) -> Iterator[Family]:
        cpus = parse_schedstat(scrape.read_text("proc/schedstat"))
        waiting = self._advance(scrape, scrape.time, cpus)
        if waiting:
            yield self._waiting_distribution(waiting)
        if self.full:
            running = counter(
                "fleetscope_schedstat_running_seconds_total",
                "Seconds tasks ran on each CPU (/proc/schedstat).",
            )
            waiting = counter(
                "fleetscope_schedstat_waiting_seconds_total",
                "Seconds runnable tasks waited on each CPU's run queue (/proc/schedstat).",
            )
            cpu_labels = self._cpu_labels
            for cpu, stats in cpus.items():
                cpu_label = cpu_labels.get(cpu) or cpu_labels.setdefault(cpu, labels(cpu=cpu))
                running.samples.append((cpu_label, seconds_from_ns(stats.running_ns)))
                waiting.samples.append((cpu_label, seconds_from_ns(stats.waiting_ns)))
            yield running
            yield waiting
        node_of = None
        with scrape.source(self.name, NODE_DIR):
            node_of = numa_node_of_cpus(scrape, cpus)
        # Without the topology the summary still carries the run queues, on
        # numa_node="unknown" (as the cpu collector's CPU time).
        yield from self._per_numa_node(cpus, node_of if node_of is not None else
                                       dict.fromkeys(cpus, "unknown"))

    def _per_numa_node(self, cpus: dict, node_of: dict) -> Iterator[Family]:
        per_node: dict[str, list[int]] = {}
        for cpu, stats in cpus.items():
            acc = per_node.setdefault(node_of[cpu], [0, 0, 0])
            acc[0] += stats.running_ns
            acc[1] += stats.waiting_ns
            acc[2] += stats.timeslices
        running = counter(
            "fleetscope_schedstat_numa_node_running_seconds_total",
            "Seconds tasks ran on the CPUs of each NUMA node (/proc/schedstat).",
        )
        waiting = counter(
            "fleetscope_schedstat_numa_node_waiting_seconds_total",
            "Seconds runnable tasks waited on the run queues of each NUMA node's CPUs; "
            "its rate over the node's CPU count is the average run-queue delay per CPU.",
        )
        slices = counter(
            "fleetscope_schedstat_numa_node_timeslices_total",
            "Timeslices run on the CPUs of each NUMA node (/proc/schedstat).",
        )
        for node in sorted(per_node, key=lambda n: (len(n), n)):
            node_label = labels(numa_node=node)
            run_ns, wait_ns, count = per_node[node]
            running.add(run_ns / 1e9, node_label)
            waiting.add(wait_ns / 1e9, node_label)
            slices.add(count, node_label)
        yield running
        yield waiting
        yield slices

    def _loadavg(self, scrape: Scrape) -> Iterator[Family]:
        load = parse_loadavg(scrape.read_text("proc/loadavg"))
        yield gauge("fleetscope_load1", "1-minute load average.").add(load.load1)
        yield gauge("fleetscope_load5", "5-minute load average.").add(load.load5)
        yield gauge("fleetscope_load15", "15-minute load average.").add(load.load15)
        yield gauge(
            "fleetscope_threads", "Threads (scheduling entities) on the node (/proc/loadavg)."
        ).add(load.threads)

    def _stat(self, scrape: Scrape) -> Iterator[Family]:
        stat = proc_stat(scrape)
        scalars = stat.scalars
        specs = (
            ("procs_running", gauge, "fleetscope_procs_running", "Runnable tasks"),
            ("procs_blocked", gauge, "fleetscope_procs_blocked", "Tasks blocked on I/O"),
            ("ctxt", counter, "fleetscope_context_switches_total", "Context switches"),
            ("processes", counter, "fleetscope_forks_total", "Processes and threads created"),
            ("btime", gauge, "fleetscope_boot_time_seconds", "Boot time in Unix seconds"),
        )
        for key, kind, name, help_text in specs:
            if key in scalars:
                yield kind(name, f"{help_text} (/proc/stat {key}).").add(scalars[key])
        if stat.interrupts_total is not None:
            yield counter(
                "fleetscope_interrupts_total", "Interrupts serviced, all CPUs (/proc/stat intr)."
            ).add(stat.interrupts_total)
        if stat.softirqs_total is not None:
            yield counter(
                "fleetscope_softirqs_total", "Softirqs serviced, all CPUs (/proc/stat softirq)."
            ).add(stat.softirqs_total)
