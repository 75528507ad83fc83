"""offline-preemption: offline/batch work (or a noisy VM neighbour) takes CPU from the
online agents on the same node.

Condition: the online pool's run-queue delay per process above 50 ms a second while the
offline pools use more than a quarter CPU, or while steal is high on most cores.
Enrichment: the antagonists, the offline processes that used the most CPU, with their
cgroups and CPUs; on Kubernetes, their pods and the online pods, and whether the kubelet's
CPU manager gave the online pods exclusive CPUs (and the offline pods ran on them).
"""

from __future__ import annotations

from fleetscope.collectors.parsers.process import parse_pid_stat, parse_status
from fleetscope.collectors.parsers.sysfs import parse_cpulist
from fleetscope.collectors.processes import program_name
from fleetscope.collectors.shared import process_file

from ..fleet import Add, FleetFault, Noisy, Set
from ..model import EXPLAINS_POOL, NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Max, Rate, Selector, Sum
from ..signals import ONLINE_DELAY, ONLINE_RUN_DELAY, POOL, online_delay

RANK = 3
OFFLINE_CPU = 0.25  # CPUs offline pools use on the node while online ones wait
STEAL_P90 = 0.1  # a tenth of the CPU time stolen on most cores
MAX_SUBJECTS = 5

_OFFLINE_CPU = Sum(Rate(Selector("fleetscope_pool_cpu_seconds_total", {"class": "offline"}),
                        WINDOW), by=NODE)
_STEAL_P90 = Max(Selector("fleetscope_cpu_core_steal_ratio", {"stat": "p90"}), by=NODE)


def _cgroup_pressure(by: tuple[str, ...]):
    return Sum(Rate(Selector("fleetscope_pool_cgroup_cpu_pressure_stall_seconds_total",
                             {"class": "online", "stall": "some"}), WINDOW), by=by)


def enrich(ctx, finding) -> None:
    """The offline processes that used the most CPU over the window (the antagonists)."""
    before = ctx.offline_cpu_before()
    usage = []
    for process in ctx.pool_members(ctx.last, workload_class="offline"):
        now = ctx.read(ctx.last, process_file(process.pid, "stat"), parse_pid_stat)
        if now is None:
            continue
        then = before.get(process.pid)
        used = now.utime_ticks + now.stime_ticks
        if then is not None:
            used -= then.utime_ticks + then.stime_ticks
        usage.append((used, process, now.processor))
    usage.sort(key=lambda item: -item[0])
    for used, process, cpu in usage[:MAX_SUBJECTS]:
        if used <= 0:
            break
        finding.subjects["pids"].append(process.pid)
        if process.cgroup and process.cgroup not in finding.subjects["cgroups"]:
            finding.subjects["cgroups"].append(process.cgroup)
        if cpu not in finding.subjects["cpus"]:
            finding.subjects["cpus"].append(cpu)
    if usage and usage[0][0] > 0:
        finding.extra_summary = f"antagonists: {antagonist_names(usage[:2], ctx.pod)}"
    _kubelet_cpus(ctx, finding, [(process, cpu) for used, process, cpu in usage[:MAX_SUBJECTS]
                                 if used > 0])


def antagonist_names(usage, pod_of=lambda pid: None) -> str:
    """The antagonists by pod (`pod batch/etl-7f9c (BestEffort)`), else by program and pid:
    never their arguments, where secrets live (an agent started with --api-key=... must not
    print it in a ticket)."""
    names = []
    for _, p, _ in usage:
        pod = pod_of(p.pid)
        names.append(pod.title if pod is not None else
                     f"{program_name(p.cmdline) or p.pid} (pid {p.pid})")
    return ", ".join(dict.fromkeys(names))


