"""The small interface every collector implements, and the per-scrape context it reads through.

A collector is one file in this folder with one class: it has a `name` (also its `collector`
label), is built from the config without touching /proc, and `collect(scrape)` yields metric
families. Every file it reads goes through `scrape.read_text("proc/stat")`, which the scrape's
evidence source reads under its roots, so a fixture tree or a bundle sample replays exactly as
a live host.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from fleetscope.core.exposition import Family

from .evidence import COLLECTORS, Evidence, Signal
from .parsers import ParseError
from .source import EvidenceSource, NotAvailable, RefusedPath, check_relative

__all__ = ["COLLECTORS", "Collector", "Evidence", "NotAvailable", "RefusedPath", "Scrape",
           "Signal", "check_relative"]

T = TypeVar("T")


class Collector:
    """Base class: subclasses set `name`, declare their `evidence` and implement `collect`;
    a subclass that sets a name registers itself in COLLECTORS when its module is imported."""

    name = ""
    evidence = Evidence()
    # (metric-name prefix, why its series are usually absent) for the series this collector
    # writes: the reason a rule that reads them gives when it cannot be evaluated.
    missing_hints: tuple[tuple[str, str], ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):  # a shared base (LogEventCollector) names none
            COLLECTORS.add(cls)

    def __init__(self, config: Any):
        self.config = config

    @classmethod
    def wanted(cls, config: Any) -> bool:
        """Whether the exporter runs this collector when the config names no `collectors`:
        one that only applies to some nodes (Kubernetes) says no where the config does not
        ask for it, and costs such a node nothing."""
        return True

    @classmethod
    def wanted_on(cls, config: Any, source: EvidenceSource) -> bool:
        """`wanted`, told the evidence too: a collector whose subject only some nodes have
        (inference modules) looks for it on the live node, or for its outputs in a
        recorded sample."""
        return cls.wanted(config)

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        raise NotImplementedError

    @classmethod
    def why_missing(cls, prefix: str, present: set[str],
                    unavailable: frozenset[str] = frozenset()) -> str:
        """The usual reason `prefix`'s series are absent; a collector narrows it where the
        series the source does have, or the sources it reported unavailable on the node
        (`unavailable`: fleetscope_scrape_source_available 0), say more."""
        return dict(cls.missing_hints)[prefix]


def configured_but_unread(sources: Iterable[str], question: str = "") -> str:
    """why_missing's words for configured sources the collector could not read."""
    return (f"{', '.join(sorted(sources))} configured but not read on this node"
            f"{': ' + question if question else ''} (fleetscope_scrape_source_available 0; "
            "the exporter's log says why)")


class Scrape:
    """What one collection pass sees: the evidence source, the time, and a memo of shared
    reads.

    `evidence` (collectors/source.py) says whether this is the live node or a recorded
    sample, runs commands (a live host only), and reads the files: `read_text`, `read_proc`,
    `listdir` and `path` are those of the source's reader for this pass. `time` is the wall
    time of a live scrape or the recorded time of a bundle sample, so rates computed by
    collectors are right in both.
    """

    def __init__(self, evidence: EvidenceSource, now: float | None = None):
        self.evidence = evidence
        self.roots = evidence.roots
        # This pass's reads, bound once: a scrape reads thousands of files.
        self.reader = reader = evidence.reader()
        self.path = reader.path
        self.read_text = reader.read_text
        self.read_proc = reader.read_proc
        self.listdir = reader.listdir
        self.time = time.time() if now is None else now
        self._memo: dict[str, Any] = {}
        # (collector, source) -> (available, reason); reported as fleetscope_scrape_source_*
        self.sources: dict[tuple[str, str], tuple[bool, str]] = {}
        self.errors: dict[str, str] = {}  # collector -> first error (makes success 0)

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """Compute a shared record once per scrape (e.g. parsed /proc/stat for two collectors).

        A failure is remembered too, so every collector that needs the record sees the same
        error without reading the file again.
        """
        if key not in self._memo:
            try:
                self._memo[key] = (True, compute())
            except (NotAvailable, ParseError) as err:
                self._memo[key] = (False, err)
        ok, value = self._memo[key]
        if not ok:
            raise value
        return value

    @contextmanager
    def source(self, collector: str, source: str, hint: str = "") -> Iterator[None]:
        """Run one source of a collector: absence marks it unavailable, corruption an error.

        Either way the rest of the collector still runs, so a missing /proc/schedstat costs the
        run-queue metrics only. `hint` says how to get a missing source.
        """
        try:
            yield
        except NotAvailable as err:
            self.sources[(collector, source)] = (False, f"{err}{hint and ': ' + hint}")
        except ParseError as err:
            self.sources[(collector, source)] = (False, str(err))
            self.errors.setdefault(collector, str(err))
        else:
            self.sources[(collector, source)] = (True, "")
