"""The context a rule's enrichment reads through (rules/builtin/<rule>.py `enrich(ctx,
finding)`): the raw evidence the metrics deliberately do not carry (which pids, cgroups,
CPUs, NUMA nodes), from a bundle's first and last samples or the live node. Metrics stay per
pool; a finding names the processes.

    Enricher(config, first, last, series, samples)(finding)
        -> finding.rule.enrich(enricher, finding), never losing the finding over it

What several rules need is here: the pool's processes, the top CPU consumers and how they
are pinned, the saturated CPUs, the network waits of worker threads, py-spy stacks (live),
the kernel log and the recorded `isa check` of a binary.
"""

from __future__ import annotations

import functools
import json
import logging
import os

from fleetscope.collectors import pods
from fleetscope.collectors.base import NotAvailable, Scrape
from fleetscope.collectors.cpu_features import CPUINFO
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers.process import parse_pid_stat, parse_status
from fleetscope.collectors.parsers.procfs import parse_proc_stat
from fleetscope.collectors.parsers.sysfs import parse_cpulist
from fleetscope.collectors.pools import CPU_ONLINE
from fleetscope.collectors.processes import pool_processes, program_name
from fleetscope.collectors.shared import PROC_STAT, process_file
from fleetscope.collectors.source import DMESG, KMSG, EvidenceSource
from fleetscope.core.bundle_format import isa_check_file
from fleetscope.core.config import Config
from fleetscope.rules.promql import Series

from .engine import Finding

log = logging.getLogger("fleetscope.diagnose")


def _read(scrape: Scrape, path: str, parser):
    try:
        return parser(scrape.read_text(path))
    except (NotAvailable, ParseError):
        return None


