"""Collector `perf`: memory bandwidth per socket, last-level cache accesses and misses, and
instructions per cycle, from hardware counters read with `perf stat`; plus resctrl's
memory-bandwidth byte counters where resctrl is mounted.

On a live host (`scrape.evidence.live`: `--root /`, `/host` in a container) a background
thread runs, back to back,

    perf stat -x, -a --per-socket -e <events> -- sleep <perf_window_seconds>

and the scrape serves the last complete window with its age: a slow perf never delays a
scrape. A perf that outlives `command_timeout_seconds` is killed (with its `sleep`) and
counted in `fleetscope_perf_runs_total{outcome="timeout"}`, logged once. After a failed run,
or a run where no event could be counted, the next one waits a minute.

On a recorded sample (a fixture tree or a bundle sample) perf is not run: the collector reads
`cmd/perf-stat.csv` (the bundle's perf output for the interval ending at that sample) and
takes the window length from `cmd/perf-stat.args` (the perf command line, one argument per
line: the `sleep N` at its end), or else from the sample's interval (the bundle's recorded
interval, as the evidence source carries it; docs/bundle-format.md: the perf window is the
sample interval). A recorded window is reported with age 0: it ends at the sample.

Events are chosen from what the kernel offers under /sys/bus/event_source/devices (names
checked in each PMU's `events/` or `format/` directory; perf resolves the names itself):

- memory_bandwidth
  - Intel: `uncore_imc_N/cas_count_read/` and `cas_count_write/`; one CAS moves a 64-byte
    line (the sysfs `.scale` 6.103515625e-5 times `.unit` MiB), perf prints MiB.
  - AMD: `amd_umc_N/event=0x0a,rdwrmask=0x1/` and `rdwrmask=0x2/` (umc_cas_cmd.rd and .wr
    of perf's Zen 4/5 JSON; the kernel's `format/` names the event and rdwrmask fields);
    64 bytes per CAS, as perf's umc_mem_read_bandwidth metric counts.
  - Kunpeng 920: `hisi_scclX_ddrcY/flux_rd/` and `flux_wr/`, times `ddrc_bytes_per_count`
    (32 by default: Huawei's tooling converts so; the kernel documents no unit).
- llc
  - Intel: `cpu/cache-references/` and `cpu/cache-misses/`, only when sysfs encodes them as
    the architectural LLC event 0x2e.
  - AMD: `amd_l3/event=0x04,umask=0xff/` and `umask=0x01/` (L3 accesses and misses in
    perf's Zen 3, 4 and 5 JSON).
  - Kunpeng 920: `hisi_scclX_l3cY/rd_cpipe/` and `rd_hit_cpipe/` (read accesses and read
    hits; misses are the difference).
- instructions: `instructions` and `cycles` everywhere.

Other arm64 cores: `ll_cache_rd`/`ll_cache_miss_rd`, else `l3d_cache`/`l3d_cache_refill`, of
the `armv8_*` core PMU. Generic `cache-misses` is never used on arm64 or AMD: there it counts
L1D (arm_pmuv3) or L2 (AMD) misses, not the last level. AMD's `amd_df` is not used: sysfs
names no events for it, and its DRAM events are family-specific encodings (Zen 3's count
reads and writes together, Zen 4's are per chip select); resctrl's `mbm_total_bytes` covers
AMD total bandwidth where there is no `amd_umc`. HiSilicon's L3C `rd_spipe`/`rd_hit_spipe`
are left out: perf's hip08 JSON calls rd_cpipe "Total read accesses", so adding the spipe
counts would risk counting reads twice.

`--per-socket` gives every count per socket (`socket` label, perf's socket id). A recorded
file without it (the documented plain `perf stat -x, -a -e ...`) yields one `socket="all"`
series per metric instead.

Where a group cannot be measured the collector says which and why: in
`fleetscope_perf_available{event_group}` 0 and `fleetscope_scrape_source_available{collector=
"perf",source="perf/<group>"}` 0, logged once by the exporter with the reason (no such PMU in
sysfs, `<not supported>` from perf: no hardware PMU, as in a VM, or not permitted).

The platform's peak bandwidth comes from the config (`platform: memory_peak_bytes_per_second`),
else from the CPU model's memory channels and speed (collectors/platform.py) for the server
CPUs it knows. It is not derived from DIMMs: SMBIOS type 17 (the only source of DIMM speed)
says nothing of which DIMMs share a channel, and two DIMMs per channel share its bandwidth,
so DIMM count x speed overstates the peak on exactly the machines that have more DIMMs.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from fleetscope.core.exposition import Family, counter, gauge, labels

from .base import Collector, Evidence, NotAvailable, Scrape, Signal
from .parsers import ParseError
from .parsers.perf import (
    NOT_SUPPORTED,
    PerfCount,
    parse_event_terms,
    parse_mbm_bytes,
    parse_perf_args,
    parse_perf_stat_csv,
    parse_scale,
    sleep_seconds,
    split_event,
    unit_bytes,
)
from .platform import derived_peak
from .source import EvidenceSource, kill

log = logging.getLogger("fleetscope.collectors.perf")

PMU_DIR = "sys/bus/event_source/devices"
RESCTRL_MON = "sys/fs/resctrl/mon_data"
RECORDED_CSV = "cmd/perf-stat.csv"
RECORDED_ARGS = "cmd/perf-stat.args"
PERF_ENV = "FLEETSCOPE_PERF"  # the perf binary (path or name); default: `perf` on PATH
RETRY_SECONDS = 60.0  # pause after a failed run, or one where nothing could be counted

MEMORY, LLC, INSTRUCTIONS = "memory_bandwidth", "llc", "instructions"
GROUPS = (MEMORY, LLC, INSTRUCTIONS)
CAS_BYTES = 64  # one DRAM CAS command moves one 64-byte cache line (Intel IMC, AMD UMC)

# One source per group: if a file holds events of two (a hand-made command line), the first
# in this order is used, so nothing is counted twice.
SOURCE_ORDER = {
    MEMORY: ("uncore_imc", "amd_umc", "hisi_ddrc"),
    LLC: ("hisi_l3c", "amd_l3", "cpu_llc", "arm_ll_cache", "arm_l3d", "generic_llc"),
    INSTRUCTIONS: ("generic", "core_pmu"),
}
REQUIRED_ROLES = {MEMORY: ({"read"}, {"write"}), LLC: ({"accesses"}, {"misses", "hits"}),
                  INSTRUCTIONS: ({"instructions"}, {"cycles"})}

_IMC = re.compile(r"uncore_imc(?:_[0-9]+)?")
_AMD_UMC = re.compile(r"amd_umc_[0-9]+")
_HISI_DDRC = re.compile(r"hisi_sccl[0-9]+_ddrc[0-9]+(?:_[0-9]+)?")
_HISI_L3C = re.compile(r"hisi_sccl[0-9]+_l3c[0-9]+(?:_[0-9]+)?")
_ARM_CORE = re.compile(r"armv[89]_[a-z0-9_]+")
_X86_CORE = ("cpu", "cpu_core")
_INTEL_LLC_EVENT = 0x2E  # the architectural LLC Reference/LLC Misses event (Intel SDM)


@dataclass(frozen=True)
class EventRole:
    """What a perf event measures: its group, its role in the group and where it is counted."""

    group: str
    role: str  # read/write, accesses/misses/hits, instructions/cycles
    source: str  # a SOURCE_ORDER entry; also the `pmu` label of fleetscope_perf_events
    bytes_per_count: float | None = None  # memory events; None: config ddrc_bytes_per_count


def _terms(body: str) -> dict[str, int] | None:
    try:
        return parse_event_terms(body)
    except ParseError:
        return None


def classify_event(name: str) -> EventRole | None:
    """The role of an event as perf names it in its output, or None for an event this
    collector does not use. Works on names alone, so recorded files classify the same.

    >>> classify_event("hisi_sccl3_ddrc1/flux_wr/")
    EventRole(group='memory_bandwidth', role='write', source='hisi_ddrc', bytes_per_count=None)
    >>> classify_event("cache-misses") is None  # L1D on arm64, L2 on AMD: not the LLC
    True
    """
    pmu, body, _modifiers = split_event(name)
    if pmu is None:
        # perf's generic hardware events, which the kernel maps onto the CPU PMU
        role = {"instructions": (INSTRUCTIONS, "instructions", "generic"),
                "cycles": (INSTRUCTIONS, "cycles", "generic"),
                "cpu-cycles": (INSTRUCTIONS, "cycles", "generic"),
                "LLC-loads": (LLC, "accesses", "generic_llc"),
                "LLC-load-misses": (LLC, "misses", "generic_llc")}.get(body)
        return EventRole(*role) if role else None
    if _IMC.fullmatch(pmu):
        direction = {"cas_count_read": "read", "cas_count_write": "write"}.get(body)
        return EventRole(MEMORY, direction, "uncore_imc", CAS_BYTES) if direction else None
    if _HISI_DDRC.fullmatch(pmu):
        direction = {"flux_rd": "read", "flux_wr": "write"}.get(body)
        return EventRole(MEMORY, direction, "hisi_ddrc") if direction else None
    if _AMD_UMC.fullmatch(pmu):
        terms = _terms(body)
        if terms and set(terms) == {"event", "rdwrmask"} and terms["event"] == 0x0A:
            direction = {1: "read", 2: "write"}.get(terms["rdwrmask"])
            return EventRole(MEMORY, direction, "amd_umc", CAS_BYTES) if direction else None
        return None
    if _HISI_L3C.fullmatch(pmu):
        role = {"rd_cpipe": "accesses", "rd_hit_cpipe": "hits"}.get(body)
        return EventRole(LLC, role, "hisi_l3c") if role else None
    if pmu == "amd_l3":
        terms = _terms(body)
        if terms and set(terms) == {"event", "umask"} and terms["event"] == 0x04:
            role = {0xFF: "accesses", 0x01: "misses"}.get(terms["umask"])
            return EventRole(LLC, role, "amd_l3") if role else None
        return None
    if pmu in _X86_CORE:
        role = {"cache-references": (LLC, "accesses", "cpu_llc"),
                "cache-misses": (LLC, "misses", "cpu_llc"),
                "instructions": (INSTRUCTIONS, "instructions", "core_pmu"),
                "cpu-cycles": (INSTRUCTIONS, "cycles", "core_pmu"),
                "cycles": (INSTRUCTIONS, "cycles", "core_pmu")}.get(body)
        return EventRole(*role) if role else None
    if _ARM_CORE.fullmatch(pmu):
        role = {"ll_cache_rd": (LLC, "accesses", "arm_ll_cache"),
                "ll_cache_miss_rd": (LLC, "misses", "arm_ll_cache"),
                "l3d_cache": (LLC, "accesses", "arm_l3d"),
                "l3d_cache_refill": (LLC, "misses", "arm_l3d"),
                "inst_retired": (INSTRUCTIONS, "instructions", "core_pmu"),
                "cpu_cycles": (INSTRUCTIONS, "cycles", "core_pmu")}.get(body)
        return EventRole(*role) if role else None
    return None


# ---------------------------------------------------------------------------------------
# Event selection from sysfs


def _natural(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"([0-9]+)", name)]


@dataclass
class Selection:
    """The events to ask perf for, and why a group has none."""

    events: list[str]
    reasons: dict[str, str]  # group -> why it cannot be measured on this node
    bytes_per_count: dict[str, float] = field(default_factory=dict)  # from sysfs .scale/.unit
    core_pmu: str | None = None  # the CPU PMU found in sysfs, if any


def _listdir(scrape: Scrape, relative: str) -> list[str]:
    try:
        return scrape.listdir(relative)
    except NotAvailable:
        return []


def _event_terms(scrape: Scrape, pmu: str, event: str) -> dict[str, int] | None:
    try:
        return parse_event_terms(scrape.read_text(f"{PMU_DIR}/{pmu}/events/{event}"))
    except (NotAvailable, ParseError):
        return None


def _imc_bytes_per_count(scrape: Scrape, pmu: str, event: str) -> float | None:
    """Bytes per raw count from the kernel's `.scale` and `.unit` (cas_count_read: 6.1e-5
    MiB, i.e. 64 bytes); None when the files are missing or not a byte size."""
    base = f"{PMU_DIR}/{pmu}/events/{event}"
    try:
        scale = parse_scale(scrape.read_text(f"{base}.scale"))
        per_unit = unit_bytes(scrape.read_text(f"{base}.unit"))
    except (NotAvailable, ParseError):
        return None
    return scale * per_unit if per_unit else None


def select_events(scrape: Scrape) -> Selection:
    """Choose the perf events for this node from /sys/bus/event_source/devices.

    `instructions` and `cycles` (perf's generic hardware events, mapped by the kernel onto
    whatever CPU PMU there is) are always asked for: perf answers `<not supported>` where
    there is none, which is how a VM without a virtual PMU shows.
    """
    devices = sorted(_listdir(scrape, PMU_DIR), key=_natural)
    events = ["instructions", "cycles"]
    reasons: dict[str, str] = {}
    bytes_per_count: dict[str, float] = {}
    events_of = {name: set(_listdir(scrape, f"{PMU_DIR}/{name}/events")) for name in devices
                 if _IMC.fullmatch(name) or _HISI_DDRC.fullmatch(name)
                 or _HISI_L3C.fullmatch(name) or _ARM_CORE.fullmatch(name)
                 or name in _X86_CORE}
    formats = {name: set(_listdir(scrape, f"{PMU_DIR}/{name}/format")) for name in devices
               if _AMD_UMC.fullmatch(name) or name == "amd_l3"}

    core_pmu = next((name for name in devices if name in _X86_CORE), None)
    arm_core = [name for name in devices if _ARM_CORE.fullmatch(name)
                and {"inst_retired", "cpu_cycles"} <= events_of.get(name, set())]
    core_pmu = core_pmu or (arm_core[0] if arm_core else None)

    # Memory bandwidth
    imc = [n for n in devices if _IMC.fullmatch(n)
           and {"cas_count_read", "cas_count_write"} <= events_of[n]]
    umc = [n for n in devices if _AMD_UMC.fullmatch(n) and {"event", "rdwrmask"} <= formats[n]]
    ddrc = [n for n in devices if _HISI_DDRC.fullmatch(n)
            and {"flux_rd", "flux_wr"} <= events_of[n]]
    if imc:
        for pmu in imc:
            for event in ("cas_count_read", "cas_count_write"):
                name = f"{pmu}/{event}/"
                events.append(name)
                per_count = _imc_bytes_per_count(scrape, pmu, event)
                if per_count:
                    bytes_per_count[name] = per_count
    elif umc:
        for pmu in umc:
            events += [f"{pmu}/event=0x0a,rdwrmask=0x1/", f"{pmu}/event=0x0a,rdwrmask=0x2/"]
    elif ddrc:
        for pmu in ddrc:
            events += [f"{pmu}/flux_rd/", f"{pmu}/flux_wr/"]
    elif any(_IMC.fullmatch(n) for n in devices):
        reasons[MEMORY] = ("the uncore_imc_* PMUs name no cas_count_read/cas_count_write "
                           "events in sysfs")
    elif "amd_df" in devices:
        reasons[MEMORY] = ("no amd_umc_* PMU (AMD memory-controller counters: Zen 4 and "
                           "later, recent kernels); amd_df names no DRAM events in sysfs, "
                           "see resctrl mbm_total_bytes for total bandwidth")
    else:
        reasons[MEMORY] = (f"no memory-controller PMU under /{PMU_DIR} (looked for "
                           "uncore_imc_*, amd_umc_*, hisi_sccl*_ddrc*)")

    # Last-level cache
    l3c = [n for n in devices if _HISI_L3C.fullmatch(n)
           and {"rd_cpipe", "rd_hit_cpipe"} <= events_of[n]]
    if l3c:
        for pmu in l3c:
            events += [f"{pmu}/rd_cpipe/", f"{pmu}/rd_hit_cpipe/"]
    elif "amd_l3" in formats and {"event", "umask"} <= formats["amd_l3"]:
        events += ["amd_l3/event=0x04,umask=0xff/", "amd_l3/event=0x04,umask=0x01/"]
    elif core_pmu in _X86_CORE and (_event_terms(scrape, core_pmu, "cache-misses") or {}).get(
            "event") == _INTEL_LLC_EVENT and "cache-references" in events_of[core_pmu]:
        events += [f"{core_pmu}/cache-references/", f"{core_pmu}/cache-misses/"]
    elif arm_core and {"ll_cache_rd", "ll_cache_miss_rd"} <= events_of[arm_core[0]]:
        events += [f"{arm_core[0]}/ll_cache_rd/", f"{arm_core[0]}/ll_cache_miss_rd/"]
    elif arm_core and {"l3d_cache", "l3d_cache_refill"} <= events_of[arm_core[0]]:
        events += [f"{arm_core[0]}/l3d_cache/", f"{arm_core[0]}/l3d_cache_refill/"]
    else:
        reasons[LLC] = (f"no last-level cache events under /{PMU_DIR} (looked for "
                        "hisi_sccl*_l3c*, amd_l3, Intel cpu/cache-misses, armv8 ll_cache_rd "
                        "or l3d_cache)")
    return Selection(events, reasons, bytes_per_count, core_pmu)


def perf_stat_argv(perf: str, events: list[str], window: float) -> list[str]:
    """The perf command line for one window. `--log-fd 1` puts the counts on stdout and
    leaves perf's own messages on stderr."""
    argv = [perf, "stat", "-x,", "-a", "--per-socket", "--log-fd", "1"]
    for event in events:
        argv += ["-e", event]
    return argv + ["--", "sleep", f"{window:g}"]


