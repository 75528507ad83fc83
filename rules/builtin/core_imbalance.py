"""core-imbalance: some cores saturated while others idle, and tasks queue on them.

Condition: the spread of the window's mean core busy (busiest minus median) above 0.4, a
saturated core, and tasks waiting on the most contended CPU's run queue (/proc/schedstat;
PSI cpu some on a kernel without it, where waiting while most cores idle is avoidable
waiting, so less of it counts). A symptom more often than a cause. Enrichment: the
saturated CPUs and the processes on them, pinned there (affinity) or not.
"""

from __future__ import annotations

from fleetscope.collectors.pods import pod_notes

from ..fleet import Add, FleetFault, Noisy, Set
from ..model import EXPLAINS_NODE, NODE, Evidence, Panel, Proof, Rule
from ..promql import Max, Selector
from ..signals import PSI_CPU, SATURATED_CORE, SATURATED_CORES, busy_ratio, busy_ratio_over_window

RANK = 14
CORE_IMBALANCE_SPREAD = 0.4  # busiest core minus the median core (window means)
CORE_WAIT = 0.2  # s/s runnable tasks wait on the most contended CPU's run queue
CORE_IMBALANCE_PSI = 0.2  # without per-CPU schedstat: tasks waited 20 % of the time
# ... or 10 % of the time while the median core was under half busy: a task that waits
# while most cores idle waits only because of where it may run (four saturated CPUs of 64)
CORE_IMBALANCE_PSI_IDLE = 0.1
MOSTLY_IDLE = 0.5  # the median core's busy share (window mean)
MAX_SUBJECTS = 5

_CORE_WAIT = Max(Selector("fleetscope_schedstat_core_waiting_ratio", {"stat": "max"}), by=NODE)
# The spread of the window's mean, not of one interval: a bursty process on the median core
# (busy 0.15-0.57 from one second to the next beside a pinned hog on a 2-core node) would
# otherwise decide each step alone. 0.4, not 0.5: three tasks queued on a pinned core while
# the median core was 0.3-0.6 busy with other work (window means) is the fault, and 0.5
# missed it in 1 of 5 live runs; the saturated core and the waiting keep a busy-but-even
# node out.
_SPREAD = busy_ratio_over_window("max") - busy_ratio_over_window("p50")
_UNEVEN = (_SPREAD > CORE_IMBALANCE_SPREAD).and_on(SATURATED_CORES >= 1, NODE)
_PSI_WAITING = ((PSI_CPU > CORE_IMBALANCE_PSI)
                | (PSI_CPU > CORE_IMBALANCE_PSI_IDLE)
                .and_on(busy_ratio_over_window("p50") < MOSTLY_IDLE, NODE))


def enrich(ctx, finding) -> None:
    """The saturated CPUs, and the processes running on them: pinned there (affinity) or
    free to move (the scheduler's doing)."""
    saturated = ctx.saturated_cpus()
    if not saturated:
        busiest = Selector("fleetscope_cpu_busiest_core").evaluate(
            ctx.series, ctx.series.timestamps()[-1])
        saturated = sorted({int(value) for value in busiest.values()})
    finding.subjects["cpus"] = saturated[:MAX_SUBJECTS * 4]
    on_hot = [(used, pid) for used, pid, cpu in ctx.top_consumers() if cpu in saturated]
    finding.subjects["pids"] = [pid for _, pid in on_hot[:MAX_SUBJECTS]]
    described = [ctx.describe(pid) for _, pid in on_hot[:3]]
    cpus = ", ".join(map(str, saturated[:8])) + (" ..." if len(saturated) > 8 else "")
    finding.extra_summary = f"saturated CPU {cpus}" + (
        f": {'; '.join(described)}" if described else "")
    if described and all("pinned to" in d for d in described):
        finding.extra_summary += " - the busy tasks are pinned: fix their affinity"
    elif described:
        finding.extra_summary += " - the busy tasks are not all pinned"
    # On Kubernetes: the CPUs the kubelet gave the busy pods (its CPU manager checkpoint).
    notes = pod_notes(ctx, [pid for _, pid in on_hot[:3]])
    if notes:
        finding.extra_summary += "; " + "; ".join(notes)


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.kp_scenario(
        "core-imbalance", "agent-kp-07",
        "a cpuset typo (4-5 instead of 4-15) pins all four workers to two CPUs: those two "
        "are saturated while the other fourteen idle",
        "busiest core 100 % against a median of ~10 % (spread 0.9), two saturated cores, "
        "workers waiting for CPU, queue creeping up",
        uptime_days=5.1, procs=k.daemons(k.KUNPENG) + k.workers(
            k.KUNPENG, [4, 5], 0.5, threads=(6, 6, 6, 6), anon_nodes={1: 0.9, 2: 0.05, 3: 0.05},
            file_nodes={1: 0.7, 0: 0.3}, lead_run=0.45, lead_wait=0.42, ivcs=80.0),
        background=k.background(k.KUNPENG, 0.16, 0.1), wait_ratio=0.6,
        agent=k.AgentPlan(sessions=7.0, session_median=0.8, queue_wait_median=0.9,
                        queue=[14, 17, 19, 22, 24, 27, 29, 32],
                        heartbeat=[1.3, 2.2, 1.7, 2.9, 2.4, 1.9, 3.1, 2.6]))


