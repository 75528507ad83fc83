"""Recording rules: the per-node aggregates the console draws, computed where the data is.

    instance:fleetscope_cpu_core_busy_ratio_p50:max
        = max by (instance) (fleetscope_cpu_core_busy_ratio{stat="p50"})

The console's Fleet page needs one number per node and signal (the heatmap) and its Latency
page the stage time per node and pool; on a Prometheus source it asks the engine for exactly
these (the recorded series when `rules export` was loaded, else the same expression as an
instant query), never every raw series of the fleet. On a demo or a bundle the console
evaluates the same expressions in-process, so a tile reads the same number either way.
Exported with the alerts by `fleetscope rules export` (group `fleetscope-recording`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .harm import SESSION_P99
from .model import NODE, WINDOW
from .promql import Arith, Avg, Expr, Max, Rate, Selector, Sum


@dataclass(frozen=True)
class Recording:
    record: str  # the recorded series' name (level:metric:operations)
    expr: Expr


def _max(metric: str, matchers: dict | None = None) -> Expr:
    return Max(Selector(metric, matchers), by=NODE)


# Heatmap signal (the console's name) -> its recording rule.
NODE_SIGNALS: dict[str, Recording] = {
    "busy (median core)": Recording(
        "instance:fleetscope_cpu_core_busy_ratio_p50:max",
        _max("fleetscope_cpu_core_busy_ratio", {"stat": "p50"})),
    "busiest core": Recording(
        "instance:fleetscope_cpu_core_busy_ratio_max:max",
        _max("fleetscope_cpu_core_busy_ratio", {"stat": "max"})),
    "steal (p90 core)": Recording(
        "instance:fleetscope_cpu_core_steal_ratio_p90:max",
        _max("fleetscope_cpu_core_steal_ratio", {"stat": "p90"})),
    "memory bandwidth % of peak": Recording(
        "instance:fleetscope_memory_bandwidth_utilization_ratio:max",
        _max("fleetscope_memory_bandwidth_utilization_ratio")),
    "L3 miss ratio": Recording("instance:fleetscope_llc_miss_ratio:max",
                               _max("fleetscope_llc_miss_ratio")),
    "PFC pauses /s": Recording(
        "instance:fleetscope_nic_pfc_pause_frames:rate1m",
        Sum(Rate(Selector("fleetscope_nic_pfc_pause_frames_total"), WINDOW), by=NODE)),
    "queue depth": Recording("instance:agent_queue_depth:max", _max("agent_queue_depth")),
    "P99 session latency (online)": Recording(
        "instance:agent_session_duration_seconds_online:p99",
        Max(SESSION_P99, by=NODE)),
    # A node's inference modules (docs/diagnosis-json.md names the series): how busy they
    # are on average, and the fullest one's device memory (one full card is the fault).
    "module utilisation": Recording(
        "instance:fleetscope_accelerator_utilization_ratio:avg",
        Avg(Selector("fleetscope_accelerator_utilization_ratio"), by=NODE)),
    "module memory (fullest)": Recording(
        "instance:fleetscope_accelerator_memory_used_ratio:max",
        Max(Arith("/", Selector("fleetscope_accelerator_memory_used_bytes"),
                  Selector("fleetscope_accelerator_memory_total_bytes")), by=NODE)),
}
# The Latency page: seconds per second each pool spends per stage, and its sessions (one
# inference stage a session).
STAGE_SECONDS = Recording(
    "instance_pool_stage:agent_stage_duration_seconds:rate1m",
    Sum(Rate(Selector("agent_stage_duration_seconds_sum"), WINDOW),
        by=(*NODE, "pool", "stage")))
SESSIONS = Recording(
    "instance_pool:agent_inference_stages:rate1m",
    Sum(Rate(Selector("agent_stage_duration_seconds_count", {"stage": "inference"}), WINDOW),
        by=(*NODE, "pool")))

RECORDINGS: tuple[Recording, ...] = (*NODE_SIGNALS.values(), STAGE_SECONDS, SESSIONS)


def recording_group() -> dict:
    """The Prometheus rule group of every recording rule."""
    return {"name": "fleetscope-recording",
            "rules": [{"record": r.record, "expr": r.expr.promql()} for r in RECORDINGS]}
