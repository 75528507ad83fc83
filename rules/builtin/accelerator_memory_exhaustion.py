"""accelerator-memory-exhaustion: an inference module's device memory is full and inference
fails for it.

Condition: a module's device memory above 95 % used (fleetscope_accelerator_memory_used_bytes
over _total_bytes) and, on the same node, inference calls failing (the agent runtime's
gen_ai_client_operation_duration_seconds with an error_type) or the online pool's processes
restarting. Memory alone says nothing: serving engines reserve most of the device up front
(vLLM's gpu_memory_utilization 0.9), so a full device with no failures is the normal state;
the KV cache that grows with context length until the engine fails an allocation is the fault.
"""

from __future__ import annotations

from ..fleet import Add, FleetFault, Noisy, Set
from ..model import EXPLAINS_NODE, NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Max, Rate, Selector, Sum
from ..signals import DEVICE, accelerator

RANK = 0.8  # a cause, after the kernel's own kills and crashes
MEMORY_FULL = 0.95  # device memory used over total
ERROR_RATIO = 0.02  # share of inference calls that failed
RESTARTS_PER_MINUTE = 0.5  # online pool processes started a minute (a crashed engine restarted)

_MEMORY = Max(accelerator("memory_used_bytes") / accelerator("memory_total_bytes"), by=DEVICE)
_CALLS = "gen_ai_client_operation_duration_seconds_count"
_ERRORS = (Sum(Rate(Selector(_CALLS, {"error_type": "~.+"}), WINDOW), by=NODE)
           / Sum(Rate(Selector(_CALLS), WINDOW), by=NODE))
_RESTARTS = Sum(Rate(Selector("fleetscope_pool_process_starts_total", {"class": "online"}),
                     WINDOW), by=NODE) * 60


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "accelerator-memory-exhaustion", "agent-x86-22",
        "long-context sessions on eight A100 80GB behind dcgm-exporter: the KV cache of "
        "GPU 2's engine grows with the contexts until allocations fail, and the engine "
        "answers a share of inference calls with errors",
        "DCGM_FI_DEV_FB_USED of GPU 2 climbing to 81 190 of 81 228 MiB (the others steady at "
        "92 %), ~8 % of gen_ai_client_operation_duration_seconds with error_type "
        "InternalServerError",
        uptime_days=6.1, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 1.3),
        background=k.background(k.X86, 0.4, 0.02),
        accelerators=k.AcceleratorPlan(
            util=[72, 78, 75, 80, 77, 74, 79, 76],
            memory={2: [0.955, 0.975, 0.988, 0.993, 0.996, 0.998, 0.999, 0.9995]}),
        agent=k.AgentPlan(sessions=20.0, inference_errors=[0.0, 0.05, 0.07, 0.08, 0.09, 0.08,
                                                           0.09, 0.1]))


def full_but_stable(k):
    """Look-alike: device memory high but stable (the engine's reservation) with no failing
    call and no restart, on a listed driver/firmware pair with the driver of the
    accelerator-driver-mismatch scenario (its firmware the listed one)."""
    return k.x86_scenario(
        "healthy-module-memory-full", "agent-x86-27",
        "nothing: eight A100s (dcgm-exporter) whose engines reserved 97 % of the framebuffer "
        "at start; driver 525.105.03 with VBIOS 92.00.45.00.05, a pair the matrix lists",
        "DCGM_FI_DEV_FB_USED 97 % of the framebuffer and flat on every GPU, no inference "
        "errors, no restarts, utilisation ~60 % and steady",
        uptime_days=5.5, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 1.0),
        background=k.background(k.X86, 0.4, 0.02),
        accelerators=k.AcceleratorPlan(util=[58, 61, 60, 62, 59, 60, 61, 60],
                                       memory_share=0.968, driver="525.105.03",
                                       firmware="92.00.45.00.05"),
        agent=k.AgentPlan(sessions=16.0, module_queue=[1, 0, 2, 1, 0, 1, 2, 0]))


RULE = Rule(
    id="accelerator-memory-exhaustion",
    severity="critical",
    explains=EXPLAINS_NODE,  # the inference modules every pool of the node sends work to
    symptom="inference calls fail (CUDA / NPU out of memory, HTTP 500 from the serving "
            "engine) or the inference process restarts; long conversations fail first",
    cause="the module's device memory is exhausted: the KV cache grows with context length "
          "and concurrency until the engine cannot allocate",
    action="cap context length and concurrent sequences (max_model_len, max_num_seqs), lower "
           "the engine's memory share or KV cache size, quantise the KV cache, or move long "
           "contexts to a module with more memory",
    summary="module {device} ({vendor}): device memory {value:.1%} used while inference "
            "fails",
    # Either harm, each side on its own: a node whose runtime reports no GenAI calls is
    # judged on its restarts (Rule.alternatives).
    condition=((_MEMORY > MEMORY_FULL).and_on(_ERRORS > ERROR_RATIO, NODE)
               | (_MEMORY > MEMORY_FULL).and_on(_RESTARTS > RESTARTS_PER_MINUTE, NODE)),
    evidence=(
        Evidence("device memory used", _MEMORY, MEMORY_FULL, "ratio"),
        Evidence("inference calls failing", _ERRORS, ERROR_RATIO, "ratio"),
        Evidence("online processes restarted a minute", _RESTARTS, RESTARTS_PER_MINUTE,
                 "1/min"),
    ),
    confidence=0.85,
    subject_labels={"devices": "device"},
    views=(
        Panel("Device memory used per module", _MEMORY, "ratio", MEMORY_FULL),
        Panel("Inference calls failing", _ERRORS, "ratio", ERROR_RATIO),
        Panel("Online processes restarted a minute", _RESTARTS, "1/min", RESTARTS_PER_MINUTE),
    ),
    fleet=FleetFault(("codegen",), 5, 25, effects=(
        # long code contexts fill the KV cache; the engine fails allocations and restarts
        Set("accel_memory_ratio", Noisy(0.985, 0.014, stream=103)),
        Add("process_start_rate", 1 / 60),
    )),
    proof=Proof(scenario, summary=r"module 2 \(nvidia\): device memory 99\.\d% used while "
                                  r"inference fails",
                subjects=("devices", ["2"]), lookalikes=(full_but_stable,)),
)