# ---------------------------------------------------------------------------------------
# From counts to per-socket totals


@dataclass
class GroupResult:
    ok: bool
    reason: str = ""
    per_socket: dict[str, dict[str, float]] = field(default_factory=dict)  # bytes or counts
    running: float = 1.0  # lowest share of the window a counter of the group ran
    events: dict[str, int] = field(default_factory=dict)  # source -> distinct events
    failed_status: str = ""  # NOT_SUPPORTED or NOT_COUNTED when that made the group fail


def _socket_key(socket: str) -> tuple:
    return (0, int(socket)) if socket.isdigit() else (1, socket)


def summarize(counts: list[PerfCount], ddrc_bytes_per_count: float,
              bytes_per_count: dict[str, float] | None = None) -> dict[str, GroupResult]:
    """Per group: totals per socket and role (memory in bytes), or why the group has none.

    A group is only reported when every one of its counters was counted: a socket whose
    counters were partly `<not counted>` would read low, not missing.
    """
    overrides = bytes_per_count or {}
    found: dict[str, list[tuple[PerfCount, EventRole]]] = {group: [] for group in GROUPS}
    for count in counts:
        role = classify_event(count.event)
        if role is None or count.cpus == 0:
            continue  # perf <= 6.1 prints a socket with no CPU of an uncore PMU as 0 CPUs
        found[role.group].append((count, role))
    results: dict[str, GroupResult] = {}
    for group, items in found.items():
        if not items:
            results[group] = GroupResult(False, f"perf output has no {group} events")
            continue
        present = {role.source for _, role in items}
        source = next(s for s in SOURCE_ORDER[group] if s in present)
        items = [(count, role) for count, role in items if role.source == source]
        results[group] = _group(group, source, items, ddrc_bytes_per_count, overrides)
    return results


