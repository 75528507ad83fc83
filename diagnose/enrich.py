"""Subjects the metrics deliberately do not carry (which pids, cgroups, CPUs, NUMA nodes),
read from the raw evidence where the source has it: a bundle's first and last samples, or
the live node. Metrics stay per pool; a finding names the processes.

    offline-preemption   the offline processes that used the most CPU (the antagonists)
    numa-remote-access   the pool's processes with the most memory off their CPUs' nodes
    fd-exhaustion        the process closest to its open-file limit
    core-imbalance       the busiest CPU
    isa-mismatch         the extensions the crashed binary uses that the CPU lacks
    worker-blocked-...   the threads parked in network calls: pid, syscall, TCP peer, how
                         long (kernel side, bundle or live), and the py-spy frame (live)
    thread-oversub...    the pool's processes with the most threads
"""

from __future__ import annotations

import json
import logging
import os

from fleetscope.collectors.base import NotAvailable, Scrape, bundle_roots
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers.process import (
    parse_limits,
    parse_numa_maps,
    parse_pid_stat,
    parse_status,
)
from fleetscope.collectors.parsers.sysfs import parse_cpulist
from fleetscope.collectors.processes import pool_processes
from fleetscope.collectors.shared import numa_node_cpus
from fleetscope.config import Config
from fleetscope.rules.promql import Selector, Series

from .engine import Finding

log = logging.getLogger("fleetscope.diagnose")
MAX_SUBJECTS = 5


def _read(scrape: Scrape, path: str, parser):
    try:
        return parser(scrape.read_text(path))
    except (NotAvailable, ParseError):
        return None


