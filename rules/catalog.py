"""The rule catalog: one entry per rule id of CONTRACT section 7, as data.

Each rule holds the symptom, cause and action of shared/reference/troubleshooting.md, a
condition that is at once its Prometheus alert expression and what the Python engine
evaluates (rules/promql.py), the evidence shown with a finding (signal, threshold, unit),
a severity and a base confidence. Thresholds are gathered at the top, commented, so they
can be tuned in one place. `runbooks/<id>.md` explains each rule.

Conditions aggregate `by (instance)` so an exported alert fires per node; replayed bundles
have no `instance` label and fall into one group.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from .promql import AvgOverTime, Delta, Expr, Max, Rate, Recent, Selector, SetOp, Sum, Time

NODE_LABELS = ("instance",)  # which label names the node in a fleet Prometheus
NODE = NODE_LABELS
WINDOW = 60  # seconds: rate windows (short bundles are rated over their own span)

# Thresholds (fraction 0-1 unless a unit says otherwise). Where the field articles give a
# number it is cited; the rest are our policy, tuned on the scenario bundles in tests/.
CORE_IMBALANCE_SPREAD = 0.4  # busiest core minus the median core (window means)
CORE_WAIT = 0.2  # s/s runnable tasks wait on the most contended CPU's run queue
CORE_IMBALANCE_PSI = 0.2  # without per-CPU schedstat: tasks waited 20 % of the time
PSI_CPU_SOME = 0.6  # share of time some task waited for a CPU (PSI cpu some)
SATURATED_MEDIAN_CORE = 0.9  # the median core this busy: every core, not a few
RUNNABLE_PER_CPU = 1.0  # runnable tasks (procs_running, less the reader) per online CPU
NUMA_REMOTE_RATIO = 0.3  # share of a pool's resident memory on nodes its CPUs are not on
ONLINE_RUN_DELAY = 0.05  # s/s an online process's main thread waits for a CPU (50 ms a second)
OFFLINE_CPU = 0.25  # CPUs offline pools use on the node while online ones wait
STEAL_P90 = 0.1  # a tenth of the CPU time stolen on most cores
THREADS_PER_CORE = 2.0  # "more than ~2x as many runnable threads as physical cores"
NONVOLUNTARY_SWITCHES = 50.0  # per second, all threads of the pool: preempted, not waiting
FD_RATIO = 0.9  # open fds over RLIMIT_NOFILE (default 1024: "Too many open files")
IRQ_RATE_ON_ONLINE_CPUS = 500.0  # device interrupts per second on the online pool's CPUs
IRQ_TIME_SHARE = 0.05  # of the online CPUs' time in irq + softirq (a NIC-heavy core: 10-30 %)
BANDWIDTH_RATIO = 0.8  # DRAM read+write over the platform peak
LLC_MISS_RATIO = 0.2  # "L3 hit rate < 80 %"
ROCE_EVENTS = 100.0  # ECN-marked packets, CNPs, out-of-sequence per second on a port
PFC_PAUSES = 100.0  # PFC pause frames per second on an interface
QUEUE_DEPTH = 50.0  # tasks waiting in a queue
HEARTBEAT_AGE = 120.0  # seconds: "a task whose heartbeat is older than 120 s is requeued"
MIGRATIONS = 0.05  # session migrations per second in a pool (3 a minute)
BAD_ARGUMENTS_RATIO = 0.05  # tool calls with malformed arguments, per model
MODEL_LOAD_SECONDS = 5.0  # average model-load stage time
SIGILL_WINDOW = 900  # seconds: crashes this recent are news (in-process: the window)


@dataclass(frozen=True)
class Evidence:
    signal: str  # what the value is, for a person
    expr: Expr
    threshold: float
    unit: str
    pick: str = "max"  # several samples match a finding: report the max (or min)


def required_metrics(expr: Expr) -> set[str]:
    """Metrics an expression cannot be judged without: what `unless` excludes may be absent
    (`a unless b` is `a` where no b exists)."""
    if isinstance(expr, SetOp) and expr.op == "unless":
        return required_metrics(expr.left)
    if isinstance(expr, SetOp):
        return required_metrics(expr.left) | required_metrics(expr.right)
    return expr.metrics()


@dataclass(frozen=True)
class Tier:
    """A lesser severity of a rule, for nodes where the rule's own condition does not hold:
    e.g. a worker parked in a network call (warning) before its heartbeat goes stale
    (critical), or SIGILL crashes older than the look-back (info)."""

    severity: str
    condition: Expr
    summary: str


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str  # critical | warning | info
    symptom: str
    cause: str
    action: str
    summary: str  # str.format template over the finding's labels and {value}
    condition: Expr
    evidence: tuple[Evidence, ...]
    confidence: float = 0.7
    for_seconds: int = 120  # Prometheus `for:`; the engine reports on the evidence it has
    subject_labels: dict[str, str] = field(default_factory=dict)  # subject kind -> label
    extra_requires: tuple[str, ...] = ()
    # Metrics whose presence alone shows the source was read (a counter family with no
    # series yet, e.g. no SIGILL ever): the rule is then evaluated, and found nothing.
    present_if: tuple[str, ...] = ()
    tiers: tuple[Tier, ...] = ()  # lesser severities, most severe first
    # "cause" rules name why; "symptom" rules (a saturated node, uneven cores) say what, and
    # rank after any cause of the same severity, which usually explains them.
    kind: str = "cause"

    def severities(self) -> list[tuple[str, Expr, str]]:
        """(severity, condition, summary) per tier, most severe first. A lesser tier's
        condition excludes the nodes where a more severe one holds, so a node gets one
        finding (and one alert) per rule."""
        out = [(self.severity, self.condition, self.summary)]
        higher = self.condition
        for tier in self.tiers:
            out.append((tier.severity, tier.condition.unless(higher, NODE), tier.summary))
            higher = higher | tier.condition
        return out

    def requires(self) -> set[str]:
        metrics = self.condition.metrics()
        for tier in self.tiers:
            metrics |= tier.condition.metrics()
        return metrics | set(self.extra_requires)

    def alternatives(self) -> list[set[str]]:
        """Metric sets any one of which lets the rule be evaluated: a condition of the form
        `a or b` is evaluable when either side's signals exist."""
        sides = []
        for condition in (self.condition, *(tier.condition for tier in self.tiers)):
            if isinstance(condition, SetOp) and condition.op == "or":
                sides += [required_metrics(condition.left), required_metrics(condition.right)]
            else:
                sides.append(required_metrics(condition))
        return [side | set(self.extra_requires) for side in sides]

    @property
    def needs_rates(self) -> bool:
        text = " ".join(condition.promql() for _, condition, _ in self.severities())
        return any(f"{fn}(" in text for fn in ("rate", "increase", "delta"))

    @property
    def alert_name(self) -> str:
        return "Fleetscope" + "".join(part.capitalize() for part in self.id.split("-"))

    def render_summary(self, labels: dict[str, str], value: float,
                       template: str | None = None) -> str:
        class _Default(dict):
            def __missing__(self, key):
                return "?"

        template = self.summary if template is None else template
        try:
            return template.format_map(_Default(labels, value=value))
        except (ValueError, TypeError):
            return template