class Enricher:
    """Called once per finding by the engine; `first`/`last` are the sources of the window's
    start and end (the same LiveHost for the live node), `samples` a recording's every
    (source, time), in order. The rule's own `enrich` does the naming; this is what it reads
    through."""

    def __init__(self, config: Config, first: EvidenceSource, last: EvidenceSource,
                 series: Series | None = None,
                 samples: tuple[tuple[EvidenceSource, float], ...] = ()):
        self.config = config
        self.first = Scrape(first)
        self.last = Scrape(last)
        self.series = series
        self.live = last.live
        self._samples = samples
        self._offline_before: dict | None = None
        self._cpu_before: dict | None = None
        self._stat_before = None
        from fleetscope.collectors.tasks import WaitTracker

        self._tracker = WaitTracker()
        self._waiting: dict | None = None  # (pid, tid) -> (wait, CPU ns, pool)
        self._isa_budget = None
        self._waited: dict = {}  # (pid, tid) -> seconds

    def __call__(self, finding: Finding) -> None:
        enrich = finding.rule.enrich
        if enrich is None:
            return
        try:
            enrich(self, finding)
            pods.add_pod_subjects((self.last, self.first), self.config, finding)
        except Exception:  # enrichment is a bonus: never lose the finding over it
            log.debug("enrichment of %s failed", finding.rule.id, exc_info=True)

    def snapshot(self) -> None:
        """Live: remember the offline processes' CPU, every process's CPU and the per-CPU
        times before sampling (a bundle has its first sample for that)."""
        self._offline_before = self._offline_cpu(self.first)
        self._cpu_before = self._process_cpu(self.first)
        self._stat_before = _read(self.first, PROC_STAT, parse_proc_stat)
        import time

        # Network waits are tracked from here: the live node's samples start now.
        self._observe_waits(self.first.evidence, time.time())

    # -- reads ---------------------------------------------------------------------------
    @staticmethod
    def read(scrape: Scrape, path: str, parser):
        """parser(the file's text), or None when the file is absent or does not parse."""
        return _read(scrape, path, parser)

    def now(self) -> float:
        """The window's end: the last sample of the series, else the last scrape's time."""
        timestamps = self.series.timestamps() if self.series is not None else []
        return timestamps[-1] / 1000 if timestamps else self.last.time

    def pool_members(self, scrape: Scrape, pool_name: str | None = None,
                     workload_class: str | None = None):
        for process in pool_processes(scrape, self.config.pools):
            if pool_name and process.pool.name != pool_name:
                continue
            if workload_class and process.pool.workload_class != workload_class:
                continue
            yield process

    def _offline_cpu(self, scrape: Scrape) -> dict:
        return {p.pid: _read(scrape, process_file(p.pid, "stat"), parse_pid_stat)
                for p in self.pool_members(scrape, workload_class="offline")}

    def offline_cpu_before(self) -> dict:
        """pid -> /proc/<pid>/stat of the offline pools' processes at the window's start."""
        if self._offline_before is None:
            self._offline_before = self._offline_cpu(self.first)
        return self._offline_before

    def _process_cpu(self, scrape: Scrape) -> dict[int, tuple[int, int]]:
        """pid -> (CPU ticks used, the CPU it last ran on), for every process the source
        has (a bundle keeps pool members and the top CPU users)."""
        out = {}
        try:
            names = scrape.listdir("proc")
        except NotAvailable:
            return out
        for name in names:
            if name.isdigit():
                stat = _read(scrape, process_file(name, "stat"), parse_pid_stat)
                if stat is not None:
                    out[int(name)] = (stat.utime_ticks + stat.stime_ticks, stat.processor)
        return out

    def top_consumers(self) -> list[tuple[int, int, int]]:
        """(ticks used over the window, pid, last CPU), busiest first."""
        before = self._cpu_before
        if before is None:
            before = self._process_cpu(self.first)
        after = self._process_cpu(self.last)
        used = [(ticks - before.get(pid, (0, 0))[0], pid, cpu)
                for pid, (ticks, cpu) in after.items() if pid != os.getpid()]
        return sorted((u for u in used if u[0] > 0), reverse=True)

    # -- Kubernetes (diagnose/pods.py) ---------------------------------------------------
    def pod(self, pid: int):
        """The pod a process runs in (collectors/pods.py Pod), or None."""
        return pods.process_pod(self.last, self.config, pid) or pods.process_pod(
            self.first, self.config, pid)

    def cpu_manager(self):
        """(the kubelet's CPU manager checkpoint, "") or (None, why not)."""
        return pods.cpu_manager(self.last, self.config)

    def memory_manager(self):
        return pods.memory_manager(self.last, self.config)

    def who(self, pid: int) -> str:
        """`pid 123`, or `pod batch/etl-7f9c (BestEffort) pid 123` in a pod: how a summary
        names a process."""
        pod = self.pod(pid)
        return f"{pod.title} pid {pid}" if pod is not None else f"pid {pid}"

    def describe(self, pid: int) -> str:
        """`pid 123 (fs_worker.py, pinned to CPU 1)`: the program, and its affinity when it is
        narrower than the node; `pod batch/etl-7f9c (BestEffort), pid 123 (...)` in a pod."""
        pod = self.pod(pid)
        described = self._describe(pid)
        return f"{pod.title}, {described}" if pod is not None else described

    def _describe(self, pid: int) -> str:
        program = program_name(_read(self.last, process_file(pid, "cmdline"), lambda t: t) or "")
        status = _read(self.last, process_file(pid, "status"), parse_status) or {}
        allowed = status.get("Cpus_allowed_list", "")
        online = _read(self.last, CPU_ONLINE, lambda t: t.strip())
        pinned = ""
        if allowed and online and parse_cpulist(allowed) != parse_cpulist(online):
            pinned = f", pinned to CPU {allowed}"
        return f"pid {pid} ({program or '?'}{pinned})"

    def full_listeners(self) -> list:
        """The listening sockets whose accept queue is at its backlog (else the one with the
        longest queue, where the backlog is not known), fullest first, with the pids holding
        them: the live node's (sock_diag, fd links) or as the bundle recorded them."""
        from fleetscope.collectors.listen import read_listeners, socket_owners

        scrape = Scrape(self.last.evidence) if self.live else self.last  # live: as of now
        try:
            listeners = read_listeners(scrape)
        except (NotAvailable, ParseError):
            return []
        full = [item for item in listeners if item.full] or sorted(
            (item for item in listeners if item.queue), key=lambda item: -item.queue)[:1]
        full.sort(key=lambda item: (-item.queue, item.address))
        if self.live:
            owners = socket_owners(scrape, {item.inode for item in full})
            full = [item._replace(pids=tuple(owners.get(item.inode, ()))) for item in full]
        return full

    def saturated_cpus(self) -> list[int]:
        """CPUs busier than the saturation ratio between the first and last /proc/stat."""
        before = self._stat_before or _read(self.first, PROC_STAT, parse_proc_stat)
        after = _read(self.last, PROC_STAT, parse_proc_stat)
        if before is None or after is None:
            return []
        busy = {}
        for cpu, ticks in after.cpus.items():
            then = before.cpus.get(cpu)
            if then is None:
                continue
            delta = [a - b for a, b in zip(ticks[:8], then[:8], strict=True)]
            total = sum(delta)
            if total > 0:
                busy[cpu] = 1 - (delta[3] + delta[4]) / total  # idle, iowait
        threshold = self.config.saturated_core_busy_ratio
        return sorted(cpu for cpu, ratio in busy.items() if ratio > threshold)

    # -- worker threads ------------------------------------------------------------------
    def stacks(self, pid: int, timeout: float = 10) -> tuple[list, str]:
        """(py-spy threads of a live process, "") or ([], why not)."""
        from fleetscope.tools.stacks import StacksError, dump

        try:
            return dump(pid, timeout=timeout), ""
        except StacksError as err:
            return [], str(err)

    def _observe_waits(self, source: EvidenceSource, at: float) -> None:
        """One observation of every pool thread's network wait into the tracker."""
        from fleetscope.collectors.tasks import process_network_waits

        scrape = Scrape(source, at)
        current = {}
        for process in self.pool_members(scrape):
            for wait, runtime in process_network_waits(scrape, process.pid):
                current[(wait.pid, wait.tid)] = (wait, runtime, process.pool.name)
        self._waited = self._tracker.observe(
            {key: (wait.signature, runtime, wait.idle_seconds)
             for key, (wait, runtime, _) in current.items()}, at)
        self._waiting = current

    def network_waits(self, pool: str | None) -> list[tuple[object, float]]:
        """[(NetworkWait, seconds parked)] of a pool, longest first: a bundle replayed sample
        by sample (as the collector tracked it), the live node from the snapshot to now."""
        import time

        if self._waiting is None or self.live:
            if self.live:
                self._observe_waits(self.last.evidence, time.time())
            else:
                for source, at in self._samples or ((self.last.evidence, self.last.time),):
                    self._observe_waits(source, at)
        found = [(self._waiting[key][0], seconds) for key, seconds in self._waited.items()
                 if pool is None or self._waiting[key][2] == pool]
        return sorted(found, key=lambda item: (-item[1], item[0].pid, item[0].tid))

    # -- the kernel log and binaries -----------------------------------------------------
    def kernel_log(self) -> str | None:
        """A bundle's static/dmesg.txt, or the live ring buffer: the logs the source has."""
        logs = self.last.evidence.kernel_logs
        if DMESG in logs:
            try:
                return self.last.read_text(DMESG)
            except NotAvailable:
                pass
        if KMSG not in logs:
            return None
        from fleetscope.collectors.cpu_features import _Kmsg

        try:
            kmsg = _Kmsg(self.last.path(KMSG))
        except OSError:
            return None
        try:
            return kmsg.read_new()
        except OSError:
            return None
        finally:
            kmsg.close()

    @property
    def isa_budget(self):
        """The time left for this diagnosis's ELF reads (fleetscope/tools/isa_budget.py)."""
        if self._isa_budget is None:
            from fleetscope.tools.isa_budget import IsaBudget

            self._isa_budget = IsaBudget(self.config.isa_scan_seconds)
        return self._isa_budget

    @functools.cache  # noqa: B019 (one Enricher per diagnosis; names a crash gives)
    def locate_binary(self, name: str) -> str | None:
        """The live node's file of a crashed binary's name (fleetscope/tools/isa.py), looked
        for once per name: a crash loop names it thousands of times."""
        from fleetscope.tools.isa import locate_binary

        if not self.isa_budget.left():
            return None
        return locate_binary(name, directories=self.config.binary_dirs)

    def isa_check_missing(self, binary: str) -> list[str]:
        """What the whole-binary check says the binary needs and this CPU lacks: recorded by
        `bundle record` (static/cmd/isa-check-<binary>.json), or checked now on a live
        node when the binary can be found."""
        document = None
        try:
            document = json.loads(self.last.read_text(isa_check_file(binary)))
        except (NotAvailable, ValueError):
            pass
        if document is None and self.live:
            from fleetscope.tools.isa import InputError

            path = self.locate_binary(binary)
            if path is not None:
                try:
                    document = self.isa_budget.check(path, self.last.read_text(CPUINFO),
                                                     "/" + CPUINFO)
                except (InputError, NotAvailable):
                    document = None
        if not isinstance(document, dict):
            return []
        missing = [str(name) for name in document.get("missing") or []]
        if document.get("arch_mismatch"):
            missing = missing or ["(built for another architecture)"]
        return missing
