"""thread-oversubscription: more runnable threads than the cores can run; context switches
eat the CPU.

Condition: runnable threads per physical core (every thread of the pool, /proc/<pid>/task/*)
above 2 and the pool's nonvoluntary context switches above 50/s. A bundle without task/
directories (a recorder other than `bundle record`) holds each process's main thread only,
whose state says nothing of its workers: there the pool's runnable threads are estimated
from what it does hold (the node's runnable tasks, /proc/stat procs_running, in the share of
the node's CPU the pool uses; threads per core from status `Threads:`) and CPU pressure is the
harm. Enrichment: the pool's processes with the most threads.
"""

from __future__ import annotations

from fleetscope.collectors.parsers.process import parse_pid_stat
from fleetscope.collectors.shared import process_file

from ..fleet import Add, FleetFault, Set
from ..model import EXPLAINS_POOL, NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Arith, Max, Rate, Selector, Sum
from ..signals import ONLINE_CPUS, POOL, PSI_CPU, RUNNABLE_TASKS

RANK = 9
THREADS_PER_CORE = 2.0  # "more than ~2x as many runnable threads as physical cores"
NONVOLUNTARY_SWITCHES = 50.0  # per second, all threads of the pool: preempted, not waiting
PSI_CPU_SOME = 0.5  # without thread states: tasks waited for a CPU half the time
MAX_SUBJECTS = 5

_THREADS_PER_CORE = Max(Selector("fleetscope_pool_threads_per_core"), by=POOL)
# Runnable threads per physical core, estimated from the threads read: their runnable
# share times the pool's threads per core. Exact when every thread was read (a live node,
# a bundle with task/ directories); from the main threads alone in a bundle without them.
_RUNNABLE_PER_CORE = (Max(Selector("fleetscope_pool_runnable_threads"), by=POOL)
                      / Max(Selector("fleetscope_pool_threads_read"), by=POOL)
                      * _THREADS_PER_CORE)
_NONVOLUNTARY = Sum(Rate(Selector("fleetscope_pool_context_switches_total",
                                  {"kind": "nonvoluntary"}), WINDOW), by=POOL)
# Main threads only read, of processes that have more: no thread state to count.
_MAIN_THREADS_ONLY = (
    (Max(Selector("fleetscope_pool_threads_read"), by=POOL)
     <= Max(Selector("fleetscope_pool_processes"), by=POOL))
    .and_on(Max(Selector("fleetscope_pool_threads"), by=POOL)
            > Max(Selector("fleetscope_pool_threads_read"), by=POOL), POOL))
# The node's runnable tasks in the pool's share of its CPUs, per physical core (the pool's
# threads over its threads per core): the runnable threads the pool's CPU use implies.
_POOL_CPUS = Sum(Rate(Selector("fleetscope_pool_cpu_seconds_total"), WINDOW), by=POOL)
_POOL_CORES = (Max(Selector("fleetscope_pool_threads"), by=POOL)
               / Max(Selector("fleetscope_pool_threads_per_core"), by=POOL))
_ESTIMATED_RUNNABLE_PER_CORE = Arith(
    "*", Arith("/", _POOL_CPUS, ONLINE_CPUS, on=NODE, group_left=True), RUNNABLE_TASKS,
    on=NODE, group_left=True) / _POOL_CORES


def enrich(ctx, finding) -> None:
    """The pool's processes with the most threads (where the oversubscription is)."""
    counts = []
    for process in ctx.pool_members(ctx.last, finding.labels.get("pool")):
        stat = ctx.read(ctx.last, process_file(process.pid, "stat"), parse_pid_stat)
        if stat is not None:
            counts.append((stat.num_threads, process.pid))
    counts.sort(key=lambda item: (-item[0], item[1]))
    top = [(n, pid) for n, pid in counts[:MAX_SUBJECTS] if n > 1]
    finding.subjects["pids"] = [pid for _, pid in top]
    if top:
        finding.extra_summary = "most threads: " + ", ".join(
            f"{ctx.who(pid)} ({n})" for n, pid in top[:3])


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "thread-oversubscription", "agent-x86-06",
        "a new worker image dropped OMP_NUM_THREADS: each worker's inference runtime starts "
        "a thread per CPU per pool, 48 threads per worker, 192 on 8 physical cores",
        "24 threads per physical core, main threads preempted 170 times a second each "
        "(nonvoluntary_ctxt_switches), 32 % system time, every online core busy, load "
        "average ~170, inference 3.4x slower",
        uptime_days=5.5, procs=k.daemons(k.X86) + k.workers(
            k.X86, k.ONLINE_X86, 3.4, threads=(48, 48, 48, 48), lead_run=0.35, lead_wait=0.31,
            vcs=900.0, ivcs=170.0),
        background=k.background(k.X86, 0.6, 0.02), slices=6000.0, wait_ratio=0.6,
        extra_runnable=150.0,
        profile={"system": 0.32, "nice": 0.0, "irq": 0.008, "softirq": 0.03},
        psi={"cpu": [3.0, 78.0, 79.0, 77.0, 78.0, 80.0, 78.0, 79.0], "memory": 0.05,
             "io": 0.3},
        cgroups={k.ONLINE_CG: {"pressure": [1.5, 74.0, 75.0, 74.0, 76.0, 75.0, 74.0, 75.0]}},
        agent=k.AgentPlan(sessions=11.0, session_median=0.9, inference_median=0.55,
                        queue=[22, 24, 23, 25, 24, 26, 25, 27],
                        heartbeat=[2.2, 3.1, 1.9, 2.8, 3.4, 2.5, 2.9, 3.3]))