def busy_ratio(stat: str) -> Expr:
    return Max(Selector("fleetscope_cpu_core_busy_ratio", {"stat": stat}), by=NODE)


_CORE_WAIT = Max(Selector("fleetscope_schedstat_core_waiting_ratio", {"stat": "max"}), by=NODE)
_PSI_CPU = Sum(Rate(Selector("fleetscope_pressure_stall_seconds_total",
                             {"resource": "cpu", "stall": "some"}), WINDOW), by=NODE)
def busy_ratio_over_window(stat: str) -> Expr:
    return Max(AvgOverTime(Selector("fleetscope_cpu_core_busy_ratio", {"stat": stat}), WINDOW),
               by=NODE)


# The spread of the window's mean, not of one interval: a bursty process on the median core
# (busy 0.15-0.57 from one second to the next beside a pinned hog on a 2-core node) would
# otherwise decide each step alone. 0.4, not 0.5: three tasks queued on a pinned core while
# the median core was 0.3-0.6 busy with other work (window means) is the fault, and 0.5
# missed it in 1 of 5 live runs; the saturated core and the waiting keep a busy-but-even
# node out.
_SPREAD = busy_ratio_over_window("max") - busy_ratio_over_window("p50")
_UNEVEN = ((_SPREAD > CORE_IMBALANCE_SPREAD)
           .and_on(Max(Selector("fleetscope_cpu_saturated_cores"), by=NODE) >= 1, NODE))
