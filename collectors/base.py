"""The small interface every collector implements, and the per-scrape context it reads through.

A collector is one file in this folder with one class: it has a `name` (also its `collector`
label), is built from the config without touching /proc, and `collect(scrape)` yields metric
families. Every file it reads goes through `scrape.read_text("proc/stat")`, which prefixes the
root (`--root`), so a fixture tree or a bundle sample replays exactly as a live host.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from fleetscope.exposition import Family

from .parsers import ParseError

T = TypeVar("T")

BUNDLE_FORMAT = "fleetscope-bundle/1"


class NotAvailable(Exception):
    """The source does not exist on this machine (no such file, feature off in the kernel).

    The message says what is missing and, where known, how to enable it.
    """


class Collector:
    """Base class: subclasses set `name` and implement `collect`."""

    name = ""

    def __init__(self, config: Any):
        self.config = config

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        raise NotImplementedError


def bundle_roots(root: str) -> tuple[str, ...]:
    """The directories a root reads from: the root, then its bundle's `static/` if it has one.

    A bundle sample directory (`<bundle>/samples/s0003`) holds what changes; what was captured
    once (cpuinfo, topology) sits in `<bundle>/static/`, and is looked up there when a sample
    lacks it (bundle format, CONTRACT section 3).
    """
    root = os.path.abspath(root)
    bundle = os.path.dirname(os.path.dirname(root))
    try:
        with open(os.path.join(bundle, "meta.json"), encoding="utf-8") as meta_file:
            meta = json.load(meta_file)
    except (OSError, ValueError):
        return (root,)
    if isinstance(meta, dict) and meta.get("format") == BUNDLE_FORMAT:
        return (root, os.path.join(bundle, "static"))
    return (root,)


class Scrape:
    """What one collection pass sees: the roots, the time, and a memo of shared reads.

    `time` is the wall time of a live scrape or the recorded time of a bundle sample, so
    rates computed by collectors are right in both.
    """

    def __init__(self, roots: tuple[str, ...], now: float | None = None):
        self.roots = roots
        self.time = time.time() if now is None else now
        self._memo: dict[str, Any] = {}
        # (collector, source) -> (available, reason); reported as fleetscope_scrape_source_*
        self.sources: dict[tuple[str, str], tuple[bool, str]] = {}
        self.errors: dict[str, str] = {}  # collector -> first error (makes success 0)

    def path(self, relative: str) -> str:
        """The first existing path for `relative` under the roots (for listings and stat)."""
        for root in self.roots:
            candidate = os.path.join(root, relative)
            if os.path.exists(candidate):
                return candidate
        return os.path.join(self.roots[0], relative)

    def read_text(self, relative: str) -> str:
        """The text of a file under the root, e.g. read_text("proc/stat")."""
        for root in self.roots:
            try:
                with open(os.path.join(root, relative), "rb") as handle:
                    return handle.read().decode("utf-8", "replace")
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as err:  # EACCES, EOPNOTSUPP (PSI disabled), EIO
                raise NotAvailable(f"/{relative}: {err.strerror or err}") from None
        raise NotAvailable(f"/{relative} does not exist")

    def listdir(self, relative: str) -> list[str]:
        """Entry names of a directory under the roots (merged across them), sorted."""
        names: set[str] = set()
        for root in self.roots:
            try:
                names.update(os.listdir(os.path.join(root, relative)))
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as err:
                raise NotAvailable(f"/{relative}: {err.strerror or err}") from None
        return sorted(names)

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