def _group(group: str, source: str, items: list, ddrc_bytes_per_count: float,
           overrides: dict[str, float]) -> GroupResult:
    per_socket: dict[str, dict[str, float]] = {}
    running = 1.0
    for count, role in items:
        if count.status != "counted":
            return GroupResult(False, f"perf reports {count.event} {count.status}",
                               failed_status=count.status)
        amount = count.value
        if amount is None or amount < 0:
            return GroupResult(False, f"perf reports a negative count for {count.event}")
        if group == MEMORY:
            if count.unit:
                per_unit = unit_bytes(count.unit)
                if per_unit is None:
                    return GroupResult(False, f"{count.event} is counted in {count.unit!r}, "
                                              "not a byte size")
                amount *= per_unit
            else:
                amount *= overrides.get(count.event) or role.bytes_per_count \
                    or ddrc_bytes_per_count
        socket = count.socket if count.socket is not None else "all"
        roles = per_socket.setdefault(socket, {})
        roles[role.role] = roles.get(role.role, 0.0) + amount
        running = min(running, count.running_percent / 100.0)
    roles_seen = {role.role for _, role in items}
    for required in REQUIRED_ROLES[group]:
        if not required & roles_seen:
            return GroupResult(False, f"perf output has no {'/'.join(sorted(required))} "
                                      f"event for {group}")
    return GroupResult(True, "", dict(sorted(per_socket.items(), key=lambda i: _socket_key(
        i[0]))), running, {source: len({count.event for count, _ in items})})