CORE_IMBALANCE = Rule(
    id="core-imbalance",
    severity="warning",
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
               | _UNEVEN.and_on(_PSI_CPU > CORE_IMBALANCE_PSI, NODE)
               .unless(Max(Selector("fleetscope_schedstat_core_waiting_ratio"), by=NODE), NODE)),
    evidence=(
        Evidence("busiest core minus median core busy (window mean)", _SPREAD,
                 CORE_IMBALANCE_SPREAD, "ratio"),
        Evidence("run-queue wait on the most contended core", _CORE_WAIT, CORE_WAIT, "s/s"),
        Evidence("CPU pressure (PSI cpu some)", _PSI_CPU, CORE_IMBALANCE_PSI, "ratio"),
        Evidence("busiest core busy", busy_ratio("max"), 0.9, "ratio"),
        Evidence("median core busy", busy_ratio("p50"), 0.5, "ratio", pick="min"),
        Evidence("saturated cores", Max(Selector("fleetscope_cpu_saturated_cores"), by=NODE),
                 1, "cores"),
    ),
    # A symptom more often than a cause: preemption, IRQ overlap and the like rank first.
    confidence=0.5,
    kind="symptom",
)

_PSI_CPU = Sum(Rate(Selector("fleetscope_pressure_stall_seconds_total",
                             {"resource": "cpu", "stall": "some"}), WINDOW), by=NODE)
# procs_running counts the task reading /proc/stat (the exporter itself): one less is the
# node's own work.
_RUNNABLE_PER_CPU = ((Max(Selector("fleetscope_procs_running"), by=NODE) - 1)
                     / Sum(Selector("fleetscope_cpu_numa_node_cpus"), by=NODE))
CPU_SATURATION = Rule(
    id="cpu-saturation",
    severity="warning",
    symptom="every request slow at once; the gateway's CPU > 85 % backpressure engages",
    cause="the node is out of CPU: more runnable work than cores on every core, tasks "
          "waiting for a CPU most of the time",
    action="find the top CPU consumers (top -H; fleetscope diagnose names them); move or "
           "limit batch work (cpu.max), scale out the pool, or lower the node's session quota",
    summary="CPU saturated: tasks waited for a CPU {value:.0%} of the time, every core busy",
    # Every core busy (the median one too) and tasks queueing: a busy node whose cores all
    # keep up (one compile job per core) has little PSI and does not fire.
    condition=((_PSI_CPU > PSI_CPU_SOME)
               .and_on(busy_ratio("p50") > SATURATED_MEDIAN_CORE, NODE)
               .and_on(_RUNNABLE_PER_CPU > RUNNABLE_PER_CPU, NODE)),
    evidence=(
        Evidence("CPU pressure (PSI cpu some)", _PSI_CPU, PSI_CPU_SOME, "ratio"),
        Evidence("median core busy", busy_ratio("p50"), SATURATED_MEDIAN_CORE, "ratio"),
        Evidence("runnable tasks per CPU", _RUNNABLE_PER_CPU, RUNNABLE_PER_CPU, "tasks"),
    ),
    confidence=0.6,
    kind="symptom",
)

_REMOTE_RATIO = Max(Selector("fleetscope_pool_numa_remote_memory_ratio"),
                    by=(*NODE, "pool", "class"))
_OTHER_NODE_PAGES = Sum(Rate(Selector("fleetscope_numastat_pages_total",
                                      {"field": "other_node"}), WINDOW), by=NODE)

NUMA_REMOTE_ACCESS = Rule(
    id="numa-remote-access",
    severity="warning",
    symptom="node CPU not high but throughput will not rise",
    cause="cross-NUMA memory access: a pool's processes run on one NUMA node while their "
          "memory sits on another",
    action="bind CPU and memory together (numactl --cpunodebind=N --membind=N, or the "
           "cpuset/topology manager); split model and state per NUMA domain",
    summary="pool {pool}: {value:.0%} of resident memory on remote NUMA nodes",
    condition=_REMOTE_RATIO > NUMA_REMOTE_RATIO,
    evidence=(
        Evidence("share of the pool's memory on remote nodes", _REMOTE_RATIO,
                 NUMA_REMOTE_RATIO, "ratio"),
        Evidence("pages allocated off-node per second (numastat other_node)",
                 _OTHER_NODE_PAGES, 0, "pages/s"),
    ),
    confidence=0.75,
)