RULE = Rule(
    id="core-imbalance",
    severity="warning",
    explains=EXPLAINS_NODE,  # a core of the node, whoever runs on it
    symptom="some cores saturated while others idle",
    cause="CPU affinity or NUMA binding wrong, or scheduling uneven: work piles onto a few "
          "cores",
    action="check binding and CPU affinity (mpstat -P ALL 1; taskset -cp PID); spread "
           "workers or fix the cpuset",
    summary="busiest core {value:.0%} busier than the median core, tasks queue on it",
    # Harm, not just shape: one busy thread on an otherwise idle node is uneven but hurts
    # nobody. Imbalance is tasks waiting on a saturated core while the median core idles.
    # Waiting is read per CPU from /proc/schedstat; a kernel without CONFIG_SCHEDSTATS
    # has only PSI (tasks waited somewhere on the node while its median core idled).
    condition=(_UNEVEN.and_on(_CORE_WAIT > CORE_WAIT, NODE)
               | _UNEVEN.and_on(_PSI_WAITING, NODE)
               .unless(Max(Selector("fleetscope_schedstat_core_waiting_ratio"), by=NODE), NODE)),
    evidence=(
        Evidence("busiest core minus median core busy (window mean)", _SPREAD,
                 CORE_IMBALANCE_SPREAD, "ratio"),
        Evidence("run-queue wait on the most contended core", _CORE_WAIT, CORE_WAIT, "s/s"),
        Evidence("CPU pressure (PSI cpu some), 20 % when the median core is half busy",
                 PSI_CPU, CORE_IMBALANCE_PSI_IDLE, "ratio"),
        Evidence("busiest core busy", busy_ratio("max"), SATURATED_CORE, "ratio"),
        Evidence("median core busy", busy_ratio("p50"), 0.5, "ratio", pick="min"),
        Evidence("saturated cores", SATURATED_CORES, 1, "cores"),
    ),
    # A symptom more often than a cause: preemption, IRQ overlap and the like rank first.
    confidence=0.5,
    kind="symptom",
    enrich=enrich,
    views=(
        Panel("Core busy: busiest, p90, median, least busy",
              Max(Selector("fleetscope_cpu_core_busy_ratio"), by=(*NODE, "stat")), "ratio",
              SATURATED_CORE),
        Panel("Cores over 90 % busy", SATURATED_CORES, "cores", 1.0),
    ),
    fleet=FleetFault(("batch",), 16, 80, effects=(
        # an eighth of the cores pinned busy, the rest mostly idle
        Set("hog_cores", 1 / 8),
        Set("busy_p50", Noisy(0.22, 0.03, stream=13)),
        Set("busy_p90", 0.99),
        Set("busy_max", 1.0),
        Set("core_wait_max", Noisy(0.7, 0.2, stream=48)),
        Add("cpu_stages_stretch", 0.3),
    )),
    proof=Proof(scenario, summary=r"busiest core \d+% busier than the median core",
                subjects=("cpus", None)),
)
