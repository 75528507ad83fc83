"""Numbers people read at a glance: the console's one formatting layer (and `bundle show`'s
times). Standard library only, so the command line can use it without pandas or plotly.

    format_value(3.754e11, "bytes/s")   -> '375 GB/s'      (SI: network and memory rates)
    format_value(56540488564, "bytes")  -> '52.7 GiB'      (IEC: memory sizes)
    format_value(0.482, "ratio")        -> '48.2 %'
    format_value(0.12, "s/s")           -> '120 ms/s'
    format_threshold(0.3, "ratio")      -> '> 30 %'   (a chart's threshold line)
    str(reading(1296, 900, "s", "min")) -> 'needs under 15 min: not met'
    reading(1296, 900, "s", "min").result -> 'not met, 1.4x the threshold'
    format_value(1, "crashes")          -> '1 crash'
    format_value(0, "check")            -> 'failing'   (a health check: 1 passing)
    local_time(1764660000)              -> '2025-12-02 07:20:00 UTC' (the console's zone)
    axis("bytes/s")                     -> plotly axis settings: ticks '100GB/s', not '100B'
    metric_title("fleetscope_nic_pfc_pause_frames_total") -> 'PFC pause frames (per second)'

Units are the evidence units of the rules (rules/builtin/) (ratio, s, s/s, 1/s, bytes/s, CPUs, ...).
Plotly's default tick labels say "100B" for 1e11 (B for billion): every chart takes its axis
settings from `axis(unit)` so a bandwidth axis reads GB/s.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo

_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_IEC = ((1 << 50, "Pi"), (1 << 40, "Ti"), (1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki"))
# Count-like units: a number and the word.
_COUNTS = {"CPUs", "cpus", "cores", "threads", "tasks", "fds", "crashes", "pages", "nodes",
           "frames", "packets", "processes", "sessions"}
_UNIT_WORDS = {"ratio": "%", "1/s": "per second", "s": "seconds", "s/s": "seconds per second",
               "bytes/s": "bytes per second", "bytes": "bytes", "ipc": "instructions per cycle"}
CHECK_UNIT = "check"  # a health check's verdict: 1 passing, 0 failing
TIME_UNIT = "unix seconds"  # a moment (a crash's time), read as a local time with its zone
TIME_ZONE_ENV = "FLEETSCOPE_CONSOLE_TZ"  # e.g. Asia/Shanghai; default: the machine's zone


# Characters a terminal acts on rather than shows (C0, DEL, C1: ESC starts clear-screen and
# clipboard writes) and the bidirectional overrides that reorder what is shown: a name from a
# node (a process's, a label's) carries any of them, so they are written as escapes.
_UNPRINTABLE = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7f, 0xa0))}
_UNPRINTABLE.update({code: f"\\u{code:04x}" for code in (*range(0x202a, 0x202f),
                                                         *range(0x2066, 0x206a))})


def printable(text: str) -> str:
    """`text` with every character a terminal would act on written as its escape:
    printable('x\x1b[2Jy') -> 'x\\x1b[2Jy'. Names from a node are data, shown, never run."""
    return text.translate(_UNPRINTABLE)


def _significant(value: float, digits: int = 3) -> str:
    """3 significant digits without exponent or trailing zeros: 375, 37.5, 3.75, 0.0375."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    text = f"{value:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _scaled(value: float, steps, suffix: str) -> str:
    for factor, prefix in steps:
        if abs(value) >= factor:
            return f"{_significant(value / factor)} {prefix}{suffix}"
    return f"{_significant(value)} {suffix}"


def format_value(value, unit: str = "") -> str:
    """One value with its unit, in the unit a person reads (GB/s, GiB, %, ms)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    value = float(value)
    if math.isinf(value):
        return "∞"
    if unit == TIME_UNIT:
        return local_time(value)
    if unit == "ratio":
        return f"{_significant(value * 100)} %"
    if unit == "bytes/s":
        return _scaled(value, _SI, "B/s")
    if unit == "bytes":
        return _scaled(value, _IEC, "B")
    if unit in ("s", "s/s"):
        per = "/s" if unit == "s/s" else ""
        if value == 0:
            return f"0 s{per}"
        if abs(value) < 1e-3:
            return f"{_significant(value * 1e6)} µs{per}"
        if abs(value) < 1:
            return f"{_significant(value * 1e3)} ms{per}"
        if unit == "s" and abs(value) >= 2 * 86400:
            return f"{_significant(value / 86400)} days"
        if unit == "s" and abs(value) >= 3600:
            return f"{_significant(value / 3600)} h"
        if unit == "s" and abs(value) >= 600:
            return f"{_significant(value / 60)} min"
        return f"{_significant(value)} s{per}"
    if unit.endswith("/s") and unit not in ("B/s",):
        thing = unit[:-2]
        scaled = _scaled(value, _SI, "").replace(" ", "")
        return f"{scaled}{' ' + thing if thing not in ('', '1') else ''}/s"
    if unit == "ipc":
        return f"{_significant(value)} IPC"
    if unit == "1/min":  # a rate per minute: "36/min", not "36 1/min"
        return f"{_significant(value)}/min"
    if unit == CHECK_UNIT:
        return "passing" if value >= 1 else "failing"
    if unit == "xid":
        return f"XID {value:.0f}" if value else "no XID"
    if unit in _COUNTS:
        text = f"{value:,.0f}" if value == int(value) or abs(value) >= 100 else \
            _significant(value)
        return f"{text} {_singular(unit) if value == 1 else unit}"
    return f"{_significant(value)} {_singular(unit) if value == 1 else unit}".strip()


def _singular(unit: str) -> str:
    """A count word for one: '1 crash', '1 error', '1 CPU' (a unit that is not a plural
    word stays as it is)."""
    if len(unit) < 3 or not unit.isalpha() or not unit.endswith("s"):
        return unit
    if unit.endswith(("sses", "shes", "ches", "xes")):
        return unit[:-2]
    return unit[:-1]


def count(number, thing: str) -> str:
    """A count of things in words: '1 node', '6,973 nodes' (thousands separated)."""
    number = int(number)
    return f"{number:,} {thing}{'' if number == 1 else 's'}"


def format_threshold(threshold, unit: str = "", pick: str = "max") -> str:
    """A rule threshold as a chart line's label: '> 30 %', '< 1 IPC'; no threshold: '–'.
    Beside a value it reads as a claim about that value: evidence rows take `reading`."""
    if threshold is None or (isinstance(threshold, float) and math.isnan(threshold)):
        return "–"
    if unit == TIME_UNIT:
        return f"{'before' if pick == 'min' else 'after'} {format_value(threshold, unit)}"
    if unit == CHECK_UNIT:
        return "failing"
    if unit == "xid":
        return "any XID"
    return f"{'<' if pick == 'min' else '>'} {format_value(threshold, unit)}"


@dataclass(frozen=True)
class Reading:
    """An evidence row's value against its threshold, in words: what the threshold needs,
    whether the value meets it, and how far from it. str() is the report's line:
    'needs under 15 min: not met'; '' for a row without threshold."""

    needs: str = ""  # 'needs over 60 %', 'needs after 07:05:15 UTC'
    verdict: str = ""  # 'met', 'not met', 'at it'
    distance: str = ""  # '1.4x the threshold', '6.3 % over it', '1.81 h before it'
    ratio: float | None = None  # 1 at the threshold, more past it on the side that fires
    moment: bool = False  # a time against a time: the gap is what a person reads

    @property
    def result(self) -> str:
        """'met, 0.7 % of it': the verdict and how far."""
        return ", ".join(part for part in (self.verdict, self.distance) if part)

    def __str__(self) -> str:
        # How far is the console's column; a moment's gap stays (its time alone says little).
        return f"{self.needs}: {self.result if self.moment else self.verdict}" \
            if self.needs else ""


def _distance(value: float, threshold: float) -> str:
    """How a value compares with a positive threshold, whichever side fires."""
    ratio = value / threshold
    if ratio <= 0 or ratio == 1:
        return ""  # 0 against a positive threshold, or at it: the verdict says it all
    if ratio >= 1.1:
        return f"{_significant(ratio, 2)}x the threshold"
    if ratio > 1:  # '1x' would read as at it: 99.4 % against 95 % is 4.6 % over it
        return f"{_significant((ratio - 1) * 100, 2)} % over it"
    if ratio >= 0.9:
        return f"{_significant((1 - ratio) * 100, 2)} % under it"
    return f"{_significant(ratio * 100, 2)} % of it"


def reading(value, threshold, unit: str = "", pick: str = "max") -> Reading:
    """What an evidence row's threshold needs and whether its value meets it: the one
    reading of the report, the console's evidence table and its bars. `pick` is the
    rule's (rules/model.py Evidence.pick): "min" fires under the threshold, "max" over it.
    A 0 threshold is context (idle CPUs, somaxconn): no reading."""
    missing = (None, 0)
    if threshold in missing or value is None or any(
            isinstance(x, float) and math.isnan(x) for x in (value, threshold)):
        return Reading()
    value, threshold = float(value), float(threshold)
    under = pick == "min"
    if unit == CHECK_UNIT:  # a verdict (1 passing): a floor of 1 fires on failing
        return Reading(f"needs {'failing' if under else 'passing'}",
                       "met" if (value < threshold) == under else "not met")
    if value == threshold:
        verdict = "at it"
    else:
        verdict = "met" if (value < threshold) == under else "not met"
    if unit == TIME_UNIT:  # a moment against a moment (a crash against the look-back's start)
        side = "before" if value < threshold else "after"
        gap = f"{duration(abs(value - threshold))} {side} it" if value != threshold else ""
        return Reading(f"needs {'before' if under else 'after'} "
                       f"{_moment_beside(threshold, value)}", verdict, gap, moment=True)
    if unit == "xid":
        return Reading("needs any XID", "met" if value else "not met")
    ratio = None
    if threshold > 0 and not under:
        ratio = value / threshold
    elif threshold > 0 and value > 0:
        ratio = threshold / value  # a floor: how far under it, 1 at it
    return Reading(f"needs {'under' if under else 'over'} {format_value(threshold, unit)}",
                   verdict, _distance(value, threshold) if threshold > 0 else "", ratio)


def _moment_beside(moment: float, other: float) -> str:
    """A moment read beside another: its time of day alone when both fall on one day."""
    zone = console_zone()
    when, beside = datetime.fromtimestamp(moment, zone), datetime.fromtimestamp(other, zone)
    if when.date() != beside.date():
        return local_time(moment, zone)
    return local_time(moment, zone).split(" ", 1)[1]


def unit_words(unit: str) -> str:
    """An axis or legend title's unit: 'GB/s' for bytes/s, '%' for a ratio."""
    return {"bytes/s": "B/s", "bytes": "bytes (IEC)", "ratio": "%", "s/s": "s/s",
            "1/s": "per second"}.get(unit, unit)


def axis(unit: str, top: float | None = None) -> dict:
    """Plotly axis settings so ticks read in the unit: 100GB/s, 30%, 120ms/s, 1.5k/s.
    `top` (the largest value drawn) keeps small event rates in decimals: 0.3/s, not 300m/s."""
    if unit == "ratio":
        return {"tickformat": ".0%", "title": {"text": "%"}}
    if unit == "bytes/s":
        return {"tickformat": "~s", "ticksuffix": "B/s", "title": {"text": "bytes per second"}}
    if unit == "bytes":
        return {"tickformat": "~s", "ticksuffix": "B", "title": {"text": "bytes"}}
    if unit == "s/s":  # d3 SI prefixes: 120ms/s
        return {"tickformat": "~s", "ticksuffix": "s/s", "title": {"text": _UNIT_WORDS[unit]}}
    if unit == "s":  # ages and durations: 1,200 s (d3 would say "1.2ks")
        return {"tickformat": ",~g", "ticksuffix": " s", "title": {"text": _UNIT_WORDS[unit]}}
    if unit.endswith("/s"):
        thing = unit[:-2]
        small = top is not None and top == top and abs(top) < 10
        return {"tickformat": ",.2~f" if small else "~s",
                "ticksuffix": "/s" if thing in ("", "1") else f" {thing}/s",
                "title": {"text": "per second" if thing in ("", "1") else f"{thing} per second"}}
    return {"exponentformat": "none", "separatethousands": True,
            "title": {"text": _UNIT_WORDS.get(unit, unit)}}


def hover_format(unit: str) -> str:
    """The d3 format and suffix of one value in a hover label, matching axis(unit)."""
    settings = axis(unit)
    if unit == "ratio":
        return "%{y:.1%}"
    if unit.endswith("/s") and unit not in ("bytes/s", "s/s"):
        return "%{y:,.4~g}" + settings.get("ticksuffix", "")
    if settings.get("tickformat") == "~s":
        return "%{y:.3~s}" + settings.get("ticksuffix", "")
    if unit == "s":
        return "%{y:,.3~g} s"
    return "%{y:,.4~g} " + unit


# -- time ----------------------------------------------------------------------------------
def console_zone() -> tzinfo:
    """The zone people read times in: $FLEETSCOPE_CONSOLE_TZ, else the machine's own."""
    name = os.environ.get(TIME_ZONE_ENV)
    if name:
        try:
            from zoneinfo import ZoneInfo

            return ZoneInfo(name)
        except (ImportError, KeyError, ValueError, OSError):
            pass
    return datetime.now().astimezone().tzinfo or timezone.utc


def zone_name(zone: tzinfo | None = None, at: float | None = None) -> str:
    """'CST (UTC+08:00)', 'UTC': what a time axis says it is in."""
    zone = zone or console_zone()
    moment = datetime.fromtimestamp(time.time() if at is None else at, zone)
    name = moment.tzname() or ""
    offset = moment.strftime("%z")
    if offset in ("+0000", "") and name in ("UTC", "GMT", ""):
        return "UTC"
    pretty = f"UTC{offset[:3]}:{offset[3:]}"
    return f"{name} ({pretty})" if name and not name.startswith(("+", "-")) else pretty


def local_time(epoch_s: float, zone: tzinfo | None = None, seconds: bool = True) -> str:
    """Unix seconds as a wall-clock time with its zone: '2025-12-02 15:20:00 CST'."""
    zone = zone or console_zone()
    moment = datetime.fromtimestamp(float(epoch_s), zone)
    text = moment.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")
    name = moment.tzname() or moment.strftime("%z")
    if name.startswith(("+", "-")):
        name = f"UTC{name}"
    return f"{text} {name}"


def duration(seconds: float) -> str:
    """A span: '59 s', '12 min', '3.2 h'."""
    return format_value(seconds, "s")


def time_window(start_s: float, end_s: float, zone: tzinfo | None = None) -> str:
    """'2025-12-02 15:00:00 .. 15:20:00 CST (20 min)': a window in one line."""
    zone = zone or console_zone()
    first = datetime.fromtimestamp(float(start_s), zone)
    last = datetime.fromtimestamp(float(end_s), zone)
    same_day = first.date() == last.date()
    end = last.strftime("%H:%M:%S") if same_day else last.strftime("%Y-%m-%d %H:%M:%S")
    name = last.tzname() or ""
    if name.startswith(("+", "-")):
        name = f"UTC{name}"
    return f"{first.strftime('%Y-%m-%d %H:%M:%S')} .. {end} {name} " \
        f"({duration(end_s - start_s)})"


# -- titles --------------------------------------------------------------------------------
# What each metric is, for a chart title, and its unit once counters are rated.
METRICS: dict[str, tuple[str, str]] = {
    "fleetscope_cpu_core_busy_ratio": ("Busy across cores", "ratio"),
    "fleetscope_cpu_core_steal_ratio": ("Steal across cores", "ratio"),
    "fleetscope_cpu_saturated_cores": ("Cores over 90 % busy", "cores"),
    "fleetscope_cpu_seconds_total": ("CPU time by mode", "s/s"),
    "fleetscope_pool_run_delay_seconds_total": ("Run-queue delay per pool", "s/s"),
    "fleetscope_pool_processes": ("Processes per pool", "processes"),
    "fleetscope_pool_cpu_seconds_total": ("CPU used per pool", "CPUs"),
    "fleetscope_pool_cgroup_cpu_pressure_stall_seconds_total":
        ("Pool cgroup CPU pressure (stall time)", "s/s"),
    "fleetscope_pool_threads": ("Threads per pool", "threads"),
    "fleetscope_pool_threads_per_core": ("Threads per physical core", "threads"),
    "fleetscope_pool_context_switches_total": ("Context switches per pool", "1/s"),
    "fleetscope_pool_fd_usage_ratio": ("Open files over the limit (worst process)", "ratio"),
    "fleetscope_pool_fd_usage_open_fds": ("Open files (worst process)", "fds"),
    "fleetscope_pool_fd_usage_limit_fds": ("Open-file limit (worst process)", "fds"),
    "fleetscope_pool_numa_remote_memory_ratio": ("Pool memory on remote NUMA nodes", "ratio"),
    "fleetscope_pool_memory_bytes": ("Pool resident memory", "bytes"),
    "fleetscope_numastat_pages_total": ("NUMA page allocations", "pages/s"),
    "fleetscope_memory_bandwidth_utilization_ratio": ("DRAM bandwidth over the peak",
                                                      "ratio"),
    "fleetscope_memory_bandwidth_bytes_per_second": ("DRAM bandwidth", "bytes/s"),
    "fleetscope_memory_bandwidth_peak_bytes_per_second": ("DRAM bandwidth peak", "bytes/s"),
    "fleetscope_llc_miss_ratio": ("L3 (last-level cache) miss ratio", "ratio"),
    "fleetscope_instructions_per_cycle": ("Instructions per cycle", "ipc"),
    "fleetscope_rdma_hw_stats_total": ("RDMA congestion counters", "1/s"),
    "fleetscope_nic_pfc_pause_frames_total": ("PFC pause frames", "frames/s"),
    "fleetscope_nic_port_bytes_total": ("NIC port traffic", "bytes/s"),
    "fleetscope_sigill_crashes_total": ("SIGILL crashes in the kernel log", "crashes"),
    "fleetscope_irq_online_pool_device_interrupts_total":
        ("Device interrupts on the online pool's CPUs", "1/s"),
    "fleetscope_irq_online_pool_overlap_cpus": ("Online pool CPUs in IRQ affinity masks",
                                                "cpus"),
    "agent_queue_depth": ("Tasks waiting in the queue", "tasks"),
    "agent_task_heartbeat_age_seconds": ("Oldest in-flight task's heartbeat age", "s"),
    "agent_tool_calls_total": ("Tool calls", "1/s"),
    "agent_session_migrations_total": ("Session migrations", "1/s"),
    "agent_stage_duration_seconds_sum": ("Time spent per stage", "s/s"),
    "agent_stage_duration_seconds_count": ("Stage runs", "1/s"),
}


def metric_title(name: str) -> str:
    """A chart title in words with its unit: 'PFC pause frames (frames/s)'."""
    words, unit = METRICS.get(name, (None, None))
    if words is None:
        stem = name.removeprefix("fleetscope_").removesuffix("_total")
        words = stem.replace("_", " ").capitalize()
        unit = "1/s" if name.endswith("_total") else ""
    return f"{words} ({unit_words(unit)})" if unit else words


def metric_unit(name: str) -> str:
    return METRICS.get(name, (None, "1/s" if name.endswith("_total") else ""))[1]
