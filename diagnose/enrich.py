"""Subjects the metrics deliberately do not carry (which pids, cgroups, CPUs, NUMA nodes),
read from the raw evidence where the source has it: a bundle's first and last samples, or
the live node. Metrics stay per pool; a finding names the processes.

    offline-preemption   the offline processes that used the most CPU (the antagonists)
    numa-remote-access   the pool's processes with the most memory off their CPUs' nodes
    fd-exhaustion        the process closest to its open-file limit
    core-imbalance       the busiest CPU
    isa-mismatch         every binary that died of SIGILL: pids, times, faulting instruction
    worker-blocked-...   live only: pool workers whose threads wait on the network (py-spy)
"""

from __future__ import annotations

import json
import logging

from fleetscope.collectors.base import NotAvailable, Scrape
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

    def snapshot(self) -> None:
        """Live: remember the offline processes' CPU before sampling (a bundle has its first
        sample for that)."""
        self._before = {p.pid: _read(self.first, f"proc/{p.pid}/stat", parse_pid_stat)
                        for p in self._pool_members(self.first, workload_class="offline")}

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
        if not self.live:
            return  # stacks exist only for running processes
        from fleetscope.stacks import StacksError, dump

        blocked = []
        for process in self._pool_members(self.last, finding.labels.get("pool")):
            try:
                threads = dump(process.pid, timeout=10)
            except StacksError as err:
                finding.evidence.append({"signal": f"stacks of pid {process.pid}: {err}",
                                         "value": 0, "threshold": 0, "unit": "threads"})
                continue
            waiting = [t for t in threads if t.state == "network"]
            if waiting:
                blocked.append(process.pid)
                finding.evidence.append({
                    "signal": f"pid {process.pid} threads waiting on the network "
                              f"(e.g. {waiting[0].blocking_call or waiting[0].frames[0]})",
                    "value": len(waiting), "threshold": 0, "unit": "threads"})
        finding.subjects["pids"] = blocked[:MAX_SUBJECTS]

    def _isa_mismatch(self, finding: Finding) -> None:
        """One finding per node: every binary the kernel log saw die of SIGILL, its pids,
        crash times, and the instruction that faulted with its extension
        (fleetscope/isa_fault.py: the kernel's file offset, ip minus the mapping base, an
        arm64 Code: word; bytes `bundle record` kept when the binary is not here), else the
        whole-binary `isa check` as a last resort."""
        import time

        from fleetscope.collectors.parsers.cpuinfo import parse_cpuinfo
        from fleetscope.collectors.parsers.kmsg import boot_time, scan_kernel_log
        from fleetscope.isa_fault import crashed_binaries

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
            from fleetscope.isa import locate_binary as locate
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
            from fleetscope.isa import InputError, check_against_cpuinfo, locate_binary

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
