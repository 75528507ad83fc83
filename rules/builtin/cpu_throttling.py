"""cpu-throttling: an online pool's CFS quota (cgroup cpu.max, v1 cpu.cfs_quota_us) stops
its threads in most scheduling periods, and they wait for it.

Condition: throttled periods over periods above 25 % across the window (kube-prometheus's
CPUThrottlingHigh: increase(container_cpu_cfs_throttled_periods_total) over
increase(container_cpu_cfs_periods_total) > 25 %) for an online pool, WITH the harm: the
pool's cgroups throttled for more than 50 ms a second, or its main threads waiting for a CPU
as long. A pool busy under its quota is never throttled (nr_throttled does not move) and
stays silent; an offline pool held to its limit is what offline-preemption asks for, so it
is only information. Enrichment: the cgroups, their quota and period, the processes.
"""

from __future__ import annotations

from fleetscope.collectors.cgroups import process_cgroups
from fleetscope.collectors.parsers.cgroup import parse_cfs_quota, parse_cpu_max

from ..fleet import FleetFault, Set
from ..model import EXPLAINS_POOL, NODE, ONGOING, WINDOW, Case, Evidence, Panel, Proof, Rule, Tier
from ..promql import Max, Rate, Selector, Sum
from ..signals import ONLINE_RUN_DELAY, POOL

RANK = 3.5  # after offline-preemption, its opposite case
THROTTLED_SHARE = 0.25  # kube-prometheus CPUThrottlingHigh: 25 % of periods throttled
THROTTLED_SECONDS = 0.05  # s/s the pool's cgroups sat throttled: work held back, as run delay
MAX_SUBJECTS = 5


def _rate(metric: str, matchers: dict | None = None, by=POOL):
    return Sum(Rate(Selector(metric, matchers or {}), WINDOW), by=by)


def _share(matchers: dict, by=POOL):
    return (_rate("fleetscope_pool_cgroup_cpu_throttled_periods_total", matchers, by)
            / _rate("fleetscope_pool_cgroup_cpu_periods_total", matchers, by))


_ONLINE = {"class": "online"}
_SHARE = _share(_ONLINE)
_THROTTLED = _rate("fleetscope_pool_cgroup_cpu_throttled_seconds_total", _ONLINE)
_DELAY = (_rate("fleetscope_pool_run_delay_seconds_total", _ONLINE)
          / Sum(Selector("fleetscope_pool_processes", _ONLINE), by=POOL))
_QUOTA = Max(Selector("fleetscope_pool_cgroup_cpu_quota_cpus"), by=POOL)
_USED = _rate("fleetscope_pool_cgroup_cpu_usage_seconds_total")


def _quota_text(scrape, location) -> str:
    """The cgroup's limit as its files say it: "0.10 CPUs (cpu.cfs_quota_us 10000 /
    cpu.cfs_period_us 100000)"."""
    directory = location.directory
    try:
        if location.version == 1:
            limit = parse_cfs_quota(scrape.read_text(f"{directory}/cpu.cfs_quota_us"),
                                    scrape.read_text(f"{directory}/cpu.cfs_period_us"))
            files = f"cpu.cfs_quota_us {limit.quota_us if limit.quota_us else -1} / " \
                    f"cpu.cfs_period_us {limit.period_us}"
        else:
            limit = parse_cpu_max(scrape.read_text(f"{directory}/cpu.max"))
            files = f"cpu.max {limit.quota_us or 'max'} {limit.period_us}"
    except Exception:  # noqa: BLE001 (a cgroup removed since: its name still helps)
        return f"{location.path} (cgroup v{location.version})"
    return f"{location.path} (cgroup v{location.version}, quota {limit.cpus:.2f} CPUs: {files})"


def enrich(ctx, finding) -> None:
    """The pool's cgroups with their quota as the files say it, and the processes."""
    members = [p.pid for p in ctx.pool_members(ctx.last, finding.labels.get("pool"))]
    cgroups = process_cgroups(ctx.last, members, "cpu")
    finding.subjects["pids"] = members[:MAX_SUBJECTS]
    finding.subjects["cgroups"] = [c.path for c in cgroups.values()][:MAX_SUBJECTS]
    if cgroups:
        finding.extra_summary = "cgroup " + "; ".join(
            _quota_text(ctx.last, c) for c in list(cgroups.values())[:2])


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.kp_scenario(
        "cpu-throttling", "agent-kp-08",
        "the chat workers' deployment was given a CPU limit of 0.4 cores per pod (cpu.max "
        "40000 100000) copied from a batch template; their bursts of inference need ~1.5",
        "the online cgroup throttled in 91 % of its 100 ms periods, 0.6 s of throttled time "
        "a second, main threads waiting 0.3 s/s, P99 from 0.2 s to 1.4 s, node half idle",
        uptime_days=3.1, procs=k.daemons(k.KUNPENG) + k.workers(
            k.KUNPENG, k.ONLINE_KP, 0.4, threads=(6, 6, 6, 6),
            lead_wait=k.per_interval([0.3] * 8)),
        background=k.background(k.KUNPENG, 0.1, 0.03),
        cgroups={k.ONLINE_CG: {"max": "40000 100000", "pressure": 21.0,
                               "throttle": [0.05, 0.9, 0.92, 0.91, 0.9, 0.93, 0.91, 0.92]}},
        agent=k.AgentPlan(sessions=11.0, session_median=0.7, session_sigma=0.8))


