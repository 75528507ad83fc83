"""Evidence as time series named as the exporter's metrics, whatever the source.

A bundle is replayed through the collectors sample by sample; the live node is sampled
through the same collectors; both land in a `Series` the rules evaluate. (Prometheus range
queries fill the same structure.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from fleetscope.bundle.read import Bundle, BundleError, replay_config
from fleetscope.collectors.agent import KEPT_PREFIXES, OVER_BUNDLE_LIMIT, AgentCollector
from fleetscope.collectors.shared import PROC_STAT, process_file
from fleetscope.collectors.source import LiveHost
from fleetscope.core.bundle_format import MAX_SERIES
from fleetscope.core.config import Config
from fleetscope.core.exposition import Family, labels
from fleetscope.exporter import Exporter
from fleetscope.rules.promql import Series


def add_families(series: Series, families: list[Family], timestamp_ms: int) -> None:
    """Add one collection pass to `series`: the families' samples as they are (data, no
    text parsed back), each under its own sample name (a histogram's _bucket/_sum/_count)."""
    add = series.add_key
    for family in families:
        for sample_name, label_set, value in family.named_samples:
            add(sample_name, label_set.key(), timestamp_ms, float(value))
        name = family.name
        for label_set, value in family.samples:
            add(name, label_set.key(), timestamp_ms, float(value))


def bundle_series(bundle: Bundle, config: Config,
                  progress: Callable[[int, int], None] | None = None,
                  per_core: str = "summary") -> Series:
    """Replay every sample of a bundle through the collectors; `per_core` "summary" is the
    shape the rules read, "full" has every core (the console's node view). Once the samples
    replayed hold more than MAX_SERIES series together, the agent runtime's are left out
    (the rules that need them say why); BundleError when the rest are still too many."""
    exporter = Exporter(bundle.source(bundle.samples[0]),
                        replace(replay_config(config), per_core=per_core))
    series = Series()
    left_out = False
    for index, sample in enumerate(bundle.samples):
        families = exporter.collect(now=sample.time, source=bundle.source(sample))
        timestamp_ms = int(round(sample.time * 1000))
        add_families(series, families, timestamp_ms)
        count = sum(len(keys) for keys in series.by_name.values())
        if count > MAX_SERIES and not left_out:
            count -= _leave_out_agent_series(exporter, series)
            left_out = True
        if left_out:
            series.add_key("fleetscope_scrape_source_available",
                           labels(collector=AgentCollector.name, source=OVER_BUNDLE_LIMIT).key(),
                           timestamp_ms, 0.0)
        if count > MAX_SERIES:
            raise BundleError(f"refused: the bundle's samples up to samples[{index}] hold "
                              f"{count} series, over the {MAX_SERIES} of a bundle (the "
                              "series limit of a bundle)")
        if progress:
            progress(index + 1, len(bundle.samples))
    return series


def _leave_out_agent_series(exporter: Exporter, series: Series) -> int:
    """Drop the agent runtime's series, and its collector for the samples to come: their
    number is the runtime's choice (label values), not the node's, and only the agent rules
    read them. Returns how many series went."""
    exporter.leave_out(AgentCollector.name)
    dropped = 0
    for name in [name for name in series.by_name if name.startswith(KEPT_PREFIXES)]:
        dropped += len(series.by_name.pop(name))
    return dropped


@dataclass
class SamplingHealth:
    """How well live sampling kept to its plan: a starved node delays the tool too, and a
    diagnosis must say when its window slipped instead of judging a different moment."""

    planned_samples: int
    planned_seconds: float
    samples: int = 0
    elapsed_seconds: float = 0.0
    max_late_seconds: float = 0.0  # how far past its slot the latest sample started
    late_samples: int = 0  # samples that started more than half an interval late
    skipped_samples: int = 0  # slots given up to stay on the clock
    max_collect_seconds: float = 0.0  # the slowest collection (all collectors once)
    stopped_at_deadline: bool = False
    # From the command's start (the kernel's process start time) to its first sample, and
    # to its verdict: on a node whose CPUs are taken, the interpreter starts and imports at
    # the node's mercy before the tool can raise its priority (400 busy threads: 45 s).
    started_late_seconds: float | None = None
    total_seconds: float | None = None

    @property
    def slipped(self) -> bool:
        return bool(self.skipped_samples or self.stopped_at_deadline
                    or self.late_samples > self.planned_samples // 4)

    @property
    def delayed(self) -> bool:
        """The window began well after the command was started: it judged a later moment
        than the one the person typed the command at."""
        late = self.started_late_seconds
        return late is not None and late > max(STARTED_LATE_S, self.planned_seconds / 4)

    def mark_start(self) -> None:
        """The command's start to now (the first sample)."""
        started = process_start_time()
        if started is not None:
            self.started_late_seconds = max(0.0, time.time() - started)

    def mark_end(self) -> None:
        started = process_start_time()
        if started is not None:
            self.total_seconds = max(0.0, time.time() - started)

    def to_json(self) -> dict:
        return {"planned_samples": self.planned_samples, "samples": self.samples,
                "planned_seconds": round(self.planned_seconds, 3),
                "elapsed_seconds": round(self.elapsed_seconds, 3),
                "max_late_seconds": round(self.max_late_seconds, 3),
                "late_samples": self.late_samples, "skipped_samples": self.skipped_samples,
                "max_collect_seconds": round(self.max_collect_seconds, 3),
                "stopped_at_deadline": self.stopped_at_deadline, "slipped": self.slipped,
                "started_late_seconds": _round(self.started_late_seconds),
                "total_seconds": _round(self.total_seconds), "delayed": self.delayed}

    def describe(self) -> str:
        return (f"sampling slipped: {self.samples} of {self.planned_samples} samples in "
                f"{self.elapsed_seconds:.1f} s (planned {self.planned_seconds:.0f} s), up to "
                f"{self.max_late_seconds:.1f} s late, slowest collection "
                f"{self.max_collect_seconds:.1f} s: the node is starving this tool too")

    def describe_delay(self) -> str:
        return (f"the node delayed this diagnosis: its window began "
                f"{self.started_late_seconds:.0f} s after the command started "
                f"({self.total_seconds or 0:.0f} s in all); the CPUs are taken - start it as "
                "`nice -n -20 fleetscope diagnose` (root) to be heard sooner")


STARTED_LATE_S = 5.0  # a window that began this much after the command is worth a word


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def process_start_time(stat_path: str = "/" + process_file("self", "stat")) -> float | None:
    """This process's start in unix seconds: boot time (/proc/stat btime) plus field 22 of
    /proc/self/stat (starttime, clock ticks since boot). None where /proc is not there."""
    import os

    try:
        with open(stat_path) as handle:
            fields = handle.read().rpartition(")")[2].split()
        with open("/" + PROC_STAT) as handle:
            btime = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


# A live window may overrun by this much (and at least DEADLINE_GRACE_S) before sampling
# stops with what it has: a diagnosis an hour late is no diagnosis.
DEADLINE_FACTOR = 1.5
DEADLINE_GRACE_S = 10.0


def live_series(config: Config, seconds: float, interval: float, source: LiveHost,
                progress: Callable[[int, int], None] | None = None,
                health: SamplingHealth | None = None) -> Series:
    """Sample this node through the collectors for `seconds`, every `interval`, on the
    clock: a sample that comes too late gives up its slot rather than bunching up with the
    next, and sampling ends at a deadline with what it has (at least two samples)."""
    exporter = Exporter(source, replay_config(config))
    series = Series()
    count = max(2, int(seconds / interval) + 1)
    health = health or SamplingHealth(count, seconds)
    health.planned_samples, health.planned_seconds = count, seconds
    health.mark_start()
    start = time.monotonic()
    deadline = start + max(seconds * DEADLINE_FACTOR, seconds + DEADLINE_GRACE_S)
    index = 0
    while index < count:
        target = start + index * interval
        delay = target - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        late = time.monotonic() - target
        if late > interval / 2:
            health.late_samples += 1
        health.max_late_seconds = max(health.max_late_seconds, late)
        began = time.monotonic()
        now = time.time()
        add_families(series, exporter.collect(now=now), int(round(now * 1000)))
        health.samples += 1
        health.max_collect_seconds = max(health.max_collect_seconds, time.monotonic() - began)
        if progress:
            progress(index + 1, count)
        # The next slot still ahead of the clock; slots already past are skipped.
        behind = int((time.monotonic() - start) / interval) + 1
        if behind > index + 1 and index + 1 < count - 1:
            skip = min(behind, count - 1) - (index + 1)
            health.skipped_samples += skip
            index += skip
        index += 1
        if time.monotonic() > deadline and health.samples >= 2:
            health.stopped_at_deadline = index < count
            break
    health.elapsed_seconds = time.monotonic() - start
    return series