# ---------------------------------------------------------------------------------------
# Windows and the background sampler


@dataclass
class Window:
    """One completed `perf stat` window."""

    counts: list[PerfCount]
    seconds: float
    end: float | None  # wall time it ended (live); None: a recorded sample (age 0)
    results: dict[str, GroupResult] | None = None


def _stderr_summary(stderr: bytes) -> str:
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines()
             if line.strip()]
    return " ".join(lines[:2])[:200] or "no message"


class PerfSampler:
    """Runs `perf stat` window after window in a daemon thread; keeps the last result. The
    command is spawned by the evidence source (a live host; a recorded sample refuses)."""

    def __init__(self, host: EvidenceSource, argv: list[str], window: float, timeout: float):
        self.host = host
        self.argv = argv
        self.window = window
        self.timeout = timeout
        self._lock = threading.Lock()
        self._latest: Window | None = None
        self._runs = {"ok": 0, "failed": 0, "timeout": 0}
        self._problem: str | None = None  # why the last run gave no window
        self._proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleetscope-perf", daemon=True)

    def start(self) -> None:
        atexit.register(self.stop)  # a hung perf must not outlive the exporter
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        proc = self._proc
        if proc is not None:
            self._kill(proc)

    def snapshot(self) -> tuple[Window | None, dict[str, int], str | None]:
        with self._lock:
            return self._latest, dict(self._runs), self._problem

    def _loop(self) -> None:
        while not self._stop.is_set():
            counted = self.run_once()
            if not counted:
                self._stop.wait(max(RETRY_SECONDS, self.window))

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        kill(proc, grace=None)  # perf and its `sleep`: own process group

    def run_once(self) -> bool:
        """One window; True when at least one event was counted."""
        env = dict(os.environ, LC_ALL="C")  # "%.2f" must print a decimal point
        try:
            proc = self.host.spawn(self.argv, env)
        except OSError as err:
            self._failed("failed", f"cannot run {self.argv[0]}: {err.strerror or err}")
            return False
        self._proc = proc
        try:
            out, err = proc.communicate(timeout=self.timeout)
            if self._stop.is_set():  # killed by stop(): the exporter is exiting
                return False
        except subprocess.TimeoutExpired:
            self._kill(proc)
            try:
                proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # unkillable (stuck in the kernel): leave it
                pass
            self._failed("timeout", f"perf stat did not finish within {self.timeout:g} s "
                                    f"(command_timeout_seconds; window {self.window:g} s): "
                                    "killed it")
            return False
        finally:
            self._proc = None
        end = time.time()
        if proc.returncode != 0:
            self._failed("failed", f"perf stat exited with status {proc.returncode}: "
                                   f"{_stderr_summary(err)}")
            return False
        try:
            counts = parse_perf_stat_csv(out.decode("utf-8", "replace"))
        except ParseError as error:
            self._failed("failed", f"perf stat output: {error}")
            return False
        with self._lock:
            self._latest = Window(counts, self.window, end)
            self._runs["ok"] += 1
            recovered, self._problem = self._problem, None
        if recovered:
            log.info("perf stat runs again (after: %s)", recovered)
        return any(count.status == "counted" for count in counts)

    def _failed(self, outcome: str, reason: str) -> None:
        with self._lock:
            self._runs[outcome] += 1
            changed = reason != self._problem
            self._problem = reason
        if changed:  # one line per new problem, not one per window
            log.warning("collector perf: %s", reason)


