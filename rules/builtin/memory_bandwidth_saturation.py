"""memory-bandwidth-saturation: DRAM bandwidth near the platform's peak.

Condition: DRAM read+write bandwidth (perf uncore counters) above 0.8 of the platform peak
and the L3 miss ratio above 0.2 ("L3 hit rate < 80 %").
"""

from __future__ import annotations

from ..fleet import Add, FleetFault, Noisy, Set
from ..model import EXPLAINS_NODE, NODE, Evidence, Panel, Proof, Rule
from ..promql import Max, Selector, Sum

RANK = 4
BANDWIDTH_RATIO = 0.8  # DRAM read+write over the platform peak
LLC_MISS_RATIO = 0.2  # "L3 hit rate < 80 %"

_BANDWIDTH = Max(Selector("fleetscope_memory_bandwidth_utilization_ratio"), by=NODE)
_LLC_MISS = Max(Selector("fleetscope_llc_miss_ratio"), by=NODE)


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "memory-bandwidth-saturation", "agent-x86-02",
        "concurrency raised from 8 to 24 sessions per worker: the workers stream a 7B Q4 "
        "model's weights for every token of every session and the ETL job scans its data, "
        "so DRAM traffic reaches 91 % of the six DDR4-2400 channels' 115.2 GB/s",
        "perf: uncore_imc CAS read+write 105 GB/s (0.91 of the peak), LLC miss ratio 47 %, "
        "IPC 0.34; cores 85 % busy but inference 2.6x slower, sessions slower",
        uptime_days=12.5, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 2.4,
                                                      threads=(4, 4, 4, 3), lead_wait=0.02)
        + [k.etl(k.X86, range(16), 2.0)],
        background=k.background(k.X86, 0.5, 0.05), psi={"cpu": 4.0, "memory": 0.3, "io": 0.4},
        perf={"bandwidth": [0.55, 0.9, 0.91, 0.9, 0.92, 0.91, 0.9, 0.91],
              "llc_miss": [0.2, 0.46, 0.47, 0.47, 0.48, 0.46, 0.47, 0.47],
              "ipc": [1.0, 0.35, 0.34, 0.34, 0.33, 0.35, 0.34, 0.34]},
        agent=k.AgentPlan(sessions=14.0, session_median=0.58, inference_median=0.42,
                        queue=[9, 12, 10, 13, 11, 12, 14, 12],
                        heartbeat=[1.4, 2.1, 0.9, 1.7, 2.4, 1.1, 1.9, 1.3]))


RULE = Rule(
    id="memory-bandwidth-saturation",
    severity="warning",
    explains=EXPLAINS_NODE,  # the node's memory bandwidth
    symptom="fine at low concurrency, stalls as concurrency rises",
    cause="DRAM bandwidth near the platform's peak: cores wait on memory (L3 misses high, "
          "IPC falls)",
    action="fewer sessions per node or more memory channels; improve locality (NUMA binding, "
           "smaller working sets, quantised weights shared per NUMA node)",
    summary="memory bandwidth at {value:.0%} of the platform peak",
    condition=(_BANDWIDTH > BANDWIDTH_RATIO).and_on(_LLC_MISS > LLC_MISS_RATIO, NODE),
    evidence=(
        Evidence("DRAM bandwidth over platform peak", _BANDWIDTH, BANDWIDTH_RATIO, "ratio"),
        Evidence("L3/LLC miss ratio", _LLC_MISS, LLC_MISS_RATIO, "ratio"),
        Evidence("DRAM bandwidth", Sum(Selector("fleetscope_memory_bandwidth_bytes_per_second"),
                                       by=NODE), 0, "bytes/s"),
        Evidence("instructions per cycle", Max(Selector("fleetscope_instructions_per_cycle"),
                                               by=NODE), 1.0, "ipc", pick="min"),
    ),
    confidence=0.75,
    views=(
        Panel("DRAM bandwidth over the platform peak", _BANDWIDTH, "ratio", BANDWIDTH_RATIO),
        Panel("DRAM bandwidth by direction",
              Sum(Selector("fleetscope_memory_bandwidth_bytes_per_second"),
                  by=(*NODE, "direction")), "bytes/s"),
        Panel("L3 miss ratio per socket",
              Max(Selector("fleetscope_llc_miss_ratio"), by=(*NODE, "socket")), "ratio",
              LLC_MISS_RATIO),
        Panel("Instructions per cycle per socket",
              Max(Selector("fleetscope_instructions_per_cycle"), by=(*NODE, "socket")), "ipc",
              1.0, pick="min"),
    ),
    fleet=FleetFault(("batch", "codegen"), 20, 60, effects=(
        Set("membw_ratio", Noisy(0.86, 0.06, stream=18)),
        Set("llc_miss_ratio", Noisy(0.3, 0.05, stream=20)),
        Set("ipc", Noisy(0.5, 0.1, stream=22)),
        Add("cpu_stages_stretch", 0.7),
    )),
    proof=Proof(scenario, summary=r"memory bandwidth at 9\d% of the platform peak"),
)
