"""numa-remote-access: a pool's processes run on one NUMA node while their memory sits on
another.

Condition: the share of a pool's resident memory (numa_maps) on nodes its CPUs are not on
above 0.3. Enrichment: the processes with the most memory off their CPUs' nodes, and those
nodes.
"""

from __future__ import annotations

from fleetscope.collectors.parsers.process import parse_numa_maps, parse_status
from fleetscope.collectors.parsers.sysfs import parse_cpulist
from fleetscope.collectors.pods import pod_notes
from fleetscope.collectors.shared import numa_node_cpus, process_file

from ..fleet import Add, FleetFault, Noisy, Set
from ..model import EXPLAINS_POOL, NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Max, Rate, Selector, Sum

RANK = 5
NUMA_REMOTE_RATIO = 0.3  # share of a pool's resident memory on nodes its CPUs are not on
MAX_SUBJECTS = 5

_REMOTE_RATIO = Max(Selector("fleetscope_pool_numa_remote_memory_ratio"),
                    by=(*NODE, "pool", "class"))
_OTHER_NODE_PAGES = Sum(Rate(Selector("fleetscope_numastat_pages_total",
                                      {"field": "other_node"}), WINDOW), by=NODE)


def enrich(ctx, finding) -> None:
    """The pool's processes with the most memory off their CPUs' nodes."""
    nodes = numa_node_cpus(ctx.last)
    node_of = {cpu: node for node, cpus in nodes.items() for cpu in cpus}
    remote_by_pid = []
    remote_nodes: set[int] = set()
    for process in ctx.pool_members(ctx.last, finding.labels.get("pool")):
        status = ctx.read(ctx.last, process_file(process.pid, "status"), parse_status)
        resident = ctx.read(ctx.last, process_file(process.pid, "numa_maps"), parse_numa_maps)
        if not status or not resident:
            continue
        allowed = parse_cpulist(status.get("Cpus_allowed_list", ""))
        local = {node_of[c] for c in allowed if c in node_of}
        remote = {n: size for n, size in resident.items() if n not in local}
        total = sum(resident.values())
        if total and remote:
            remote_by_pid.append((sum(remote.values()) / total, process.pid))
            remote_nodes.update(remote)
    remote_by_pid.sort(reverse=True)
    finding.subjects["pids"] = [pid for _, pid in remote_by_pid[:MAX_SUBJECTS]]
    finding.subjects["numa_nodes"] = sorted(remote_nodes)
    # On Kubernetes: each pod's exclusive CPUs and the NUMA nodes the memory manager chose.
    notes = pod_notes(ctx, finding.subjects["pids"], memory=True)
    if notes:
        finding.extra_summary = "; ".join(filter(None, [finding.extra_summary, *notes]))


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.kp_scenario(
        "numa-remote-access", "agent-kp-02",
        "the workers loaded their model on node 0, then a rebalancing moved their cpuset to "
        "node 1 (CPUs 4-7); the memory did not follow (cpuset.memory_migrate off, NUMA "
        "balancing off) and their launcher's numactl --preferred=0 keeps new pages on node 0",
        "90 % of the pool's resident memory on node 0 while its CPUs are on node 1 "
        "(numa_maps), numastat other_node on node 0 rising 2600 pages/s, CPU 71 % on node 1 "
        "and low elsewhere, IPC 0.55, throughput well below the node's",
        uptime_days=8.7, procs=k.daemons(k.KUNPENG) + k.workers(
            k.KUNPENG, [4, 5, 6, 7], 0.68, threads=(6, 6, 6, 6), anon_nodes={0: 0.91, 1: 0.09},
            file_nodes={0: 0.6, 1: 0.4}, growth_nodes={0: 0.95, 1: 0.05}),
        background=k.background(k.KUNPENG, 0.08, 0.03),
        numa_flows=[(1, 0, 0, 2600.0)],
        perf={"bandwidth": 0.2, "llc_miss": 0.34, "ipc": 0.55},
        agent=k.AgentPlan(sessions=9.0, session_median=0.41, inference_median=0.29,
                        queue=[5, 6, 5, 7, 6, 6, 7, 6],
                        heartbeat=[0.8, 1.4, 0.9, 1.1, 1.6, 0.7, 1.2, 1.0]))


RULE = Rule(
    id="numa-remote-access",
    severity="warning",
    explains=EXPLAINS_POOL,  # its processes' memory, off their NUMA node
    symptom="node CPU not high but throughput will not rise",
    cause="cross-NUMA memory access: a pool's processes run on one NUMA node while their "
          "memory sits on another",
    action="bind CPU and memory together (numactl --cpunodebind=N --membind=N, or the "
           "cpuset/topology manager); split model and state per NUMA domain",
    summary="pool {pool}: {value:.0%} of resident memory on remote NUMA nodes",
    condition=_REMOTE_RATIO > NUMA_REMOTE_RATIO,
    evidence=(
        Evidence("share of the pool's memory on remote nodes", _REMOTE_RATIO,
                 NUMA_REMOTE_RATIO, "ratio"),
        Evidence("pages allocated off-node per second (numastat other_node)",
                 _OTHER_NODE_PAGES, 0, "pages/s"),
    ),
    confidence=0.75,
    enrich=enrich,
    views=(
        Panel("Share of each pool's memory on remote NUMA nodes",
              Max(Selector("fleetscope_pool_numa_remote_memory_ratio"), by=(*NODE, "pool")),
              "ratio", NUMA_REMOTE_RATIO, narrow=False),
        Panel("Pages allocated off-node per NUMA node (numastat other_node)",
              Sum(Rate(Selector("fleetscope_numastat_pages_total", {"field": "other_node"}),
                       WINDOW), by=(*NODE, "numa_node")), "pages/s", narrow=False),
    ),
    fleet=FleetFault(("chat", "codegen"), 24, 150, effects=(
        Set("numa_remote_pages", 6e4),
        Set("numa_remote_ratio", Noisy(0.48, 0.15, stream=42, per_minute=False)),
        Add("cpu_stages_stretch", 0.5),
    )),
    proof=Proof(scenario,
                summary=r"pool chat-online: 9\d% of resident memory on remote NUMA nodes",
                subjects=("numa_nodes", [0])),
)
