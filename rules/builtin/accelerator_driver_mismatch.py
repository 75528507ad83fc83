"""accelerator-driver-mismatch: an inference module runs a driver and firmware pair that the
operator's compatibility matrix does not list.

Condition: fleetscope_accelerator_matrix_listed is 0 for a device (its vendor, model, driver
and firmware match no entry of the `accelerator_matrix` file, docs/accelerators.md) and the
node's workloads hurt (rules/harm.py: session latency, tool errors, run delay, ... over their
targets): a warning. Without harm the same pair is an `info` finding: worth fixing at the next
maintenance, not the cause of anything yet. "The vendor's official compatibility matrix
decides", not the newest driver: a pair outside it is how throughput ends at half the spec.
"""

from __future__ import annotations

from ..fleet import Add, FleetFault, Set
from ..harm import HARM, HARM_SIGNALS
from ..model import EXPLAINS_NODE, NODE, Evidence, Panel, Proof, Rule, Tier
from ..promql import Count, Min
from ..signals import accelerator

RANK = 7.6

_PAIR = (*NODE, "vendor", "model", "driver", "firmware")
_LISTED = accelerator("matrix_listed")
_UNLISTED = Min(_LISTED, by=_PAIR) < 1
_UNLISTED_MODULES = Count(_LISTED < 1, by=_PAIR)

_SUMMARY = ("{model} with driver {driver} and firmware {firmware} is not in the "
            "compatibility matrix")


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "accelerator-driver-mismatch", "agent-x86-24",
        "eight A100-SXM4-80GB re-flashed with VBIOS 92.00.36.00.02 while the node kept "
        "driver 525.105.03: a pair the operator's matrix (the vendors' published pairs, "
        "examples/accelerator-matrix.yaml) does not list; inference runs at half speed, so "
        "online sessions' P99 passes its target",
        "dcgm-exporter labels DCGM_FI_DRIVER_VERSION 525.105.03 and DCGM_FI_DEV_VBIOS_VERSION "
        "92.00.36.00.02 on every GPU, the matrix lists 92.00.45.00.05/.06 for that driver, "
        "inference stage ~2x its usual time, session P99 ~1.3 s over a 1 s target",
        uptime_days=2.3, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 1.2),
        background=k.background(k.X86, 0.4, 0.02),
        accelerators=k.AcceleratorPlan(util=[88, 90, 89, 91, 90, 88, 89, 90],
                                       driver="525.105.03", firmware="92.00.36.00.02"),
        agent=k.AgentPlan(sessions=16.0, session_median=0.62, inference_median=0.3))


RULE = Rule(
    id="accelerator-driver-mismatch",
    severity="warning",
    explains=EXPLAINS_NODE,  # the inference modules every pool of the node sends work to
    symptom="inference throughput well below the spec sheet (half, in the field) on some "
            "nodes, with no error anywhere; the slow nodes share a driver/firmware pair",
    cause="the module's driver and firmware pair is not one the vendor's compatibility "
          "matrix lists: an upgraded driver on old firmware, or the reverse",
    action="install the driver/firmware pair the operator's matrix (the vendor's published "
           "one) lists for this model and the CUDA/CANN release in use, not simply the newest "
           "driver; group the fleet by pair (`fleetscope diagnose --fleet`) to find the rest",
    summary=_SUMMARY + ", and the node's workloads miss their targets",
    condition=_UNLISTED.and_on(HARM, NODE),
    tiers=(Tier("info", _UNLISTED, _SUMMARY),),
    evidence=(
        Evidence("modules on a pair the matrix does not list", _UNLISTED_MODULES, 0,
                 "modules"),
        # the harm, each signal against its default target (the node's own is in its config)
        *(Evidence(signal.title, signal.value, signal.default, signal.unit)
          for signal in HARM_SIGNALS),
    ),
    confidence=0.75,
    views=(
        Panel("Modules on a pair the matrix does not list", _UNLISTED_MODULES, "modules", 0.0),
        Panel("Modules per driver/firmware pair", Count(_LISTED, by=_PAIR), "modules", None,
              narrow=False),
    ),
    fleet=FleetFault(("codegen",), 12, 60, staggered=False, effects=(
        # a batch of nodes upgraded to firmware their driver is not listed with: inference
        # at half speed, codegen sessions past their 8 s target
        Set("accel_matrix_listed", 0),
        Add("cpu_stages_stretch", 2.5),
        Add("session_tail", 0.5),
    )),
    proof=Proof(scenario, summary=r"NVIDIA A100-SXM4-80GB with driver 525\.105\.03 and "
                                  r"firmware 92\.00\.36\.00\.02 is not in the compatibility "
                                  r"matrix, and the node's workloads miss their targets"),
)
