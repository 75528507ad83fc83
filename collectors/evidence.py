"""What each collector reads and writes, declared once in its own module, and the registry of
collectors that derives everything else from the declarations.

    class TuningCollector(Collector):
        name = "tuning"
        evidence = Evidence(
            sampled=("proc/sys/net/core/somaxconn", ...),   copied into every bundle sample
            read_limits={"somaxconn": 4 * KIB},               the most the kernel writes there
            signals=(Signal("fleetscope_sysctl", "kernel settings, by sysctl name"),))

A collector registers itself when its module is imported (Collector.__init_subclass__), so a
new one is its own module: the exporter runs it, `bundle record` copies what it declares
(once, per sample, per recorded process), the bundle reader bounds its files by its read
limits, the engine explains its absent signals by its missing hints, and the console titles its
signals, with no list elsewhere to extend (as insights-core's specs name each piece of evidence
once for every consumer).

Standard library only: the node side imports this.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from fleetscope.core.bundle_format import DEFAULT_READ_LIMIT

HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")


@dataclass(frozen=True)
class Signal:
    """A metric family a collector writes: its name, what people call it, and its unit (as
    core/units.format_value reads units: "ratio", "s", "bytes", "1/s", ...)."""

    name: str
    title: str
    unit: str = ""


@dataclass(frozen=True)
class Evidence:
    """A collector's evidence, as paths relative to the node's root (globs allowed):

    once         captured once per bundle (static/): what does not change in a window
    sampled      copied into every bundle sample
    per_process  file names under proc/<pid>/ of every process a bundle records
    per_cgroup   (controller, cgroup version) -> file names in the cgroup directory of each
                 pool process, where a bundle records them
    read_limits  the most bytes the kernel (or the tool) writes in a file, by relative path,
                 directory or file name: more in a bundle is refused, not parsed
    signals      the metric families it writes, titled for people
    described    (path, what it is evidence for): the parts `bundle show` says a bundle has
    """

    once: tuple[str, ...] = ()
    sampled: tuple[str, ...] = ()
    per_process: tuple[str, ...] = ()
    per_cgroup: Mapping[tuple[str, int], tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({}))
    read_limits: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    signals: tuple[Signal, ...] = ()
    described: tuple[tuple[str, str], ...] = ()


class CollectorRegistry(dict):
    """name -> collector class, in registration (import) order, which is the exporter's
    order; the evidence of all of them, merged (recomputed when the registry changes: a
    scrape looks up a read limit for each of its thousands of files)."""

    def __init__(self) -> None:
        super().__init__()
        self._limits: dict[str, int] | None = None
        self._signals: dict[str, Signal] | None = None

    def __setitem__(self, name: str, collector: Any) -> None:
        self._limits = self._signals = None
        super().__setitem__(name, collector)

    def __delitem__(self, name: str) -> None:
        self._limits = self._signals = None
        super().__delitem__(name)

    def pop(self, name: str, *default: Any) -> Any:
        self._limits = self._signals = None
        return super().pop(name, *default)

    def add(self, collector: Any) -> None:
        self[collector.name] = collector

    @contextmanager
    def registered(self, collector: Any) -> Iterator[None]:
        """`collector` registered for the block, then gone (a test's throwaway collector)."""
        before = self.get(collector.name)
        self.add(collector)
        try:
            yield
        finally:
            if before is None:
                self.pop(collector.name, None)
            else:
                self[collector.name] = before

    def _merged(self, part: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(item for collector in self.values()
                                   for item in getattr(collector.evidence, part)))

    def once(self) -> tuple[str, ...]:
        return self._merged("once")

    def sampled(self) -> tuple[str, ...]:
        return self._merged("sampled")

    def per_process(self) -> tuple[str, ...]:
        return self._merged("per_process")

    def per_cgroup(self) -> dict[tuple[str, int], tuple[str, ...]]:
        merged: dict[tuple[str, int], tuple[str, ...]] = {}
        for collector in self.values():
            for key, names in collector.evidence.per_cgroup.items():
                merged[key] = tuple(dict.fromkeys(merged.get(key, ()) + tuple(names)))
        return merged

    def described(self) -> tuple[tuple[str, str], ...]:
        return self._merged("described")

    def read_limit(self, relative: str) -> int:
        """The most bytes read from `relative`: a collector's declared limit (by relative
        path, then its directory, then its file name), else the bundle format's default."""
        limits = self._limits
        if limits is None:
            limits = {}
            for collector in self.values():
                for key, most in collector.evidence.read_limits.items():
                    limits.setdefault(key, most)
            self._limits = limits
        directory, _, name = relative.rpartition("/")
        for key in (relative, directory, name):
            if key in limits:
                return limits[key]
        return DEFAULT_READ_LIMIT

    def signal(self, name: str) -> Signal | None:
        """The declared signal `name` (a metric family; a histogram's _bucket, _count and
        _sum series are its family's), or None."""
        signals = self._signals
        if signals is None:
            signals = {}
            for collector in self.values():
                for signal in collector.evidence.signals:
                    signals.setdefault(signal.name, signal)
            self._signals = signals
        for family in (name, *(name.removesuffix(suffix) for suffix in HISTOGRAM_SERIES
                               if name.endswith(suffix))):
            if family in signals:
                return signals[family]
        return None


COLLECTORS = CollectorRegistry()
