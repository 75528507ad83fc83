"""accelerator-utilization-swing: an inference module swings between busy and idle while
requests wait on its side.

Condition: a module's utilisation moved by more than half its range inside the window
(max_over_time - min_over_time of fleetscope_accelerator_utilization_ratio) while the
module-side queue (agent_module_queue_depth) never emptied: requests of uneven size (one long
prompt holds the batch, short ones wait behind it) keep the module alternately saturated and
starved. A busy module with steady utilisation, or a bursty one with nothing waiting, is fine.
"""

from __future__ import annotations

from ..fleet import FleetFault, Noisy, Set
from ..model import EXPLAINS_NODE, NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Max, MaxOverTime, MinOverTime
from ..signals import DEVICE, MODULE_QUEUE, MODULE_QUEUE_HELD, accelerator

RANK = 7.3
SWING = 0.5  # utilisation moved by more than half its range within the window
MODULE_QUEUE_DEPTH = 4.0  # requests waiting on the module side at every sample of the window

_UTIL = accelerator("utilization_ratio")
_SWING = Max(MaxOverTime(_UTIL, WINDOW) - MinOverTime(_UTIL, WINDOW), by=DEVICE)


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "accelerator-utilization-swing", "agent-x86-21",
        "uneven request sizes on a node serving a 7B model from eight A100s behind "
        "dcgm-exporter: a few 30k-token prompts hold each batch while short chat turns wait, "
        "so the GPUs alternate between saturated prefill and near-idle decode",
        "DCGM_FI_DEV_GPU_UTIL swinging 12-97 % from one scrape to the next on every GPU, "
        "agent_module_queue_depth 9-14 and never empty, CPUs ~45 % busy",
        uptime_days=11.2, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 1.1),
        background=k.background(k.X86, 0.4, 0.02),
        accelerators=k.AcceleratorPlan(util=[55, 97, 14, 95, 12, 96, 15, 97]),
        agent=k.AgentPlan(sessions=18.0, queue=[3, 4, 3, 5, 4, 3, 4, 3],
                          module_queue=[6, 11, 13, 9, 12, 14, 10, 12],
                          heartbeat=[0.6, 1.0, 0.8, 1.1, 0.7, 0.9, 1.2, 0.8]))


def steady_busy_module(k):
    """Look-alike: a busy module with steady utilisation and a few requests always waiting
    on it (the engine's batch kept full), on a node whose CPUs keep up: the harm's signal at
    a normal level without the swing."""
    return k.x86_scenario(
        "healthy-module-steady", "agent-x86-26",
        "nothing: eight A100s (dcgm-exporter, a listed driver/firmware pair) serving steady "
        "chat traffic; the engine keeps a few requests queued so every batch is full",
        "DCGM_FI_DEV_GPU_UTIL 78-84 % on every GPU with no swing, agent_module_queue_depth "
        "5-8 and never empty, memory 92 % reserved and flat, CPUs ~35 % busy",
        uptime_days=13.0, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 0.9),
        background=k.background(k.X86, 0.35, 0.02),
        accelerators=k.AcceleratorPlan(util=[80, 81, 79, 82, 80, 81, 80, 82]),
        agent=k.AgentPlan(sessions=18.0, module_queue=[6, 5, 7, 6, 8, 6, 5, 7]))


RULE = Rule(
    id="accelerator-utilization-swing",
    severity="warning",
    explains=EXPLAINS_NODE,  # the inference modules every pool of the node sends work to
    symptom="inference latency uneven; the module's utilisation graph saw-tooths between "
            "busy and idle while requests wait for it",
    cause="uneven request sizes: long prompts hold the module's batch while short requests "
          "queue behind them, so the module alternates between saturated and starved",
    action="split or cap long requests (chunked prefill, max prompt length per pool), "
           "rate-limit the heavy callers, or route long contexts to their own module",
    summary="module {device} ({vendor}): utilisation swings by {value:.0%} within the window "
            "while requests wait on the module side",
    condition=(_SWING > SWING).and_on(MODULE_QUEUE_HELD > MODULE_QUEUE_DEPTH, NODE),
    evidence=(
        Evidence("module utilisation swing (max - min over the window)", _SWING, SWING,
                 "ratio"),
        Evidence("requests waiting on the module side, least over the window",
                 MODULE_QUEUE_HELD, MODULE_QUEUE_DEPTH, "requests"),
    ),
    confidence=0.7,
    subject_labels={"devices": "device"},
    views=(
        Panel("Module utilisation per device", Max(_UTIL, by=DEVICE), "ratio", None),
        Panel("Module utilisation swing over the window", _SWING, "ratio", SWING),
        Panel("Requests waiting on the module side",
              MODULE_QUEUE, "requests", MODULE_QUEUE_DEPTH, narrow=False),
    ),
    fleet=FleetFault(("batch",), 6, 30, effects=(
        # uneven batch documents: the modules alternate between full and near idle each scrape
        Set("accel_util_swing", Noisy(0.8, 0.15, stream=101)),
        Set("accel_util", 0.55),
        Set("module_queue_depth", Noisy(9, 6, stream=102)),
    )),
    proof=Proof(scenario, summary=r"module \d \(nvidia\): utilisation swings by \d+% within "
                                  r"the window while requests wait on the module side",
                subjects=("devices", None), lookalikes=(steady_busy_module,)),
)
