"""Collector `cpu_features`: what the CPU is, which instruction-set extensions it has, and
which binaries died of SIGILL on it (the evidence of the `isa-mismatch` rule).

Sources, each optional on its own:
- /proc/cpuinfo (parsers/cpuinfo.py): model, stepping or MIDR fields, microcode, flags.
- the kernel log (parsers/kmsg.py), for lines such as (x86; arm64 prints
  `agent[4242]: unhandled exception: undefined instruction in agent[400000+1000]`)

      traps: agent_worker_il[6073] trap invalid opcode ip:55bc07eee040 sp:7fff9ef3b438
      error:0 in agent_worker_ill[1040,55bc07eee000+1000]     (one line in the log)

  Live: /dev/kmsg under the root, opened once (non-blocking), positioned at the start of the
  ring so crashes already logged count, then read record by record until EAGAIN on every
  scrape (the one reader of the live kernel log: the other fatal traps it holds are exported
  from here too, collectors/fatal_traps.py). Reading it needs CAP_SYSLOG (root) when
  kernel.dmesg_restrict is 1, and `dmesg.txt` at the root is read when it cannot be. A
  recorded source (a bundle, a fixture tree) has `dmesg.txt` alone (the source's
  `kernel_logs` say which logs it has); a bundle keeps it in static/, its fallback root.
- /proc/sys/debug/exception-trace (show_unhandled_signals): when 0 the kernel logs no SIGILL
  and the crash counter cannot move.
- /proc/stat `btime`: the kernel log's timestamps are seconds since boot; boot time plus them
  is each crash's Unix time (fleetscope_sigill_last_crash_timestamp_seconds). A bundle's
  samples carry /proc/stat, so a bundle converts its static/dmesg.txt the same way.

Label values stay bounded: at most MAX_BINARIES binaries have their own series, the ones that
crashed most recently (a node's ring can hold dozens of old names; the binary crashing now is
the one an SRE needs named). When a new binary crashes and every name is taken, the binary
whose latest crash is oldest folds into binary="other": its series ends, "other" grows by its
count and keeps the later of the two crash times, so no series' counter ever goes down.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TypeVar

from fleetscope.core.exposition import Family, counter, gauge, labels
from fleetscope.core.units import TIME_UNIT

from .base import Collector, Evidence, NotAvailable, Scrape, Signal
from .fatal_traps import fatal_trap_families, pool_crash_family
from .parsers import ParseError
from .parsers.cpuinfo import CpuInfo, CpuModel, parse_cpuinfo, psabi_level, psabi_level_name
from .parsers.kmsg import (
    KernelLogScan,
    LogClock,
    SigillCrash,
    boot_time,
    log_clock,
    scan_kernel_log,
    wall_clock,
)
from .source import DMESG, KMSG

T = TypeVar("T")
MAX_BINARIES = 50
MAX_VARIANTS = 16  # distinct CPU variants exported; more than this is not a real machine
CPUINFO = "proc/cpuinfo"
CPUINFO_MEMO = "proc/cpuinfo:CpuInfo"  # the parsed record, shared with any other reader
EXCEPTION_TRACE = "proc/sys/debug/exception-trace"
KMSG_HINT = (
    "reading /dev/kmsg needs CAP_SYSLOG (run as root) when kernel.dmesg_restrict=1; "
    "a bundle carries the kernel log as static/dmesg.txt"
)
EXCEPTION_TRACE_HINT = (
    "the sysctl exists with CONFIG_SYSCTL_EXCEPTION_TRACE (x86, arm64); bundles do not record it"
)
_READ_SIZE = 16384  # larger than any /dev/kmsg record (a smaller buffer gets EINVAL)


class _Kmsg:
    """An open /dev/kmsg, read incrementally."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.lseek(self.fd, 0, os.SEEK_SET)  # the first record still in the ring
        except OSError:
            os.close(self.fd)
            raise

    def read_new(self) -> str:
        """Every record logged since the last call, one per line."""
        records: list[str] = []
        while True:
            try:
                data = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno == errno.EPIPE:  # records overwritten before we read them
                    continue
                raise
            if not data:
                break
            records.append(data.decode("utf-8", "replace"))
        return "".join(records)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_kmsg(kmsg: _Kmsg | None, scrape: Scrape) -> tuple[_Kmsg | None, str]:
    """(the open /dev/kmsg under the scrape's root, the records logged since its last read):
    `kmsg` is reused while the root is the same, reopened after a read error."""
    path = scrape.path(KMSG)
    if kmsg is not None and kmsg.path != path:
        kmsg.close()
        kmsg = None
    if kmsg is None:
        try:
            kmsg = _Kmsg(path)
        except OSError as err:
            raise NotAvailable(f"/{KMSG}: {err.strerror or err}") from None
    try:
        return kmsg, kmsg.read_new()
    except OSError as err:
        kmsg.close()
        raise NotAvailable(f"/{KMSG}: {err.strerror or err}") from None


