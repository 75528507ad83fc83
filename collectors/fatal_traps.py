"""Metrics of the fatal traps other than SIGILL in the kernel log: the evidence of the
`crash-loop` rule.

The kernel log has one reader, the cpu_features collector (it opens /dev/kmsg once and reads
it incrementally, or a bundle's dmesg.txt): it parses every record once
(parsers/kmsg.py `scan_kernel_log`: SIGILLs in `crashes`, segfaults, general protection
faults, divide errors, int3, arm64 data aborts ... in `faults`), keeps per-binary counts and
latest times of each kind the same bounded way (at most MAX_BINARIES names, the stalest folded
into binary="other"), and exports the faults' families from here:

    fleetscope_fatal_trap_crashes_total{binary}            processes killed, per binary
    fleetscope_fatal_trap_last_crash_timestamp_seconds{binary}   Unix time of the latest

A binary is the file holding the faulting instruction (print_vma_addr's name), else the task
name. Crashes whose line has no timestamp count but have no time.
"""

from __future__ import annotations

from fleetscope.core.exposition import Family, counter, gauge, labels


def fatal_trap_families(counts: dict[str, int], last: dict[str, float]) -> list[Family]:
    crashes = counter(
        "fleetscope_fatal_trap_crashes_total",
        "Processes killed by a fatal trap other than SIGILL (segfault, general protection "
        "fault, divide error, int3, arm64 data/instruction abort ...) as the kernel logged "
        "them, by the file holding the faulting instruction (or the task name).",
    )
    for binary in sorted(counts):
        crashes.add(counts[binary], labels(binary=binary))
    latest = gauge(
        "fleetscope_fatal_trap_last_crash_timestamp_seconds",
        "Unix time of the latest fatal trap (not SIGILL) of each binary in the kernel log "
        "(boot time from /proc/stat btime plus the log's seconds since boot).",
    )
    for binary in sorted(last):
        latest.add(round(last[binary], 3), labels(binary=binary))
    return [crashes, latest]