def _pool(metric: str, matchers: dict | None = None) -> Selector:
    return Selector(metric, matchers)


_POOL = (*NODE, "pool", "class")
# Per process (main thread), so a pool of 40 workers is held to the same bar as one of 4.
_ONLINE_DELAY = (Sum(Rate(_pool("fleetscope_pool_run_delay_seconds_total", {"class": "online"}),
                          WINDOW), by=_POOL)
                 / Sum(Selector("fleetscope_pool_processes", {"class": "online"}), by=_POOL))
_OFFLINE_CPU = Sum(Rate(_pool("fleetscope_pool_cpu_seconds_total", {"class": "offline"}),
                        WINDOW), by=NODE)
_STEAL_P90 = Max(Selector("fleetscope_cpu_core_steal_ratio", {"stat": "p90"}), by=NODE)

OFFLINE_PREEMPTION = Rule(
    id="offline-preemption",
    severity="warning",
    symptom="online P99 latency jumps around (200 ms -> 1 s)",
    cause="offline/batch jobs (or a noisy VM neighbour: steal) take CPU from online agents on "
          "the same node",
    action="separate online and offline pools; give offline cgroups strict CPU limits "
           "(cpu.max) or move them off the online pool's CPUs",
    summary="online pool {pool} waits {value:.2f} s/s for CPU while offline work runs",
    condition=((_ONLINE_DELAY > ONLINE_RUN_DELAY).and_on(_OFFLINE_CPU > OFFLINE_CPU, NODE)
               | (_ONLINE_DELAY > ONLINE_RUN_DELAY).and_on(_STEAL_P90 > STEAL_P90, NODE)),
    evidence=(
        Evidence("online pool run-queue delay per process", _ONLINE_DELAY, ONLINE_RUN_DELAY,
                 "s/s"),
        Evidence("offline pools' CPU use", _OFFLINE_CPU, OFFLINE_CPU, "CPUs"),
        Evidence("steal on the p90 core", _STEAL_P90, STEAL_P90, "ratio"),
        Evidence("online pool cgroup CPU pressure (some)",
                 Sum(Rate(Selector("fleetscope_pool_cgroup_cpu_pressure_stall_seconds_total",
                                   {"class": "online", "stall": "some"}), WINDOW), by=_POOL),
                 0.1, "s/s"),
    ),
    confidence=0.8,
    extra_requires=(),
)

_THREADS_PER_CORE = Max(Selector("fleetscope_pool_threads_per_core"), by=_POOL)
# Runnable threads per physical core, estimated from the threads read: their runnable
# share times the pool's threads per core. Exact when every thread was read (a live node,
# a bundle with task/ directories); from the main threads alone in a bundle without them.
_RUNNABLE_PER_CORE = (Max(Selector("fleetscope_pool_runnable_threads"), by=_POOL)
                      / Max(Selector("fleetscope_pool_threads_read"), by=_POOL)
                      * _THREADS_PER_CORE)
_NONVOLUNTARY = Sum(Rate(Selector("fleetscope_pool_context_switches_total",
                                  {"kind": "nonvoluntary"}), WINDOW), by=_POOL)
THREAD_OVERSUBSCRIPTION = Rule(
    id="thread-oversubscription",
    severity="warning",
    symptom="throughput drops as threads are added",
    cause="more than ~2x as many runnable threads as physical cores: context-switch cost eats "
          "the CPU",
    action="size thread pools to the physical cores (e.g. OMP_NUM_THREADS, worker counts); "
           "use async I/O instead of a thread per request",
    summary="pool {pool}: {value:.1f} runnable threads per physical core, preempted often",
    # Every thread of the pool (/proc/<pid>/task/*): runnable ones over the cores, and their
    # nonvoluntary switches, which rise as the problem worsens.
    condition=(_RUNNABLE_PER_CORE > THREADS_PER_CORE).and_on(
        _NONVOLUNTARY > NONVOLUNTARY_SWITCHES, (*NODE, "pool")),
    evidence=(
        Evidence("runnable threads per physical core", _RUNNABLE_PER_CORE, THREADS_PER_CORE,
                 "threads"),
        Evidence("nonvoluntary context switches (all threads)", _NONVOLUNTARY,
                 NONVOLUNTARY_SWITCHES, "1/s"),
        Evidence("threads per physical core", _THREADS_PER_CORE, THREADS_PER_CORE, "threads"),
    ),
    confidence=0.65,
)

