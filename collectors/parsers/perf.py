"""Parsers for `perf stat -x,` output, the perf command line recorded beside it, and the
sysfs files of perf PMUs (event terms, `.scale`, resctrl byte counters).

`perf stat -x, -a --per-socket -e ... -- sleep 5` prints one line per event and socket:

    S0,1,4521.37,MiB,uncore_imc_0/cas_count_read/,5000931412,100.00,,
    S1,0,<not counted>,,hisi_sccl1_ddrc0/flux_rd/,0,100.00,,
    S0,48,190528816633,,instructions,240044755110,100.00,1.06,insn per cycle

The layout comes from tools/perf/util/stat-display.c (perf 5.10 to 6.x): an interval
timestamp with `-I` ("%lu.%09lu", space-padded to 6 digits before perf 6.2), the aggregation
id (`S0` socket, `S0-D1` die, `S0-D1-C3` core, `N0` node: each followed by the number of
CPUs aggregated; `CPU3` with -A), then the counter value ("%.2f" when the event has a
non-integer sysfs scale, else "%.0f"; or `<not supported>` / `<not counted>`), the unit, the
event name, a cgroup with -G, the variance ("%.2f%%") with -r, the counter's run time in ns,
the percentage of the window it was running (below 100: multiplexed, already scaled), then
the metric value and unit, or two empty fields. An event with a second derived metric gets a
continuation line with an empty value; it carries no count and is skipped.

Event names may contain the separator (`amd_umc_0/event=0x0a,rdwrmask=0x1/`): perf prints
them unquoted ("Commas in the output are not put into quotes", perf-stat.txt), so the
fields of a `pmu/.../` name are joined back until its slashes pair up.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from . import ParseError

NOT_SUPPORTED = "<not supported>"  # the event cannot be opened (no PMU, no permission)
NOT_COUNTED = "<not counted>"  # opened, but never ran in the window

_TIMESTAMP = re.compile(r"[0-9]+\.[0-9]{9}")  # -I: "%lu.%09lu"
_AGGR_WITH_NR = re.compile(r"(S[0-9]+(?:-D[0-9]+)?(?:-C[0-9]+|-CLS[0-9]+|-L[0-9]+-ID[0-9]+)?"
                           r"|N[0-9]+)")
_AGGR_CPU = re.compile(r"CPU[0-9]+")
_VALUE = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_DIGITS = re.compile(r"[0-9]+")
_PERCENT = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_VARIANCE = re.compile(r"[0-9]+(?:\.[0-9]+)?%")
_SOCKET = re.compile(r"S([0-9]+)")


@dataclass(frozen=True)
class PerfCount:
    """One counter line of `perf stat -x,`."""

    event: str
    value: float | None  # None unless status == "counted"
    status: str  # "counted", NOT_SUPPORTED or NOT_COUNTED
    unit: str  # sysfs .unit the value is already scaled to ("MiB"), or ""
    run_ns: int  # time the counter ran (summed over the CPUs aggregated)
    running_percent: float  # share of the enabled time it ran; < 100 means multiplexed
    aggregate: str | None = None  # "S0", "S0-D1", "N0", "CPU3"; None: one total
    cpus: int | None = None  # CPUs aggregated into this line (per-socket/die/core/node)
    timestamp: float | None = None  # seconds since start, with -I
    metric_value: float | None = None
    metric_unit: str = ""

    @property
    def socket(self) -> str | None:
        """The socket id of a per-socket (or per-die/core) line: "S1-D0" -> "1"."""
        if self.aggregate is None:
            return None
        match = _SOCKET.match(self.aggregate)
        return match.group(1) if match else None


def _join_event(fields: list[str], start: int, sep: str) -> tuple[str, int]:
    """The event name starting at fields[start], re-joined where perf's own separator split
    a `pmu/term=a,term=b/` name; returns (name, index of the next field)."""
    name = fields[start]
    end = start + 1
    if "/" in name:
        while name.count("/") % 2 == 1 and end < len(fields):
            name = f"{name}{sep}{fields[end]}"
            end += 1
        if name.count("/") % 2 == 1:
            raise ParseError(f"perf stat: unterminated event name {name[:60]!r}")
    return name, end


def _parse_line(line: str, sep: str) -> PerfCount | None:
    fields = [field.strip() for field in line.split(sep)]
    i = 0
    timestamp = None
    if fields[0] == "summary":  # perf 6.x --summary with -x
        i = 1
    elif _TIMESTAMP.fullmatch(fields[0]) and len(fields) > 1:
        timestamp = float(fields[0])
        i = 1
    aggregate = None
    cpus = None
    if i < len(fields) and _AGGR_WITH_NR.fullmatch(fields[i]):
        if i + 1 >= len(fields) or not _DIGITS.fullmatch(fields[i + 1]):
            raise ParseError(f"perf stat: {fields[i]} without a CPU count in {line[:80]!r}")
        aggregate, cpus = fields[i], int(fields[i + 1])
        i += 2
    elif i < len(fields) and _AGGR_CPU.fullmatch(fields[i]):
        aggregate = fields[i]
        i += 1
    if i >= len(fields) or fields[i] == "":
        return None  # a second metric of the event above: no count on this line
    raw_value = fields[i]
    if raw_value in (NOT_SUPPORTED, NOT_COUNTED):
        value, status = None, raw_value
    elif _VALUE.fullmatch(raw_value):
        value, status = float(raw_value), "counted"
    else:
        raise ParseError(f"perf stat: bad counter value {raw_value[:40]!r} in {line[:80]!r}")
    if i + 2 >= len(fields):
        raise ParseError(f"perf stat: too few fields in {line[:80]!r}")
    unit = fields[i + 1]
    event, j = _join_event(fields, i + 2, sep)
    if not event:
        raise ParseError(f"perf stat: empty event name in {line[:80]!r}")
    # -G adds a cgroup field and -r a variance ("0.16%") before the run time.
    if j < len(fields) and not _DIGITS.fullmatch(fields[j]) \
            and not _VARIANCE.fullmatch(fields[j]) and j + 1 < len(fields) \
            and (_DIGITS.fullmatch(fields[j + 1]) or _VARIANCE.fullmatch(fields[j + 1])):
        j += 1
    if j < len(fields) and _VARIANCE.fullmatch(fields[j]):
        j += 1
    if j + 1 >= len(fields) or not _DIGITS.fullmatch(fields[j]) \
            or not _PERCENT.fullmatch(fields[j + 1]):
        raise ParseError(f"perf stat: no run time and percentage in {line[:80]!r}")
    run_ns, percent = int(fields[j]), float(fields[j + 1])
    rest = fields[j + 2:]
    metric_value = None
    metric_unit = ""
    if rest and rest[0]:
        if not _PERCENT.fullmatch(rest[0]):
            raise ParseError(f"perf stat: bad metric value {rest[0][:40]!r}")
        metric_value = float(rest[0])
        metric_unit = sep.join(rest[1:]).strip()
    return PerfCount(event, value, status, unit, run_ns, percent, aggregate, cpus, timestamp,
                     metric_value, metric_unit)


def parse_perf_stat_csv(text: str, sep: str = ",") -> list[PerfCount]:
    """Parse the output of `perf stat -x<sep>` (counts only; continuation lines dropped).

    >>> [c.value for c in parse_perf_stat_csv("S0,1,0.85,MiB,uncore_imc_0/cas_count_read/,"
    ...                                       "1000921300,100.00,,\\n")]
    [0.85]
    >>> c = parse_perf_stat_csv("<not supported>,,cycles,0,100.00,,\\n")[0]
    >>> c.status, c.socket
    ('<not supported>', None)
    """
    counts: list[PerfCount] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue  # blank, or "# started on ..." written by -o
        count = _parse_line(line, sep)
        if count is not None:
            counts.append(count)
    return counts


def split_event(name: str) -> tuple[str | None, str, str]:
    """(PMU, event, modifiers) of a perf event name.

    >>> split_event("hisi_sccl1_ddrc0/flux_rd/")
    ('hisi_sccl1_ddrc0', 'flux_rd', '')
    >>> split_event("amd_l3/event=0x04,umask=0xff/u")
    ('amd_l3', 'event=0x04,umask=0xff', 'u')
    >>> split_event("cycles:u")
    (None, 'cycles', 'u')
    """
    if "/" in name:
        pmu, _, remainder = name.partition("/")
        body, closed, modifiers = remainder.rpartition("/")
        if not closed:  # "pmu/event" without the closing slash
            body, modifiers = remainder, ""
        return pmu, body, modifiers
    event, _, modifiers = name.partition(":")
    return None, event, modifiers


_TERM_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_TERM_VALUE = re.compile(r"(?:0[xX][0-9a-fA-F]+|[0-9]+)")


def parse_event_terms(text: str) -> dict[str, int]:
    """Parse a PMU event's terms: a sysfs `events/<name>` file ("event=0x04,umask=0x03",
    Intel uncore files have no newline), or the body of a raw perf event. A bare term is a
    flag worth 1.

    >>> parse_event_terms("event=0x002b\\n")
    {'event': 43}
    >>> parse_event_terms("event=0x0a,rdwrmask=0x1")
    {'event': 10, 'rdwrmask': 1}
    """
    terms: dict[str, int] = {}
    body = text.strip()
    if not body:
        raise ParseError("PMU event: empty")
    for term in body.split(","):
        key, eq, value = term.strip().partition("=")
        if not _TERM_KEY.fullmatch(key):
            raise ParseError(f"PMU event: bad term {term[:40]!r}")
        if not eq:
            terms[key] = 1
            continue
        if not _TERM_VALUE.fullmatch(value) or len(value) > 20:
            raise ParseError(f"PMU event: bad value in {term[:40]!r}")
        terms[key] = int(value[2:], 16) if value[:2] in ("0x", "0X") else int(value)
    return terms


def parse_scale(text: str) -> float:
    """A sysfs `events/<name>.scale` file: the factor perf multiplies raw counts by.

    >>> parse_scale("6.103515625e-5")
    6.103515625e-05
    """
    token = text.strip()
    if not re.fullmatch(r"[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?", token):
        raise ParseError(f"PMU scale: not a number: {token[:40]!r}")
    value = float(token)
    if not math.isfinite(value) or value <= 0:
        raise ParseError(f"PMU scale: out of range: {token[:40]!r}")
    return value


# Units perf prints for byte-counting events (sysfs `.unit`, or a metric's ScaleUnit).
_UNIT_BYTES = {"B": 1, "Bytes": 1, "bytes": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3,
               "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def unit_bytes(unit: str) -> float | None:
    """Bytes in one `unit` as perf prints it, or None for a unit that is not a byte size.

    >>> unit_bytes("MiB"), unit_bytes("msec")
    (1048576, None)
    """
    return _UNIT_BYTES.get(unit.strip())


def parse_perf_args(text: str) -> list[str]:
    """A recorded perf command line, one argument per line (no quoting to undo).

    >>> parse_perf_args("perf\\nstat\\n-x,\\n--\\nsleep\\n5\\n")[-2:]
    ['sleep', '5']
    """
    args = text.split("\n")
    if args and args[-1] == "":
        args.pop()
    if not args or not any(args):
        raise ParseError("perf args: empty")
    return args


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([smhd]?)")
_DURATION_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def sleep_seconds(args: list[str]) -> float:
    """The window of `perf stat ... -- sleep N`: GNU sleep's N (suffix s/m/h/d; several
    arguments add up).

    >>> sleep_seconds(["perf", "stat", "-a", "--", "sleep", "5"])
    5.0
    >>> sleep_seconds(["perf", "stat", "-a", "sleep", "0.5s"])
    0.5
    """
    if "--" in args:
        command = args[args.index("--") + 1:]
    else:
        starts = [i for i, arg in enumerate(args) if arg.rsplit("/", 1)[-1] == "sleep"]
        command = args[starts[0]:] if starts else []
    if not command or command[0].rsplit("/", 1)[-1] != "sleep" or len(command) < 2:
        raise ParseError("perf args: the measured command is not `sleep N`")
    total = 0.0
    for arg in command[1:]:
        match = _DURATION.fullmatch(arg)
        if not match:
            raise ParseError(f"perf args: bad sleep duration {arg[:20]!r}")
        total += float(match.group(1)) * _DURATION_UNIT[match.group(2)]
    if not 0 < total < 86400 * 365:
        raise ParseError(f"perf args: sleep duration out of range: {total}")
    return total


# What resctrl prints instead of a number (fs/resctrl rdtgroup_mondata_show): the counter is
# not ready or not assigned. Missing data, never zero.
MBM_NOT_READY = ("Unavailable", "Error", "Unassigned")


def parse_mbm_bytes(text: str) -> int | None:
    """A resctrl `mon_data/mon_L3_XX/mbm_total_bytes` (or `mbm_local_bytes`) file: a byte
    counter, or None when the kernel has no value to give.

    >>> parse_mbm_bytes("2847213568\\n"), parse_mbm_bytes("Unavailable\\n")
    (2847213568, None)
    """
    token = text.strip()
    if token in MBM_NOT_READY:
        return None
    if not _DIGITS.fullmatch(token):
        raise ParseError(f"resctrl: expected a byte count, got {token[:40]!r}")
    return int(token)