class Enricher:
    """Called once per finding by the engine; `first`/`last` are the raw evidence roots."""

    def __init__(self, config: Config, first: tuple[str, ...], last: tuple[str, ...],
                 series: Series | None = None, live: bool = False):
        self.config = config
        self.first = Scrape(first)
        self.last = Scrape(last)
        self.series = series
        self.live = live
        self._before: dict | None = None
        from fleetscope.collectors.tasks import WaitTracker

        self._tracker = WaitTracker()
        self._waiting: dict | None = None  # (pid, tid) -> (wait, CPU ns, pool)
        self._waited: dict = {}  # (pid, tid) -> seconds

    def snapshot(self) -> None:
        """Live: remember the offline processes' CPU before sampling (a bundle has its first
        sample for that)."""
        self._before = {p.pid: _read(self.first, f"proc/{p.pid}/stat", parse_pid_stat)
                        for p in self._pool_members(self.first, workload_class="offline")}
        import time

        # Network waits are tracked from here: the live node's samples start now.
        self._observe_waits(self.first.roots, time.time())

    def __call__(self, finding: Finding) -> None:
        handler = getattr(self, "_" + finding.rule.id.replace("-", "_"), None)
        if handler is None:
            return
        try:
            handler(finding)
        except Exception:  # enrichment is a bonus: never lose the finding over it
            log.debug("enrichment of %s failed", finding.rule.id, exc_info=True)

    def _pool_members(self, scrape: Scrape, pool_name: str | None = None,
                      workload_class: str | None = None):
        for process in pool_processes(scrape, self.config.pools):
            if pool_name and process.pool.name != pool_name:
                continue
            if workload_class and process.pool.workload_class != workload_class:
                continue
            yield process

    def _offline_preemption(self, finding: Finding) -> None:
        before = self._before
        if before is None:
            before = {p.pid: _read(self.first, f"proc/{p.pid}/stat", parse_pid_stat)
                      for p in self._pool_members(self.first, workload_class="offline")}
        usage = []
        for process in self._pool_members(self.last, workload_class="offline"):
            now = _read(self.last, f"proc/{process.pid}/stat", parse_pid_stat)
            if now is None:
                continue
            then = before.get(process.pid)
            used = now.utime_ticks + now.stime_ticks
            if then is not None:
                used -= then.utime_ticks + then.stime_ticks
            usage.append((used, process, now.processor))
        usage.sort(key=lambda item: -item[0])
        for used, process, cpu in usage[:MAX_SUBJECTS]:
            if used <= 0:
                break
            finding.subjects["pids"].append(process.pid)
            if process.cgroup and process.cgroup not in finding.subjects["cgroups"]:
                finding.subjects["cgroups"].append(process.cgroup)
            if cpu not in finding.subjects["cpus"]:
                finding.subjects["cpus"].append(cpu)
        if usage and usage[0][0] > 0:
            names = ", ".join(f"{p.cmdline[:40] or p.pid}" for _, p, _ in usage[:2])
            finding.extra_summary = f"antagonists: {names}"

    def _numa_remote_access(self, finding: Finding) -> None:
        nodes = numa_node_cpus(self.last)
        node_of = {cpu: node for node, cpus in nodes.items() for cpu in cpus}
        remote_by_pid = []
        remote_nodes: set[int] = set()
        for process in self._pool_members(self.last, finding.labels.get("pool")):
            status = _read(self.last, f"proc/{process.pid}/status", parse_status)
            resident = _read(self.last, f"proc/{process.pid}/numa_maps", parse_numa_maps)
            if not status or not resident:
                continue
            allowed = parse_cpulist(status.get("Cpus_allowed_list", ""))
            local = {node_of[c] for c in allowed if c in node_of}
            remote = {n: size for n, size in resident.items() if n not in local}
            total = sum(resident.values())
            if total and remote:
                remote_by_pid.append((sum(remote.values()) / total, process.pid))
                remote_nodes.update(remote)
        remote_by_pid.sort(reverse=True)
        finding.subjects["pids"] = [pid for _, pid in remote_by_pid[:MAX_SUBJECTS]]
        finding.subjects["numa_nodes"] = sorted(remote_nodes)

    def _fd_exhaustion(self, finding: Finding) -> None:
        worst = []
        for process in self._pool_members(self.last, finding.labels.get("pool")):
            limits = _read(self.last, f"proc/{process.pid}/limits", parse_limits)
            soft = (limits or {}).get("Max open files", (None, None))[0]
            try:
                count = int(self.last.read_text(f"proc/{process.pid}/fd_count").strip())
            except (NotAvailable, ValueError):
                try:
                    count = len(self.last.listdir(f"proc/{process.pid}/fd"))
                except NotAvailable:
                    continue
            if soft:
                worst.append((count / soft, process.pid))
        worst.sort(reverse=True)
        # Name the processes near the limit, not every member of the pool.
        finding.subjects["pids"] = [pid for ratio, pid in worst[:MAX_SUBJECTS]
                                    if ratio >= worst[0][0] * 0.8]

    def _core_imbalance(self, finding: Finding) -> None:
        busiest = Selector("fleetscope_cpu_busiest_core").evaluate(
            self.series, self.series.timestamps()[-1])
        for value in busiest.values():
            finding.subjects["cpus"].append(int(value))

    def _worker_blocked_external_call(self, finding: Finding) -> None:
        """The threads parked in a network call (kernel side: syscall, fd, TCP peer, and for
        how long, tracked as the pools collector tracks them), with the py-spy frame each
        waits in on a live node."""
        pool = finding.labels.get("pool")
        waits = self._network_waits(pool)
        stacks: dict[tuple[int, int], object] = {}
        if self.live:
            from fleetscope.stacks import StacksError, dump

            pids = sorted({wait.pid for wait, _ in waits}) or [
                p.pid for p in self._pool_members(self.last, pool)]
            blocked = []
            for pid in pids[:MAX_SUBJECTS * 4]:  # py-spy costs a ptrace stop per process
                try:
                    threads = dump(pid, timeout=10)
                except StacksError as err:
                    finding.evidence.append({"signal": f"stacks of pid {pid}: {err}",
                                             "value": 0, "threshold": 0, "unit": "threads"})
                    continue
                stacks.update({(pid, t.native_id): t for t in threads})
                waiting = [t for t in threads if t.state == "network"]
                if waiting:
                    blocked.append(pid)
                    finding.evidence.append({
                        "signal": f"pid {pid} threads waiting on the network "
                                  f"(e.g. {waiting[0].blocking_call or waiting[0].frames[0]})",
                        "value": len(waiting), "threshold": 0, "unit": "threads"})
            if not waits:
                finding.subjects["pids"] = blocked[:MAX_SUBJECTS]
        threshold = self.config.blocked_call_seconds
        described = []
        for wait, seconds in waits[:MAX_SUBJECTS]:
            if wait.pid not in finding.subjects["pids"]:
                finding.subjects["pids"].append(wait.pid)
            stack = stacks.get((wait.pid, wait.tid))
            frame = ""
            if stack is not None:  # "s.recv(4096) in tool_call (worker.py:5)"
                parts = [stack.blocking_call.split("  [")[0]] + stack.frames[:1]
                frame = " in ".join(part for part in parts if part)
            peer = wait.peer or "an unconnected TCP socket"
            text = (f"pid {wait.pid} thread {wait.tid} in {wait.call}() on {peer} "
                    f"for {seconds:.0f} s" + (f" at {frame}" if frame else ""))
            described.append(text)
            finding.evidence.append({
                "signal": f"{text} (fd {wait.fd}, kernel wait {wait.wchan or '?'})",
                "value": round(seconds, 1), "threshold": threshold, "unit": "seconds"})
        if described:
            more = len(waits) - 1
            finding.extra_summary = described[0] + (
                f" (+{more} more thread{'s' if more > 1 else ''})" if more > 0 else "")

    def _observe_waits(self, roots: tuple[str, ...], at: float) -> None:
        """One observation of every pool thread's network wait into the tracker."""
        from fleetscope.collectors.tasks import process_network_waits

        scrape = Scrape(roots, at)
        current = {}
        for process in self._pool_members(scrape):
            for wait, runtime in process_network_waits(scrape, process.pid):
                current[(wait.pid, wait.tid)] = (wait, runtime, process.pool.name)
        self._waited = self._tracker.observe(
            {key: (wait.signature, runtime, wait.idle_seconds)
             for key, (wait, runtime, _) in current.items()}, at)
        self._waiting = current

    def _network_waits(self, pool: str | None) -> list[tuple[object, float]]:
        """[(NetworkWait, seconds parked)] of a pool, longest first: a bundle replayed sample
        by sample (as the collector tracked it), the live node from the snapshot to now."""
        import time

        if self._waiting is None or self.live:
            if self.live:
                self._observe_waits(self.last.roots, time.time())
            else:
                for roots, at in self._bundle_samples():
                    self._observe_waits(roots, at)
        found = [(self._waiting[key][0], seconds) for key, seconds in self._waited.items()
                 if pool is None or self._waiting[key][2] == pool]
        return sorted(found, key=lambda item: (-item[1], item[0].pid, item[0].tid))

    def _bundle_samples(self) -> list[tuple[tuple[str, ...], float]]:
        first = self.first.roots[0]
        bundle = os.path.dirname(os.path.dirname(first))
        try:
            with open(os.path.join(bundle, "meta.json"), encoding="utf-8") as handle:
                samples = json.load(handle)["samples"]
            return [(bundle_roots(os.path.join(bundle, s["dir"])), float(s["time"]))
                    for s in samples]
        except (OSError, ValueError, KeyError, TypeError):
            return [(self.last.roots, self.last.time)]

    def _thread_oversubscription(self, finding: Finding) -> None:
        """The pool's processes with the most threads (where the oversubscription is)."""
        counts = []
        for process in self._pool_members(self.last, finding.labels.get("pool")):
            stat = _read(self.last, f"proc/{process.pid}/stat", parse_pid_stat)
            if stat is not None:
                counts.append((stat.num_threads, process.pid))
        counts.sort(key=lambda item: (-item[0], item[1]))
        top = [(n, pid) for n, pid in counts[:MAX_SUBJECTS] if n > 1]
        finding.subjects["pids"] = [pid for _, pid in top]
        if top:
            finding.extra_summary = "most threads: " + ", ".join(
                f"pid {pid} ({n})" for n, pid in top[:3])

    def _isa_mismatch(self, finding: Finding) -> None:
        """Which extensions the crashed binary uses that this CPU lacks: recorded in the
        bundle by `bundle record` (static/cmd/isa-check-<binary>.json), or checked now on a
        live node when the binary can be found."""
        binary = finding.labels.get("binary", "")
        document = None
        try:
            document = json.loads(self.last.read_text(f"cmd/isa-check-{binary}.json"))
        except (NotAvailable, ValueError):
            pass
        if document is None and self.live:
            from fleetscope.isa import InputError, check_against_cpuinfo, locate_binary

            path = locate_binary(binary)
            if path is not None:
                try:
                    document = check_against_cpuinfo(path, self.last.read_text("proc/cpuinfo"),
                                                      "/proc/cpuinfo")
                except (InputError, ParseError, NotAvailable, ImportError):
                    document = None
        if not isinstance(document, dict):
            return
        missing = [str(name) for name in document.get("missing") or []]
        if document.get("arch_mismatch"):
            missing = missing or ["(built for another architecture)"]
        if missing:
            finding.extra_summary = f"it uses {', '.join(missing)}, which this CPU lacks"
        finding.evidence.append({
            "signal": f"extensions {binary} uses that this CPU lacks"
                      + (f": {', '.join(missing)}" if missing else " (none found by isa check)"),
            "value": len(missing), "threshold": 0, "unit": "extensions"})