def _kubelet_cpus(ctx, finding, antagonists) -> None:
    """On a Kubernetes node: the online pods, whether the kubelet gave them exclusive CPUs,
    and whether the offline pods ran on those CPUs (diagnose/pods.py)."""
    from fleetscope.collectors.pods import cpulist, describe_cpus, exclusive_cpus

    online = {}
    for process in ctx.pool_members(ctx.last, finding.labels.get("pool"), "online"):
        pod = ctx.pod(process.pid)
        if pod is not None:
            online.setdefault(pod.ref, pod)
    if not online:
        return
    state, why = ctx.cpu_manager()
    notes = [f"online {pod.title}: {describe_cpus(state, why, pod)}"
             for pod in list(online.values())[:3]]
    for ref in online:
        if ref not in finding.subjects["pods"] and "/" in ref:
            finding.subjects["pods"].append(ref)
    if state is not None:
        guarded = frozenset().union(*(exclusive_cpus(state, p) for p in online.values()))
        # Exclusive only if the offline work cannot run there: its affinity (the cpuset the
        # kubelet gives shared-pool containers) must leave those CPUs out.
        intruders: set[int] = set()
        for process, cpu in antagonists:
            status = ctx.read(ctx.last, process_file(process.pid, "status"), parse_status) or {}
            allowed = parse_cpulist(status.get("Cpus_allowed_list", "")) or [cpu]
            intruders.update(guarded.intersection([*allowed, cpu]))
        with_cpus = sum(1 for p in online.values() if exclusive_cpus(state, p))
        finding.evidence.append({
            "signal": "online containers with exclusive CPUs (kubelet CPU manager)",
            "value": with_cpus, "threshold": len(online), "unit": "containers"})
        if guarded and intruders:
            notes.append(f"offline work runs on their exclusive CPUs {cpulist(intruders)} "
                         "(its CPU affinity includes them: not confined to the shared pool)")
        elif guarded:
            notes.append("offline work stays off their exclusive CPUs")
    finding.extra_summary = "; ".join(filter(None, [finding.extra_summary, *notes]))


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    procs = k.daemons(k.KUNPENG) + k.workers(
        k.KUNPENG, k.ONLINE_KP, 1.05, threads=(6, 6, 6, 6),
        lead_wait=k.per_interval([0.052, 0.37, 0.39, 0.38, 0.4, 0.37, 0.38, 0.39]),
        ivcs=k.per_interval([12.0, 95.0, 98.0, 92.0, 96.0, 97.0, 94.0, 95.0]))
    procs += [k.etl(k.KUNPENG, k.ONLINE_KP, 3.6, threads=12, age=2400.0 + 37.1),
              k.train(k.KUNPENG, k.ONLINE_KP, 4.3)]
    return k.kp_scenario(
        "offline-preemption", "agent-kp-03",
        "a training job and an ETL job were scheduled onto the online workers' CPUs (4-15) "
        "40 minutes ago without a cpu.max limit; they take ~8 of the 12 CPUs",
        "online workers' main threads wait 0.38 s per second for a CPU (schedstat run "
        "delay), the online cgroup's cpu.pressure some 48 %, offline pools using 7.9 CPUs, "
        "CPUs 4-15 saturated, online P99 from 0.2 s to over 1 s",
        uptime_days=6.6, procs=procs, background=k.background(k.KUNPENG, 0.25, 0.02),
        wait_ratio=[0.03, 0.4, 0.42, 0.41, 0.4, 0.42, 0.41, 0.4],
        psi={"cpu": [4.0, 38.0, 39.0, 37.0, 38.0, 40.0, 38.0, 39.0], "memory": 0.1,
             "io": 0.5},
        cgroups={k.ONLINE_CG: {"pressure": [3.0, 47.0, 48.0, 49.0, 48.0, 47.0, 48.0, 49.0]},
                 k.ETL_CG: {"pressure": 31.0}, k.TRAIN_CG: {"pressure": 28.0}},
        agent=k.AgentPlan(sessions=11.0, session_median=0.65, session_sigma=0.9,
                        inference_median=0.38, queue=[6, 8, 9, 8, 10, 11, 9, 12],
                        heartbeat=[1.9, 2.6, 3.1, 2.2, 2.9, 3.4, 2.5, 2.8]))


RULE = Rule(
    id="offline-preemption",
    severity="warning",
    explains=EXPLAINS_POOL,  # the online pool whose processes wait for a CPU
    symptom="online P99 latency jumps around (200 ms -> 1 s)",
    cause="offline/batch jobs (or a noisy VM neighbour: steal) take CPU from online agents on "
          "the same node",
    action="separate online and offline pools; give offline cgroups strict CPU limits "
           "(cpu.max) or move them off the online pool's CPUs",
    summary="online pool {pool} waits {value:.2f} s/s for CPU while offline work runs",
    condition=((ONLINE_DELAY > ONLINE_RUN_DELAY).and_on(_OFFLINE_CPU > OFFLINE_CPU, NODE)
               | (ONLINE_DELAY > ONLINE_RUN_DELAY).and_on(_STEAL_P90 > STEAL_P90, NODE)),
    evidence=(
        Evidence("online pool run-queue delay per process", ONLINE_DELAY, ONLINE_RUN_DELAY,
                 "s/s"),
        Evidence("offline pools' CPU use", _OFFLINE_CPU, OFFLINE_CPU, "CPUs"),
        Evidence("steal on the p90 core", _STEAL_P90, STEAL_P90, "ratio"),
        Evidence("online pool cgroup CPU pressure (some)", _cgroup_pressure(POOL), 0.1, "s/s"),
    ),
    confidence=0.8,
    enrich=enrich,
    views=(
        Panel("Online pool run-queue delay per process", online_delay((*NODE, "pool")), "s/s",
              ONLINE_RUN_DELAY, role="victim"),
        Panel("Offline pools' CPU use",
              Sum(Rate(Selector("fleetscope_pool_cpu_seconds_total", {"class": "offline"}),
                       WINDOW), by=(*NODE, "pool")),
              "CPUs", OFFLINE_CPU, narrow=False, role="antagonist"),
        Panel("Steal on the p90 core (a noisy VM neighbour)", _STEAL_P90, "ratio", STEAL_P90,
              role="antagonist"),
        Panel("Online pool cgroup CPU pressure (some)", _cgroup_pressure((*NODE, "pool")),
              "s/s", 0.1, role="victim"),
    ),
    fleet=FleetFault(
        ("mixed",), "rack", 70,
        # the mixed nodes' batch pool takes 30 CPUs; the online pool waits for CPU
        effects=(
            Add("cpu_load", 0.25),
            Add("cpu_wait", 0.2),
            Set("pool_cpu", 30.0, pools="offline"),
            Set("run_delay_per_process", 0.12, pools="online"),
            Set("cgroup_cpu_pressure", 0.35, pools="online"),
            Add("cpu_stages_stretch", 0.8, pools="online"),
            Add("queue_wait_stretch", 1.5, pools="online"),
            Add("session_tail", 0.25, pools="online"),
        ),
        # a few chat nodes on an oversold hypervisor: steal takes the online pool's CPU
        also=(FleetFault(("chat",), 4, 55, staggered=False, effects=(
            Set("steal_p90", Noisy(0.16, 0.03, stream=16)),
            Set("run_delay_per_process", 0.09, pools="online"),
            Set("cgroup_cpu_pressure", 0.35, pools="online"),
        )),)),
    proof=Proof(scenario, summary=r"online pool chat-online waits 0\.\d+ s/s for CPU",
                subjects=("cgroups", None)),
)