_FD_RATIO = Max(Selector("fleetscope_pool_fd_usage_ratio"), by=_POOL)
FD_EXHAUSTION = Rule(
    id="fd-exhaustion",
    severity="critical",
    symptom='"Too many open files" as agents scale',
    cause="a process is close to its file-descriptor limit (RLIMIT_NOFILE, 1024 by default)",
    action="raise nofile to >= 65535 (LimitNOFILE= in the unit, ulimit -n, the container "
           "runtime) before deploying; look for fd leaks (ls -l /proc/PID/fd)",
    summary="pool {pool}: a process uses {value:.0%} of its open-file limit",
    condition=_FD_RATIO > FD_RATIO,
    evidence=(
        Evidence("open fds over RLIMIT_NOFILE (worst process)", _FD_RATIO, FD_RATIO, "ratio"),
        Evidence("open fds of that process",
                 Max(Selector("fleetscope_pool_fd_usage_open_fds"), by=_POOL), 0, "fds"),
        Evidence("its soft limit", Max(Selector("fleetscope_pool_fd_usage_limit_fds"), by=_POOL),
                 65535, "fds", pick="min"),
    ),
    confidence=0.9,
)

_OVERLAP = Max(Selector("fleetscope_irq_online_pool_overlap_cpus"), by=(*NODE, "pool"))
_IRQ_ON_ONLINE = Sum(Rate(Selector("fleetscope_irq_online_pool_device_interrupts_total"),
                          WINDOW), by=(*NODE, "pool"))
# Share of the online pool's CPU time spent in hard + soft interrupts.
_IRQ_SHARE = (Sum(Rate(Selector("fleetscope_irq_online_pool_irq_seconds_total"), WINDOW),
                  by=(*NODE, "pool"))
              / Max(Selector("fleetscope_irq_online_pool_cpus"), by=(*NODE, "pool")))
_ONLINE_POOL_DELAY = (Sum(Rate(_pool("fleetscope_pool_run_delay_seconds_total",
                                     {"class": "online"}), WINDOW), by=(*NODE, "pool"))
                      / Sum(Selector("fleetscope_pool_processes", {"class": "online"}),
                            by=(*NODE, "pool")))
IRQ_CORE_OVERLAP = Rule(
    id="irq-core-overlap",
    severity="warning",
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
                                                               (*NODE, "pool")),
    evidence=(
        Evidence("device interrupts on the online pool's CPUs", _IRQ_ON_ONLINE,
                 IRQ_RATE_ON_ONLINE_CPUS, "1/s"),
        Evidence("share of the online CPUs' time in irq + softirq", _IRQ_SHARE,
                 IRQ_TIME_SHARE, "ratio"),
        Evidence("online pool run-queue delay per process", _ONLINE_POOL_DELAY,
                 ONLINE_RUN_DELAY, "s/s"),
        Evidence("online pool CPUs targeted by device IRQ affinity", _OVERLAP, 0, "cpus"),
    ),
    confidence=0.6,
)

_SIGILL = Selector("fleetscope_sigill_crashes_total")
_SIGILL_AGE = Time() - Max(Selector("fleetscope_sigill_last_crash_timestamp_seconds"), by=NODE)
ISA_MISMATCH = Rule(
    id="isa-mismatch",
    severity="critical",
    symptom="some nodes crash as soon as a task starts",
    cause="a binary built for a newer instruction set than this node's CPU (e.g. "
          "-march=native on a newer stepping) dies with SIGILL",
    action="rebuild for the fleet's common baseline (no -march=native; x86-64-v2/v3 or "
           "armv8.2-a as the oldest stepping allows) and redeploy; fleetscope isa check BINARY "
           "names the missing extension",
    summary="SIGILL (illegal instruction) crashes, the last {value:.0f} s before the window's "
            "end",
    # Crashes inside the look-back (Prometheus: the last 15 minutes; in-process: inside the
    # window, see Recent), one finding per node naming every crashing binary (enrichment).
    # Older crashes are only information: a node that once ran a bad build is not sick now.
    condition=Recent(_SIGILL_AGE, SIGILL_WINDOW),
    tiers=(Tier("info", _SIGILL_AGE >= 0,
                "earlier SIGILL crashes, the last {value:.0f} s before the window's end"),),
    evidence=(
        Evidence("SIGILL crashes in the kernel log", Sum(Max(_SIGILL, by=(*NODE, "binary")),
                                                         by=NODE), 0, "crashes"),
        Evidence("seconds since the last SIGILL crash", _SIGILL_AGE, SIGILL_WINDOW, "s",
                 pick="min"),
    ),
    confidence=0.9,
    for_seconds=0,  # an event: one crash in the window is the finding
    present_if=("fleetscope_sigill_reports_suppressed_total",),
)

