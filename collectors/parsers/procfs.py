"""Parsers for /proc files that describe CPU time and scheduler pressure.

Formats follow the kernel source that prints them (cited per parser). Every counter here is
cumulative since boot; collectors export them as counters and compute deltas where needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from . import ParseError, parse_int

# /proc/stat column order after the `cpuN` label (Documentation/filesystems/proc.rst).
CPU_STAT_FIELDS = (
    "user",
    "nice",
    "system",
    "idle",
    "iowait",
    "irq",
    "softirq",
    "steal",
    "guest",
    "guest_nice",
)
# Columns up to softirq exist on every kernel we support; steal/guest/guest_nice were added
# later (2.6.11, 2.6.24, 2.6.33) and read as 0 when absent.
_CPU_STAT_MIN_FIELDS = 7


@dataclass(slots=True)
class ProcStat:
    """/proc/stat: per-CPU tick counters (USER_HZ) and the scalar lines."""

    cpus: dict[int, tuple[int, ...]]  # cpu number -> 10 tick counters, CPU_STAT_FIELDS order
    total: tuple[int, ...]
    scalars: dict[str, int] = field(default_factory=dict)  # ctxt, btime, processes, ...
    interrupts_total: int | None = None
    softirqs_total: int | None = None


def parse_proc_stat(text: str) -> ProcStat:
    """Parse /proc/stat as printed by fs/proc/stat.c:show_stat().

    >>> s = parse_proc_stat("cpu  10 0 5 100 1 0 0 2 0 0\\ncpu0 10 0 5 100 1 0 0 2 0 0\\n"
    ...                     "intr 7 0 0\\nctxt 42\\nbtime 1700000000\\nprocs_running 3\\n")
    >>> s.cpus[0][CPU_STAT_FIELDS.index("steal")], s.scalars["ctxt"], s.interrupts_total
    (2, 42, 7)
    """
    if not text.isascii():
        raise ParseError("/proc/stat: non-ASCII bytes")
    cpus: dict[int, tuple[int, ...]] = {}
    total: tuple[int, ...] | None = None
    scalars: dict[str, int] = {}
    interrupts_total = softirqs_total = None
    try:
        for line in text.splitlines():
            if line.startswith("cpu"):
                parts = line.split()
                label = parts[0]
                values = parts[1:11]
                if len(values) < _CPU_STAT_MIN_FIELDS:
                    raise ParseError(f"/proc/stat: {label} line has {len(values)} fields")
                if "-" in line:  # int() would take "-5"; the kernel prints unsigned
                    raise ParseError(f"/proc/stat: negative counter on {label} line")
                ticks = tuple(map(int, values))
                if len(ticks) < 10:
                    ticks += (0,) * (10 - len(ticks))
                if label == "cpu":
                    total = ticks
                else:
                    number = label[3:]
                    if not (number.isdigit() and number.isascii()):
                        raise ParseError(f"/proc/stat: bad cpu number in {label[:20]!r}")
                    cpu = int(number)
                    if cpu in cpus:
                        raise ParseError(f"/proc/stat: {label} appears twice")
                    cpus[cpu] = ticks
                continue
            # Only the first number of the other lines is used; intr can carry thousands of
            # per-IRQ counts on a big machine, so they are not split further.
            parts = line.split(None, 2)
            if not parts:
                continue
            label = parts[0]
            if label == "intr":
                interrupts_total = parse_int(parts[1], "/proc/stat intr")
            elif label == "softirq":
                softirqs_total = parse_int(parts[1], "/proc/stat softirq")
            elif len(parts) == 2:
                scalars[label] = parse_int(parts[1], f"/proc/stat {label}")
    except (ValueError, IndexError) as err:  # int() on a corrupt token, a bare label
        if isinstance(err, ParseError):
            raise
        raise ParseError(f"/proc/stat: {err}") from None
    if not cpus or total is None:
        raise ParseError("/proc/stat: no cpu lines (truncated or not /proc/stat)")
    return ProcStat(cpus, total, scalars, interrupts_total, softirqs_total)


@dataclass(slots=True, frozen=True)
class LoadAvg:
    load1: float
    load5: float
    load15: float
    runnable: int  # scheduling entities currently runnable
    threads: int  # scheduling entities that exist (all threads)
    last_pid: int


def _kernel_decimal(token: str, what: str) -> float:
    # The kernel prints fixed-point "%lu.%02lu"; float() alone would accept "nan" or "1e9".
    whole, dot, frac = token.partition(".")
    bad_fraction = dot and not (frac.isdigit() and frac.isascii())
    if not whole.isdigit() or not whole.isascii() or bad_fraction:
        raise ParseError(f"{what}: expected a decimal like 0.25, got {token[:40]!r}")
    return float(token)


def parse_loadavg(text: str) -> LoadAvg:
    """Parse /proc/loadavg (fs/proc/loadavg.c: "%lu.%02lu %lu.%02lu %lu.%02lu %u/%d %d").

    >>> parse_loadavg("0.20 0.18 0.12 1/80 11206\\n")
    LoadAvg(load1=0.2, load5=0.18, load15=0.12, runnable=1, threads=80, last_pid=11206)
    """
    parts = text.split()
    if len(parts) != 5 or "/" not in parts[3]:
        raise ParseError("/proc/loadavg: expected 5 fields like '0.20 0.18 0.12 1/80 11206'")
    runnable, _, threads = parts[3].partition("/")
    return LoadAvg(
        _kernel_decimal(parts[0], "/proc/loadavg"),
        _kernel_decimal(parts[1], "/proc/loadavg"),
        _kernel_decimal(parts[2], "/proc/loadavg"),
        parse_int(runnable, "/proc/loadavg runnable"),
        parse_int(threads, "/proc/loadavg threads"),
        parse_int(parts[4], "/proc/loadavg last pid"),
    )


@dataclass(slots=True, frozen=True)
class PressureLine:
    avg10: float  # percent of wall time stalled, last 10 s
    avg60: float
    avg300: float
    total_us: int  # cumulative stall time, microseconds


_PSI_KEYS = ("avg10", "avg60", "avg300", "total")


def parse_pressure(text: str, what: str = "pressure") -> dict[str, PressureLine]:
    """Parse a PSI file: /proc/pressure/{cpu,memory,io,irq} or a cgroup's *.pressure.

    Format from kernel/sched/psi.c:psi_show():
    "%s avg10=%lu.%02lu avg60=%lu.%02lu avg300=%lu.%02lu total=%llu" with %s in {some, full}.
    The cpu file has no `full` line before 5.13 and the irq file has only `full`.

    >>> parse_pressure("some avg10=1.65 avg60=0.50 avg300=0.33 total=4410972\\n")["some"].total_us
    4410972
    """
    lines: dict[str, PressureLine] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        kind = parts[0]
        if kind not in ("some", "full") or len(parts) != 5:
            raise ParseError(f"{what}: unexpected line {line[:60]!r}")
        values = {}
        for token, key in zip(parts[1:], _PSI_KEYS, strict=True):
            name, eq, value = token.partition("=")
            if name != key or not eq:
                raise ParseError(f"{what}: expected {key}=..., got {token[:40]!r}")
            values[key] = value
        lines[kind] = PressureLine(
            _kernel_decimal(values["avg10"], what),
            _kernel_decimal(values["avg60"], what),
            _kernel_decimal(values["avg300"], what),
            parse_int(values["total"], what),
        )
    if not lines:
        raise ParseError(f"{what}: empty")
    return lines


class SchedstatCpu(NamedTuple):  # a tuple: built 256 times a scrape on a big node
    running_ns: int  # field 7: time tasks spent running on this CPU
    waiting_ns: int  # field 8: time tasks spent runnable, waiting on this run queue
    timeslices: int  # field 9: timeslices run on this CPU


def parse_schedstat(text: str) -> dict[int, SchedstatCpu]:
    """Parse /proc/schedstat (Documentation/scheduler/sched-stats.rst), versions 15 to 17.

    The cpu lines have 9 fields in every supported version; fields 7 and 8 are nanoseconds.
    Domain lines change per version and are skipped.

    >>> parse_schedstat("version 15\\ntimestamp 4295347219\\n"
    ...                 "cpu0 0 0 0 0 0 0 3035466036 858375615 67578\\n")[0].waiting_ns
    858375615
    """
    first_line = text.partition("\n")[0]
    if not first_line.startswith("version "):
        raise ParseError("/proc/schedstat: first line is not 'version N'")
    version = parse_int(first_line[8:].strip(), "/proc/schedstat version")
    if version < 15:
        raise ParseError(f"/proc/schedstat: version {version} is older than 15 (unsupported)")
    cpus: dict[int, SchedstatCpu] = {}
    for line in text.split("\n"):
        if line[:3] != "cpu":
            continue  # domain lines: several per CPU, version-specific
        parts = line.split()
        if len(parts) < 10 or "-" in line:
            raise ParseError(f"/proc/schedstat: malformed line {line[:40]!r}")
        try:
            cpus[int(parts[0][3:])] = SchedstatCpu(int(parts[7]), int(parts[8]), int(parts[9]))
        except ValueError:
            raise ParseError(f"/proc/schedstat: non-number in {line[:40]!r}") from None
    if not cpus:
        raise ParseError("/proc/schedstat: no cpu lines")
    return cpus