def read_kernel_log(scrape: Scrape, readers: dict[str, Callable[[], T]]) -> tuple[str, T]:
    """(the name, what its reader returned) of the first kernel log the scrape's source has
    (`kernel_logs`: the ring then dmesg.txt live, dmesg.txt recorded) that can be read.
    NotAvailable says why none could, with how to get one; a ParseError carries the log's
    name as `kernel_log`."""
    missing = []
    for name in scrape.evidence.kernel_logs:
        try:
            return name, readers[name]()
        except NotAvailable as err:
            missing.append(str(err))
        except ParseError as err:
            err.kernel_log = name
            raise
    raise NotAvailable(f"{'; '.join(missing)}: {KMSG_HINT}")


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_fatal_trap_crashes_total",
           "processes killed by a fatal trap (not SIGILL)", "crashes"),
    Signal("fleetscope_fatal_trap_last_crash_timestamp_seconds",
           "latest fatal trap of a binary", TIME_UNIT),
    Signal("fleetscope_pool_fatal_trap_last_crash_timestamp_seconds",
           "latest fatal trap of a pool's binary", TIME_UNIT),
    Signal("fleetscope_pool_sigill_last_crash_timestamp_seconds",
           "latest SIGILL of a pool's binary", TIME_UNIT),
    Signal("fleetscope_sigill_crashes_total",
           "processes killed by SIGILL (illegal instruction)", "crashes"),
    Signal("fleetscope_sigill_last_crash_timestamp_seconds",
           "latest SIGILL of a binary", TIME_UNIT),
)


