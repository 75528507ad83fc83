"""irq-core-overlap: device interrupts land on the CPUs the online agents run on, and cost
them time.

Condition: device interrupts on the online pool's CPUs above 500/s and the share of those
CPUs' time in irq + softirq above 5 %. Enrichment: the CPUs that took the most interrupts
and the devices behind them.
"""

from __future__ import annotations

from fleetscope.collectors.irq import INTERRUPTS
from fleetscope.collectors.parsers.process import parse_status
from fleetscope.collectors.parsers.sysfs import parse_cpulist
from fleetscope.collectors.shared import process_file

from ..fleet import Add, FleetFault, Noisy, Set
from ..model import EXPLAINS_POOL, NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Max, Rate, Selector, Sum
from ..signals import ONLINE_RUN_DELAY, online_delay

RANK = 8
IRQ_RATE_ON_ONLINE_CPUS = 500.0  # device interrupts per second on the online pool's CPUs
IRQ_TIME_SHARE = 0.05  # of the online CPUs' time in irq + softirq (a NIC-heavy core: 10-30 %)
MAX_SUBJECTS = 5

_BY_POOL = (*NODE, "pool")
_OVERLAP = Max(Selector("fleetscope_irq_online_pool_overlap_cpus"), by=_BY_POOL)
_IRQ_ON_ONLINE = Sum(Rate(Selector("fleetscope_irq_online_pool_device_interrupts_total"),
                          WINDOW), by=_BY_POOL)
# Share of the online pool's CPU time spent in hard + soft interrupts.
_IRQ_SHARE = (Sum(Rate(Selector("fleetscope_irq_online_pool_irq_seconds_total"), WINDOW),
                  by=_BY_POOL)
              / Max(Selector("fleetscope_irq_online_pool_cpus"), by=_BY_POOL))


def enrich(ctx, finding) -> None:
    """The online pool's CPUs that took the most device interrupts over the window, and
    the IRQs (device names) behind them."""
    from fleetscope.collectors.irq import row_kind
    from fleetscope.collectors.parsers.interrupts import parse_interrupts

    allowed: set[int] = set()
    for process in ctx.pool_members(ctx.last, finding.labels.get("pool")):
        status = ctx.read(ctx.last, process_file(process.pid, "status"), parse_status) or {}
        allowed |= set(parse_cpulist(status.get("Cpus_allowed_list", "")))
    before = ctx.read(ctx.first, INTERRUPTS, parse_interrupts)
    after = ctx.read(ctx.last, INTERRUPTS, parse_interrupts)
    if after is None:
        return
    earlier = {row.name: row.counts for row in (before.rows if before else [])}
    per_cpu: dict[int, int] = {}
    per_irq: dict[str, int] = {}
    for row in after.rows:
        if not row.per_cpu or row_kind(row) != "device":
            continue
        then = earlier.get(row.name, (0,) * len(row.counts))
        for cpu, now, old in zip(after.cpus, row.counts, then, strict=False):
            if cpu in allowed and now > old:
                per_cpu[cpu] = per_cpu.get(cpu, 0) + now - old
                name = row.description.split()[-1] if row.description else row.name
                per_irq[name] = per_irq.get(name, 0) + now - old
    hot = sorted(per_cpu, key=lambda cpu: -per_cpu[cpu])
    finding.subjects["cpus"] = sorted(hot[:MAX_SUBJECTS * 2])
    top_irqs = sorted(per_irq, key=lambda name: -per_irq[name])[:3]
    if hot:
        finding.extra_summary = (f"most on CPU {', '.join(map(str, hot[:4]))}"
                                 + (f" from {', '.join(top_irqs)}" if top_irqs else ""))


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.kp_scenario(
        "irq-core-overlap", "agent-kp-06",
        "irqbalance is off and the hns3 port keeps the driver's placement, one TxRx vector "
        "per CPU, so 12 of its 16 queues interrupt the online workers' CPUs (4-15) under "
        "14 Gbit/s of traffic",
        "12 online-pool CPUs in device IRQ affinity masks, ~33,000 device interrupts/s on "
        "them, softirq time on the worker cores, session latency jitter",
        uptime_days=9.9, procs=k.daemons(k.KUNPENG) + k.workers(k.KUNPENG, k.ONLINE_KP, 1.5,
                                                          threads=(6, 6, 6, 6)),
        background=k.background(k.KUNPENG, 0.15, 0.12),
        profile={"system": 0.14, "nice": 0.0, "irq": 0.04, "softirq": 0.18},
        irqs=k.kp_irqs(txrx_on_own_cpu=True, nic_irq_rate=44000.0), nic_gbps=14.0,
        agent=k.AgentPlan(sessions=16.0, session_median=0.27, session_sigma=0.85,
                        queue=[4, 5, 3, 6, 4, 5, 6, 4],
                        heartbeat=[0.8, 1.3, 0.7, 1.9, 1.1, 0.9, 1.5, 1.2]))


RULE = Rule(
    id="irq-core-overlap",
    severity="warning",
    explains=EXPLAINS_POOL,  # the online pool whose CPUs take the interrupts
    symptom="latency jitter under network load",
    cause="device interrupts (NIC queues) land on the CPUs the online agents run on",
    action="keep 10-15 % of cores for the system and IRQs: set /proc/irq/N/smp_affinity_list "
           "(or irqbalance --banirq / IRQBALANCE_BANNED_CPULIST) away from the workers' CPUs",
    summary="online pool {pool}: its CPUs handle {value:.0f} device interrupts per second",
    # Cause and harm: interrupts land on the online CPUs (/proc/interrupts) and cost them
    # time (irq+softirq share; the online pool's run delay is shown, but a worker may wait
    # for other reasons). A few dozen timer or virtio interrupts a second on an idle node
    # cost nothing and do not fire.
    condition=(_IRQ_ON_ONLINE > IRQ_RATE_ON_ONLINE_CPUS).and_on(_IRQ_SHARE > IRQ_TIME_SHARE,
                                                               _BY_POOL),
    evidence=(
        Evidence("device interrupts on the online pool's CPUs", _IRQ_ON_ONLINE,
                 IRQ_RATE_ON_ONLINE_CPUS, "1/s"),
        Evidence("share of the online CPUs' time in irq + softirq", _IRQ_SHARE,
                 IRQ_TIME_SHARE, "ratio"),
        Evidence("online pool run-queue delay per process", online_delay(_BY_POOL),
                 ONLINE_RUN_DELAY, "s/s"),
        Evidence("online pool CPUs targeted by device IRQ affinity", _OVERLAP, 0, "cpus"),
    ),
    confidence=0.6,
    enrich=enrich,
    views=(
        Panel("Device interrupts on the online pool's CPUs", _IRQ_ON_ONLINE, "1/s",
              IRQ_RATE_ON_ONLINE_CPUS),
        Panel("Online pool CPUs in device IRQ affinity masks", _OVERLAP, "cpus"),
    ),
    fleet=FleetFault(("chat",), 16, 120, effects=(
        # the NIC's IRQs land on 16 of the online pool's CPUs (every 8th core)
        Set("irq_overlap_cpus", 16.0),
        Set("irq_cpu_share", 0.12),
        Set("device_interrupt_rate", Noisy(5000, 2000, stream=44)),
        Add("node_softirq", 0.04),
        Add("irq_core_softirq", 0.3),
        Add("other_stretch", 0.5),
        Add("session_tail", 0.25),
    )),
    proof=Proof(scenario, summary=r"online pool chat-online: its CPUs handle \d+ device "
                                  r"interrupts per second"),
)
