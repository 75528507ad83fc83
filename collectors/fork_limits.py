"""Collector `fork_limits`: forks and thread creations the pids controller refused, from the
kernel log (the evidence beside pids.events of the `pid-exhaustion` rule, and its only one
for cgroups outside the configured pools).

    [13964.753718] cgroup: fork rejected by pids controller in /user.slice/session-7.scope

The kernel prints it once per cgroup, at its first refusal (parsers/pids_log.py), so the
line dates the start of the trouble and names the cgroup; pids.events `max` (the pools
collector) counts every refusal. Read like the SIGILL reports (collectors/cpu_features.py):
live, /dev/kmsg opened once and read incrementally, from the start of the ring; a bundle or
fixture tree, `dmesg.txt` at the root (a bundle keeps it in static/). Each line's time is the
boot time (/proc/stat btime) plus its seconds since boot. At most MAX_CGROUPS cgroups keep
their own series, the most recently refused; older ones fold into cgroup="other". Whether each
named cgroup still exists (its pids.max under the v1 pids mount or the cgroup2 mount) says
whether the refusals can still act: a job's cgroup removed since is history.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from fleetscope.core.bundle_format import KIB
from fleetscope.core.exposition import Family, counter, gauge, labels
from fleetscope.core.units import TIME_UNIT

from .base import Collector, Evidence, NotAvailable, Scrape, Signal
from .cpu_features import DMESG, KMSG, _Kmsg, read_kernel_log
from .parsers import ParseError
from .parsers.kmsg import boot_time, log_clock
from .parsers.pids_log import fork_rejections

MAX_CGROUPS = 20
# Where a cgroup's pids.max is, by hierarchy (as the memory collector looks for memory cgroups).
PIDS_MOUNTS = ("sys/fs/cgroup/pids", "sys/fs/cgroup", "sys/fs/cgroup/unified")


def pids_cgroup_files(path: str) -> list[str]:
    """Where a pids cgroup's pids.max would be, under each mount (relative to the root)."""
    return [f"{mount}{path}/pids.max" for mount in PIDS_MOUNTS]


def rejected_cgroups(text: str) -> set[str]:
    """The cgroups the kernel log's fork-rejected lines name: what a bundle records the
    existence of."""
    if "fork rejected" not in text:
        return set()
    return {path for path, _ in fork_rejections(text)[-4 * MAX_CGROUPS:]
            if path.startswith("/")}


def cgroup_exists(scrape: Scrape, path: str) -> bool:
    for marker in pids_cgroup_files(path):
        try:
            if scrape.reader.read_head(marker, 32) is not None:
                return True
        except NotAvailable:  # a path the reader refuses (a ".." in it)
            return False
    return False


class _LiveLog:
    """/dev/kmsg under a root, opened at first use and reopened when the root changes or a
    read fails."""

    def __init__(self) -> None:
        self.kmsg: _Kmsg | None = None

    def read_new(self, path: str) -> str:
        if self.kmsg is not None and self.kmsg.path != path:
            self.close()
        try:
            if self.kmsg is None:
                self.kmsg = _Kmsg(path)
            return self.kmsg.read_new()
        except OSError as err:
            self.close()
            raise NotAvailable(f"/{KMSG}: {err.strerror or err}") from None

    def close(self) -> None:
        if self.kmsg is not None:
            self.kmsg.close()
            self.kmsg = None

    __del__ = close


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_pids_fork_rejected_cgroup_exists",
           "fork-rejecting cgroup still exists (1 yes)", "check"),
    Signal("fleetscope_pids_fork_rejected_last_timestamp_seconds",
           "latest fork rejected by a cgroup's pids.max", TIME_UNIT),
)


class ForkLimitsCollector(Collector):
    name = "fork_limits"
    evidence = Evidence(signals=SIGNALS,
                        per_cgroup={(controller, version): ("pids.current", "pids.max",
                                                            "pids.events")
                                    for controller, version in (("pids", 1), ("pids", 2))},
                        read_limits={"pids.current": 4 * KIB, "pids.max": 4 * KIB,
                                     "pids.events": 4 * KIB})

    def __init__(self, config):
        super().__init__(config)
        self._lock = threading.Lock()
        self._log = _LiveLog()
        self._counts: dict[str, int] = {}  # live: lines since the start, per cgroup
        self._last: dict[str, float] = {}

    def close(self) -> None:
        with self._lock:
            self._log.close()

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        with self._lock:
            try:
                # The ring is read on from where it was; dmesg.txt is the whole log each
                # time, counted afresh.
                source, (text, counts, last) = read_kernel_log(scrape, {
                    KMSG: lambda: (self._log.read_new(scrape.path(KMSG)), self._counts,
                                   self._last),
                    DMESG: lambda: (scrape.read_text(DMESG), {}, {})})
            except NotAvailable as err:
                scrape.sources[(self.name, KMSG)] = (False, str(err))
                return
            boot = None
            if "fork rejected" in text:
                try:
                    boot = boot_time(scrape.read_text("proc/stat"))
                except (NotAvailable, ParseError):
                    pass
            # the clock times lines stamped with the wall clock (journalctl -k, dmesg -T)
            rejected = fork_rejections(text, log_clock(boot, scrape.time)) if (
                "fork rejected" in text) else []
            for path, seconds in rejected:
                counts[path] = counts.get(path, 0) + 1
                if boot is not None and seconds is not None:
                    last[path] = max(last.get(path, 0.0), boot + seconds)
            _fold(counts, last)
            counts, last = dict(counts), dict(last)
        scrape.sources[(self.name, source)] = (True, "")
        refused = counter("fleetscope_pids_fork_rejected_total",
                          "'cgroup: fork rejected by pids controller in <cgroup>' kernel-log "
                          "lines, per cgroup (printed once per cgroup, at its first refused "
                          "fork; pids.events counts every refusal).")
        for path in sorted(counts):
            refused.add(counts[path], labels(cgroup=path))
        latest = gauge("fleetscope_pids_fork_rejected_last_timestamp_seconds",
                       "Unix time of the latest fork-rejected kernel-log line of each cgroup "
                       "(boot time plus the log's seconds since boot).")
        for path in sorted(last):
            latest.add(round(last[path], 3), labels(cgroup=path))
        exists = gauge("fleetscope_pids_fork_rejected_cgroup_exists",
                       "1 while a cgroup named by a fork-rejected kernel-log line still "
                       "exists (its pids.max is there), 0 once it is gone.")
        for path in sorted(counts):
            if path.startswith("/"):  # not "other"
                exists.add(int(cgroup_exists(scrape, path)), labels(cgroup=path))
        yield refused
        yield latest
        yield exists


def _fold(counts: dict[str, int], last: dict[str, float]) -> None:
    """Keep MAX_CGROUPS named series, the latest refused; the rest add into "other" (whose
    counter then never falls)."""
    named = [c for c in counts if c != "other"]
    if len(named) <= MAX_CGROUPS:
        return
    named.sort(key=lambda c: last.get(c, 0.0), reverse=True)
    for path in named[MAX_CGROUPS:]:
        counts["other"] = counts.get("other", 0) + counts.pop(path)
        if path in last:
            last["other"] = max(last.get("other", 0.0), last.pop(path))