class CpuFeaturesCollector(Collector):
    name = "cpu_features"
    evidence = Evidence(signals=SIGNALS,
                        once=(CPUINFO,))
    missing_hints = (("fleetscope_sigill_", "kernel log not readable (dmesg / /dev/kmsg)"),)

    def __init__(self, config):
        super().__init__(config)
        self._lock = threading.Lock()
        self._cpuinfo: tuple[str, CpuInfo] | None = None
        self._kmsg: _Kmsg | None = None
        self._counts: Counter[str] = Counter()  # live kernel log: crashes since the start
        self._last: dict[str, float] = {}  # live kernel log: latest crash time per label
        self._seen: dict[str, int] = {}  # live kernel log: position of each label's latest crash
        self._position = 0  # crashes read so far from the live kernel log
        self._suppressed = 0
        self._dmesg: tuple[str, LogClock | None, KernelLogScan] | None = None
        # the same, for the other fatal traps (segfaults, ...; collectors/fatal_traps.py)
        self._fault_counts: Counter[str] = Counter()
        self._fault_last: dict[str, float] = {}
        self._fault_seen: dict[str, int] = {}
        self._fault_position = 0
        # executable name -> (pool, class, last seen): whose a crashed binary was
        self._owners: dict[str, tuple[str, str, float]] = {}

    def close(self) -> None:
        with self._lock:
            if self._kmsg is not None:
                self._kmsg.close()
                self._kmsg = None

    def __del__(self):
        kmsg = getattr(self, "_kmsg", None)
        if kmsg is not None:
            kmsg.close()

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        with scrape.source(self.name, CPUINFO):
            info = scrape.memo(CPUINFO_MEMO, lambda: self._parse_cpuinfo(scrape))
            yield from self._cpu(info)
        yield from self._sigill(scrape)
        with scrape.source(self.name, EXCEPTION_TRACE, EXCEPTION_TRACE_HINT):
            text = scrape.read_text(EXCEPTION_TRACE).strip()
            if text.isdigit() and text.isascii():
                yield gauge(
                    "fleetscope_sigill_exception_trace_enabled",
                    "1 when the kernel logs unhandled SIGILL/SIGSEGV (debug.exception-trace); "
                    "at 0 fleetscope_sigill_crashes_total cannot count crashes.",
                ).add(1 if int(text) else 0)

    # -- /proc/cpuinfo ---------------------------------------------------------------------

    def _parse_cpuinfo(self, scrape: Scrape) -> CpuInfo:
        text = scrape.read_text(CPUINFO)
        cached = self._cpuinfo
        if cached is not None and cached[0] == text:
            return cached[1]
        info = parse_cpuinfo(text)
        self._cpuinfo = (text, info)
        return info

    @staticmethod
    def _identity(model: CpuModel) -> dict[str, str]:
        if model.arch == "aarch64":
            return {"implementer": model.implementer, "part": model.part,
                    "variant": model.variant, "revision": model.revision}
        return {"family": model.family, "model": model.model, "stepping": model.stepping}

    def _cpu(self, info: CpuInfo) -> Iterator[Family]:
        model = info.model
        extra = {"microcode": model.microcode} if model.arch == "x86_64" else {
            "architecture": model.architecture}
        yield gauge(
            "fleetscope_cpu_info",
            "The node's CPU model (the first CPU in /proc/cpuinfo); always 1.",
        ).add(1, labels(arch=model.arch, vendor=model.vendor, model_name=model.model_name,
                         **self._identity(model), **extra))
        feature_labels: dict[str, str] = {"arch": model.arch, "fingerprint": model.fingerprint}
        if model.arch == "x86_64":
            feature_labels["isa_level"] = psabi_level_name(psabi_level(model.features))
        elif model.arch == "aarch64":
            feature_labels["features"] = " ".join(model.features)
        yield gauge(
            "fleetscope_cpu_features_info",
            "The first CPU's feature set: fingerprint = first 12 hex digits of the SHA-256 of "
            "its sorted /proc/cpuinfo flags; x86-64 psABI level on x86, the Features list on "
            "arm64; always 1.",
        ).add(1, labels(**feature_labels))
        cpus = gauge(
            "fleetscope_cpu_model_cpus",
            "CPUs of each model, stepping and feature set; more than one series means a mixed "
            "node.",
        )
        for variant, count in info.variants[:MAX_VARIANTS]:
            cpus.add(count, labels(model_name=variant.model_name, **self._identity(variant),
                                   fingerprint=variant.fingerprint))
        yield cpus

    # -- the kernel log ---------------------------------------------------------------------

    def _sigill(self, scrape: Scrape) -> Iterator[Family]:
        try:
            with self._lock:
                boot = _boot_time(scrape)
                source, (counts, last, suppressed, faults) = read_kernel_log(scrape, {
                    KMSG: lambda: self._read_kmsg(scrape, boot),
                    DMESG: lambda: self._read_dmesg(scrape, boot)})
        except NotAvailable as err:
            scrape.sources[(self.name, KMSG)] = (False, str(err))
            return
        except ParseError as err:  # not kernel log text (NUL bytes)
            scrape.sources[(self.name, err.kernel_log)] = (False, str(err))
            scrape.errors.setdefault(self.name, str(err))
            return
        scrape.sources[(self.name, source)] = (True, "")
        crashes = counter(
            "fleetscope_sigill_crashes_total",
            "Processes killed by SIGILL (illegal instruction) as the kernel logged them, by the "
            "file holding the faulting instruction (or the task name for anonymous code).",
        )
        for binary in sorted(counts):
            crashes.add(counts[binary], labels(binary=binary))
        yield crashes
        latest = gauge(
            "fleetscope_sigill_last_crash_timestamp_seconds",
            "Unix time of the latest SIGILL of each binary in the kernel log (boot time from "
            "/proc/stat btime plus the log's seconds since boot); absent for crashes whose "
            "line carries no timestamp.",
        )
        for binary in sorted(last):
            latest.add(round(last[binary], 3), labels(binary=binary))
        yield latest
        yield from fatal_trap_families(*faults)
        if self.config.pools:
            owners = self._pool_owners(scrape)
            yield pool_crash_family("fleetscope_pool_sigill_last_crash_timestamp_seconds",
                                    "SIGILL", last, owners)
            yield pool_crash_family("fleetscope_pool_fatal_trap_last_crash_timestamp_seconds",
                                    "fatal trap", faults[1], owners)
        yield counter(
            "fleetscope_sigill_reports_suppressed_total",
            "Unhandled-signal reports the kernel dropped by rate limit ('show_signal: N "
            "callbacks suppressed'); while it rises the crash counter undercounts.",
        ).add(suppressed)

    def _pool_owners(self, scrape: Scrape) -> dict[str, tuple[str, str]]:
        """Executable name -> (pool, class) of the pool processes seen now or in the last
        GONE_TTL_SECONDS (a worker that crashes at start is seldom there at a scrape)."""
        from .pools import GONE_TTL_SECONDS
        from .processes import pool_processes

        with self._lock:
            for process in pool_processes(scrape, self.config.pools):
                words = process.cmdline.replace("\0", " ").split()
                if words:
                    self._owners[os.path.basename(words[0])] = (
                        process.pool.name, process.pool.workload_class, scrape.time)
            for name in [n for n, (*_, seen) in self._owners.items()
                         if scrape.time - seen > GONE_TTL_SECONDS]:
                del self._owners[name]
            return {name: (pool, cls) for name, (pool, cls, _) in self._owners.items()}

    def _read_kmsg(self, scrape: Scrape, boot: float | None) -> tuple:
        try:
            self._kmsg, text = read_kmsg(self._kmsg, scrape)
        except NotAvailable:
            self._kmsg = None  # closed by read_kmsg: reopened on the next scrape
            raise
        scan = scan_kernel_log(text, f"/{KMSG}")
        self._suppressed += scan.suppressed
        self._position = _account(self._counts, self._last, self._seen, scan.crashes, boot,
                                  self._position)
        self._fault_position = _account(self._fault_counts, self._fault_last,
                                        self._fault_seen, scan.faults, boot,
                                        self._fault_position)
        return (dict(self._counts), dict(self._last), self._suppressed,
                (dict(self._fault_counts), dict(self._fault_last)))

    def _read_dmesg(self, scrape: Scrape, boot: float | None) -> tuple:
        text = scrape.read_text(DMESG)
        clock = log_clock(boot, scrape.time)  # for lines stamped with the wall clock
        cached = self._dmesg
        if cached is None or cached[:2] != (text, clock):
            cached = self._dmesg = (text, clock, scan_kernel_log(text, f"/{DMESG}", clock))
        scan = cached[2]
        counts: Counter[str] = Counter()
        last: dict[str, float] = {}
        _account(counts, last, {}, scan.crashes, boot, 0)
        fault_counts: Counter[str] = Counter()
        fault_last: dict[str, float] = {}
        _account(fault_counts, fault_last, {}, scan.faults, boot, 0)
        return dict(counts), last, scan.suppressed, (dict(fault_counts), fault_last)


