"""memory-pressure: tasks stall on memory (PSI) while memory is being reclaimed under them.

Condition: the harm, PSI memory `some` over MEMORY_STALL of the time, together with its cause:
direct reclaim on the node (/proc/vmstat allocstall_* rising: allocating tasks had to free
memory themselves) or a pool's memory cgroup at its limit (v1 memory.failcnt, v2
memory.events max/high rising). A busy node churning page cache without stalls (kswapd
keeping up, PSI near zero) is fine and stays silent. Evidence: the stall share, the reclaim
rates, and each pool cgroup's usage against its limit.
"""

from __future__ import annotations

from fleetscope.collectors.shared import process_file

from ..fleet import FleetFault, Set
from ..model import EXPLAINS_NODE, NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Max, Rate, Selector, Sum

RANK = 3.7  # after the CPU causes of the same severity
# Share of wall time at least one task stalled on memory (PSI some): 10 % is a tenth of every
# second lost to reclaim or refaults, far above the 0-1 % of a node with memory to spare.
MEMORY_STALL = 0.10

_PSI_MEMORY = Sum(Rate(Selector("fleetscope_pressure_stall_seconds_total",
                                {"resource": "memory", "stall": "some"}), WINDOW), by=NODE)
_ALLOCSTALLS = Sum(Rate(Selector("fleetscope_memory_allocation_stalls_total"), WINDOW), by=NODE)
_LIMIT_HITS = Sum(Rate(Selector("fleetscope_pool_memory_limit_hits_total"), WINDOW), by=NODE)
_HIGH = Sum(Rate(Selector("fleetscope_pool_memory_high_events_total"), WINDOW), by=NODE)


def enrich(ctx, finding) -> None:
    """The pools' memory cgroups near their limit (usage over limit of at least 0.9): where
    the reclaim comes from when it is not node-wide."""
    from fleetscope.collectors.memory import _read_memcg, read_mount_points
    from fleetscope.collectors.parsers.oom import memory_cgroup_path

    from .oom_kill import _size

    v1_mounts, v2_mounts = read_mount_points(ctx.last)
    seen, full = set(), []
    for process in ctx.pool_members(ctx.last):
        line = ctx.read(ctx.last, process_file(process.pid, "cgroup"), memory_cgroup_path)
        if line is None or line in seen or line[1] in ("", "/"):
            continue
        seen.add(line)
        reading = _read_memcg(ctx.last, line[0], line[1],
                              v1_mounts if line[0] == "v1" else v2_mounts)
        if reading and reading["limit"] and reading["usage"] >= 0.9 * reading["limit"]:
            full.append((reading["usage"] / reading["limit"], process.pool.name, line[1],
                         reading))
    full.sort(reverse=True)
    finding.subjects["cgroups"] = [path for _, _, path, _ in full][:5]
    if full:
        ratio, pool, path, reading = full[0]
        finding.extra_summary = (f"pool {pool}'s memory cgroup {path} at {ratio:.0%} of its "
                                 f"{_size(reading['limit'] // 1024)} limit")


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.kp_scenario(
        "memory-pressure", "agent-kp-07",
        "the chat workers' pod cgroup runs at its 8 GiB memory limit after a model cache was "
        "enabled: every allocation reclaims from the cgroup first, and the node's page cache "
        "is squeezed into direct reclaim",
        "PSI memory some ~22 %, memory.events max rising ~35/s, allocstall ~40/s, "
        "pgscan_direct ~9,000 pages/s, no OOM kill yet",
        uptime_days=21.3, procs=k.daemons(k.KUNPENG) + k.workers(k.KUNPENG, k.ONLINE_KP, 0.9,
                                                            threads=(6, 6, 6, 6)),
        background=k.background(k.KUNPENG, 0.1, 0.03),
        psi={"cpu": 2.0, "memory": 22.0, "io": 3.0},
        memory=k.MemoryPlan(limit_bytes=8 << 30, usage=0.99, limit_hits=35.0, stall=0.22,
                            direct_scan=9000.0, allocstalls=40.0))


RULE = Rule(
    id="memory-pressure",
    severity="warning",
    explains=EXPLAINS_NODE,  # the node's memory
    symptom="agent work slows down in bursts on a node with no CPU shortage; latency tails grow",
    cause="tasks stall on memory: allocations wait for reclaim (direct reclaim on the node, or "
          "a pool's memory cgroup at its limit), which precedes OOM kills",
    action="find the cgroup at its limit (memory.current against memory.max / "
           "memory.usage_in_bytes against memory.limit_in_bytes) and raise its limit or cut "
           "its use; on node-wide pressure move workloads off or reserve memory for the kernel",
    summary="tasks stalled on memory {value:.0%} of the time, with reclaim under them",
    # Harm (PSI) and cause (reclaim) together: page-cache churn that kswapd absorbs has
    # reclaim but no stalls; a cgroup at its limit stalls only its own tasks.
    condition=((_PSI_MEMORY > MEMORY_STALL).and_on(_ALLOCSTALLS > 0, NODE)
               | (_PSI_MEMORY > MEMORY_STALL).and_on((_LIMIT_HITS > 0) | (_HIGH > 0), NODE)),
    evidence=(
        Evidence("share of time tasks stalled on memory (PSI some)", _PSI_MEMORY,
                 MEMORY_STALL, "ratio"),
        Evidence("allocations entering direct reclaim", _ALLOCSTALLS, 0, "stalls/s"),
        Evidence("pages scanned by direct reclaim",
                 Sum(Rate(Selector("fleetscope_memory_reclaim_scanned_pages_total",
                                   {"mode": "direct"}), WINDOW), by=NODE), 0, "pages/s"),
        Evidence("pool memory cgroups hitting their limit", _LIMIT_HITS, 0, "hits/s"),
        Evidence("memory use over limit of the fullest pool cgroup",
                 Max(Selector("fleetscope_pool_memory_usage_ratio"), by=NODE), 0.9, "ratio"),
    ),
    confidence=0.75,
    enrich=enrich,
    views=(
        Panel("Share of time tasks stalled on memory (PSI some)", _PSI_MEMORY, "ratio",
              MEMORY_STALL),
        Panel("Allocations entering direct reclaim", _ALLOCSTALLS, "stalls/s", 0.0),
        Panel("Pool memory cgroups hitting their limit, per pool",
              Max(Rate(Selector("fleetscope_pool_memory_limit_hits_total"), WINDOW),
                  by=(*NODE, "pool")), "hits/s", 0.0, narrow=False),
    ),
    fleet=FleetFault(("codegen",), 14, 30, effects=(
        # a cgroup at its limit: tasks stalled ~22 % of the time in reclaim
        Set("memory_pressure", 0.22),
        Set("allocation_stall_rate", 40.0),
    )),
    proof=Proof(scenario, summary=r"tasks stalled on memory 2\d% of the time, with reclaim "
                                  r"under them; pool chat-online's memory cgroup \S+ at 9\d% "
                                  r"of its 8 GiB limit",
                subjects=("cgroups", None)),
)
