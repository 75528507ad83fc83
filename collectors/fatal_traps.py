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

Whose crash it was: a binary named like the executable (argv[0]'s base name) of a pool's
process seen in the last GONE_TTL_SECONDS (a crash-looping worker's replacement, or the worker
before it died) is that pool's, and its latest crash is the pool's too:

    fleetscope_pool_sigill_last_crash_timestamp_seconds{pool, class}
    fleetscope_pool_fatal_trap_last_crash_timestamp_seconds{pool, class}

so an alert says which pool's workers are dying. A crash in a library or a binary no pool runs
is the node's alone.
"""

from __future__ import annotations

from fleetscope.core.exposition import Family, counter, gauge, labels


def pool_crash_family(name: str, what: str, last: dict[str, float],
                      owners: dict[str, tuple[str, str]]) -> Family:
    """Per pool, its latest crash: the binaries `owners` (executable name -> (pool, class))
    says it runs."""
    family = gauge(name, f"Unix time of the latest {what} of a binary the pool's processes run "
                         "(their executable's name), from the kernel log.")
    latest: dict[tuple[str, str], float] = {}
    for binary, when in last.items():
        owner = owners.get(binary.rsplit("/", 1)[-1])
        if owner is not None and when > latest.get(owner, 0.0):
            latest[owner] = when
    for (pool, workload_class), when in sorted(latest.items()):
        family.add(round(when, 3), labels(pool=pool, **{"class": workload_class}))
    return family


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