_BANDWIDTH = Max(Selector("fleetscope_memory_bandwidth_utilization_ratio"), by=NODE)
_LLC_MISS = Max(Selector("fleetscope_llc_miss_ratio"), by=NODE)
MEMORY_BANDWIDTH_SATURATION = Rule(
    id="memory-bandwidth-saturation",
    severity="warning",
    symptom="fine at low concurrency, stalls as concurrency rises",
    cause="DRAM bandwidth near the platform's peak: cores wait on memory (L3 misses high, "
          "IPC falls)",
    action="fewer sessions per node or more memory channels; improve locality (NUMA binding, "
           "smaller working sets, quantised weights shared per NUMA node)",
    summary="memory bandwidth at {value:.0%} of the platform peak",
    condition=(_BANDWIDTH > BANDWIDTH_RATIO).and_on(_LLC_MISS > LLC_MISS_RATIO, NODE),
    evidence=(
        Evidence("DRAM bandwidth over platform peak", _BANDWIDTH, BANDWIDTH_RATIO, "ratio"),
        Evidence("L3/LLC miss ratio", _LLC_MISS, LLC_MISS_RATIO, "ratio"),
        Evidence("DRAM bandwidth", Sum(Selector("fleetscope_memory_bandwidth_bytes_per_second"),
                                       by=NODE), 0, "bytes/s"),
        Evidence("instructions per cycle", Max(Selector("fleetscope_instructions_per_cycle"),
                                               by=NODE), 1.0, "ipc", pick="min"),
    ),
    confidence=0.75,
)

_ROCE = Sum(Rate(Selector("fleetscope_rdma_hw_stats_total",
                          {"counter": "~np_ecn_marked_roce_packets|np_cnp_sent|rp_cnp_handled|"
                                      "out_of_sequence|packet_seq_err"}), WINDOW),
            by=(*NODE, "device"))
_PFC = Sum(Rate(Selector("fleetscope_nic_pfc_pause_frames_total"), WINDOW),
           by=(*NODE, "interface"))
ROCE_CONGESTION = Rule(
    id="roce-congestion",
    severity="warning",
    symptom="Redis / storage latency high, cross-node bandwidth low, jitter",
    cause="congestion on a shared network plane: ECN marks and CNPs, PFC pauses; storage and "
          "business traffic mixed, or PFC watermarks misconfigured",
    action="separate storage and business planes; check PFC watermarks and ECN (DCQCN) on "
           "NICs and switches; RoCEv2 packet loss must be zero",
    summary="RoCE congestion signals at {value:g}/s",
    condition=(_ROCE > ROCE_EVENTS) | (_PFC > PFC_PAUSES),
    evidence=(
        Evidence("ECN marks, CNPs and sequence errors on the RDMA port", _ROCE, ROCE_EVENTS,
                 "1/s"),
        Evidence("PFC pause frames", _PFC, PFC_PAUSES, "1/s"),
    ),
    confidence=0.7,
    subject_labels={"devices": "device", "interfaces": "interface"},
)

