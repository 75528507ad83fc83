"""accelerator-errors: an inference module reports hardware or driver errors.

Condition, per device: NVIDIA's last XID error is set (DCGM_FI_DEV_XID_ERRORS, e.g. 48 a
double-bit ECC error, 79 the GPU fell off the bus, 94/95 contained/uncontained ECC errors),
the volatile uncorrected ECC count grew inside the window, Ascend raises error codes
(npu-exporter npu_chip_info_error_code), or the vendor's own health verdict is not OK
(npu-smi Health, npu-exporter health_status). Each is judged on whatever the node's source
reports: a dcgm-exporter node has no health verdict, an npu-smi node no XID.
"""

from __future__ import annotations

from ..fleet import FleetFault, Set
from ..model import EXPLAINS_NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Delta, Max, Min
from ..signals import DEVICE, accelerator

RANK = 0.6  # a cause: a failing device explains the crashes and errors around it

_XID = Max(accelerator("last_xid"), by=DEVICE)
_ECC_GROWTH = Max(Delta(accelerator("ecc_uncorrected_errors"), WINDOW), by=DEVICE)
_CODES = Max(accelerator("error_codes"), by=DEVICE)
_HEALTH = Min(accelerator("healthy"), by=DEVICE)


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "accelerator-errors", "agent-x86-23",
        "GPU 5 of eight A100s behind dcgm-exporter falls off the bus (XID 79) in the middle "
        "of the window; the engine sharded over it stops answering",
        "DCGM_FI_DEV_XID_ERRORS of GPU 5 going 0 -> 79 at the third sample and staying, its "
        "utilisation dropping to 0, the other GPUs steady",
        uptime_days=21.4, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 0.9),
        background=k.background(k.X86, 0.4, 0.02),
        accelerators=k.AcceleratorPlan(util=[70, 72, 71, 69, 73, 70, 72, 71],
                                       xid={5: [0, 0, 79, 79, 79, 79, 79, 79]}))


RULE = Rule(
    id="accelerator-errors",
    severity="critical",
    explains=EXPLAINS_NODE,  # the inference modules every pool of the node sends work to
    symptom="inference on one module fails or hangs; the engine sharded over it stalls; "
            "the node's kernel log shows NVRM Xid or Ascend device errors",
    cause="the module reports hardware or driver errors: an XID, uncorrected ECC errors, "
          "raised Ascend error codes, or the vendor's health check failing",
    action="drain the module's work to other modules or nodes, read the XID / error code in "
           "the vendor's table (reset, reseat, replace), and file the module for RMA when "
           "uncorrected ECC or bus errors repeat",
    summary="module {device} ({vendor}) reports device errors",
    condition=((_XID > 0) | (_ECC_GROWTH > 0) | (_CODES > 0) | (_HEALTH < 1)),
    evidence=(
        Evidence("last XID error (DCGM)", _XID, 0, "xid"),
        Evidence("uncorrected ECC errors in the window", _ECC_GROWTH, 0, "errors"),
        Evidence("Ascend error codes raised", _CODES, 0, "codes"),
        Evidence("vendor health check", _HEALTH, 1, "check", pick="min"),
    ),
    confidence=0.9,
    for_seconds=0,  # an error is the finding
    subject_labels={"devices": "device"},
    views=(
        Panel("Last XID error per module", _XID, "xid", 0.0),
        Panel("Uncorrected ECC errors in the window", _ECC_GROWTH, "errors", 0.0),
        Panel("Module utilisation per device", Max(accelerator("utilization_ratio"), by=DEVICE),
              "ratio", None),
    ),
    fleet=FleetFault(("batch",), 4, 20, effects=(
        # one GPU fell off the bus: XID 79 on the node's first module, its work stopped
        Set("accel_last_xid", 79),
        Set("accel_ecc_uncorrected", 2),
    )),
    proof=Proof(scenario, summary=r"module 5 \(nvidia\) reports device errors",
                subjects=("devices", ["5"])),
)
