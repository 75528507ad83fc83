"""cpu-saturation (beyond the contract's list): the node is out of CPU.

Condition: tasks waited for a CPU (PSI cpu some) more than 60 % of the time, the median
core above 90 % busy (every core, not a few), and more runnable tasks than CPUs. A symptom:
it ranks after any cause of the same severity. Enrichment: the top CPU consumers.
"""

from __future__ import annotations

from ..fleet import FleetFault, Noisy, Set
from ..model import EXPLAINS_NODE, NODE, Evidence, Panel, Proof, Rule
from ..promql import Max, Selector, Sum
from ..signals import PSI_CPU, busy_ratio

RANK = 13
PSI_CPU_SOME = 0.6  # share of time some task waited for a CPU (PSI cpu some)
SATURATED_MEDIAN_CORE = 0.9  # the median core this busy: every core, not a few
RUNNABLE_PER_CPU = 1.0  # runnable tasks (procs_running, less the reader) per online CPU
MAX_SUBJECTS = 5

# procs_running counts the task reading /proc/stat (the exporter itself): one less is the
# node's own work.
_RUNNABLE_PER_CPU = ((Max(Selector("fleetscope_procs_running"), by=NODE) - 1)
                     / Sum(Selector("fleetscope_cpu_numa_node_cpus"), by=NODE))


def enrich(ctx, finding) -> None:
    """The top CPU consumers over the window."""
    top = ctx.top_consumers()[:MAX_SUBJECTS]
    finding.subjects["pids"] = [pid for _, pid, _ in top]
    if top:
        finding.extra_summary = "top CPU users: " + "; ".join(
            ctx.describe(pid) for _, pid, _ in top[:3])


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "cpu-saturation", "agent-x86-10",
        "a traffic peak beyond the node's share: the gateway's quota was raised for a launch, "
        "every worker thread is busy and more requests queue on the run queues than the 16 "
        "CPUs can run; no batch job, thread pools sized right",
        "every core 100 % busy, PSI cpu some ~70 %, ~34 runnable tasks on 16 CPUs, online "
        "run-queue delay high, queue depth 20-30 and flat",
        uptime_days=7.3, procs=k.daemons(k.X86) + k.workers(
            k.X86, k.ONLINE_X86, 3.6, threads=(4, 4, 4, 4), lead_run=0.6, lead_wait=0.3,
            vcs=500.0, ivcs=40.0),
        background=k.background(k.X86, 0.6, 0.02), wait_ratio=0.7, extra_runnable=18.0,
        psi={"cpu": [3.0, 68.0, 71.0, 70.0, 69.0, 72.0, 70.0, 71.0], "memory": 0.05,
             "io": 0.3},
        agent=k.AgentPlan(sessions=30.0, session_median=1.6, queue=[24, 26, 23, 25, 27, 24, 26, 25],
                        heartbeat=[1.2, 2.1, 1.9, 1.8, 2.4, 1.5, 1.9, 2.3]))


RULE = Rule(
    id="cpu-saturation",
    severity="warning",
    explains=EXPLAINS_NODE,  # the node's CPUs
    symptom="every request slow at once; the gateway's CPU > 85 % backpressure engages",
    cause="the node is out of CPU: more runnable work than cores on every core, tasks "
          "waiting for a CPU most of the time",
    action="find the top CPU consumers (top -H; fleetscope diagnose names them); move or "
           "limit batch work (cpu.max), scale out the pool, or lower the node's session quota",
    summary="CPU saturated: tasks waited for a CPU {value:.0%} of the time, every core busy",
    # Every core busy (the median one too) and tasks queueing: a busy node whose cores all
    # keep up (one compile job per core) has little PSI and does not fire.
    condition=((PSI_CPU > PSI_CPU_SOME)
               .and_on(busy_ratio("p50") > SATURATED_MEDIAN_CORE, NODE)
               .and_on(_RUNNABLE_PER_CPU > RUNNABLE_PER_CPU, NODE)),
    evidence=(
        Evidence("CPU pressure (PSI cpu some)", PSI_CPU, PSI_CPU_SOME, "ratio"),
        Evidence("median core busy", busy_ratio("p50"), SATURATED_MEDIAN_CORE, "ratio"),
        Evidence("runnable tasks per CPU", _RUNNABLE_PER_CPU, RUNNABLE_PER_CPU, "tasks"),
    ),
    confidence=0.6,
    kind="symptom",
    enrich=enrich,
    views=(
        Panel("Time tasks waited for a CPU (PSI cpu some)", PSI_CPU, "ratio", PSI_CPU_SOME),
        Panel("Median core busy", busy_ratio("p50"), "ratio", SATURATED_MEDIAN_CORE),
        Panel("Runnable tasks", Max(Selector("fleetscope_procs_running"), by=NODE), "tasks",
              None),
    ),
    fleet=FleetFault(("chat",), 8, 50, effects=(
        # every core busy, twice as many runnable tasks as cores
        Set("busy_p50", Noisy(0.97, 0.02, stream=46)),
        Set("busy_p90", 0.995),
        Set("busy_max", 1.0),
        Set("cpu_pressure", Noisy(0.68, 0.1, stream=47)),
        Set("core_wait_max", 0.6),
        Set("runnable_per_core", 2.2),
    )),
    proof=Proof(scenario, summary=r"CPU saturated: tasks waited for a CPU [67]\d% of the time, "
                                  r"every core busy"),
)
