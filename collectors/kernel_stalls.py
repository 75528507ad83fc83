"""Collector `kernel_stalls`: hung tasks, soft lockups and RCU CPU stalls the kernel logged (the
evidence of the `hung-task` rule).

    [26825.855448] INFO: task kworker/2:1:5747 blocked for more than 120 seconds.
    [  904.173307] watchdog: BUG: soft lockup - CPU#1 stuck for 842s! [udevadm:94]

Read like the fork-rejected lines (collectors/fork_limits.py): live, /dev/kmsg opened once and
read on from where it was; a bundle or fixture tree, `dmesg.txt` at the root, counted afresh.
Per kind (hung_task, soft_lockup, rcu_stall: three label values, whatever the node prints):

    fleetscope_kernel_stall_reports_total{kind}                    reports so far
    fleetscope_kernel_stall_last_timestamp_seconds{kind}           Unix time of the latest
    fleetscope_kernel_stall_previous_timestamp_seconds{kind}       of the one before it
    fleetscope_kernel_stall_last_stuck_seconds{kind}               how long the latest was stuck

Times are the boot time (/proc/stat btime) plus the log's seconds since boot. The one before
the latest says whether the kernel repeated itself (the same task still blocked a timeout
later, or a second task): the tasks and pids are named from the log by the rule's
enrichment, not in labels.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from fleetscope.core.exposition import Family, counter, gauge, labels
from fleetscope.core.units import TIME_UNIT

from .base import Collector, Evidence, NotAvailable, Scrape, Signal
from .cpu_features import DMESG, KMSG, read_kernel_log
from .fork_limits import _LiveLog
from .parsers import ParseError
from .parsers.kmsg import boot_time, log_clock
from .parsers.stall_log import KINDS, scan_stalls


class _Tally:
    """Per kind: reports, the latest two times and the latest stuck seconds."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(KINDS, 0)
        self.times: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.stuck: dict[str, float] = {}

    def add(self, scan, boot: float | None) -> None:
        for stall in scan.stalls:
            self.counts[stall.kind] += 1
            if boot is not None and stall.seconds is not None:
                times = self.times[stall.kind]
                times.append(boot + stall.seconds)
                times.sort()
                del times[:-2]
            if stall.stuck is not None:
                self.stuck[stall.kind] = stall.stuck


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_kernel_stall_last_stuck_seconds",
           "how long the latest stalled task or CPU was stuck", "s"),
    Signal("fleetscope_kernel_stall_last_timestamp_seconds",
           "latest kernel stall report", TIME_UNIT),
    Signal("fleetscope_kernel_stall_previous_timestamp_seconds",
           "kernel stall report before the latest", TIME_UNIT),
    Signal("fleetscope_kernel_stall_reports_total",
           "kernel stall reports (hung task, soft lockup)", "reports"),
)


class KernelStallsCollector(Collector):
    name = "kernel_stalls"
    evidence = Evidence(signals=SIGNALS)

    def __init__(self, config):
        super().__init__(config)
        self._lock = threading.Lock()
        self._log = _LiveLog()
        self._tally = _Tally()  # live: every report since the exporter started reading

    def close(self) -> None:
        with self._lock:
            self._log.close()

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        with self._lock:
            try:
                source, (text, tally) = read_kernel_log(scrape, {
                    KMSG: lambda: (self._log.read_new(scrape.path(KMSG)), self._tally),
                    DMESG: lambda: (scrape.read_text(DMESG), _Tally())})
            except NotAvailable as err:
                scrape.sources[(self.name, KMSG)] = (False, str(err))
                return
            boot = None
            try:
                boot = boot_time(scrape.read_text("proc/stat"))
            except (NotAvailable, ParseError):
                pass  # counted, but without times
            try:
                tally.add(scan_stalls(text, f"/{source}", log_clock(boot, scrape.time)), boot)
            except ParseError as err:
                scrape.sources[(self.name, source)] = (False, str(err))
                return
            counts, stuck = dict(tally.counts), dict(tally.stuck)
            times = {kind: list(values) for kind, values in tally.times.items()}
        scrape.sources[(self.name, source)] = (True, "")
        reports = counter("fleetscope_kernel_stall_reports_total",
                          "Stall reports in the kernel log, by kind: hung_task ('INFO: task "
                          "<comm>:<pid> blocked for more than N seconds'), soft_lockup ('BUG: "
                          "soft lockup - CPU#N stuck for Ns!'), rcu_stall ('rcu_sched "
                          "self-detected stall', 'detected stalls on CPUs/tasks').")
        last = gauge("fleetscope_kernel_stall_last_timestamp_seconds",
                     "Unix time of the latest stall report of each kind (boot time plus the "
                     "log's seconds since boot).")
        previous = gauge("fleetscope_kernel_stall_previous_timestamp_seconds",
                         "Unix time of the stall report of each kind before the latest: "
                         "whether the kernel repeated itself.")
        longest = gauge("fleetscope_kernel_stall_last_stuck_seconds",
                        "How long the task (hung_task) or the CPU (soft_lockup) of the latest "
                        "report of each kind had been stuck, as the kernel printed it.")
        for kind in KINDS:
            reports.add(counts[kind], labels(kind=kind))
            if times[kind]:
                last.add(round(times[kind][-1], 3), labels(kind=kind))
            if len(times[kind]) > 1:
                previous.add(round(times[kind][-2], 3), labels(kind=kind))
            if kind in stuck:
                longest.add(stuck[kind], labels(kind=kind))
        yield reports
        yield last
        yield previous
        yield longest
