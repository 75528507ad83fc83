"""Collector `irq`: where interrupts land, and whether device interrupts may land on the CPUs
of online pools (troubleshooting: irq-core-overlap, "system work and interrupts share the
agents' cores").

Inputs:

    proc/interrupts                          (parsers/interrupts.py has the full format)
                   CPU0       CPU1
         36:          0      84951 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0
        LOC:     122488     132036   Local timer interrupts
    proc/irq/<n>/smp_affinity_list           0-1   (cpulist: where IRQ n may be delivered)
    proc/<pid>/status                        Cpus_allowed_list:\t0-1 (online pools' processes)

Rows are of two kinds (label `kind`):
- `device`: numbered IRQs of devices (MSI/MSI-X, IO-APIC, GIC SPIs): steerable with
  smp_affinity, the ones the runbook moves off worker cores.
- `local`: interrupts every CPU raises for itself: the architecture's named rows (LOC, RES,
  CAL, TLB, IPI0..) and GIC interrupts below 32 (SGIs and PPIs such as arch_timer and the
  PMU; Documentation/devicetree/bindings/interrupt-controller/arm,gic-v3.yaml numbering).
Single-number rows (ERR, MIS, Err) are left out.

Cardinality stays bounded: per NUMA node and kind (per CPU only with `per_core: full`), and
per online pool; never per IRQ.

The per-CPU counts are 32-bit and wrap, and IRQs come and go (a driver reload frees its
vectors), so a plain sum over rows would fall and Prometheus would read a reset. The totals
here are accumulated from per-row differences between scrapes: a vanished IRQ keeps what it
counted, a count that fell from the upper half of the 32-bit range wrapped (2^32 is added),
one that fell from lower was reallocated to a new IRQ (the new count is all new). A CPU that
comes online adds its counts since boot once. Totals restart with the exporter.

Cost follows what moved, not the table's size (a 256-core node has 256 counts per row): rows
unchanged since the last scrape are neither parsed again nor summed (parsers/interrupts.py
InterruptsParser), and affinity masks, which change when a driver allocates vectors or
irqbalance moves them, are read for new or reassigned IRQs at once and otherwise refreshed
every AFFINITY_REFRESH_SECONDS.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

from fleetscope.core.bundle_format import KIB
from fleetscope.core.exposition import Family, counter, gauge, labels

from .base import Collector, Evidence, NotAvailable, Scrape, Signal
from .parsers import ParseError
from .parsers.interrupts import Interrupts, InterruptsParser, IrqRow
from .parsers.procfs import CPU_STAT_FIELDS
from .parsers.sysfs import parse_cpulist
from .pools import SourceTally
from .processes import pool_processes, process_status
from .shared import NODE_DIR, numa_node_of_cpus, proc_stat

KINDS = ("device", "local")
IRQ, SOFTIRQ = CPU_STAT_FIELDS.index("irq"), CPU_STAT_FIELDS.index("softirq")
INTERRUPTS = "proc/interrupts"
WRAP = 1 << 32  # kstat_irqs are unsigned int per CPU
AFFINITY_REFRESH_SECONDS = 30.0  # longest a device IRQ's cached affinity mask is served


def row_kind(row: IrqRow) -> str:
    """`device` for a numbered, steerable IRQ; `local` for per-CPU interrupts."""
    if not (row.name.isdigit() and row.name.isascii()):
        return "local"
    if row.chip.startswith("GIC") and row.hwirq is not None and row.hwirq < 32:
        return "local"  # SGI 0-15 and PPI 16-31 are private to each CPU
    return "device"


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_irq_online_pool_cpus", "CPUs the online pool may run on", "cpus"),
    Signal("fleetscope_irq_online_pool_device_interrupts_total",
           "device interrupts on the online pool's CPUs", "interrupts"),
    Signal("fleetscope_irq_online_pool_irq_seconds_total",
           "interrupt time on the online pool's CPUs", "s"),
    Signal("fleetscope_irq_online_pool_overlap_cpus",
           "online pool CPUs that device IRQs target", "cpus"),
)


class IrqCollector(Collector):
    name = "irq"
    evidence = Evidence(signals=SIGNALS,

        sampled=(INTERRUPTS, "proc/irq/*/smp_affinity_list"),
        described=((INTERRUPTS, "interrupts"),),
        read_limits={"smp_affinity_list": 64 * KIB})
    missing_hints = (("fleetscope_irq_online_pool",
                      "no online pool in the config, or no process matched it"),)

    def __init__(self, config):
        super().__init__(config)
        self.full = config.per_core == "full"
        self.ticks_per_second = os.sysconf("SC_CLK_TCK")
        self._lock = threading.Lock()
        self._cpus: tuple[int, ...] | None = None
        # IRQ name -> (kind, its row at the last scrape, counts on the current CPU header)
        self._rows: dict[str, tuple[str, IrqRow, tuple[int, ...]]] = {}
        self._parser = InterruptsParser()  # re-parses only the rows that changed
        # (roots, IRQ name -> (its description, time read, CPU set or why it is unreadable))
        self._affinity: tuple[tuple[str, ...], dict] = ((), {})
        self._acc: dict[str, dict[int, int]] = {kind: {} for kind in KINDS}  # kind -> cpu
        self._node_of: dict[int, str] = {}  # last known NUMA node of every CPU seen
        self._pool_device: dict[str, int] = {}  # online pool -> device interrupts on its CPUs
        self._pool_irq_ticks: dict[str, int] = {}  # online pool -> irq+softirq ticks on its CPUs
        self._irq_ticks: dict[int, int] = {}  # cpu -> irq+softirq ticks at the last scrape

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        parsed = self._parser.parse(scrape.read_text(INTERRUPTS))  # the required source
        pool_cpus = self._online_pool_cpus(scrape, parsed.cpus)
        affinity = self._device_affinity(scrape, parsed)
        with self._lock:  # the running totals advance in reading order
            before = dict(self._acc["device"])
            self._advance(parsed)
            device = self._acc["device"]
            for pool, cpus in (pool_cpus or {}).items():
                if pool in self._pool_device:
                    landed = sum(device[c] - before.get(c, 0) for c in cpus if c in device)
                    self._pool_device[pool] += landed
                else:
                    self._pool_device[pool] = sum(device.get(c, 0) for c in cpus)
            acc = {kind: dict(values) for kind, values in self._acc.items()}
            pool_device = dict(self._pool_device)
            pool_irq_ticks = self._advance_irq_time(scrape, pool_cpus)
        with scrape.source(self.name, NODE_DIR):
            known = numa_node_of_cpus(scrape, parsed.cpus)
            self._node_of.update((c, n) for c, n in known.items() if n != "unknown")
        yield from self._per_cpu(acc, parsed.cpus)
        if pool_cpus is not None:
            yield from self._pools(pool_cpus, affinity, pool_device)
            if pool_irq_ticks is not None:
                yield self._irq_time(pool_irq_ticks)

    def _advance_irq_time(self, scrape: Scrape, pool_cpus) -> dict[str, int] | None:
        """Time the online pool's CPUs spent in hard and soft interrupts: the harm side of
        irq-core-overlap (/proc/stat irq + softirq per CPU). Accumulated per scrape over the
        CPUs the pool has then, like the device interrupt count, so a changing CPU set
        never looks like a counter reset."""
        if not pool_cpus:
            return None
        try:
            cpus = proc_stat(scrape).cpus
        except (NotAvailable, ParseError):
            return None
        now = {cpu: ticks[IRQ] + ticks[SOFTIRQ] for cpu, ticks in cpus.items()}
        for pool, allowed in pool_cpus.items():
            if pool in self._pool_irq_ticks:
                self._pool_irq_ticks[pool] += sum(
                    max(0, now[c] - self._irq_ticks.get(c, now[c])) for c in allowed if c in now)
            else:
                self._pool_irq_ticks[pool] = sum(now.get(c, 0) for c in allowed)
        self._irq_ticks = now
        return dict(self._pool_irq_ticks)

    def _irq_time(self, pool_irq_ticks: dict[str, int]) -> Family:
        family = counter(
            "fleetscope_irq_online_pool_irq_seconds_total",
            "Seconds the CPUs the online pool may run on spent in hard and soft interrupts "
            "(/proc/stat irq + softirq); over fleetscope_irq_online_pool_cpus, their share.",
        )
        for pool, ticks in pool_irq_ticks.items():
            family.add(ticks / self.ticks_per_second, labels(pool=pool))
        return family

    def _advance(self, parsed: Interrupts) -> None:
        """Add this scrape's increase to the per-(kind, CPU) totals (see the docstring).

        Only rows that changed cost anything: a row the parser handed back unchanged (the
        same IrqRow object as last scrape) adds nothing, so the work follows the IRQs that
        fired, not the size of the table.
        """
        cpus = parsed.cpus
        ncpu = len(cpus)
        previous = self._rows
        if self._cpus is not None and self._cpus != cpus:
            previous = self._realign(cpus)
        rows: dict[str, tuple[str, IrqRow, tuple[int, ...]]] = {}
        # kind -> this scrape's increase per CPU column; rows that appeared count whole
        # (on the first scrape: every row, i.e. the counts since boot).
        grew: dict[str, list[int]] = {kind: [0] * ncpu for kind in KINDS}
        for row in parsed.rows:
            if not row.per_cpu:
                continue
            old = previous.get(row.name)
            if old is not None and old[1] is row:
                rows[row.name] = old  # unchanged since the last scrape
                continue
            kind = row_kind(row)
            counts = row.counts
            rows[row.name] = (kind, row, counts)
            out = grew[kind]
            if old is None or old[0] != kind or old[1].description != row.description:
                # New, or another IRQ under the same number: the old one's counts stay
                # counted, the new one's are all new.
                grew[kind] = list(map(sum, zip(out, counts, strict=True)))
                continue
            for i, (now, then) in enumerate(zip(counts, old[2], strict=True)):
                if now >= then:
                    out[i] += now - then
                else:  # wrapped past 2^32 from the upper half, else reallocated
                    out[i] += now + (WRAP - then) if then >= WRAP // 2 else now
        # A freed IRQ: what it counted stays counted (nothing to add or remove).
        for kind in KINDS:
            acc = self._acc[kind]
            for cpu, increase in zip(cpus, grew[kind], strict=True):
                acc[cpu] = acc.get(cpu, 0) + increase
        self._cpus, self._rows = cpus, rows

    def _realign(self, cpus: tuple[int, ...]):
        """The previous rows laid out on a new CPU header (CPU hotplug); a CPU that was not
        online before starts from 0, so its counts since boot count once."""
        index = {cpu: i for i, cpu in enumerate(self._cpus or ())}

        def align(values):
            return tuple(values[index[c]] if c in index else 0 for c in cpus)

        return {name: (kind, row, align(counts))
                for name, (kind, row, counts) in self._rows.items()}

    def _per_cpu(self, acc: dict, online: tuple[int, ...]) -> Iterator[Family]:
        if self.full:
            per_cpu = counter(
                "fleetscope_irq_interrupts_total",
                "Interrupts each CPU handled (/proc/interrupts): kind=device for device IRQs, "
                "local for per-CPU ones (timer, IPIs, rescheduling, PMU).",
            )
            for cpu in online:
                for kind in KINDS:
                    per_cpu.add(acc[kind][cpu], labels(cpu=cpu, kind=kind))
            yield per_cpu
        per_node = counter(
            "fleetscope_irq_numa_node_interrupts_total",
            "Interrupts the CPUs of each NUMA node handled (/proc/interrupts), by kind: device "
            "IRQs or per-CPU (local) interrupts.",
        )
        node_of = self._node_of
        totals: dict[tuple[str, str], int] = {}
        for kind in KINDS:
            for cpu, value in acc[kind].items():
                key = (node_of.get(cpu, "unknown"), kind)
                totals[key] = totals.get(key, 0) + value
        for (node, kind) in sorted(totals, key=lambda k: (not k[0].isdigit(), len(k[0]), k)):
            per_node.add(totals[(node, kind)], labels(numa_node=node, kind=kind))
        yield per_node

    def _online_pool_cpus(self, scrape: Scrape, online: tuple[int, ...]):
        """Online pool -> the online CPUs its processes may run on (None without pools)."""
        pools = [p for p in self.config.pools if p.workload_class == "online"]
        if not pools:
            return None
        online_set = set(online)
        allowed: dict[str, set[int]] = {p.name: set() for p in pools}
        tally = SourceTally()
        processes = None
        with scrape.source(self.name, "proc"):
            processes = pool_processes(scrape, self.config.pools)
        if processes is None:
            return None
        parsed_lists: dict[str, frozenset[int]] = {}
        for process in processes:
            if process.pool.workload_class != "online":
                continue
            try:
                text = process_status(scrape, process.pid).get("Cpus_allowed_list")
                if text is None:
                    raise ParseError(f"/proc/{process.pid}/status: no Cpus_allowed_list")
                cpus = parsed_lists.get(text)
                if cpus is None:
                    cpus = parsed_lists[text] = frozenset(parse_cpulist(text))
            except (NotAvailable, ParseError) as err:
                tally.fail(err)
                continue
            tally.ok += 1
            allowed[process.pool.name] |= cpus
        tally.report(scrape, self.name, "proc/<pid>/status")
        return {name: cpus & online_set for name, cpus in allowed.items()}

    def _device_affinity(self, scrape: Scrape, parsed: Interrupts) -> list[frozenset[int]]:
        """The smp_affinity_list of every device IRQ, as CPU sets.

        Off the scrape path where it can be: a mask is read again when its IRQ is new or now
        belongs to another device (a driver allocating vectors sets them), else at most every
        AFFINITY_REFRESH_SECONDS (irqbalance or an operator moving it); a 256-core node has
        hundreds of device IRQs, one file each.
        """
        if not any(p.workload_class == "online" for p in self.config.pools):
            return []
        tally = SourceTally()
        masks: list[frozenset[int]] = []
        parsed_lists: dict[str, frozenset[int]] = {}
        roots, known = self._affinity
        if roots != scrape.roots:
            known = {}
        now = scrape.time
        current: dict[str, tuple[str, float, frozenset[int] | Exception]] = {}
        for row in parsed.rows:
            if not row.per_cpu or row_kind(row) != "device":
                continue
            entry = known.get(row.name)
            if entry is None or entry[0] != row.description \
                    or not 0 <= now - entry[1] < AFFINITY_REFRESH_SECONDS:
                entry = (row.description, now, self._read_affinity(scrape, row, parsed_lists))
            current[row.name] = entry
            if isinstance(entry[2], Exception):
                tally.fail(entry[2])
                continue
            tally.ok += 1
            masks.append(entry[2])
        self._affinity = (scrape.roots, current)  # replaced whole: scrapes may run at once
        tally.report(scrape, self.name, "proc/irq/<n>/smp_affinity_list")
        return masks

    @staticmethod
    def _read_affinity(scrape: Scrape, row: IrqRow, parsed_lists: dict
                       ) -> frozenset[int] | Exception:
        path = f"proc/irq/{row.name}/smp_affinity_list"
        try:
            text = scrape.read_text(path).strip()
            cpus = parsed_lists.get(text)
            if cpus is None:
                cpus = parsed_lists[text] = frozenset(parse_cpulist(text, f"/{path}"))
        except (NotAvailable, ParseError) as err:
            return err
        return cpus

    def _pools(self, pool_cpus: dict, affinity: list, pool_device: dict) -> Iterator[Family]:
        targeted = frozenset().union(*affinity) if affinity else frozenset()
        if affinity:
            yield gauge(
                "fleetscope_irq_device_affinity_cpus",
                "CPUs at least one device IRQ may be delivered to (union of "
                "/proc/irq/<n>/smp_affinity_list).",
            ).add(len(targeted))
        cpus = gauge(
            "fleetscope_irq_online_pool_cpus",
            "Online CPUs the online pool's processes may run on (union of their "
            "Cpus_allowed_list).",
        )
        overlap = gauge(
            "fleetscope_irq_online_pool_overlap_cpus",
            "CPUs that online pool processes may run on and device IRQ affinity masks "
            "target (irq-core-overlap when above 0).",
        )
        overlap_irqs = gauge(
            "fleetscope_irq_online_pool_overlap_irqs",
            "Device IRQs whose smp_affinity_list includes a CPU the online pool may run on.",
        )
        landed = counter(
            "fleetscope_irq_online_pool_device_interrupts_total",
            "Device interrupts handled by the CPUs the online pool may run on (the set at "
            "each scrape); over the node's device interrupts it is the share landing there.",
        )
        for pool, allowed in pool_cpus.items():
            pool_label = labels(pool=pool)
            cpus.add(len(allowed), pool_label)
            landed.add(pool_device.get(pool, 0), pool_label)
            if affinity:
                overlap.add(len(allowed & targeted), pool_label)
                overlap_irqs.add(sum(1 for mask in affinity if mask & allowed), pool_label)
        yield from (f for f in (cpus, overlap, overlap_irqs, landed) if f.samples)