def _boot_time(scrape: Scrape) -> float | None:
    try:
        return boot_time(scrape.read_text("proc/stat"))
    except NotAvailable:
        return None


def _account(counts: Counter[str], last: dict[str, float], seen: dict[str, int],
             crashes: tuple[SigillCrash, ...], boot: float | None, position: int) -> int:
    """Add `crashes` (one kind of a scan, in log order, numbered from `position`) to `counts` and
    `last`, keeping own series for the MAX_BINARIES most recently crashed binaries (ties: more
    crashes, then name); returns the next position."""
    new: Counter[str] = Counter()
    for crash in crashes:
        new[crash.binary] += 1
        seen[crash.binary] = position
        position += 1
    named = {binary for binary in counts if binary != "other"} | (set(new) - {"other"})
    ranked = sorted(named, key=lambda b: (-seen.get(b, -1), -(counts[b] + new[b]), b))
    keep = set(ranked[:MAX_BINARIES])
    for binary in ranked[MAX_BINARIES:]:  # fold the stalest names into "other"
        if binary in counts:
            counts["other"] += counts.pop(binary)
            if binary in last:
                last["other"] = max(last.get("other", 0.0), last.pop(binary))
        seen.pop(binary, None)
    for binary, count in new.items():
        counts[binary if binary in keep else "other"] += count
    for crash in crashes:
        when = wall_clock(crash, boot)
        if when is None:
            continue
        label = crash.binary if crash.binary in keep else "other"
        if when > last.get(label, 0.0):
            last[label] = when
    return position
