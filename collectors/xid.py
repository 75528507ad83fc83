"""Collector `xid`: NVIDIA Xid errors from the kernel log (parsers/xid.py), the evidence of the
`accelerator-errors` rule on a node whose GPUs no dcgm-exporter watches:

    [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An
        uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer ...

    fleetscope_accelerator_xid_errors_total{vendor="nvidia", device="0000:07:00", xid="48"}
    fleetscope_accelerator_xid_last_timestamp_seconds{vendor="nvidia", device=..., xid=...}

`device` is the GPU's PCI bus id as the driver prints it (what `nvidia-smi -q` shows as Bus
Id, and dmesg's other NVRM lines name). The kernel log is read as collectors/log_events.py
says; at most MAX_SERIES (device, xid) pairs have their own series, the latest seen, the
older folded into device="other", xid="other". A node with no Xid line exports the two
families without series.
"""

from __future__ import annotations

from collections.abc import Iterator

from fleetscope.core.exposition import Family, counter, gauge, labels
from fleetscope.core.units import TIME_UNIT

from .base import Evidence, Signal
from .log_events import LogEventCollector, LogTally
from .parsers.xid import xid_errors

MAX_SERIES = 64  # eight GPUs with a few codes each, and room
PREFIX = "fleetscope_accelerator_xid_"


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_accelerator_xid_errors_total",
           "NVIDIA Xid errors in the kernel log", "errors"),
    Signal("fleetscope_accelerator_xid_last_timestamp_seconds",
           "latest Xid error of a GPU and code", TIME_UNIT),
)


class XidCollector(LogEventCollector):
    name = "xid"
    evidence = Evidence(signals=SIGNALS)
    missing_hints = ((PREFIX, "no NVRM Xid line in the kernel log (no NVIDIA GPU, none has "
                              "reported an error, or the kernel log is not readable)"),)

    def tally(self) -> LogTally:
        return LogTally("NVRM: Xid", xid_errors, lambda e: (e.device, str(e.code)),
                        MAX_SERIES, ("other", "other"))

    def families(self, counts: dict, last: dict) -> Iterator[Family]:
        errors = counter(PREFIX + "errors_total",
                         "'NVRM: Xid (PCI:<bus id>): <code>, ...' kernel-log lines: errors the "
                         "NVIDIA driver reported, per GPU (PCI bus id) and Xid code.")
        for (device, code) in sorted(counts):
            errors.add(counts[(device, code)], labels(vendor="nvidia", device=device, xid=code))
        latest = gauge(PREFIX + "last_timestamp_seconds",
                       "Unix time of the latest Xid line of each GPU and code (boot time plus "
                       "the log's seconds since boot, or the line's wall-clock stamp).")
        for (device, code) in sorted(last):
            latest.add(round(last[(device, code)], 3),
                       labels(vendor="nvidia", device=device, xid=code))
        yield errors
        yield latest
