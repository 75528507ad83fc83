"""fd-exhaustion: a process close to its open-file limit ("Too many open files").

Condition: open fds over RLIMIT_NOFILE of a pool's worst process above 0.9. Enrichment:
the processes near the limit.
"""

from __future__ import annotations

from fleetscope.collectors.base import NotAvailable
from fleetscope.collectors.parsers.process import parse_limits
from fleetscope.collectors.shared import process_file

from ..fleet import FleetFault, Noisy, Set
from ..model import EXPLAINS_POOL, NODE, Evidence, Panel, Proof, Rule
from ..promql import Max, Selector
from ..signals import POOL

RANK = 2
FD_RATIO = 0.9  # open fds over RLIMIT_NOFILE (default 1024: "Too many open files")
MAX_SUBJECTS = 5

_FD_RATIO = Max(Selector("fleetscope_pool_fd_usage_ratio"), by=POOL)


def enrich(ctx, finding) -> None:
    """The processes closest to their limit, not every member of the pool."""
    worst = []
    for process in ctx.pool_members(ctx.last, finding.labels.get("pool")):
        limits = ctx.read(ctx.last, process_file(process.pid, "limits"), parse_limits)
        soft = (limits or {}).get("Max open files", (None, None))[0]
        try:
            count = int(ctx.last.read_text(process_file(process.pid, "fd_count")).strip())
        except (NotAvailable, ValueError):
            try:
                count = len(ctx.last.listdir(process_file(process.pid, "fd")))
            except NotAvailable:
                continue
        if soft:
            worst.append((count / soft, process.pid))
    worst.sort(reverse=True)
    finding.subjects["pids"] = [pid for ratio, pid in worst[:MAX_SUBJECTS]
                                if ratio >= worst[0][0] * 0.8]


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    fds = ([986, 991, 995, 1000, 1004, 1008, 1013, 1017], [212] * 8, [236] * 8,
           [198, 199, 201, 203, 203, 204, 206, 207])
    return k.kp_scenario(
        "fd-exhaustion", "agent-kp-05",
        "the workers' containers run with the runtime's default RLIMIT_NOFILE of 1024, and one "
        "worker leaks an HTTP connection per failed tool call: it holds 1017 descriptors",
        "fd_count / Max open files 0.99 for one worker (1024 soft limit), its descriptor count "
        "growing ~4 per 10 s, tool-call errors (EMFILE) rising",
        uptime_days=14.2, procs=k.daemons(k.KUNPENG) + k.workers(
            k.KUNPENG, k.ONLINE_KP, 1.1, threads=(6, 6, 6, 6), fds=fds, nofile=(1024, 4096)),
        background=k.background(k.KUNPENG, 0.1, 0.03),
        agent=k.AgentPlan(sessions=13.0, errors=0.045, queue=[3, 2, 4, 3, 3, 5, 4, 3],
                        heartbeat=[0.9, 1.1, 0.6, 1.4, 0.8, 1.2, 0.7, 1.0]))


RULE = Rule(
    id="fd-exhaustion",
    severity="critical",
    explains=EXPLAINS_POOL,  # its processes' open-file limit
    symptom='"Too many open files" as agents scale',
    cause="a process is close to its file-descriptor limit (RLIMIT_NOFILE, 1024 by default)",
    action="raise nofile to >= 65535 (LimitNOFILE= in the unit, ulimit -n, the container "
           "runtime) before deploying; look for fd leaks (ls -l /proc/PID/fd)",
    summary="pool {pool}: a process uses {value:.0%} of its open-file limit",
    condition=_FD_RATIO > FD_RATIO,
    evidence=(
        Evidence("open fds over RLIMIT_NOFILE (worst process)", _FD_RATIO, FD_RATIO, "ratio"),
        Evidence("open fds of that process",
                 Max(Selector("fleetscope_pool_fd_usage_open_fds"), by=POOL), 0, "fds"),
        Evidence("its soft limit", Max(Selector("fleetscope_pool_fd_usage_limit_fds"), by=POOL),
                 65535, "fds", pick="min"),
    ),
    confidence=0.9,
    enrich=enrich,
    views=(
        Panel("Open files over RLIMIT_NOFILE (worst process per pool)",
              Max(Selector("fleetscope_pool_fd_usage_ratio"), by=(*NODE, "pool")), "ratio",
              FD_RATIO),
        Panel("Open files of that process",
              Max(Selector("fleetscope_pool_fd_usage_open_fds"), by=(*NODE, "pool")), "fds"),
    ),
    fleet=FleetFault(("codegen",), 6, 35, effects=(
        Set("fd_limit", 1024.0),
        Set("open_fds", Noisy(980, 30, stream=40)),
    )),
    proof=Proof(scenario, summary=r"pool chat-online: a process uses 99% of its open-file limit",
                subjects=("pids", None)),
)
