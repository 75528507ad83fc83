"""Per-rule evidence views: which series prove each rule, drawn with their thresholds.

    VIEWS["offline-preemption"]  -> the victim (online pools' run-queue delay per process),
                                    the antagonist (offline pools' CPU use), steal, pressure
    views_for("cpu-saturation")  -> a rule without a declaration: one panel per `evidence`
                                    expression of the catalog entry, so a new rule still draws

Each panel is a rules.promql expression evaluated over the finding's node history at every
sample (the same expressions the engine and the exported alerts use), with the threshold the
rule fires on. No streamlit or pandas here: data.py evaluates, charts.py draws.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetscope.rules import catalog
from fleetscope.rules.catalog import CATALOG, NODE
from fleetscope.rules.promql import Expr, Max, Rate, Selector, Sum

WINDOW = catalog.WINDOW


@dataclass(frozen=True)
class Panel:
    title: str  # words, no unit (the chart adds it)
    expr: Expr
    unit: str
    threshold: float | None = None
    pick: str = "max"  # "min": the rule fires below the threshold
    narrow: bool = True  # keep only the finding's own pool / binary / device ...
    role: str = ""  # victim | antagonist | ... : said in the title


def _t(name: str, default: float) -> float:
    """A catalog threshold by name (the catalog is tuned in one place)."""
    return float(getattr(catalog, name, default))


def _sel(metric: str, matchers: dict | None = None) -> Selector:
    return Selector(metric, matchers)


def _rate(metric: str, matchers: dict | None = None, window: int = WINDOW) -> Rate:
    return Rate(_sel(metric, matchers), window)


_POOL = (*NODE, "pool")
_RDMA_EVENTS = {"counter": "~np_ecn_marked_roce_packets|np_cnp_sent|rp_cnp_handled|"
                           "out_of_sequence|packet_seq_err"}

VIEWS: dict[str, tuple[Panel, ...]] = {
    "offline-preemption": (
        Panel("Online pool run-queue delay per process",
              Sum(_rate("fleetscope_pool_run_delay_seconds_total", {"class": "online"}),
                  by=_POOL)
              / Sum(_sel("fleetscope_pool_processes", {"class": "online"}), by=_POOL),
              "s/s", _t("ONLINE_RUN_DELAY", 0.05), role="victim"),
        Panel("Offline pools' CPU use",
              Sum(_rate("fleetscope_pool_cpu_seconds_total", {"class": "offline"}), by=_POOL),
              "CPUs", _t("OFFLINE_CPU", 0.5), narrow=False, role="antagonist"),
        Panel("Steal on the p90 core (a noisy VM neighbour)",
              Max(_sel("fleetscope_cpu_core_steal_ratio", {"stat": "p90"}), by=NODE),
              "ratio", _t("STEAL_P90", 0.1), role="antagonist"),
        Panel("Online pool cgroup CPU pressure (some)",
              Sum(_rate("fleetscope_pool_cgroup_cpu_pressure_stall_seconds_total",
                        {"class": "online", "stall": "some"}), by=_POOL),
              "s/s", 0.1, role="victim"),
    ),
    "isa-mismatch": (
        Panel("SIGILL crashes in the kernel log so far, per binary",
              Max(_sel("fleetscope_sigill_crashes_total"), by=(*NODE, "binary")),
              "crashes", narrow=False),
        Panel("New SIGILL crashes per minute, per binary",
              Max(Rate(_sel("fleetscope_sigill_crashes_total"), 60, increase=True),
                  by=(*NODE, "binary")), "crashes", 0.0, narrow=False),
    ),
    "roce-congestion": (
        Panel("PFC pause frames per interface",
              Sum(_rate("fleetscope_nic_pfc_pause_frames_total"), by=(*NODE, "interface")),
              "frames/s", _t("PFC_PAUSES", 100.0), narrow=False),
        Panel("ECN marks, CNPs and sequence errors per RDMA device",
              Sum(_rate("fleetscope_rdma_hw_stats_total", _RDMA_EVENTS), by=(*NODE, "device")),
              "1/s", _t("ROCE_EVENTS", 100.0), narrow=False),
        Panel("Each RDMA congestion counter",
              Sum(_rate("fleetscope_rdma_hw_stats_total", _RDMA_EVENTS),
                  by=(*NODE, "device", "counter")), "1/s", narrow=False),
    ),
    "numa-remote-access": (
        Panel("Share of each pool's memory on remote NUMA nodes",
              Max(_sel("fleetscope_pool_numa_remote_memory_ratio"), by=_POOL), "ratio",
              _t("NUMA_REMOTE_RATIO", 0.3), narrow=False),
        Panel("Pages allocated off-node per NUMA node (numastat other_node)",
              Sum(_rate("fleetscope_numastat_pages_total", {"field": "other_node"}),
                  by=(*NODE, "numa_node")), "pages/s", narrow=False),
    ),
    "memory-bandwidth-saturation": (
        Panel("DRAM bandwidth over the platform peak",
              Max(_sel("fleetscope_memory_bandwidth_utilization_ratio"), by=NODE), "ratio",
              _t("BANDWIDTH_RATIO", 0.8)),
        Panel("DRAM bandwidth by direction",
              Sum(_sel("fleetscope_memory_bandwidth_bytes_per_second"),
                  by=(*NODE, "direction")), "bytes/s"),
        Panel("L3 miss ratio per socket",
              Max(_sel("fleetscope_llc_miss_ratio"), by=(*NODE, "socket")), "ratio",
              _t("LLC_MISS_RATIO", 0.2)),
        Panel("Instructions per cycle per socket",
              Max(_sel("fleetscope_instructions_per_cycle"), by=(*NODE, "socket")), "ipc",
              1.0, pick="min"),
    ),
    "fd-exhaustion": (
        Panel("Open files over RLIMIT_NOFILE (worst process per pool)",
              Max(_sel("fleetscope_pool_fd_usage_ratio"), by=_POOL), "ratio",
              _t("FD_RATIO", 0.9)),
        Panel("Open files of that process",
              Max(_sel("fleetscope_pool_fd_usage_open_fds"), by=_POOL), "fds"),
    ),
    "queue-backlog": (
        Panel("Tasks waiting per queue", Max(_sel("agent_queue_depth"),
                                             by=(*NODE, "pool", "queue")),
              "tasks", _t("QUEUE_DEPTH", 50.0)),
        Panel("Busiest core", Max(_sel("fleetscope_cpu_core_busy_ratio", {"stat": "max"}),
                                  by=NODE), "ratio", 0.9),
    ),
    "worker-blocked-external-call": (
        Panel("Oldest in-flight task's heartbeat age per pool",
              Max(_sel("agent_task_heartbeat_age_seconds"), by=_POOL), "s",
              _t("HEARTBEAT_AGE", 120.0)),
        Panel("Tool calls timing out per pool",
              Sum(_rate("agent_tool_calls_total", {"outcome": "timeout"}), by=_POOL), "1/s"),
    ),
    "thread-oversubscription": (
        Panel("Threads per physical core per pool",
              Max(_sel("fleetscope_pool_threads_per_core"), by=_POOL), "threads",
              _t("THREADS_PER_CORE", 2.0)),
        Panel("Nonvoluntary context switches per pool (main threads)",
              Sum(_rate("fleetscope_pool_context_switches_total", {"kind": "nonvoluntary"}),
                  by=_POOL), "1/s", _t("NONVOLUNTARY_SWITCHES", 50.0)),
    ),
    "irq-core-overlap": (
        Panel("Device interrupts on the online pool's CPUs",
              Sum(_rate("fleetscope_irq_online_pool_device_interrupts_total"), by=_POOL),
              "1/s", _t("IRQ_RATE_ON_ONLINE_CPUS", 500.0)),
        Panel("Online pool CPUs in device IRQ affinity masks",
              Max(_sel("fleetscope_irq_online_pool_overlap_cpus"), by=_POOL), "cpus"),
    ),
    "session-affinity-loss": (
        Panel("Session migrations per pool",
              Sum(_rate("agent_session_migrations_total"), by=_POOL), "1/s",
              _t("MIGRATIONS", 0.05)),
    ),
    "quantization-tool-errors": (
        Panel("Tool calls with malformed arguments, per model",
              Sum(_rate("agent_tool_calls_total", {"outcome": "bad_arguments"}),
                  by=(*NODE, "pool", "model"))
              / Sum(_rate("agent_tool_calls_total"), by=(*NODE, "pool", "model")),
              "ratio", _t("BAD_ARGUMENTS_RATIO", 0.05), narrow=False),
    ),
    "cold-start": (
        Panel("Average model-load stage per pool (5 min)",
              Sum(Rate(_sel("agent_stage_duration_seconds_sum", {"stage": "model_load"}), 300,
                       increase=True), by=_POOL)
              / Sum(Rate(_sel("agent_stage_duration_seconds_count", {"stage": "model_load"}),
                         300, increase=True), by=_POOL),
              "s", _t("MODEL_LOAD_SECONDS", 5.0)),
    ),
    "core-imbalance": (
        Panel("Core busy: busiest, p90, median, least busy",
              Max(_sel("fleetscope_cpu_core_busy_ratio"), by=(*NODE, "stat")), "ratio", 0.9),
        Panel("Cores over 90 % busy", Max(_sel("fleetscope_cpu_saturated_cores"), by=NODE),
              "cores", 1.0),
    ),
    "cpu-saturation": (
        Panel("Time tasks waited for a CPU (PSI cpu some)",
              Sum(Rate(_sel("fleetscope_pressure_stall_seconds_total",
                            {"resource": "cpu", "stall": "some"}), WINDOW), by=NODE),
              "ratio", catalog.PSI_CPU_SOME),
        Panel("Median core busy", Max(_sel("fleetscope_cpu_core_busy_ratio", {"stat": "p50"}),
                                      by=NODE), "ratio", catalog.SATURATED_MEDIAN_CORE),
        Panel("Runnable tasks", Max(_sel("fleetscope_procs_running"), by=NODE), "tasks", None),
    ),
}


def generic_views(rule_id: str) -> tuple[Panel, ...]:
    """A rule with no declaration: its catalog `evidence` expressions, one panel each."""
    try:
        rule = catalog.by_id(rule_id)
    except KeyError:
        return ()
    return tuple(Panel(e.signal[:1].upper() + e.signal[1:], e.expr, e.unit,
                       e.threshold if e.threshold else None, e.pick) for e in rule.evidence)


def views_for(rule_id: str) -> tuple[Panel, ...]:
    return VIEWS.get(rule_id) or generic_views(rule_id)


def declared() -> set[str]:
    return set(VIEWS)


def undeclared() -> list[str]:
    """Catalog rules drawn by the generic view (a declaration would draw them better)."""
    return [rule.id for rule in CATALOG if rule.id not in VIEWS]