_DEPTH = Max(Selector("agent_queue_depth"), by=(*NODE, "pool", "queue"))
_GROWTH = Max(Delta(Selector("agent_queue_depth"), WINDOW), by=(*NODE, "pool", "queue"))
QUEUE_BACKLOG = Rule(
    id="queue-backlog",
    severity="warning",
    symptom="end-to-end latency rises, queue keeps growing",
    cause="the orchestration layer is saturated: tasks arrive faster than workers dispatch "
          "them (serial scheduling, lock contention, too few CPU workers)",
    action="scale out CPU workers for the pool; look for lock waits in the framework "
           "(fleetscope stacks PID); apply backpressure at the gateway (token bucket, 429)",
    summary="queue {queue} of pool {pool} holds {value:g} tasks and grows",
    condition=(_DEPTH > QUEUE_DEPTH).and_on(_GROWTH > 0, (*NODE, "pool", "queue")),
    evidence=(
        Evidence("tasks waiting", _DEPTH, QUEUE_DEPTH, "tasks"),
        Evidence("growth over the window", _GROWTH, 0, "tasks"),
        Evidence("busiest core busy", busy_ratio("max"), 0.9, "ratio"),
    ),
    confidence=0.7,
)

_HEARTBEAT = Max(Selector("agent_task_heartbeat_age_seconds"), by=(*NODE, "pool"))
_TIMEOUTS = Sum(Rate(Selector("agent_tool_calls_total", {"outcome": "timeout"}), WINDOW),
                by=(*NODE, "pool"))
_BLOCKED = Max(Selector("fleetscope_pool_blocked_network_threads"), by=(*NODE, "pool"))
_LONGEST_WAIT = Max(Selector("fleetscope_pool_network_wait_longest_seconds"),
                    by=(*NODE, "pool"))
WORKER_BLOCKED = Rule(
    id="worker-blocked-external-call",
    severity="critical",
    symptom="agent task times out, no log lines",
    cause="a worker is blocked in an external API or tool call (no timeout, exhausted "
          "connection pool)",
    action="give every tool call its own timeout and a circuit breaker; check the connection "
           "pool size; fleetscope stacks PID shows the blocking call",
    summary="pool {pool}: oldest in-flight task silent for {value:.0f} s",
    condition=_HEARTBEAT > HEARTBEAT_AGE,
    # Earlier, from the kernel: a worker thread parked in a network call longer than the
    # node config's blocked_call_seconds (default 30 s) - before the heartbeat goes stale.
    tiers=(Tier("warning", _BLOCKED > 0,
                "pool {pool}: {value:.0f} worker thread(s) parked in a network call"),),
    evidence=(
        Evidence("oldest in-flight task heartbeat age", _HEARTBEAT, HEARTBEAT_AGE, "s"),
        Evidence("worker threads parked in a network call", _BLOCKED, 0, "threads"),
        Evidence("longest network wait of a worker thread", _LONGEST_WAIT, 30, "s"),
        Evidence("tool calls timing out", _TIMEOUTS, 0, "1/s"),
    ),
    confidence=0.8,
)

_MIGRATIONS = Sum(Rate(Selector("agent_session_migrations_total"), WINDOW), by=(*NODE, "pool"))
SESSION_AFFINITY_LOSS = Rule(
    id="session-affinity-loss",
    severity="warning",
    symptom="a session gets slow half-way",
    cause="the scheduler moves sessions to other nodes, which then re-sync their context",
    action="route by session id (consistent hashing), stick-and-redirect failover, longer "
           "stickiness; check health-check flapping",
    summary="pool {pool}: {value:.2f} session migrations per second",
    condition=_MIGRATIONS > MIGRATIONS,
    evidence=(Evidence("session migrations", _MIGRATIONS, MIGRATIONS, "1/s"),),
    confidence=0.65,
)

_BY_MODEL = (*NODE, "pool", "model")
_BAD_RATIO = (Sum(Rate(Selector("agent_tool_calls_total", {"outcome": "bad_arguments"}),
                       WINDOW), by=_BY_MODEL)
              / Sum(Rate(Selector("agent_tool_calls_total"), WINDOW), by=_BY_MODEL))
QUANTIZATION_TOOL_ERRORS = Rule(
    id="quantization-tool-errors",
    severity="warning",
    symptom="tool-call arguments sometimes malformed",
    cause="the model is quantised too aggressively (e.g. Q2_K) to produce valid tool-call "
          "arguments",
    action="compare tool-call success of Q4_K_M against Q8_0 on a test set; move the pool to "
           "the better quantisation",
    summary="model {model} in pool {pool}: {value:.0%} of tool calls had malformed arguments",
    condition=_BAD_RATIO > BAD_ARGUMENTS_RATIO,
    evidence=(Evidence("tool calls with bad arguments", _BAD_RATIO, BAD_ARGUMENTS_RATIO,
                       "ratio"),),
    confidence=0.7,
)

