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

from collections.abc import Iterator

from fleetscope.exposition import Family, counter, gauge, labels

from .base import Collector, Scrape
from .parsers.procfs import parse_loadavg, parse_pressure, parse_schedstat
from .shared import NODE_DIR, numa_node_of_cpus, proc_stat

PSI_RESOURCES = ("cpu", "memory", "io", "irq")
PSI_HINT = (
    "PSI needs CONFIG_PSI and is off when booted with psi=0 (some distros default it off); "
    "/proc/pressure/irq also needs CONFIG_IRQ_TIME_ACCOUNTING"
)
SCHEDSTAT_HINT = "the kernel was built without CONFIG_SCHEDSTATS"


def _ns(nanoseconds: int) -> str:
    """Nanoseconds as exact seconds, formatted from integers (cheaper than from floats)."""
    seconds, rest = divmod(nanoseconds, 1_000_000_000)
    return f"{seconds}.{rest:09d}"


class PressureCollector(Collector):
    name = "pressure"

    def __init__(self, config):
        super().__init__(config)
        self.full = config.per_core == "full"
        self._cpu_labels: dict[int, str] = {}

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
                running.blocks.append(f"{running.name}{{{cpu_label}}} {_ns(stats.running_ns)}")
                waiting.blocks.append(f"{waiting.name}{{{cpu_label}}} {_ns(stats.waiting_ns)}")
            yield running
            yield waiting
        with scrape.source(self.name, NODE_DIR):
            node_of = numa_node_of_cpus(scrape, cpus)
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