RULE = Rule(
    id="thread-oversubscription",
    severity="warning",
    explains=EXPLAINS_POOL,  # its threads, more than its CPUs
    symptom="throughput drops as threads are added",
    cause="more than ~2x as many runnable threads as physical cores: context-switch cost eats "
          "the CPU",
    action="size thread pools to the physical cores (e.g. OMP_NUM_THREADS, worker counts); "
           "use async I/O instead of a thread per request",
    summary="pool {pool}: {value:.1f} runnable threads per physical core, preempted often",
    # Every thread of the pool (/proc/<pid>/task/*): runnable ones over the cores, and their
    # nonvoluntary switches, which rise as the problem worsens. Where only main threads were
    # recorded: the estimate, with the pool's own threads per core and CPU pressure as harm.
    condition=((_RUNNABLE_PER_CORE > THREADS_PER_CORE).and_on(
        _NONVOLUNTARY > NONVOLUNTARY_SWITCHES, (*NODE, "pool"))
        | (_ESTIMATED_RUNNABLE_PER_CORE > THREADS_PER_CORE)
        .and_on(_THREADS_PER_CORE > THREADS_PER_CORE, (*NODE, "pool"))
        .and_on(_MAIN_THREADS_ONLY, (*NODE, "pool"))
        .and_on(PSI_CPU > PSI_CPU_SOME, NODE)),
    # Where only main threads were read, their states and switches stand for the pool only
    # when they show the fault; else the estimate from the node's runnable tasks does.
    evidence=(
        Evidence("runnable threads per physical core",
                 _RUNNABLE_PER_CORE.unless(_MAIN_THREADS_ONLY, (*NODE, "pool"))
                 | (_RUNNABLE_PER_CORE > THREADS_PER_CORE), THREADS_PER_CORE, "threads"),
        Evidence("runnable threads per physical core, from the pool's share of the node's "
                 "runnable tasks (main threads only recorded)",
                 _ESTIMATED_RUNNABLE_PER_CORE.and_on(_MAIN_THREADS_ONLY, (*NODE, "pool")),
                 THREADS_PER_CORE, "threads"),
        Evidence("nonvoluntary context switches (all threads)",
                 _NONVOLUNTARY.unless(_MAIN_THREADS_ONLY, (*NODE, "pool"))
                 | (_NONVOLUNTARY > NONVOLUNTARY_SWITCHES), NONVOLUNTARY_SWITCHES, "1/s"),
        Evidence("threads per physical core", _THREADS_PER_CORE, THREADS_PER_CORE, "threads"),
        Evidence("CPU pressure (PSI cpu some)", PSI_CPU, PSI_CPU_SOME, "ratio"),
    ),
    confidence=0.65,
    enrich=enrich,
    views=(
        Panel("Threads per physical core per pool",
              Max(Selector("fleetscope_pool_threads_per_core"), by=(*NODE, "pool")), "threads",
              THREADS_PER_CORE),
        Panel("Nonvoluntary context switches per pool (all threads)",
              Sum(Rate(Selector("fleetscope_pool_context_switches_total",
                                {"kind": "nonvoluntary"}), WINDOW), by=(*NODE, "pool")),
              "1/s", NONVOLUNTARY_SWITCHES),
    ),
    fleet=FleetFault(("batch",), 12, 90, effects=(
        # each offline process runs 64 threads, nearly all runnable
        Set("threads_per_process", 64, pools="offline"),
        Set("runnable_share", 0.9, pools="offline"),
        Set("nonvoluntary_switch_rate", 900.0, pools="offline"),
        Add("cpu_stages_stretch", 0.5, pools="offline"),
    )),
    proof=Proof(scenario, summary=r"pool chat-online: 6\.0 runnable threads per physical core",
                also_shown=("cpu-saturation",)),  # every online core busy
)
