"""module-bound-cpu-idle: the CPUs wait for the inference modules.

Condition: the busiest inference module saturated over the window (mean utilisation above
90 %) while the median core is mostly idle (under 30 % busy over the window) and requests
wait on the module side all window long (agent_module_queue_depth's least value above 4):
the module is the bottleneck, and more CPU workers would only queue more requests on it.
Its mirror is cpu-bound-module-idle; a node without module data is not evaluated.
"""

from __future__ import annotations

from ..fleet import FleetFault, Noisy, Set
from ..model import EXPLAINS_NODE, NODE, Evidence, Panel, Proof, Rule
from ..promql import Max
from ..signals import (
    DEVICE,
    MODULE_BUSY,
    MODULE_QUEUE,
    MODULE_QUEUE_HELD,
    accelerator,
    busy_ratio_over_window,
)

RANK = 7.2
MODULE_SATURATED = 0.9  # the busiest module's mean utilisation over the window
CPU_IDLE = 0.3  # the median core's mean busy share below this: the CPUs wait
MODULE_QUEUE_DEPTH = 4.0  # requests waiting on the module side at every sample of the window

_CPU = busy_ratio_over_window("p50")


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "module-bound-cpu-idle", "agent-x86-25",
        "a launch doubled the chat traffic of a node with eight A100s behind dcgm-exporter: "
        "the GPUs run flat out and requests wait in the serving engine's queue, while the "
        "agent workers' CPUs mostly wait for replies",
        "DCGM_FI_DEV_GPU_UTIL 96-99 % on every GPU, agent_module_queue_depth 18-31 and never "
        "empty, the median core ~12 % busy, inference stage ~3x its usual time",
        uptime_days=8.8, procs=k.daemons(k.X86) + k.workers(
            k.X86, k.ONLINE_X86, 0.35, lead_run=0.05, vcs=120.0, state="S"),
        background=k.background(k.X86, 0.3, 0.02),
        psi={"cpu": 0.6, "memory": 0.02, "io": 0.2},
        accelerators=k.AcceleratorPlan(util=[97, 98, 97, 99, 98, 97, 98, 99]),
        agent=k.AgentPlan(sessions=12.0, inference_median=0.45,
                          module_queue=[18, 22, 25, 24, 27, 29, 28, 31]))


RULE = Rule(
    id="module-bound-cpu-idle",
    severity="warning",
    explains=EXPLAINS_NODE,  # the node's CPUs and modules
    symptom="requests wait on the inference module while the node's CPUs are mostly idle; "
            "adding CPU workers does not help",
    cause="the inference module is the bottleneck: it runs saturated and requests queue on "
          "its side, while the CPU side waits for its replies",
    action="add module capacity (another module or node, a smaller or quantised model), "
           "rate-limit at the gateway, tune the engine's batching (max_num_seqs, chunked "
           "prefill); do not add CPU workers, which only queue more on the module",
    summary="the inference module is the bottleneck: the busiest module {value:.0%} busy with "
            "requests waiting on it while the CPUs idle",
    condition=((MODULE_BUSY > MODULE_SATURATED).and_on(_CPU < CPU_IDLE, NODE)
               .and_on(MODULE_QUEUE_HELD > MODULE_QUEUE_DEPTH, NODE)),
    evidence=(
        Evidence("busiest module's mean utilisation", MODULE_BUSY, MODULE_SATURATED, "ratio"),
        Evidence("median core busy over the window", _CPU, CPU_IDLE, "ratio", pick="min"),
        Evidence("requests waiting on the module side, least over the window",
                 MODULE_QUEUE_HELD, MODULE_QUEUE_DEPTH, "requests"),
    ),
    confidence=0.8,
    views=(
        Panel("Module utilisation per device", Max(accelerator("utilization_ratio"),
                                                   by=DEVICE), "ratio", MODULE_SATURATED),
        Panel("Median core busy", _CPU, "ratio", CPU_IDLE, pick="min"),
        Panel("Requests waiting on the module side",
              MODULE_QUEUE, "requests", MODULE_QUEUE_DEPTH, narrow=False),
    ),
    fleet=FleetFault(("batch",), 6, 40, effects=(
        # the modules flat out, requests waiting on them, the CPUs waiting for replies
        Set("accel_util", Noisy(0.95, 0.04, stream=106)),
        Set("accel_util_swing", 0.02),
        Set("module_queue_depth", Noisy(15, 10, stream=107)),
        Set("cpu_load", Noisy(0.12, 0.08, stream=108)),
    )),
    proof=Proof(scenario, summary=r"the inference module is the bottleneck: the busiest module "
                                  r"9\d% busy with requests waiting on it while the CPUs idle"),
)
