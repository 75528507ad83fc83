"""lock-contention: a pool's workers take turns on one file lock instead of working.

Condition: across the window, on average at least one of the pool's processes and at least a
quarter of them blocked in /proc/locks (the '->' rows: asleep in flock()/fcntl(F_SETLKW)
until the holder lets go). A waiter is harm in itself: a worker that does nothing while its
request waits; the node's idle CPUs beside it say what the serialisation costs. An idle
pool (threads waiting for work on a condition variable or queue) blocks on no file lock and
stays silent. Enrichment: the holder's pid and command, the waiting pids, the file's
device:inode and, on a live node, its path.
"""

from __future__ import annotations

import os

from fleetscope.collectors.base import NotAvailable
from fleetscope.collectors.locks import LOCKS
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers.locks import parse_proc_locks
from fleetscope.collectors.shared import process_file

from ..fleet import FleetFault, Set
from ..model import EXPLAINS_POOL, NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import AvgOverTime, Max, Rate, Selector, Sum
from ..signals import POOL

RANK = 2.7  # after the per-process limits
WAITERS = 1.0  # processes of the pool blocked on a file lock, on average over the window
WAITING_SHARE = 0.25  # ...and this share of the pool's processes at least
MAX_SUBJECTS = 8

_WAITERS = Max(AvgOverTime(Selector("fleetscope_pool_file_lock_waiters"), WINDOW), by=POOL)
_PROCESSES = Max(AvgOverTime(Selector("fleetscope_pool_processes"), WINDOW), by=POOL)
_SHARE = _WAITERS / _PROCESSES
_IDLE_CPUS = Sum(Rate(Selector("fleetscope_cpu_numa_node_seconds_total", {"mode": "idle"}),
                      WINDOW),
                 by=NODE)


def lock_waits(scrape, pids: set[int] | None) -> list[tuple[object, object]]:
    """(waiter row, holder row) of /proc/locks for waiters among `pids` (None: all)."""
    try:
        rows = parse_proc_locks(scrape.read_text(LOCKS))
    except (NotAvailable, ParseError):
        return []
    holders = {row.id: row for row in rows if not row.waiting}
    return [(row, holders.get(row.id)) for row in rows
            if row.waiting and (pids is None or row.pid in pids)]


def _path(scrape, holder) -> str:
    """The locked file's path on a live node, as the node names it: the holder's fd whose
    inode it is, under the scrape's root (a container's /host too)."""
    fd_dir = process_file(holder.pid, "fd")
    try:
        base, fds = scrape.path(fd_dir), scrape.listdir(fd_dir)
    except NotAvailable:
        return ""
    for fd in fds[:4096]:
        try:
            if os.stat(f"{base}/{fd}").st_ino == holder.inode:
                return os.readlink(f"{base}/{fd}")
        except OSError:
            continue
    return ""


def enrich(ctx, finding) -> None:
    """Who holds the lock the pool waits for, who waits, and which file."""
    pool = finding.labels.get("pool")
    members = {p.pid for p in ctx.pool_members(ctx.last, pool)}
    waits = lock_waits(ctx.last, members)
    if not waits:
        return
    by_lock: dict[int, list] = {}
    for waiter, holder in waits:
        by_lock.setdefault(waiter.id, []).append((waiter, holder))
    parts = []
    pids: list[int] = []
    for entries in sorted(by_lock.values(), key=len, reverse=True)[:3]:
        holder = entries[0][1]
        waiters = [w.pid for w, _ in entries]
        file = f"{entries[0][0].device}:{entries[0][0].inode}"
        path = _path(ctx.last, holder) if ctx.live and holder is not None else ""
        if holder is not None:
            pids.append(holder.pid)
            held = ctx.describe(holder.pid)
        else:
            held = "an unknown holder"
        pids.extend(waiters)
        what = f"{entries[0][0].kind} lock on {path or 'inode ' + file}"
        finding.evidence.append({
            "signal": f"processes waiting for the {what} held by {held} (waiting pids "
                      f"{', '.join(str(p) for p in waiters[:10])})",
            "value": len(waiters), "threshold": 0, "unit": "processes"})
        parts.append(f"{len(waiters)} waiting for the {what} held by {held}")
    finding.subjects["pids"] = list(dict.fromkeys(pids))[:MAX_SUBJECTS]
    finding.extra_summary = "; ".join(parts)


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "lock-contention", "agent-x86-11",
        "the workers serialise their model-cache refresh on one flock()ed file and do the "
        "refresh (a CPU-bound rebuild) while holding it: three of four always wait",
        "three '->' rows in /proc/locks behind one holder in every sample; the workers use "
        "about one CPU between them while twelve sit idle",
        uptime_days=2.2, procs=k.daemons(k.X86) + k.workers(
            k.X86, k.ONLINE_X86, (0.97, 0.01, 0.01, 0.01)),
        background=k.background(k.X86, 0.15, 0.02), file_lock_waiters=3)


RULE = Rule(
    id="lock-contention",
    severity="warning",
    explains=EXPLAINS_POOL,  # its processes, queued on one file lock
    symptom="throughput flat however many workers run; sessions slow while CPUs idle",
    cause="the pool's workers serialise on one file lock (flock, fcntl): one works while "
          "the others sleep in the lock",
    action="hold the lock only around the shared write, not the compute (or give each "
           "worker its own file); /proc/locks names the holder, fleetscope stacks PID shows "
           "where the waiters block (state lock)",
    summary="pool {pool}: {value:.1f} processes on average blocked on a file lock",
    # Harm and cause together, over the window: waiters on most samples (a mean of at least
    # one process and a quarter of the pool), not one brief collision.
    condition=(_WAITERS >= WAITERS).and_on(_SHARE >= WAITING_SHARE, (*NODE, "pool")),
    evidence=(
        Evidence("pool processes blocked on a file lock (mean over the window)", _WAITERS,
                 WAITERS, "processes"),
        Evidence("share of the pool's processes blocked on a file lock", _SHARE,
                 WAITING_SHARE, "ratio"),
        Evidence("idle CPUs on the node", _IDLE_CPUS, 0, "CPUs"),
    ),
    confidence=0.8,
    for_seconds=120,
    enrich=enrich,
    views=(
        Panel("Processes blocked on a file lock per pool",
              Max(Selector("fleetscope_pool_file_lock_waiters"), by=(*NODE, "pool")),
              "processes", WAITERS),
        Panel("Idle CPUs on the node", _IDLE_CPUS, "CPUs"),
    ),
    fleet=FleetFault(("chat",), 8, 30, effects=(
        # all the pool's processes but the lock's holder wait
        Set("lock_waiters", lambda site: site.processes - 1),
    )),
    proof=Proof(scenario,
                summary=r"pool chat-online: 3\.0 processes on average blocked on a file lock; "
                        r"3 waiting for the FLOCK lock on inode .* held by pid \d+",
                subjects=("pids", None)),
)
