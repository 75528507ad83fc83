"""Expressions more than one rule (or the console) reads, built once.

    busy_ratio("p50")              max by (instance) (fleetscope_cpu_core_busy_ratio{stat="p50"})
    PSI_CPU                        share of time some task waited for a CPU (PSI cpu some)
    ONLINE_DELAY                   online pools' run-queue delay per process, s/s
    accelerator("utilization_ratio")   an inference module's series (docs/accelerators.md)
    MODULE_BUSY                    the busiest module's mean utilisation over the window
    MODULE_QUEUE_HELD              requests that waited on the module side all window long
    AGENT_QUEUE_GROWTH             how much the node's fastest-growing agent queue grew
"""

from __future__ import annotations

from .model import NODE, WINDOW
from .promql import AvgOverTime, Delta, Expr, Max, MinOverTime, Rate, Selector, Sum

POOL = (*NODE, "pool", "class")  # a pool finding's labels
ONLINE_RUN_DELAY = 0.05  # s/s an online process's main thread waits for a CPU (50 ms a second)
SATURATED_CORE = 0.9  # a core this busy is saturated


def busy_ratio(stat: str) -> Expr:
    return Max(Selector("fleetscope_cpu_core_busy_ratio", {"stat": stat}), by=NODE)


def busy_ratio_over_window(stat: str) -> Expr:
    return Max(AvgOverTime(Selector("fleetscope_cpu_core_busy_ratio", {"stat": stat}), WINDOW),
               by=NODE)


PSI_CPU = Sum(Rate(Selector("fleetscope_pressure_stall_seconds_total",
                            {"resource": "cpu", "stall": "some"}), WINDOW), by=NODE)
SATURATED_CORES = Max(Selector("fleetscope_cpu_saturated_cores"), by=NODE)
# procs_running counts the task reading /proc/stat (the exporter itself): one less is the
# node's own work.
RUNNABLE_TASKS = Max(Selector("fleetscope_procs_running"), by=NODE) - 1
ONLINE_CPUS = Sum(Selector("fleetscope_cpu_numa_node_cpus"), by=NODE)


def online_delay(by: tuple[str, ...] = POOL) -> Expr:
    """Per process (main thread), so a pool of 40 workers is held to the same bar as one
    of 4."""
    return (Sum(Rate(Selector("fleetscope_pool_run_delay_seconds_total", {"class": "online"}),
                     WINDOW), by=by)
            / Sum(Selector("fleetscope_pool_processes", {"class": "online"}), by=by))


ONLINE_DELAY = online_delay()


# Inference modules (GPU, NPU ...): one series per device, `vendor` and `device` labelled.
DEVICE = (*NODE, "vendor", "device")


def accelerator(name: str) -> Selector:
    return Selector(f"fleetscope_accelerator_{name}")


MODULE_BUSY = Max(AvgOverTime(accelerator("utilization_ratio"), WINDOW), by=NODE)
# A queue's least depth over the window: requests waited on the module side the whole time,
# not at one unlucky sample.
MODULE_QUEUE = Max(Selector("agent_module_queue_depth"), by=(*NODE, "pool", "module"))
MODULE_QUEUE_HELD = Max(MinOverTime(Selector("agent_module_queue_depth"), WINDOW), by=NODE)
AGENT_QUEUE_GROWTH = Max(Delta(Selector("agent_queue_depth"), WINDOW), by=NODE)
