"""cpu-bound-module-idle: the inference modules wait for the CPUs.

Condition: every inference module of the node mostly idle over the window (the busiest one's
mean utilisation under 30 %) while the median core is saturated (above 90 % over the window)
and an agent queue grows: work is waiting, the modules could take it, and what holds it is
the CPU side (pre- and post-processing, tokenisation, tool calls, scheduling on saturated
cores). Its mirror is module-bound-cpu-idle; a node without module data is not evaluated.
"""

from __future__ import annotations

from ..fleet import FleetFault, Noisy, Set
from ..model import EXPLAINS_NODE, NODE, Evidence, Panel, Proof, Rule
from ..promql import Max, Selector
from ..signals import (
    AGENT_QUEUE_GROWTH,
    MODULE_BUSY,
    SATURATED_CORE,
    accelerator,
    busy_ratio_over_window,
)

RANK = 7.1  # before queue-backlog: it says why the queue grows
MODULE_IDLE = 0.3  # the busiest module's mean utilisation below this: the modules wait

_CPU = busy_ratio_over_window("p50")


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.kp_scenario(
        "cpu-bound-module-idle", "agent-kp-21",
        "a Kunpeng node with eight Ascend 910B (npu-smi): a new retrieval step tokenises and "
        "re-ranks every document on the CPU before inference, so the 16 cores are saturated "
        "while the NPUs wait for batches and the task queue grows",
        "npu-smi AICore 4-11 % on every NPU, every core ~97 % busy, PSI cpu some ~40 %, "
        "agent_queue_depth 12 -> 41",
        uptime_days=4.8, procs=k.daemons(k.KUNPENG) + k.workers(
            k.KUNPENG, k.ONLINE_KP, 3.0, threads=(6, 6, 6, 6), lead_wait=0.05, ivcs=12.0),
        background=k.background(k.KUNPENG, 0.9, 0.03), wait_ratio=0.25, extra_runnable=4.0,
        psi={"cpu": [2.0, 38.0, 41.0, 40.0, 39.0, 42.0, 40.0, 41.0], "memory": 0.05,
             "io": 0.3},
        accelerators=k.AcceleratorPlan(source="npu-smi", util=[6, 9, 4, 11, 7, 5, 10, 8]),
        agent=k.AgentPlan(sessions=9.0, session_median=0.9, queue=[12, 16, 20, 24, 29, 33,
                                                                    37, 41],
                          module_queue=0.0, heartbeat=[0.9, 1.3, 1.1, 1.6, 1.2, 1.4, 1.8, 1.5]))


def idle_modules_cpus_keep_up(k):
    """Look-alike: the modules mostly idle and a queue that moves, on a Kunpeng node whose
    CPUs are busy but keep up (no core saturated): the modules' idleness without the CPU
    side holding them back."""
    return k.kp_scenario(
        "healthy-npu-idle", "agent-kp-22",
        "nothing: a Kunpeng node with eight Ascend 910B (npu-smi) between traffic peaks; an "
        "embedding job keeps the CPUs ~60 % busy, the NPUs have little to do",
        "npu-smi AICore 3-9 %, Health OK, every core 55-65 % busy, agent_queue_depth 2-4 "
        "and flat",
        uptime_days=7.7, procs=k.daemons(k.KUNPENG) + k.workers(
            k.KUNPENG, k.ONLINE_KP, 1.6, threads=(6, 6, 6, 6)),
        background=k.background(k.KUNPENG, 0.5, 0.03),
        accelerators=k.AcceleratorPlan(source="npu-smi", util=[5, 7, 4, 9, 6, 3, 8, 5]),
        agent=k.AgentPlan(sessions=10.0, queue=[3, 2, 4, 3, 2, 3, 4, 3], module_queue=0.0))


RULE = Rule(
    id="cpu-bound-module-idle",
    severity="warning",
    explains=EXPLAINS_NODE,  # the node's CPUs and modules
    symptom="requests queue and latency climbs while the inference modules sit mostly idle",
    cause="the CPU side is the bottleneck: pre/post-processing, tokenisation, tool calls or "
          "scheduling on saturated cores cannot feed the modules fast enough",
    action="find the CPU consumers (fleetscope diagnose, top -H, fleetscope stacks PID); move "
           "pre/post-processing off the serving path or onto more cores, batch tokenisation, "
           "scale out the CPU workers feeding each module; adding modules will not help",
    summary="the CPUs are the bottleneck: the median core {value:.0%} busy and an agent queue "
            "growing while the inference modules idle",
    condition=((_CPU > SATURATED_CORE).and_on(MODULE_BUSY < MODULE_IDLE, NODE)
               .and_on(AGENT_QUEUE_GROWTH > 0, NODE)),
    evidence=(
        Evidence("median core busy over the window", _CPU, SATURATED_CORE, "ratio"),
        Evidence("busiest module's mean utilisation", MODULE_BUSY, MODULE_IDLE, "ratio",
                 pick="min"),
        Evidence("agent queue growth over the window", AGENT_QUEUE_GROWTH, 0, "tasks"),
    ),
    confidence=0.8,
    views=(
        Panel("Median core busy", _CPU, "ratio", SATURATED_CORE),
        Panel("Busiest module's utilisation", Max(accelerator("utilization_ratio"), by=NODE),
              "ratio", MODULE_IDLE, pick="min"),
        Panel("Tasks waiting per queue", Max(Selector("agent_queue_depth"),
                                             by=(*NODE, "pool", "queue")), "tasks", None),
    ),
    fleet=FleetFault(("batch",), 5, 30, effects=(
        # the CPU side saturated, the modules starved, the queue growing a task a minute
        # (under queue-backlog's 50: the CPU side, not the dispatcher, is the finding)
        Set("busy_p50", Noisy(0.95, 0.03, stream=104)),
        Set("busy_p90", 0.99),
        Set("busy_max", 1.0),
        Set("accel_util", Noisy(0.05, 0.1, stream=105)),
        Set("accel_util_swing", 0.02),
        Set("queue_depth", lambda site: 8 + site.since / 60),
    )),
    proof=Proof(scenario,
                summary=r"the CPUs are the bottleneck: the median core (9\d|100)% busy and an "
                        r"agent queue growing while the inference modules idle",
                lookalikes=(idle_modules_cpus_keep_up,)),
)