_LOAD = (Sum(Rate(Selector("agent_stage_duration_seconds_sum", {"stage": "model_load"}),
                  300, increase=True), by=(*NODE, "pool"))
         / Sum(Rate(Selector("agent_stage_duration_seconds_count", {"stage": "model_load"}),
                    300, increase=True), by=(*NODE, "pool")))
COLD_START = Rule(
    id="cold-start",
    severity="warning",
    symptom="first request after a restart is very slow",
    cause="the model is loaded cold on the first request",
    action="keep warm instances; preload models at start (readiness only after the load)",
    summary="pool {pool}: model loads take {value:.1f} s on average",
    condition=_LOAD > MODEL_LOAD_SECONDS,
    evidence=(Evidence("average model-load stage", _LOAD, MODEL_LOAD_SECONDS, "s"),),
    confidence=0.65,
    for_seconds=0,  # an event: a slow load in the last 5 minutes is the finding
)

class Registry(Sequence):
    """The catalog: every registered rule, in rank order (ties between equally severe, equally
    confident findings go to the rule ranked first: causes first). A live sequence: what
    imports it (the engine, `rules list`, `rules export`, the console) sees a rule registered
    later, e.g. a throwaway rule in a test."""

    def __init__(self) -> None:
        self._rules: dict[str, tuple[float, int, Rule]] = {}

    def register(self, rule: Rule, rank: float | None = None) -> Rule:
        if rule.id in self._rules:
            raise ValueError(f"rule {rule.id} is registered already")
        rank = float(len(self._rules)) if rank is None else rank
        self._rules[rule.id] = (rank, len(self._rules), rule)
        return rule

    def unregister(self, rule_id: str) -> None:
        del self._rules[rule_id]

    @contextmanager
    def registered(self, rule: Rule, rank: float | None = None) -> Iterator[Rule]:
        """Register a rule for the length of a block (tests)."""
        self.register(rule, rank)
        try:
            yield rule
        finally:
            self.unregister(rule.id)

    def _ordered(self) -> list[Rule]:
        return [rule for _, _, rule in sorted(self._rules.values(), key=lambda e: e[:2])]

    def __getitem__(self, index):
        return self._ordered()[index]

    def __len__(self) -> int:
        return len(self._rules)

    def __iter__(self) -> Iterator[Rule]:
        return iter(self._ordered())

    def ids(self) -> tuple[str, ...]:
        return tuple(rule.id for rule in self)


class _Ids(Sequence):
    """RULE_IDS: the registered rule ids, derived from the registry (never hand-listed)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def __getitem__(self, index):
        return self._registry.ids()[index]

    def __len__(self) -> int:
        return len(self._registry)

    def __repr__(self) -> str:
        return repr(self._registry.ids())


CATALOG = Registry()
register = CATALOG.register
# Order breaks ties between equally severe, equally confident findings: causes first.
for _rule in (
    ISA_MISMATCH,
    WORKER_BLOCKED,
    FD_EXHAUSTION,
    OFFLINE_PREEMPTION,
    MEMORY_BANDWIDTH_SATURATION,
    NUMA_REMOTE_ACCESS,
    ROCE_CONGESTION,
    QUEUE_BACKLOG,
    IRQ_CORE_OVERLAP,
    THREAD_OVERSUBSCRIPTION,
    QUANTIZATION_TOOL_ERRORS,
    SESSION_AFFINITY_LOSS,
    COLD_START,
    CPU_SATURATION,
    CORE_IMBALANCE,
):
    register(_rule)

RULE_IDS = _Ids(CATALOG)
# CONTRACT section 7: the ids the catalog holds at least (it may hold more, e.g.
# cpu-saturation).
CONTRACT_RULE_IDS = (
    "worker-blocked-external-call", "numa-remote-access", "memory-bandwidth-saturation",
    "isa-mismatch", "offline-preemption", "roce-congestion", "queue-backlog",
    "thread-oversubscription", "fd-exhaustion", "core-imbalance", "irq-core-overlap",
    "session-affinity-loss", "quantization-tool-errors", "cold-start",
)


def by_id(rule_id: str) -> Rule:
    for rule in CATALOG:
        if rule.id == rule_id:
            return rule
    raise KeyError(rule_id)
