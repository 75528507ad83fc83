"""Subjects the metrics deliberately do not carry (which pids, cgroups, CPUs, NUMA nodes),
read from the raw evidence where the source has it: a bundle's first and last samples, or
the live node. Metrics stay per pool; a finding names the processes.

    offline-preemption   the offline processes that used the most CPU (the antagonists)
    numa-remote-access   the pool's processes with the most memory off their CPUs' nodes
    fd-exhaustion        the process closest to its open-file limit
    core-imbalance       the busiest CPU
    isa-mismatch         every binary that died of SIGILL: pids, times, faulting instruction
    worker-blocked-...   the threads parked in network calls: pid, syscall, TCP peer, how
                         long (kernel side, bundle or live), and the py-spy frame (live)
    thread-oversub...    the pool's processes with the most threads
"""

from __future__ import annotations

import json
import logging
import os
import re

from fleetscope.collectors.base import NotAvailable, Scrape
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers.process import (
    parse_limits,
    parse_numa_maps,
    parse_pid_stat,
    parse_status,
)
from fleetscope.collectors.parsers.procfs import parse_proc_stat
from fleetscope.collectors.parsers.sysfs import parse_cpulist
from fleetscope.collectors.processes import pool_processes
from fleetscope.collectors.shared import numa_node_cpus
from fleetscope.core.bundle_format import META, bundle_roots, load_meta
from fleetscope.core.config import Config
from fleetscope.rules.promql import Selector, Series

from .engine import Finding

log = logging.getLogger("fleetscope.diagnose")
MAX_SUBJECTS = 5


INTERPRETERS = re.compile(r"(python[0-9.]*|pypy[0-9.]*|node|java|ruby|perl|php|bash|sh|dash|"
                          r"uv|uvx|env)")


