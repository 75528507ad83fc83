"""accelerator-errors: an inference module reports hardware or driver errors.

Condition, per device: NVIDIA's last XID error is set (DCGM_FI_DEV_XID_ERRORS, e.g. 48 a
double-bit ECC error, 79 the GPU fell off the bus, 94/95 contained/uncontained ECC errors),
the volatile uncorrected ECC count grew inside the window, Ascend raises error codes
(npu-exporter npu_chip_info_error_code), or the vendor's own health verdict is not OK
(npu-smi Health, npu-exporter health_status). Each is judged on whatever the node's source
reports: a dcgm-exporter node has no health verdict, an npu-smi node no XID.

A node whose GPUs no dcgm-exporter watches still has the driver's own word: its
`NVRM: Xid (PCI:<bus id>): <code>, ...` kernel-log lines (collectors/xid.py). An Xid logged in
the last 15 minutes (the event look-back) is the finding, per GPU (its PCI bus id); older ones
are an `info` tier, as crash-loop reads its crashes: a GPU that once logged an Xid is not
failing now. Enrichment names each GPU's codes, what they mean, how many lines and when.
"""

from __future__ import annotations

import time

from fleetscope.collectors.shared import PROC_STAT

from ..fleet import FleetFault, Set
from ..model import ENDED, EXPLAINS_NODE, WINDOW, Evidence, Panel, Proof, Rule, Tier
from ..promql import EVENT_LOOKBACK_SECONDS, Delta, Max, Min, Recent, Sum, Time
from ..signals import DEVICE, accelerator

RANK = 0.6  # a cause: a failing device explains the crashes and errors around it

_XID = Max(accelerator("last_xid"), by=DEVICE)
_ECC_GROWTH = Max(Delta(accelerator("ecc_uncorrected_errors"), WINDOW), by=DEVICE)
_CODES = Max(accelerator("error_codes"), by=DEVICE)
_HEALTH = Min(accelerator("healthy"), by=DEVICE)
# The kernel log's Xid lines (collectors/xid.py), per GPU (PCI bus id) and code
_KERNEL_XIDS = Sum(Max(accelerator("xid_errors_total"), by=(*DEVICE, "xid")), by=DEVICE)
_KERNEL_XID_AGE = Time() - Max(accelerator("xid_last_timestamp_seconds"), by=DEVICE)
MAX_SHOWN = 8  # (GPU, code) pairs an enriched finding lists


def enrich(ctx, finding) -> None:
    """The Xid lines of the finding's GPU in the kernel log: per code, what it means, how
    many lines, the last one's time and the process the driver named."""
    from fleetscope.collectors.parsers.kmsg import boot_time, log_clock
    from fleetscope.collectors.parsers.xid import xid_errors

    device = finding.labels.get("device")
    text = ctx.kernel_log()
    if not device or text is None or "NVRM: Xid" not in text:
        return
    boot = ctx.read(ctx.last, PROC_STAT, boot_time)
    errors = [e for e in xid_errors(text, log_clock(boot, ctx.last.time)) if e.device == device]
    by_code: dict[int, list] = {}
    for error in errors:
        by_code.setdefault(error.code, []).append(error)
    # latest first
    ordered = sorted(by_code.items(), key=lambda item: -(_when(item[1][-1], boot) or 0.0))
    parts = []
    for code, lines in ordered[:MAX_SHOWN]:
        last = lines[-1]
        when = _when(last, boot)
        named = f" (pid {last.pid} {last.name})".rstrip() if last.pid else ""
        meaning = f" ({last.meaning})" if last.meaning else ""
        at = f", the last at {_utc(when)}" if when is not None else ""
        finding.evidence.append({
            "signal": f"NVRM Xid {code}{meaning} of GPU {device} in the kernel log{at}{named}: "
                      f"{last.text}"[:400],
            "value": len(lines), "threshold": 0, "unit": "lines"})
        parts.append(f"Xid {code}{meaning} x{len(lines)}")
    if parts:
        finding.extra_summary = "kernel log: " + ", ".join(parts)


def _when(error, boot: float | None) -> float | None:
    return None if boot is None or error.seconds is None else boot + error.seconds


def _utc(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


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
    condition=((_XID > 0) | (_ECC_GROWTH > 0) | (_CODES > 0) | (_HEALTH < 1)
               | Recent(_KERNEL_XID_AGE, EVENT_LOOKBACK_SECONDS)),
    tiers=(Tier("info", _KERNEL_XID_AGE >= 0,
                "module {device} ({vendor}): Xid errors in the kernel log, the last "
                "{value:duration} before the window's end", ENDED),),
    evidence=(
        Evidence("last XID error (DCGM)", _XID, 0, "xid"),
        Evidence("uncorrected ECC errors in the window", _ECC_GROWTH, 0, "errors"),
        Evidence("Ascend error codes raised", _CODES, 0, "codes"),
        Evidence("vendor health check", _HEALTH, 1, "check", pick="min"),
        Evidence("NVRM Xid lines in the kernel log", _KERNEL_XIDS, 0, "lines"),
        Evidence("seconds since the last NVRM Xid line", _KERNEL_XID_AGE,
                 EVENT_LOOKBACK_SECONDS, "s", pick="min"),
    ),
    enrich=enrich,
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