# ---------------------------------------------------------------------------------------
# The collector


@dataclass
class _Live:
    problem: str | None  # why perf cannot run at all (not installed)
    selection: Selection | None = None
    sampler: PerfSampler | None = None


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_instructions_per_cycle", "instructions per cycle", "ipc"),
    Signal("fleetscope_llc_miss_ratio", "last-level cache miss ratio", "ratio"),
    Signal("fleetscope_memory_bandwidth_bytes_per_second", "DRAM bandwidth per socket", "bytes/s"),
    Signal("fleetscope_memory_bandwidth_utilization_ratio",
           "DRAM bandwidth over the platform peak", "ratio"),
)


class PerfCollector(Collector):
    name = "perf"
    evidence = Evidence(signals=SIGNALS,
                        described=((RECORDED_CSV, "perf memory bandwidth / L3"),))
    missing_hints = (
        ("fleetscope_memory_bandwidth", "perf cannot count memory traffic here: no uncore PMU "
                                        "access (VM, perf_event_paranoid) or perf missing"),
        ("fleetscope_llc_", "perf cannot count last-level cache events here"),
    )

    def __init__(self, config):
        super().__init__(config)
        self._lock = threading.Lock()
        self._live: _Live | None = None
        # What cannot change while a node runs, kept per root: the derived peak (CPU model
        # and socket count), and the last recorded perf window (a sample never changes).
        self._derived: tuple[tuple[str, ...], tuple[float, str] | None] | None = None
        self._recorded: tuple[tuple, Window] | None = None

    def _peak(self, scrape: Scrape) -> tuple[float | None, str]:
        """The config's peak, else the one the CPU model implies (collectors/platform.py),
        derived once per root: re-reading /proc/cpuinfo and every CPU's topology cost more
        than the rest of a scrape on a 256-core node."""
        if self.config.memory_peak_bytes_per_second:
            return self.config.memory_peak_bytes_per_second, "config"
        cached = self._derived
        if cached is None or cached[0] != scrape.roots:
            cached = self._derived = (scrape.roots, derived_peak(scrape))
        derived = cached[1]
        return (derived[0], derived[1]) if derived else (None, "")

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        if scrape.evidence.live:
            yield from self._collect_live(scrape)
        else:
            yield from self._collect_recorded(scrape)
        peak, origin = self._peak(scrape)
        if peak:
            yield gauge("fleetscope_memory_bandwidth_peak_bytes_per_second",
                        "Peak memory bandwidth of the platform: the config's "
                        "platform.memory_peak_bytes_per_second, else derived from the CPU "
                        "model (see `source`).").add(peak, labels(source=origin))
        with scrape.source(self.name, RESCTRL_MON,
                           "mount -t resctrl resctrl /sys/fs/resctrl (needs Intel RDT or AMD "
                           "PQoS memory-bandwidth monitoring: cpuinfo flag cqm_mbm_total)"):
            yield from self._resctrl(scrape)

    # -- live node --------------------------------------------------------------------

    def _start_live(self, scrape: Scrape) -> _Live:
        wanted = os.environ.get(PERF_ENV)
        perf = shutil.which(wanted or "perf")
        if not perf and wanted:
            return _Live(f"{PERF_ENV}={wanted} is not an executable file")
        if not perf:
            return _Live("perf is not installed (Debian: apt-get install linux-perf; "
                         "elsewhere linux-tools or perf)")
        selection = select_events(scrape)
        window = self.config.perf_window_seconds
        sampler = PerfSampler(scrape.evidence, perf_stat_argv(perf, selection.events, window),
                              window, self.config.command_timeout_seconds)
        sampler.start()
        return _Live(None, selection, sampler)

    def _collect_live(self, scrape: Scrape) -> Iterator[Family]:
        with self._lock:
            if self._live is None:
                self._live = self._start_live(scrape)
            live = self._live
        with scrape.source(self.name, "perf stat"):
            if live.problem:
                raise NotAvailable(live.problem)
        if live.sampler is None:
            yield self._available({group: (False, live.problem) for group in GROUPS})
            return
        window, runs, problem = live.sampler.snapshot()
        runs_total = counter("fleetscope_perf_runs_total",
                             "perf stat runs of the background sampler by outcome (timeout: "
                             "killed after command_timeout_seconds).")
        for outcome in ("ok", "failed", "timeout"):
            runs_total.add(runs[outcome], labels(outcome=outcome))
        yield runs_total
        selection = live.selection
        if window is None:
            # No window yet: report what is already known. A failing perf (logged once by
            # the sampler, counted in runs_total) leaves every group unmeasured.
            status = {group: (False, reason) for group, reason in selection.reasons.items()}
            for group, (ok, reason) in status.items():
                self._mark(scrape, group, ok, reason)
            if problem:
                for group in GROUPS:
                    status.setdefault(group, (False, problem))
            if status:
                yield self._available(status)
            return
        yield from self._window(scrape, window, scrape.time - window.end, selection)

    # -- recorded sample --------------------------------------------------------------

    def _recorded_window(self, scrape: Scrape) -> float:
        try:
            return sleep_seconds(parse_perf_args(scrape.read_text(RECORDED_ARGS)))
        except NotAvailable:
            pass
        interval = scrape.evidence.interval_s
        if interval is None:
            raise NotAvailable(f"/{RECORDED_CSV} has no window length: no /{RECORDED_ARGS} "
                               "and no recorded sample interval")
        return interval

    def _read_recorded(self, scrape: Scrape) -> Window:
        """The sample's perf window, parsed once: a scrape of the same sample with the same
        file reuses the parsed counts and their per-group totals."""
        text = scrape.read_text(RECORDED_CSV)
        cached = self._recorded
        if cached is not None and cached[0] == (scrape.roots, text):
            return cached[1]
        window = Window(parse_perf_stat_csv(text), self._recorded_window(scrape), None)
        self._recorded = ((scrape.roots, text), window)
        return window

    def _collect_recorded(self, scrape: Scrape) -> Iterator[Family]:
        window = None
        with scrape.source(self.name, RECORDED_CSV, "recorded without perf"):
            window = self._read_recorded(scrape)
        if window is None:
            reason = f"no usable /{RECORDED_CSV} in this sample"
            yield self._available({group: (False, reason) for group in GROUPS})
            return
        yield from self._window(scrape, window, 0.0, None)

    # -- metrics ----------------------------------------------------------------------

    def _mark(self, scrape: Scrape, group: str, ok: bool, reason: str) -> None:
        with scrape.source(self.name, f"perf/{group}"):
            if not ok:
                raise NotAvailable(reason)

    @staticmethod
    def _available(status: dict[str, tuple[bool, str]]) -> Family:
        family = gauge("fleetscope_perf_available",
                       "Whether the event group could be measured with perf in the last "
                       "window (0: see fleetscope_scrape_source_available and the log).")
        for group in GROUPS:
            if group in status:
                family.add(1 if status[group][0] else 0, labels(event_group=group))
        return family

    @staticmethod
    def _reason(group: str, result: GroupResult, selection: Selection | None) -> str:
        """Why a group has no values, in words an operator can act on."""
        if result.ok:
            return ""
        if selection and group in selection.reasons:
            return selection.reasons[group]
        if result.failed_status == NOT_SUPPORTED:
            if group == INSTRUCTIONS and selection and selection.core_pmu is None:
                hint = f"no CPU PMU under /{PMU_DIR} (a VM without a virtual PMU?)"
            else:
                hint = ("the PMU cannot be used: absent, or not permitted (needs root, "
                        "CAP_PERFMON or kernel.perf_event_paranoid <= 0)")
            return f"{result.reason}: {hint}"
        if result.failed_status:
            return f"{result.reason}: the counter never ran in the window"
        return result.reason

    def _window(self, scrape: Scrape, window: Window, age: float,
                selection: Selection | None) -> Iterator[Family]:
        if window.results is None:  # computed once per window, live or recorded
            window.results = summarize(window.counts, self.config.ddrc_bytes_per_count,
                                       selection.bytes_per_count if selection else None)
        results = window.results
        status: dict[str, tuple[bool, str]] = {}
        for group in GROUPS:
            status[group] = (results[group].ok, self._reason(group, results[group], selection))
            self._mark(scrape, group, *status[group])
        yield gauge("fleetscope_perf_window_seconds",
                    "Length of the perf stat window the perf metrics cover.").add(
            round(window.seconds, 6))
        yield gauge("fleetscope_perf_window_age_seconds",
                    "Time since that window ended (0 for a recorded sample, which ends at "
                    "the sample).").add(round(max(age, 0.0), 3))
        yield self._available(status)
        events = gauge("fleetscope_perf_events",
                       "perf events counted for each group, by where they are counted.")
        running = gauge("fleetscope_perf_running_ratio",
                        "Lowest share of the window a counter of the group was running "
                        "(below 1: multiplexed, and perf scaled the count up).")
        for group in GROUPS:
            result = results[group]
            if result.ok:
                for source, number in result.events.items():
                    events.add(number, labels(event_group=group, pmu=source))
                running.add(round(result.running, 4), labels(event_group=group))
        yield from (family for family in (events, running) if family.samples)
        seconds = window.seconds
        if results[MEMORY].ok:
            yield from self._memory(results[MEMORY], seconds, scrape)
        if results[LLC].ok:
            yield from self._llc(results[LLC], seconds)
        if results[INSTRUCTIONS].ok:
            yield from self._instructions(results[INSTRUCTIONS], seconds)

    def _memory(self, result: GroupResult, seconds: float, scrape: Scrape) -> Iterator[Family]:
        where = {"uncore_imc": "Intel IMC CAS x 64 bytes",
                 "amd_umc": "AMD UMC CAS x 64 bytes",
                 "hisi_ddrc": f"HiSilicon DDRC flux x {self.config.ddrc_bytes_per_count:g} bytes "
                              "(ddrc_bytes_per_count: Huawei's tooling converts 32 bytes per "
                              "count; the kernel documents no unit)"}
        source = ", ".join(where[s] for s in result.events)
        bandwidth = gauge("fleetscope_memory_bandwidth_bytes_per_second",
                          f"DRAM read and write bandwidth per socket over the last perf window "
                          f"({source}).")
        total = 0.0
        for socket, roles in result.per_socket.items():
            for direction in ("read", "write"):
                value = roles.get(direction, 0.0) / seconds
                total += value
                bandwidth.add(round(value, 3), labels(socket=socket, direction=direction))
        yield bandwidth
        peak, _ = self._peak(scrape)
        if peak:
            yield gauge("fleetscope_memory_bandwidth_utilization_ratio",
                        "Read plus write bandwidth of all sockets over the platform peak "
                        "(fleetscope_memory_bandwidth_peak_bytes_per_second).").add(
                round(total / peak, 6))

    def _llc(self, result: GroupResult, seconds: float) -> Iterator[Family]:
        accesses = gauge("fleetscope_llc_accesses_per_second",
                         "Last-level cache accesses per second over the last perf window "
                         "(Kunpeng: L3C read accesses; AMD: L3 lookups; Intel: LLC "
                         "references).")
        misses = gauge("fleetscope_llc_misses_per_second",
                       "Last-level cache misses per second over the last perf window.")
        ratio = gauge("fleetscope_llc_miss_ratio",
                      "Last-level cache misses over accesses in the last perf window (0-1).")
        for socket, roles in result.per_socket.items():
            total = roles.get("accesses", 0.0)
            missed = roles["misses"] if "misses" in roles \
                else max(total - roles.get("hits", 0.0), 0.0)
            accesses.add(round(total / seconds, 3), labels(socket=socket))
            misses.add(round(missed / seconds, 3), labels(socket=socket))
            if total > 0:
                ratio.add(round(min(missed / total, 1.0), 6), labels(socket=socket))
        yield from (f for f in (accesses, misses, ratio) if f.samples)

    def _instructions(self, result: GroupResult, seconds: float) -> Iterator[Family]:
        instructions = gauge("fleetscope_instructions_per_second",
                             "Instructions retired per second over the last perf window.")
        cycles = gauge("fleetscope_cpu_cycles_per_second",
                       "CPU cycles per second over the last perf window (all CPUs of the "
                       "socket).")
        ipc = gauge("fleetscope_instructions_per_cycle",
                    "Instructions per cycle over the last perf window.")
        for socket, roles in result.per_socket.items():
            retired, spent = roles.get("instructions", 0.0), roles.get("cycles", 0.0)
            instructions.add(round(retired / seconds, 3), labels(socket=socket))
            cycles.add(round(spent / seconds, 3), labels(socket=socket))
            if spent > 0:
                ipc.add(round(retired / spent, 6), labels(socket=socket))
        yield from (f for f in (instructions, cycles, ipc) if f.samples)

    # -- resctrl ----------------------------------------------------------------------

    def _resctrl(self, scrape: Scrape) -> Iterator[Family]:
        domains = [d for d in _listdir(scrape, RESCTRL_MON) if d.startswith("mon_L3_")]
        if not domains:
            raise NotAvailable(f"/{RESCTRL_MON} has no mon_L3_* domains (resctrl not mounted)")
        family = counter("fleetscope_resctrl_mbm_bytes_total",
                         "resctrl memory-bandwidth monitoring byte counters of the root group "
                         "per L3 domain (mbm_total_bytes: all traffic; mbm_local_bytes: to "
                         "the local memory controller); rate() gives bytes per second.")
        for domain in sorted(domains, key=_natural):
            for event in ("mbm_total_bytes", "mbm_local_bytes"):
                try:
                    text = scrape.read_text(f"{RESCTRL_MON}/{domain}/{event}")
                except NotAvailable:
                    continue  # CMT without MBM, or this event not supported
                value = parse_mbm_bytes(text)
                if value is not None:  # "Unavailable": no value yet, never a zero
                    family.add(value, labels(l3_domain=domain[len("mon_L3_"):], event=event))
        yield family