def program_name(cmdline: str) -> str:
    """What a person calls the program: the script or module an interpreter runs
    (`python3 -m agent.worker` -> agent.worker, `/usr/bin/python3 /srv/etl_job.py` ->
    etl_job.py), else the executable's base name. Never the arguments, which may hold
    secrets."""
    words = cmdline.replace("\0", " ").split()
    if not words:
        return ""
    first = os.path.basename(words[0])
    if not INTERPRETERS.fullmatch(first):
        return first
    rest = iter(words[1:])
    for word in rest:
        if word in ("-m", "-jar"):  # python -m module, java -jar app.jar
            return os.path.basename(next(rest, first))
        if word == "-c":
            return f"{first} -c"
        if word in ("-X", "-W", "-Q", "-cp", "-classpath"):  # options with a value
            next(rest, None)
            continue
        if word.startswith("-") or "=" in word:
            continue
        return os.path.basename(word)
    return first


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
        """Live: remember the offline processes' CPU, every process's CPU and the per-CPU
        times before sampling (a bundle has its first sample for that)."""
        self._before = {p.pid: _read(self.first, f"proc/{p.pid}/stat", parse_pid_stat)
                        for p in self._pool_members(self.first, workload_class="offline")}
        self._cpu_before = self._process_cpu(self.first)
        self._stat_before = _read(self.first, "proc/stat", parse_proc_stat)
        import time

        # Network waits are tracked from here: the live node's samples start now.
        self._observe_waits(self.first.roots, time.time())

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
                stat = _read(scrape, f"proc/{name}/stat", parse_pid_stat)
                if stat is not None:
                    out[int(name)] = (stat.utime_ticks + stat.stime_ticks, stat.processor)
        return out

    def _top_consumers(self) -> list[tuple[int, int, int]]:
        """(ticks used over the window, pid, last CPU), busiest first."""
        before = getattr(self, "_cpu_before", None)
        if before is None:
            before = self._process_cpu(self.first)
        after = self._process_cpu(self.last)
        used = [(ticks - before.get(pid, (0, 0))[0], pid, cpu)
                for pid, (ticks, cpu) in after.items() if pid != os.getpid()]
        return sorted((u for u in used if u[0] > 0), reverse=True)

    def _describe(self, pid: int) -> str:
        """`pid 123 (fs_worker.py, pinned to CPU 1)`: the program, and its affinity when it is
        narrower than the node."""
        program = program_name(_read(self.last, f"proc/{pid}/cmdline", lambda t: t) or "")
        status = _read(self.last, f"proc/{pid}/status", parse_status) or {}
        allowed = status.get("Cpus_allowed_list", "")
        online = _read(self.last, "sys/devices/system/cpu/online", lambda t: t.strip())
        pinned = ""
        if allowed and online and parse_cpulist(allowed) != parse_cpulist(online):
            pinned = f", pinned to CPU {allowed}"
        return f"pid {pid} ({program or '?'}{pinned})"

    def _saturated_cpus(self) -> list[int]:
        """CPUs busier than the saturation ratio between the first and last /proc/stat."""
        before = getattr(self, "_stat_before", None) or _read(self.first, "proc/stat",
                                                              parse_proc_stat)
        after = _read(self.last, "proc/stat", parse_proc_stat)
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
            finding.extra_summary = f"antagonists: {self._antagonist_names(usage[:2])}"

    def _antagonist_names(self, usage) -> str:
        """The antagonists by program and pid: never their arguments, where secrets live
        (an agent started with --api-key=... must not print it in a ticket)."""
        return ", ".join(f"{program_name(p.cmdline) or p.pid} (pid {p.pid})"
                         for _, p, _ in usage)

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
        """The saturated CPUs, and the processes running on them: pinned there (affinity) or
        free to move (the scheduler's doing)."""
        saturated = self._saturated_cpus()
        if not saturated:
            busiest = Selector("fleetscope_cpu_busiest_core").evaluate(
                self.series, self.series.timestamps()[-1])
            saturated = sorted({int(value) for value in busiest.values()})
        finding.subjects["cpus"] = saturated[:MAX_SUBJECTS * 4]
        on_hot = [(used, pid) for used, pid, cpu in self._top_consumers() if cpu in saturated]
        finding.subjects["pids"] = [pid for _, pid in on_hot[:MAX_SUBJECTS]]
        described = [self._describe(pid) for _, pid in on_hot[:3]]
        cpus = ", ".join(map(str, saturated[:8])) + (" ..." if len(saturated) > 8 else "")
        finding.extra_summary = f"saturated CPU {cpus}" + (
            f": {'; '.join(described)}" if described else "")
        if described and all("pinned to" in d for d in described):
            finding.extra_summary += " - the busy tasks are pinned: fix their affinity"
        elif described:
            finding.extra_summary += " - the busy tasks are not all pinned"

    def _irq_core_overlap(self, finding: Finding) -> None:
        """The online pool's CPUs that took the most device interrupts over the window, and
        the IRQs (device names) behind them."""
        from fleetscope.collectors.irq import row_kind
        from fleetscope.collectors.parsers.interrupts import parse_interrupts

        allowed: set[int] = set()
        for process in self._pool_members(self.last, finding.labels.get("pool")):
            status = _read(self.last, f"proc/{process.pid}/status", parse_status) or {}
            allowed |= set(parse_cpulist(status.get("Cpus_allowed_list", "")))
        before = _read(self.first, "proc/interrupts", parse_interrupts)
        after = _read(self.last, "proc/interrupts", parse_interrupts)
        if after is None:
            return
        earlier = {row.name: row.counts for row in (before.rows if before else [])}
        per_cpu: dict[int, int] = {}
        per_irq: dict[str, int] = {}
        for row in after.rows:
            if not row.per_cpu or row_kind(row) != "device":
                continue
            then = earlier.get(row.name, (0,) * len(row.counts))
            for cpu, now, old in zip(after.cpus, row.counts, then, strict=False):
                if cpu in allowed and now > old:
                    per_cpu[cpu] = per_cpu.get(cpu, 0) + now - old
                    name = row.description.split()[-1] if row.description else row.name
                    per_irq[name] = per_irq.get(name, 0) + now - old
        hot = sorted(per_cpu, key=lambda cpu: -per_cpu[cpu])
        finding.subjects["cpus"] = sorted(hot[:MAX_SUBJECTS * 2])
        top_irqs = sorted(per_irq, key=lambda name: -per_irq[name])[:3]
        if hot:
            finding.extra_summary = (f"most on CPU {', '.join(map(str, hot[:4]))}"
                                     + (f" from {', '.join(top_irqs)}" if top_irqs else ""))

    def _cold_start(self, finding: Finding) -> None:
        """The pool's processes that started in the last five minutes of the window: the
        ones that loaded their model cold."""
        stat = _read(self.last, "proc/stat", parse_proc_stat)
        boot = (stat.scalars.get("btime") if stat else None)
        if not boot:
            return
        hz = os.sysconf("SC_CLK_TCK")
        end = self.series.timestamps()[-1] / 1000 if self.series else self.last.time
        young = []
        for process in self._pool_members(self.last, finding.labels.get("pool")):
            pid_stat = _read(self.last, f"proc/{process.pid}/stat", parse_pid_stat)
            if pid_stat is None:
                continue
            age = end - (boot + pid_stat.starttime_ticks / hz)
            if 0 <= age <= 300:
                young.append((age, process.pid))
        young.sort()
        finding.subjects["pids"] = [pid for _, pid in young[:MAX_SUBJECTS]]
        if young:
            finding.extra_summary = "started in the last 5 minutes: " + ", ".join(
                f"pid {pid} ({age:.0f} s ago)" for age, pid in young[:3])

    def _cpu_saturation(self, finding: Finding) -> None:
        """The top CPU consumers over the window."""
        top = self._top_consumers()[:MAX_SUBJECTS]
        finding.subjects["pids"] = [pid for _, pid, _ in top]
        if top:
            finding.extra_summary = "top CPU users: " + "; ".join(
                self._describe(pid) for _, pid, _ in top[:3])

    def _worker_blocked_external_call(self, finding: Finding) -> None:
        """The threads parked in a network call (kernel side: syscall, fd, TCP peer, and for
        how long, tracked as the pools collector tracks them), with the py-spy frame each
        waits in on a live node."""
        pool = finding.labels.get("pool")
        waits = self._network_waits(pool)
        stacks: dict[tuple[int, int], object] = {}
        if self.live:
            from fleetscope.tools.stacks import StacksError, dump

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
            samples = load_meta(os.path.join(bundle, META))["samples"]
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
        """One finding per node: every binary the kernel log saw die of SIGILL, its pids,
        crash times, and the instruction that faulted with its extension
        (fleetscope/tools/isa_fault.py: the kernel's file offset, ip minus the mapping base, an
        arm64 Code: word; bytes `bundle record` kept when the binary is not here), else the
        whole-binary `isa check` as a last resort."""
        import time

        from fleetscope.collectors.parsers.cpuinfo import parse_cpuinfo
        from fleetscope.collectors.parsers.kmsg import boot_time, scan_kernel_log
        from fleetscope.tools.isa_fault import crashed_binaries

        text = self._kernel_log()
        if text is None:
            return
        crashes = scan_kernel_log(text).crashes
        labelled = finding.labels.get("binary")
        if labelled:  # a per-binary finding describes its own binary only
            crashes = tuple(c for c in crashes if c.binary == labelled)
        if not crashes:
            return
        boot = _read(self.last, "proc/stat", boot_time)
        cpu = _read(self.last, "proc/cpuinfo", parse_cpuinfo)
        try:
            captures = json.loads(self.last.read_text("cmd/sigill-faults.json"))
        except (NotAvailable, ValueError):
            captures = []
        timestamps = self.series.timestamps() if self.series is not None else []
        now = timestamps[-1] / 1000 if timestamps else time.time()
        locate = None
        if self.live:
            from fleetscope.tools.isa import locate_binary as locate
        binaries = crashed_binaries(
            crashes, boot, now, SIGILL_LOOKBACK, captures=captures if isinstance(
                captures, list) else [], locate=locate,
            cpu_flags=cpu.features if cpu else frozenset(), cpu_arch=cpu.model.arch if cpu
            else "")
        finding.subjects["binaries"] = [b.binary for b in binaries]
        finding.subjects["pids"] = list(dict.fromkeys(
            pid for b in binaries for pid in b.pids))[:MAX_SUBJECTS * 4]
        parts, earlier = [], []
        scans = 3  # a whole-binary check of a big library costs seconds: the latest few only
        for crashed in binaries:
            if crashed.fault is None and scans and (crashed.recent or crashed.last_time is None):
                scans -= 1
                crashed.scan_missing = self._isa_check_missing(crashed.binary)
            finding.evidence.extend(_crash_evidence(crashed, now))
            (parts if crashed.recent or crashed.last_time is None else earlier).append(crashed)
        summary = [_crash_summary(c, now) for c in parts[:3]]
        if earlier:
            last = max(c.last_time for c in earlier)
            summary.append(f"earlier SIGILL crashes of {', '.join(c.binary for c in earlier[:3])}"
                           f"{' and others' if len(earlier) > 3 else ''}, last at "
                           f"{_utc(last)}")
        finding.extra_summary = "; ".join(summary)
        main = parts[0] if parts else binaries[0]
        if main.fault is None:  # the verdict rests on a whole-binary scan at best
            finding.confidence = min(finding.confidence, 0.6)

    def _kernel_log(self) -> str | None:
        """A bundle's static/dmesg.txt, or the live ring buffer (/dev/kmsg, then `dmesg`)."""
        try:
            return self.last.read_text("dmesg.txt")
        except NotAvailable:
            pass
        if not self.live:
            return None
        from fleetscope.collectors.cpu_features import _Kmsg

        try:
            kmsg = _Kmsg("/dev/kmsg")
        except OSError:
            return None
        try:
            return kmsg.read_new()
        except OSError:
            return None
        finally:
            kmsg.close()

    def _isa_check_missing(self, binary: str) -> list[str]:
        """What the whole-binary check says the binary needs and this CPU lacks: recorded by
        `bundle record` (static/cmd/isa-check-<binary>.json), or checked now on a live
        node when the binary can be found."""
        document = None
        try:
            document = json.loads(self.last.read_text(f"cmd/isa-check-{binary}.json"))
        except (NotAvailable, ValueError):
            pass
        if document is None and self.live:
            from fleetscope.tools.isa import InputError, check_against_cpuinfo, locate_binary

            path = locate_binary(binary)
            if path is not None:
                try:
                    document = check_against_cpuinfo(path, self.last.read_text("proc/cpuinfo"),
                                                      "/proc/cpuinfo")
                except (InputError, ParseError, NotAvailable, ImportError):
                    document = None
        if not isinstance(document, dict):
            return []
        missing = [str(name) for name in document.get("missing") or []]
        if document.get("arch_mismatch"):
            missing = missing or ["(built for another architecture)"]
        return missing


