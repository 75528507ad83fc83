"""Collector `locks`: processes blocked waiting for a file lock (the evidence of the
`lock-contention` rule).

Input: /proc/locks (parsers/locks.py), one small file whatever the node runs: every lock held
and every request blocked behind one (`1: -> FLOCK  ADVISORY  WRITE 10865 fe:00:2146322 0
EOF`). A blocked request is a process (or thread) asleep in flock()/fcntl(F_SETLKW) until the
holder lets go: work serialised on the lock.

    fleetscope_file_lock_waiters                      blocked requests on the node
    fleetscope_pool_file_lock_waiters{pool,class}     those whose owner is a pool's process

The owner pid is in the reader's pid namespace: run the exporter in the host's (hostPID) so the
pids are the pools'. OFD locks (owner -1) count on the node only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from fleetscope.core.exposition import Family, gauge, labels

from .base import Collector, Evidence, Scrape, Signal
from .parsers.locks import parse_proc_locks
from .processes import pool_processes

LOCKS = "proc/locks"


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_pool_file_lock_waiters",
           "pool processes waiting for a file lock", "processes"),
)


class LocksCollector(Collector):
    name = "locks"
    evidence = Evidence(signals=SIGNALS,
                        sampled=(LOCKS,))

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        with scrape.source(self.name, LOCKS, "the kernel was built without CONFIG_FILE_LOCKING"):
            rows = parse_proc_locks(scrape.read_text(LOCKS))
        if (self.name, LOCKS) in scrape.sources and not scrape.sources[(self.name, LOCKS)][0]:
            return
        waiters = [row for row in rows if row.waiting]
        yield gauge(
            "fleetscope_file_lock_waiters",
            "Requests blocked waiting for a file lock another process holds (/proc/locks "
            "'->' rows: flock, POSIX and OFD locks, leases).",
        ).add(len(waiters))
        pools = self.config.pools
        if not pools:
            return
        pool_of = {p.pid: p.pool for p in pool_processes(scrape, pools)}
        blocked: Counter[str] = Counter(pool_of[row.pid].name for row in waiters
                                        if row.pid in pool_of)
        family = gauge(
            "fleetscope_pool_file_lock_waiters",
            "Processes of the pool blocked waiting for a file lock (/proc/locks '->' rows "
            "owned by the pool's pids).",
        )
        for pool in pools:
            family.add(blocked[pool.name], labels(pool=pool.name,
                                                  **{"class": pool.workload_class}))
        yield family
