"""Counting one kind of kernel-log event, per a bounded label key: what the `xid` and
`syn_flood` collectors share.

Read like the fork-rejected lines (collectors/fork_limits.py): live, /dev/kmsg opened once
and read on from where it was (the counts grow with the ring's new records); a bundle or
fixture tree, `dmesg.txt` at the root, the whole log counted afresh each time. A line's time
is the boot time (/proc/stat btime) plus its seconds since boot, or its wall-clock stamp put
on that clock (parsers/kmsg.py LogClock). At most `limit` keys keep their own series, the
latest seen; older ones fold into the `other` key, whose counter then never falls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Iterator

from fleetscope.core.exposition import Family

from .base import Collector, NotAvailable, Scrape
from .cpu_features import DMESG, KMSG, read_kernel_log
from .fork_limits import _LiveLog
from .parsers import ParseError
from .parsers.kmsg import LogClock, boot_time, log_clock


class LogTally:
    """Lines of one event kind read from the node's kernel log: per key, how many and the
    Unix time of the latest."""

    def __init__(self, needle: str, parse: Callable[[str, LogClock | None], Iterable],
                 key: Callable[[object], Hashable], limit: int, other: Hashable):
        self.needle = needle  # a line without it holds no such event (skips the parse)
        self.parse = parse  # (text, clock) -> events with `.seconds`, in log order
        self.key = key
        self.limit = limit
        self.other = other
        self._lock = threading.Lock()
        self._log = _LiveLog()
        self._counts: dict = {}  # live: lines since the exporter started reading the ring
        self._last: dict = {}

    def close(self) -> None:
        with self._lock:
            self._log.close()

    def collect(self, scrape: Scrape, collector: str) -> tuple[dict, dict] | None:
        """(counts per key, latest Unix time per key), the kernel log read reported as the
        collector's source; None (reported unavailable) when the node has no readable one."""
        try:
            source, counts, last = self.read(scrape)
        except NotAvailable as err:
            scrape.sources[(collector, KMSG)] = (False, str(err))
            return None
        except ParseError as err:  # not kernel log text
            scrape.sources[(collector, getattr(err, "kernel_log", DMESG))] = (False, str(err))
            return None
        scrape.sources[(collector, source)] = (True, "")
        return counts, last

    def read(self, scrape: Scrape) -> tuple[str, dict, dict]:
        """(the kernel log read, counts per key, latest Unix time per key); NotAvailable
        when the node has no readable kernel log."""
        with self._lock:
            source, (text, counts, last) = read_kernel_log(scrape, {
                KMSG: lambda: (self._log.read_new(scrape.path(KMSG)), self._counts,
                               self._last),
                DMESG: lambda: (scrape.read_text(DMESG), {}, {})})
            if self.needle in text:
                boot = None
                try:
                    boot = boot_time(scrape.read_text("proc/stat"))
                except (NotAvailable, ParseError):
                    pass
                for event in self.parse(text, log_clock(boot, scrape.time)):
                    key = self.key(event)
                    counts[key] = counts.get(key, 0) + 1
                    if boot is not None and event.seconds is not None:
                        last[key] = max(last.get(key, 0.0), boot + event.seconds)
                self._fold(counts, last)
            return source, dict(counts), dict(last)

    def _fold(self, counts: dict, last: dict) -> None:
        named = [key for key in counts if key != self.other]
        if len(named) <= self.limit:
            return
        named.sort(key=lambda k: last.get(k, 0.0), reverse=True)
        for key in named[self.limit:]:
            counts[self.other] = counts.get(self.other, 0) + counts.pop(key)
            if key in last:
                last[self.other] = max(last.get(self.other, 0.0), last.pop(key))


class LogEventCollector(Collector):
    """A collector of one event kind of the kernel log: `tally()` says how it is found and
    keyed, `families(counts, last)` what is exported."""

    def __init__(self, config):
        super().__init__(config)
        self._tally = self.tally()

    def tally(self) -> LogTally:
        raise NotImplementedError

    def families(self, counts: dict, last: dict) -> Iterator[Family]:
        raise NotImplementedError

    def close(self) -> None:
        self._tally.close()

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        read = self._tally.collect(scrape, self.name)
        if read is not None:
            yield from self.families(*read)