SIGILL_LOOKBACK = 900  # seconds: crashes this recent are the incident; older ones "earlier"


def _utc(when: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


def _crash_summary(crashed, now: float) -> str:
    fault = crashed.fault
    pids = ", ".join(str(p) for p in crashed.pids[:3])
    head = f"{crashed.binary} (pid {pids}" + (
        f", {max(0, now - crashed.last_time):.0f} s ago)" if crashed.last_time else ")")
    if fault is not None and fault.text:
        verdict = ", ".join(f"{name} {'absent' if state == 'missing' else state} on this CPU"
                            for name, state in crashed.on_cpu.items()) or fault.note
        return f"{head} faulted on {fault.text}" + (f": {verdict}" if verdict else "") + \
            f" [{fault.source}]"
    if fault is not None:
        return f"{head}: {fault.note} [{fault.source}]"
    if crashed.scan_missing:
        return f"{head}: it uses {', '.join(crashed.scan_missing)}, which this CPU lacks " \
               "[whole-binary scan; the faulting instruction is unknown]"
    return f"{head}: faulting instruction unknown (the binary is not here and no bytes of " \
           "it were recorded)"


def _crash_evidence(crashed, now: float) -> list[dict]:
    """Evidence rows (the contract's four fields) for one crashed binary: its crashes with
    pids and latest time against the look-back, and the faulting instruction's verdict."""
    pids = ", ".join(str(p) for p in crashed.pids[:10])
    rows = [{"signal": f"SIGILL crashes of {crashed.binary} (pids {pids})",
             "value": crashed.crashes, "threshold": 0, "unit": "crashes"}]
    if crashed.last_time is not None:
        rows.append({"signal": f"latest SIGILL of {crashed.binary} at {_utc(crashed.last_time)} "
                               f"({'within' if crashed.recent else 'before'} the "
                               f"{SIGILL_LOOKBACK // 60} min look-back)",
                     "value": round(crashed.last_time, 3),
                     "threshold": round(now - SIGILL_LOOKBACK, 3), "unit": "unix seconds"})
    fault = crashed.fault
    if fault is not None:
        absent = [n for n, state in crashed.on_cpu.items() if state == "missing"]
        needs = f" needing {', '.join(fault.extensions)}" if fault.extensions else ""
        where = f" at file offset {fault.file_offset:#x}" if fault.file_offset is not None \
            else ""
        rows.append({"signal": f"faulting instruction of {crashed.binary}: "
                               f"{fault.text or 'undecodable bytes'}{needs}{where} "
                               f"(verdict from the {fault.source}, confidence "
                               f"{fault.confidence:.2f})" + (f"; {fault.note}" if fault.note
                                                             else ""),
                     "value": len(absent), "threshold": 0,
                     "unit": "extensions absent on this CPU"})
    elif crashed.scan_missing:
        rows.append({"signal": f"extensions {crashed.binary} uses that this CPU lacks: "
                               f"{', '.join(crashed.scan_missing)} (whole-binary scan, "
                               "confidence 0.50: the faulting instruction is unknown)",
                     "value": len(crashed.scan_missing), "threshold": 0, "unit": "extensions"})
    return rows