def offline_at_quota(k):
    """A healthy busy node whose batch pool sits at its cpu.max: what its limit is for."""
    return k.x86_scenario(
        "healthy-offline-at-quota", "agent-x86-05",
        "nothing wrong: the offline ETL job's cgroup is capped at 4 CPUs (cpu.max 400000 "
        "100000) and its 16 threads want more, so they spend the quota early in nearly every "
        "100 ms period; the online workers keep their CPUs",
        "the batch cgroup throttled in ~100 % of its periods (cpu.stat nr_throttled / "
        "nr_periods) at its 4 CPUs; the online pool's run delay ~12 ms/s, sessions fast, "
        "queue flat, every core 60-80 % busy",
        uptime_days=11.3, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 1.5)
        + [k.etl(k.X86, range(16), 4.0, threads=16)],
        background=k.background(k.X86, 0.45, 0.02), psi={"cpu": 6.2, "memory": 0.04, "io": 0.4},
        cgroups={k.ETL_CG: {"max": "400000 100000", "pressure": 38.0,
                            "throttle": [0.97, 0.99, 1.0, 0.99, 1.0, 1.0, 0.98, 1.0]},
                 k.ONLINE_CG: {"pressure": 1.5}},
        nic_gbps=6.0)


RULE = Rule(
    id="cpu-throttling",
    severity="warning",
    explains=EXPLAINS_POOL,  # its cgroup's CPU quota
    symptom="online latency spikes while the node has idle CPUs",
    cause="the pool's CFS quota (cgroup cpu.max / cpu.cfs_quota_us, a Kubernetes CPU limit) "
          "stops its threads for the rest of most 100 ms periods",
    action="raise the pool's CPU quota (cpu.max, cpu.cfs_quota_us, the pod's limits.cpu) "
           "above its bursts, or remove the CPU limit of the online pool and keep only its "
           "request; the opposite of offline-preemption's advice, which limits offline pools",
    summary="online pool {pool} throttled by its CPU quota in {value:.0%} of its periods",
    condition=(_SHARE > THROTTLED_SHARE) & ((_THROTTLED > THROTTLED_SECONDS)
                                            | (_DELAY > ONLINE_RUN_DELAY)),
    tiers=(Tier("info", (_share({"class": "offline"}) > THROTTLED_SHARE),
                "offline pool {pool} held to its CPU quota in {value:.0%} of its periods "
                "(what a batch limit is for)"),),
    evidence=(
        Evidence("throttled periods over periods (cpu.stat nr_throttled / nr_periods)",
                 _share({}), THROTTLED_SHARE, "ratio"),
        Evidence("time the pool's cgroups sat throttled (throttled_usec / throttled_time)",
                 _rate("fleetscope_pool_cgroup_cpu_throttled_seconds_total"),
                 THROTTLED_SECONDS, "s/s"),
        Evidence("the pool's run-queue delay per process", _DELAY, ONLINE_RUN_DELAY, "s/s"),
        Evidence("the pool's CPU quota (cpu.max, cpu.cfs_quota_us / cpu.cfs_period_us)",
                 _QUOTA, 0, "CPUs", pick="min"),
        Evidence("CPU the pool's cgroups used", _USED, 0, "CPUs"),
    ),
    confidence=0.85,
    enrich=enrich,
    views=(
        Panel("Throttled periods over periods per pool", _share({}, (*NODE, "pool")), "ratio",
              THROTTLED_SHARE),
        Panel("Time throttled per second per pool",
              _rate("fleetscope_pool_cgroup_cpu_throttled_seconds_total", by=(*NODE, "pool")),
              "s/s", THROTTLED_SECONDS, role="victim"),
        Panel("CPU quota and CPU used per pool",
              Max(Selector("fleetscope_pool_cgroup_cpu_quota_cpus"), by=(*NODE, "pool")),
              "CPUs"),
        Panel("CPU used by the pool's cgroups",
              _rate("fleetscope_pool_cgroup_cpu_usage_seconds_total", by=(*NODE, "pool")),
              "CPUs"),
    ),
    fleet=FleetFault(("chat",), 5, 40, effects=(
        # the pool's own quota stops it in ~90 % of its 100 ms periods
        Set("cpu_quota_per_process", 0.4),
        Set("throttled_periods_rate", 9.1),
        Set("throttled_seconds_rate", 0.6),
    )),
    proof=Proof(scenario, summary=r"online pool chat-online throttled by its CPU quota in "
                                  r"\d+% of its periods",
                subjects=("cgroups", None),
                # an offline pool held to its quota is no one's harm: only the info tier
                cases=(Case("healthy-offline-at-quota", offline_at_quota,
                            findings=(("cpu-throttling", "info", ONGOING, "batch"),)),)),
)
