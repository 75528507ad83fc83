"""A simulated fleet for `fleetscope demo`: the exporter's metrics for thousands of nodes.

    fleet = Fleet(nodes=4096, cores=128)
    series = fleet.series()                 # every node, the last two scrapes (60 s apart)
    fleet.faults[rule.id]                   # the nodes where that rule's fault was injected
    one = fleet.node_series("r007n12:9105") # one node over the last hours, per core too

The output is what the console reads from Prometheus: `rules.promql.Series` (metric name ->
label set -> [(t_ms, value)]) named as the exporter's metrics (docs/exporter.md, collectors) and
the agent signals (docs/metrics-and-rules.md), each series carrying `instance`. Node metadata rides
on `fleetscope_cpu_info` as the target labels a fleet's scrape config would add (`rack`,
`node_pool`), beside the collector's own (`model_name`, `variant`/`revision` or
`family`/`model`/`stepping`). The faults are found by running the real rule engine on it.

The layout is a reference cluster of the kind fleetscope watches: racks of 32
2-socket nodes (Kunpeng 920 in three steppings, two x86 generations), pools for online chat,
code generation, offline batch and a mixed pool, 2 RoCE ports per node, diurnal load, and the
fault of every registered rule that has one: its module says where it lands and how it moves
the metrics (rules/fleet.py), in the vocabulary of SIGNALS below, so this module holds no
rule id. Everything is a pure function of (seed, node, time): the last scrape of
`node_series` equals the one in `series`, and two runs give the same fleet. Values are
computed with numpy over all nodes at once; only the conversion to `Series` loops.

No streamlit here: the console's pages draw what this produces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from fleetscope.agent_runtime.schema import SESSION_BUCKETS, STAGES
from fleetscope.core.harm_targets import parse_harm_targets
from fleetscope.rules.fleet import Events, FleetFault, Set
from fleetscope.rules.promql import Series

STEP_S = 60  # seconds between scrapes
END_S = 1_764_660_000  # the last scrape: 2025-12-02 07:20 UTC, 15:20 in the fleet's UTC+8
LOCAL_UTC_OFFSET_H = 8

RACK_SIZE = 32


@dataclass(frozen=True)
class CpuModel:
    key: str
    arch: str
    vendor: str
    model_name: str
    identity: tuple[tuple[str, str], ...]  # the collector's identity labels
    stepping: str  # short name for people
    numa_nodes: int
    physical_cores_ratio: float  # physical cores per logical CPU (SMT halves it)
    peak_bytes_per_second: float  # both sockets' DRAM bandwidth
    features: str  # arm64 Features or x86 psABI level


CPU_MODELS = (
    CpuModel("kp920-r1p0", "aarch64", "HiSilicon", "HiSilicon Kunpeng 920",
             (("implementer", "0x48"), ("part", "0xd01"), ("variant", "0x1"), ("revision", "0")),
             "0xd01 r1p0", 4, 1.0, 375.4e9, "fp asimd aes pmull sha1 sha2 crc32 atomics asimddp"),
    CpuModel("kp920-r1p1", "aarch64", "HiSilicon", "HiSilicon Kunpeng 920",
             (("implementer", "0x48"), ("part", "0xd01"), ("variant", "0x1"), ("revision", "1")),
             "0xd01 r1p1", 4, 1.0, 375.4e9,
             "fp asimd aes pmull sha1 sha2 crc32 atomics asimddp asimdfhm"),
    CpuModel("kp920b", "aarch64", "HiSilicon", "HiSilicon Kunpeng 920B",
             (("implementer", "0x48"), ("part", "0xd02"), ("variant", "0x0"), ("revision", "0")),
             "0xd02 r0p0", 4, 1.0, 563.2e9,
             "fp asimd aes pmull sha1 sha2 crc32 atomics asimddp asimdfhm sve sve2 i8mm bf16"),
    CpuModel("xeon-8358", "x86_64", "GenuineIntel",
             "Intel(R) Xeon(R) Platinum 8358 CPU @ 2.60GHz",
             (("family", "6"), ("model", "106"), ("stepping", "6")),
             "6/106/6", 2, 0.5, 409.6e9, "x86-64-v4"),
    CpuModel("xeon-8480", "x86_64", "GenuineIntel", "Intel(R) Xeon(R) Platinum 8480+",
             (("family", "6"), ("model", "143"), ("stepping", "8")),
             "6/143/8", 2, 0.5, 614.4e9, "x86-64-v4"),
)
# The kernel each purchase batch was installed with (node_exporter's node_uname_info release).
KERNELS = ("5.10.0-136.12.0.86.oe2203sp1.{arch}", "5.10.0-182.0.0.95.oe2203sp3.{arch}")
# Racks were bought in batches: the model of rack r is RACK_MODELS[r % 8].
RACK_MODELS = (0, 1, 2, 3, 0, 1, 2, 4)

NODE_POOLS = ("chat", "codegen", "batch", "mixed")
# Node pools whose nodes carry inference modules, and the modules per CPU architecture: what
# they are, the exporter that reports them, and (listed, not listed) driver/firmware pairs of
# examples/accelerator-matrix.yaml: the second is the vendor's other release the matrix pairs
# with other firmware (docs/accelerators.md).
# Half the fleet, four modules a node: the console's first render pays for every series
# the rules read.
MODULE_POOLS = ("codegen", "batch")
MODULES_PER_NODE = 4


@dataclass(frozen=True)
class ModuleModel:
    vendor: str
    model: str
    source: str
    memory_bytes: float
    pairs: tuple[tuple[str, str], tuple[str, str]]  # (driver, firmware) listed, not listed
    module: str  # the serving engine the agent runtime names in agent_module_queue_depth


MODULE_MODELS = {
    "x86_64": ModuleModel("nvidia", "NVIDIA A100-SXM4-80GB", "dcgm-exporter", 81228 * 2 ** 20,
                          (("535.183.06", "92.00.45.00.05"), ("525.105.03", "92.00.36.00.02")),
                          "vllm"),
    "aarch64": ModuleModel("huawei", "910B", "npu-exporter", 65536 * 2 ** 20,
                           (("24.1.rc1", "7.1.0.6.220"), ("23.0.3", "7.1.0.6.220")), "mindie"),
}
NODE_POOL_SHARE = (0.40, 0.25, 0.25, 0.10)


@dataclass(frozen=True)
class WorkloadPool:
    name: str
    workload_class: str
    processes: int
    threads_per_process: int
    sessions_per_second: float
    model: str
    tools: tuple[str, ...]
    queue: str
    stages: tuple[tuple[str, float], ...]  # mean seconds per session in each stage


WORKLOAD_POOLS = (
    WorkloadPool("chat-online", "online", 24, 4, 25.0, "qwen2.5-7b-instruct-q4_k_m",
                 ("search", "kv_lookup"), "tasks:chat",
                 (("queue_wait", 0.04), ("context_assembly", 0.03), ("inference", 0.14),
                  ("tool_call", 0.09), ("state_io", 0.035), ("other", 0.03))),
    WorkloadPool("codegen-online", "online", 16, 6, 8.0, "qwen2.5-coder-14b-instruct-q4_k_m",
                 ("code_exec", "repo_search"), "tasks:codegen",
                 (("queue_wait", 0.10), ("context_assembly", 0.08), ("inference", 0.60),
                  ("tool_call", 0.50), ("state_io", 0.07), ("other", 0.10))),
    WorkloadPool("batch-offline", "offline", 6, 8, 2.0, "qwen2.5-1.5b-instruct-q8_0",
                 ("fetch",), "tasks:batch",
                 (("queue_wait", 3.0), ("context_assembly", 0.4), ("inference", 1.8),
                  ("tool_call", 1.5), ("state_io", 0.3), ("other", 0.2))),
)
# Workload pools running on each node pool: slot 0 always, slot 1 on mixed nodes only.
POOL_SLOTS = {"chat": (0, -1), "codegen": (1, -1), "batch": (2, -1), "mixed": (0, 2)}
# The pools' own session targets: codegen sessions take seconds by design.
DEMO_HARM_TARGETS = parse_harm_targets({"pools": {
    "chat-online": {"online_session_p99_seconds": 1.5},
    "codegen-online": {"online_session_p99_seconds": 8.0}}})
RDMA_COUNTERS = ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled",
                 "out_of_sequence", "packet_seq_err")
MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def faults() -> tuple[tuple[str, FleetFault], ...]:
    """(rule id, fault) of every placement of every registered rule that declares a fleet
    fault (rules/builtin/<rule>.py `fleet`). Sizes scale with the fleet; every fault gets at
    least one node. Whole-rack faults are placed first (they need racks no other fault took),
    the rest in rank order, then every rule's further placements (`also`)."""
    from fleetscope.rules.catalog import CATALOG

    first = [(rule.id, rule.fleet) for rule in CATALOG if rule.fleet is not None]
    further = [(rule_id, more) for rule_id, fault in first for more in fault.also]
    return (*sorted(first, key=lambda placed: placed[1].nodes != "rack"), *further)


# The simulator's vocabulary: the signals a rule's fault can move (rules/fleet.py), each a
# node's (per node and minute) or a workload pool's (per pool on the node and minute), and
# what it is. Effects apply where the fault is active, on top of the healthy value given.
NODE, POOL = "node", "pool"
SIGNALS = {
    # CPU
    "cpu_load": (NODE, "the median core's busy share before it clips at 3-90 %"),
    "busy_p50": (NODE, "the median core's busy share"),
    "busy_p90": (NODE, "the 90th percentile core's busy share"),
    "busy_max": (NODE, "the busiest core's busy share"),
    "hog_cores": (NODE, "share of the cores pinned busy by hogs (they set the node's p90)"),
    "core_wait_max": (NODE, "the largest share of time a core's tasks wait to run"),
    "cpu_pressure": (NODE, "PSI cpu some: share of time some task waits for a CPU"),
    "cpu_wait": (NODE, "seconds a second each CPU's tasks wait to run, beyond the load's"),
    "runnable_per_core": (NODE, "runnable tasks per core"),
    "steal_p90": (NODE, "the 90th percentile core's steal share (p50, min, max follow)"),
    "node_softirq": (NODE, "softirq share of every CPU beyond 5 % of its busy time"),
    "irq_core_softirq": (NODE, "softirq share of every 8th core (where device IRQs land)"),
    # memory
    "membw_ratio": (NODE, "DRAM bandwidth used over the peak"),
    "llc_miss_ratio": (NODE, "last-level cache misses over references"),
    "ipc": (NODE, "instructions per cycle"),
    "numa_remote_pages": (NODE, "pages a second allocated on another NUMA node"),
    "oom_kill_rate": (NODE, "OOM kills a second (memcg)"),
    "memory_pressure": (NODE, "PSI memory some: share of time some task stalls"),
    "allocation_stall_rate": (NODE, "allocation stalls a second"),
    # network
    "roce_ecn_rate": (NODE, "ECN-marked RoCE packets a second (CNPs follow)"),
    "pfc_pause_rate": (NODE, "PFC pause frames a second received"),
    "listen_overflow_rate": (NODE, "listen queue overflows (and drops) a second"),
    "listen_queue": (NODE, "connections waiting in the gateway's accept queue"),
    # inference modules (eight per node of the chat and codegen pools)
    "accel_util": (NODE, "the modules' mean utilisation"),
    "accel_util_swing": (NODE, "how far the modules' utilisation swings from one scrape to the "
                               "next (amplitude, 0-1)"),
    "accel_memory_ratio": (NODE, "device memory used over total of the node's first module"),
    "accel_last_xid": (NODE, "the first module's last XID (NVIDIA); on Ascend a raised error "
                             "code and health not OK"),
    "accel_ecc_uncorrected": (NODE, "uncorrected ECC errors a minute on the first module"),
    "accel_matrix_listed": (NODE, "1: the modules run a pair the matrix lists; 0: the vendor's "
                                  "other pair, which it does not"),
    # a workload pool's processes
    "threads_per_process": (POOL, "threads each process runs"),
    "runnable_share": (POOL, "share of the pool's threads runnable"),
    "nonvoluntary_switch_rate": (POOL, "involuntary context switches a second"),
    "process_start_rate": (POOL, "processes started a second"),
    "lock_waiters": (POOL, "processes waiting on a file lock"),
    "run_delay_per_process": (POOL, "run-queue delay seconds a second, per process"),
    "pool_cpu": (POOL, "CPUs the pool uses"),
    "cgroup_cpu_pressure": (POOL, "the pool cgroup's PSI cpu some (full is 30 % of it)"),
    "open_fds": (POOL, "open files of the pool's fullest process"),
    "fd_limit": (POOL, "its RLIMIT_NOFILE"),
    "throttled_periods_rate": (POOL, "CFS periods throttled a second (of 10)"),
    "throttled_seconds_rate": (POOL, "seconds throttled a second"),
    "cpu_quota_per_process": (POOL, "the cgroup's CPU quota per process (inf: none)"),
    "pids_limit": (POOL, "the cgroup's pids.max"),
    "pids_current": (POOL, "the cgroup's pids.current"),
    "pid_limit_hit_rate": (POOL, "forks refused at pids.max a second"),
    "nproc_limit": (POOL, "RLIMIT_NPROC of the pool's processes"),
    "numa_remote_ratio": (POOL, "share of the pool's memory on a remote NUMA node"),
    "irq_overlap_cpus": (POOL, "CPUs of an online pool that also serve device IRQs"),
    "irq_cpu_share": (POOL, "share of an online pool's CPU time in IRQs"),
    "device_interrupt_rate": (POOL, "device interrupts a second on an online pool's CPUs"),
    # a workload pool's agent runtime
    "queue_depth": (POOL, "tasks waiting in the pool's queue"),
    "module_queue_depth": (POOL, "requests waiting on the inference module's side"),
    "heartbeat_age": (POOL, "seconds since the oldest task's heartbeat"),
    "session_migration_rate": (POOL, "sessions moved to another worker a second"),
    "tool_timeout_share": (POOL, "share of tool calls that time out"),
    "tool_bad_arguments_share": (POOL, "share of tool calls with bad arguments"),
    "tool_model": (POOL, "the model named on the tool calls (at the last scrape)"),
    "cpu_stages_stretch": (POOL, "how many times longer inference and context assembly take"),
    "queue_wait_stretch": (POOL, "how many times longer sessions wait in the queue"),
    "state_io_stretch": (POOL, "how many times longer state reads and writes take"),
    "tool_call_stretch": (POOL, "how many times longer tool calls take"),
    "other_stretch": (POOL, "how many times longer the rest of a session takes"),
    "model_load_rate": (POOL, "model loads a second"),
    "model_load_seconds": (POOL, "seconds a model load takes"),
    "unexplained_session_seconds": (POOL, "session seconds outside every measured stage"),
    "session_tail": (POOL, "the log-normal width of session latency"),
    "session_error_share": (POOL, "share of sessions that fail (outcome error)"),
    "oldest_in_flight": (POOL, "seconds since the arrival of the oldest session in flight"),
}
POOL_CHOICES = ("first", "online", "offline")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64: a fast, well-spread hash of uint64 arrays."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(0xFFFFFFFFFFFFFFFF)
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9))
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB))
    return x ^ (x >> np.uint64(31))


def _uniform(seed: int, salt: int, *keys: np.ndarray) -> np.ndarray:
    """Deterministic uniform [0, 1) noise for every combination of the broadcast keys."""
    with np.errstate(over="ignore"):
        h = np.uint64(seed * 1_000_003 + salt)
        for key in keys:
            h = _mix(np.asarray(key).astype(np.uint64) ^ _mix(np.asarray(h, dtype=np.uint64)))
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _noise(seed: int, salt: int, *keys: np.ndarray) -> np.ndarray:
    """Deterministic noise, roughly normal (sum of three uniforms), mean 0 and sd 1."""
    total = sum(_uniform(seed, salt * 3 + j, *keys) for j in range(3))
    return (total - 1.5) * 2.0


def _erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf."""
    sign = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
               + 0.254829592) * t * np.exp(-x * x)
    return sign * y


def _index_effects(fault_list) -> tuple[dict[str, list], list]:
    """Signal -> [(placement number, effect)] and [(placement number, Events)], checked
    against the simulator's vocabulary."""
    effects_on: dict[str, list] = {name: [] for name in SIGNALS}
    events = []
    for number, (rule_id, fault) in enumerate(fault_list):
        for effect in fault.effects:
            if isinstance(effect, Events):
                if effect.pools is not None and effect.pools not in POOL_CHOICES:
                    raise ValueError(f"{rule_id}: events of pools={effect.pools!r}: a pool's "
                                     f"events take one of {POOL_CHOICES}, a node's None")
                events.append((number, effect))
                continue
            if not isinstance(effect, Set) or effect.signal not in SIGNALS:
                raise ValueError(f"{rule_id}: the simulated fleet has no signal "
                                 f"{getattr(effect, 'signal', effect)!r} (fleet_sim.SIGNALS)")
            if effect.pools not in POOL_CHOICES or (
                    SIGNALS[effect.signal][0] == NODE and effect.pools != "first"):
                raise ValueError(f"{rule_id}: {effect.signal} pools={effect.pools!r}: a "
                                 f"pool's signal takes one of {POOL_CHOICES}, a node's none")
            effects_on[effect.signal].append((number, effect))
    return effects_on, events


class Site:
    """Where a fault is active, as its effects' values see it: the rows' nodes, the scrape
    times, the seconds since the fault's onset and, for a pool's signal, its processes."""

    def __init__(self, fleet: Fleet, nodes: np.ndarray, t: np.ndarray, since: np.ndarray,
                 processes: np.ndarray | None = None):
        self.nodes = nodes
        self.t = t
        self.since = since  # [rows, times]
        self.processes = processes  # [rows, 1]
        self.cores = fleet.cores
        self._seed = fleet.seed

    def noise(self, stream: int, per_minute: bool = True) -> np.ndarray:
        """Uniform [0, 1) per node (and minute) from the noise stream `stream`."""
        if per_minute:
            return _uniform(self._seed, stream, self.nodes[:, None], (self.t // STEP_S)[None, :])
        return _uniform(self._seed, stream, self.nodes[:, None])


class _Effects:
    """The faults' effects over some nodes and times: each signal's healthy value in, the
    value with every active fault's effects out."""

    def __init__(self, fleet: Fleet, idx: np.ndarray, t: np.ndarray):
        self.fleet, self.idx, self.t = fleet, idx, t
        self.tt = t[None, :].astype(np.float64)
        self.active = [fleet.onset_s[number][idx][:, None] <= t[None, :]
                       for number in range(len(fleet.fault_list))]
        self._since: dict[int, np.ndarray] = {}

    def since(self, number: int) -> np.ndarray:
        if number not in self._since:
            self._since[number] = self.tt - self.fleet.onset_s[number][self.idx][:, None]
        return self._since[number]

    def node(self, signal: str, healthy):
        return self._apply(signal, healthy, slice(None), None, None)

    def pool(self, signal: str, healthy, rows: np.ndarray, online: np.ndarray, slot: int,
             processes: np.ndarray):
        """A pool signal on these rows (one pool of each node): an effect hits the node's
        first pool, or every online or offline one (Set.pools)."""
        return self._apply(signal, healthy, rows, (online[:, None], slot), processes)

    def _apply(self, signal, healthy, rows, pools, processes):
        value = healthy
        for number, effect in self.fleet.effects_on[signal]:
            on = self.active[number][rows]
            if pools is not None:
                on = on & _pools_hit(effect.pools, *pools)
            change = self.value(effect.value, number, rows, processes)
            value = value + np.where(on, change, 0.0) if effect.add else \
                np.where(on, change, value)
        return value

    def value(self, value, number: int, rows, processes=None):
        """An effect's value on these rows: a number or text as it is, `Noisy` or a function
        of the Site evaluated there."""
        if not callable(value):
            return value
        return value(Site(self.fleet, self.idx[rows], self.t, self.since(number)[rows],
                          processes))


def _pools_hit(which: str, online: np.ndarray, slot: int):
    """The rows whose pool an effect hits (Set.pools): the node's first pool, or its online
    or offline ones."""
    if which == "online":
        return online
    if which == "offline":
        return ~online
    return slot == 0


class Fleet:
    """A deterministic simulated fleet; `nodes` rows are in instance order."""

    def __init__(self, nodes: int = 4096, cores: int = 128, seed: int = 7,
                 end_s: int = END_S):
        if nodes < 16:
            raise ValueError("a simulated fleet needs at least 16 nodes (one per fault)")
        if cores < 16 or cores % 4:
            raise ValueError("cores must be a multiple of 4, at least 16")
        self.size = nodes
        self.cores = cores
        self.seed = seed
        self.end_s = end_s
        self.rack_size = RACK_SIZE if nodes >= RACK_SIZE * 16 else max(2, nodes // 16)
        n = nodes
        index = np.arange(n)
        self.rack = index // self.rack_size
        self.slot = index % self.rack_size
        racks = int(self.rack[-1]) + 1
        # Pools take whole racks, in order; every pool gets at least one rack.
        counts = [max(1, int(round(share * racks))) for share in NODE_POOL_SHARE]
        while sum(counts) > racks:
            counts[int(np.argmax(counts))] -= 1
        counts[0] += racks - sum(counts)
        rack_pool = np.repeat(np.arange(len(NODE_POOLS)), counts)
        self.pool = rack_pool[self.rack]
        # Within each pool the racks cycle through the purchase batches, so every pool
        # holds several CPU models and steppings.
        rack_rank = np.concatenate([np.arange(c) for c in counts])
        self.model = np.asarray(RACK_MODELS)[(rack_rank + rack_pool) % len(RACK_MODELS)][self.rack]
        self.instances = [f"r{r:03d}n{s:02d}:9105" for r, s in zip(self.rack, self.slot,
                                                                    strict=True)]
        self.position = {name: i for i, name in enumerate(self.instances)}
        self.load_scale = 0.85 + 0.3 * _uniform(seed, 1, index)
        self.uptime_s = 86400 * (3 + 40 * _uniform(seed, 2, index))
        self.faults: dict[str, np.ndarray] = {}  # rule id -> its nodes, every placement
        self.fault_list = faults()  # the registry at the time the fleet is built
        # (rule id, fault, its nodes) per placement, in fault_list order
        self.placements: list[tuple[str, FleetFault, np.ndarray]] = []
        self.onset_s = np.full((len(self.fault_list), n), np.inf)
        self._inject()
        self.effects_on, self.events = _index_effects(self.fault_list)

    # -- layout ------------------------------------------------------------------------
    def _inject(self) -> None:
        taken = np.zeros(self.size, dtype=bool)
        n = self.size
        order = np.argsort(_uniform(self.seed, 3, np.arange(n)), kind="stable")
        model_keys = [model.key for model in CPU_MODELS]
        for number, (rule_id, fault) in enumerate(self.fault_list):
            allowed = np.isin(self.pool, [NODE_POOLS.index(p) for p in fault.pools]) & ~taken
            if fault.cpu_models:
                allowed &= np.isin(self.model, [model_keys.index(k) for k in fault.cpu_models])
            if fault.nodes == "rack":
                racks = [r for r in np.unique(self.rack[allowed])
                         if allowed[self.rack == r].all()]
                if not racks:
                    racks = list(np.unique(self.rack[allowed]))
                choose = allowed & (self.rack == racks[len(racks) // 2])
            else:
                want = max(1, int(round(fault.nodes * n / 4096)))
                picked = [i for i in order if allowed[i]][:want]
                choose = np.zeros(n, dtype=bool)
                choose[picked] = True
            if not choose.any():
                raise ValueError(f"fleet too small to inject {rule_id}")
            taken |= choose
            nodes = np.flatnonzero(choose)
            self.placements.append((rule_id, fault, nodes))
            self.faults[rule_id] = np.sort(np.concatenate([self.faults[rule_id], nodes])) \
                if rule_id in self.faults else nodes
            onset = self.end_s - fault.minutes * 60
            if fault.staggered:
                onset = onset - 60 * _uniform(self.seed, 4 + number, nodes)
            self.onset_s[number, choose] = onset

    def node_table(self) -> list[dict]:
        """One dict per node: instance, node_pool, rack, cpu_model, stepping, arch."""
        out = []
        for i, name in enumerate(self.instances):
            model = CPU_MODELS[self.model[i]]
            out.append({"instance": name, "node_pool": NODE_POOLS[self.pool[i]],
                        "rack": f"r{self.rack[i]:03d}", "cpu_model": model.model_name,
                        "stepping": model.stepping, "arch": model.arch})
        return out

    def expected_findings(self) -> dict[str, set[str]]:
        """Rule id -> the instances where its fault was injected (what the engine must find)."""
        return {rule: {self.instances[i] for i in nodes} for rule, nodes in self.faults.items()}

    def times(self, minutes: int) -> np.ndarray:
        steps = max(2, minutes * 60 // STEP_S + 1)
        return self.end_s - STEP_S * np.arange(steps - 1, -1, -1, dtype=np.int64)

    # -- signals (arrays [nodes, times]) -------------------------------------------------
    def _signals(self, idx: np.ndarray, t: np.ndarray) -> dict[str, np.ndarray]:
        seed = self.seed
        tt = t[None, :].astype(np.float64)
        ii = idx[:, None]
        tk = (t // STEP_S)[None, :]
        hour = (tt / 3600 + LOCAL_UTC_OFFSET_H) % 24
        online_day = 0.6 + 0.4 * np.cos(2 * math.pi * (hour - 15) / 24)
        batch_day = 0.8 + 0.2 * np.cos(2 * math.pi * (hour - 3) / 24)
        pool = self.pool[idx][:, None]
        base = np.choose(pool, (0.32, 0.42, 0.70, 0.40))
        day = np.where(pool == 2, batch_day, online_day)
        s: dict[str, np.ndarray] = {}
        fx = _Effects(self, idx, t)
        zero = np.zeros((len(idx), 1))
        p50 = base * day * self.load_scale[idx][:, None] + 0.03 * _noise(seed, 10, ii, tk)
        p50 = np.clip(fx.node("cpu_load", p50), 0.03, 0.9)
        p90 = np.minimum(p50 + 0.09 + 0.03 * _uniform(seed, 11, ii, tk), 0.97)
        pmax = np.minimum(p90 + 0.05 + 0.03 * _uniform(seed, 12, ii, tk), 0.995)
        p50 = fx.node("busy_p50", p50)
        p90 = fx.node("busy_p90", p90)
        pmax = fx.node("busy_max", pmax)
        s["psi_cpu"] = fx.node("cpu_pressure", 0.01 + 0.08 * p50 ** 4)
        s["core_wait_max"] = fx.node("core_wait_max", 0.01 + 0.05 * p50 ** 3)
        s["busy_p50"], s["busy_p90"], s["busy_max"] = p50, p90, pmax
        s["busy_min"] = np.maximum(p50 - 0.2 - 0.05 * _uniform(seed, 14, ii, tk), 0.0)
        s["hog_cores"] = hogs = fx.node("hog_cores", zero)
        s["saturated"] = np.where(hogs > 0, np.floor(self.cores * hogs),
                                  np.where(pmax > 0.9, np.ceil((pmax - 0.9) * 40), 0))
        s["busiest"] = np.floor(_uniform(seed, 15, ii) * self.cores) + 0 * tt
        s["steal_p90"] = fx.node("steal_p90", 0.002 + 0.002 * _uniform(seed, 17, ii, tk))
        s["steal_p50"] = s["steal_p90"] * 0.7
        s["steal_max"] = s["steal_p90"] * 1.4
        s["steal_min"] = s["steal_p90"] * 0.2
        s["bw_ratio"] = fx.node("membw_ratio",
                                0.12 + 0.5 * p50 + 0.03 * _uniform(seed, 19, ii, tk))
        s["llc_miss"] = fx.node("llc_miss_ratio", 0.06 + 0.08 * _uniform(seed, 21, ii, tk))
        s["ipc"] = fx.node("ipc", 1.2 + 0.6 * _uniform(seed, 23, ii, tk))
        s["ecn_rate"] = fx.node("roce_ecn_rate", 2 * _uniform(seed, 25, ii, tk))
        s["pfc_rate"] = fx.node("pfc_pause_rate", 0.5 * _uniform(seed, 27, ii, tk))
        s["port_bytes"] = 4e8 + 8e8 * p50
        s["numa_remote_pages"] = fx.node("numa_remote_pages", 1.5e3) * (
            0.8 + 0.4 * _uniform(seed, 28, ii, tk))
        s["node_softirq"] = fx.node("node_softirq", zero)
        s["irq_core_softirq"] = fx.node("irq_core_softirq", zero)
        s["day"] = day
        s["effects"] = fx
        return s

    # -- families ------------------------------------------------------------------------
    def _families(self, idx: np.ndarray, t: np.ndarray, names: set[str] | None):
        """Yield (metric, labels per row, values [rows, times], row -> node position)."""
        s = self._signals(idx, t)
        fx = s["effects"]
        n, m = len(idx), len(t)
        rows = np.arange(n)
        inst = [self.instances[i] for i in idx]

        def want(name: str) -> bool:
            return names is None or name in names

        def node_labels(**extra) -> list[dict]:
            return [{"instance": name, **extra} for name in inst]

        def counter(rate: np.ndarray, base: np.ndarray) -> np.ndarray:
            """Counter values on the scrape grid whose last point is `base` (per row)."""
            rate = np.broadcast_to(rate, (rate.shape[0], m)) if rate.ndim == 2 else \
                np.broadcast_to(rate[:, None], (rate.shape[0], m))
            out = np.empty((rate.shape[0], m))
            out[:, -1] = base
            if m > 1:
                back = np.cumsum((rate[:, :0:-1]) * STEP_S, axis=1)
                out[:, :-1] = base[:, None] - back[:, ::-1]
            return out

        uptime = self.uptime_s[idx]
        arm = np.asarray([CPU_MODELS[self.model[i]].arch == "aarch64" for i in idx])
        for group in (np.flatnonzero(arm), np.flatnonzero(~arm)):  # one label set each
            if not len(group):
                continue
            info, features = [], []
            for r in group:
                i = idx[r]
                model = CPU_MODELS[self.model[i]]
                extra = {"microcode": "0x2b000590"} if model.arch == "x86_64" else \
                    {"architecture": "8"}
                info.append({"instance": self.instances[i], "arch": model.arch,
                             "vendor": model.vendor, "model_name": model.model_name,
                             **dict(model.identity), **extra, "rack": f"r{self.rack[i]:03d}",
                             "node_pool": NODE_POOLS[self.pool[i]]})
                key = "features" if model.arch == "aarch64" else "isa_level"
                features.append({"instance": self.instances[i], "arch": model.arch,
                                 "fingerprint": model.key, key: model.features})
            if want("fleetscope_cpu_info"):
                yield "fleetscope_cpu_info", info, np.ones((len(group), m)), group
            if want("node_uname_info"):
                uname = [{"instance": d["instance"], "sysname": "Linux", "machine": d["arch"],
                          "nodename": d["instance"].split(":")[0],
                          "release": KERNELS[int(self.rack[idx[r]] % 3 == 0)].format(
                              arch=d["arch"])} for r, d in zip(group, info, strict=True)]
                yield "node_uname_info", uname, np.ones((len(group), m)), group
            if want("fleetscope_cpu_features_info"):
                yield "fleetscope_cpu_features_info", features, np.ones((len(group), m)), group
        for stat in ("min", "p50", "p90", "max"):
            if want("fleetscope_cpu_core_busy_ratio"):
                yield ("fleetscope_cpu_core_busy_ratio", node_labels(stat=stat),
                       s[f"busy_{stat}"], rows)
            if want("fleetscope_cpu_core_steal_ratio"):
                yield ("fleetscope_cpu_core_steal_ratio", node_labels(stat=stat),
                       s[f"steal_{stat}"], rows)
        if want("fleetscope_cpu_saturated_cores"):
            yield "fleetscope_cpu_saturated_cores", node_labels(), s["saturated"], rows
        if want("fleetscope_harm_target"):  # the demo nodes' config (collector `harm`)
            for key, value in DEMO_HARM_TARGETS.node.items():
                yield ("fleetscope_harm_target", node_labels(signal=key), np.full((n, m), value),
                       rows)
            for pool, values in DEMO_HARM_TARGETS.pools.items():
                for key, value in values.items():
                    yield ("fleetscope_harm_target", node_labels(signal=key, pool=pool),
                           np.full((n, m), value), rows)
        if want("fleetscope_schedstat_core_waiting_ratio"):
            for stat, share in (("min", 0.0), ("p50", 0.2), ("p90", 0.6), ("max", 1.0)):
                yield ("fleetscope_schedstat_core_waiting_ratio", node_labels(stat=stat),
                       s["core_wait_max"] * share, rows)
        if want("fleetscope_pressure_stall_seconds_total"):
            yield ("fleetscope_pressure_stall_seconds_total",
                   node_labels(resource="cpu", stall="some"),
                   counter(s["psi_cpu"], s["psi_cpu"][:, -1] * uptime), rows)
        if want("fleetscope_procs_running"):
            runnable = self.cores * fx.node("runnable_per_core", s["busy_p50"] * 0.9)
            yield "fleetscope_procs_running", node_labels(), np.round(runnable), rows
        if want("fleetscope_cpu_busiest_core"):
            yield "fleetscope_cpu_busiest_core", node_labels(), s["busiest"], rows
        numa = np.asarray([CPU_MODELS[self.model[i]].numa_nodes for i in idx])
        cpu_wait = fx.node("cpu_wait", np.zeros((n, 1)))
        for node in range(4):
            has = numa > node
            sub = rows[has]
            if not len(sub):
                continue
            sub_inst = [inst[r] for r in sub]
            per_node_cpus = self.cores // numa[sub]
            if want("fleetscope_cpu_numa_node_cpus"):
                yield ("fleetscope_cpu_numa_node_cpus",
                       [{"instance": x, "numa_node": str(node)} for x in sub_inst],
                       np.repeat(per_node_cpus[:, None], m, axis=1).astype(float), sub)
            if want("fleetscope_numastat_pages_total"):
                local = 2e5 * s["busy_p50"][sub] + 1e4
                remote = s["numa_remote_pages"][sub] / numa[sub][:, None]
                for field, rate in (("numa_hit", local), ("local_node", local),
                                    ("numa_miss", remote), ("other_node", remote)):
                    yield ("fleetscope_numastat_pages_total",
                           [{"instance": x, "numa_node": str(node), "field": field}
                            for x in sub_inst],
                           counter(rate, rate[:, -1] * uptime[sub]), sub)
            busy = s["busy_p50"][sub] * (1.0 + 0.08 * (node - 1.5) * (s["busy_max"][sub] > 0.99))
            cpus = per_node_cpus[:, None].astype(float)
            if want("fleetscope_cpu_numa_node_seconds_total"):
                steal = s["steal_p50"][sub]
                shares = {"user": busy * 0.76, "nice": busy * 0.0, "system": busy * 0.15,
                          "irq": busy * 0.01, "softirq": busy * 0.05 + s["node_softirq"][sub],
                          "steal": steal,
                          "iowait": 0.004 + 0 * busy}
                shares["idle"] = np.maximum(1 - sum(shares.values()), 0.0)
                for mode in MODES:
                    rate = shares[mode] * cpus
                    yield ("fleetscope_cpu_numa_node_seconds_total",
                           [{"instance": x, "numa_node": str(node), "mode": mode}
                            for x in sub_inst],
                           counter(rate, rate[:, -1] * uptime[sub]), sub)
            if want("fleetscope_schedstat_numa_node_waiting_seconds_total"):
                wait = cpus * (0.002 + 0.05 * busy ** 3 + cpu_wait[sub])
                yield ("fleetscope_schedstat_numa_node_waiting_seconds_total",
                       [{"instance": x, "numa_node": str(node)} for x in sub_inst],
                       counter(wait, wait[:, -1] * uptime[sub]), sub)
        # Memory bandwidth and cache (perf): per socket and direction, and the node ratios.
        peak = np.asarray([CPU_MODELS[self.model[i]].peak_bytes_per_second for i in idx])
        total = s["bw_ratio"] * peak[:, None]
        if want("fleetscope_memory_bandwidth_bytes_per_second"):
            for socket in ("0", "1"):
                for direction, share in (("read", 0.65), ("write", 0.35)):
                    yield ("fleetscope_memory_bandwidth_bytes_per_second",
                           node_labels(socket=socket, direction=direction),
                           total * share / 2, rows)
        if want("fleetscope_memory_bandwidth_peak_bytes_per_second"):
            yield ("fleetscope_memory_bandwidth_peak_bytes_per_second", node_labels(),
                   np.repeat(peak[:, None], m, axis=1), rows)
        if want("fleetscope_memory_bandwidth_utilization_ratio"):
            yield ("fleetscope_memory_bandwidth_utilization_ratio", node_labels(),
                   s["bw_ratio"], rows)
        for socket in ("0", "1"):
            if want("fleetscope_llc_miss_ratio"):
                yield ("fleetscope_llc_miss_ratio", node_labels(socket=socket),
                       s["llc_miss"] * (1.0 if socket == "0" else 0.93), rows)
            if want("fleetscope_instructions_per_cycle"):
                yield ("fleetscope_instructions_per_cycle", node_labels(socket=socket),
                       s["ipc"] * (1.0 if socket == "0" else 1.04), rows)
        # RoCE: two mlx5 ports per node, PFC on priority 3.
        for port in (0, 1):
            iface = [f"enp{'125' if a else '1'}s0f{port}np{port}" for a in arm]
            share = 0.6 if port == 0 else 0.4
            if want("fleetscope_rdma_hw_stats_total"):
                for number, name in enumerate(RDMA_COUNTERS):
                    weight = (1.0, 0.4, 0.35, 0.02, 0.005)[number]
                    rate = s["ecn_rate"] * weight * share
                    yield ("fleetscope_rdma_hw_stats_total",
                           node_labels(device=f"mlx5_{port}", port="1", counter=name),
                           counter(rate, rate[:, -1] * uptime * 0.01), rows)
            for direction, weight in (("rx", 1.0), ("tx", 0.25)):
                if want("fleetscope_nic_pfc_pause_frames_total"):
                    rate = s["pfc_rate"] * weight * share
                    yield ("fleetscope_nic_pfc_pause_frames_total",
                           [{"instance": x, "interface": f, "priority": "3",
                             "direction": direction} for x, f in zip(inst, iface, strict=True)],
                           counter(rate, rate[:, -1] * uptime * 0.01), rows)
                if want("fleetscope_nic_port_bytes_total"):
                    rate = s["port_bytes"] * share * (1.0 if direction == "rx" else 0.8)
                    yield ("fleetscope_nic_port_bytes_total",
                           [{"instance": x, "interface": f, "direction": direction}
                            for x, f in zip(inst, iface, strict=True)],
                           counter(rate, rate[:, -1] * uptime), rows)
        # The gateway's listener (backlog 511): its queue and overflows.
        for name in ("ListenOverflows", "ListenDrops"):
            if want("fleetscope_tcp_stats_total"):
                rate = fx.node("listen_overflow_rate", np.zeros((n, m)))
                yield ("fleetscope_tcp_stats_total",
                       node_labels(group="TcpExt", counter=name),
                       counter(rate, rate[:, -1] * uptime * 0.001), rows)
        if want("fleetscope_tcp_listen_queue_connections"):
            queue = fx.node("listen_queue", np.floor(3 * _uniform(self.seed, 92, idx[:, None],
                                                                   t // STEP_S)))
            yield ("fleetscope_tcp_listen_queue_connections",
                   node_labels(listener="0.0.0.0:8443"), queue, rows)
        if want("fleetscope_tcp_listen_backlog_connections"):
            yield ("fleetscope_tcp_listen_backlog_connections",
                   node_labels(listener="0.0.0.0:8443"), np.full((n, m), 511.0), rows)
        # Events since a fault's onset (crashes in the kernel log, kills), on the nodes where
        # it is active at the last scrape.
        for number, events in self.events:
            hit = np.flatnonzero(fx.active[number][:, -1])
            if not len(hit):
                continue
            for rows, labels in self._event_rows(idx, hit, events):
                since = fx.since(number)[rows]
                if events.counter and want(events.counter):
                    values = np.where(since >= 0, np.floor(since / events.every_s) + 1,
                                      np.nan)
                    yield events.counter, labels, values, rows
                if events.last_seen and want(events.last_seen):
                    ago = fx.value(events.ago, number, rows)
                    last = np.where(since >= 0, t[None, :] - np.minimum(ago, since), np.nan)
                    yield events.last_seen, labels, last, rows
        yield from self._memory_families(idx, t, s, want, counter, node_labels)
        yield from self._module_families(idx, t, s, want, counter)
        yield from self._pool_families(idx, t, s, want, counter, node_labels)

    def _event_rows(self, idx: np.ndarray, hit: np.ndarray, events: Events):
        """(rows, labels per row) of a fault's events on the rows `hit`: the node's, or
        (Events.pools) each pool's it hits, labelled as the exporter labels a pool."""
        if events.pools is None:
            yield hit, [{"instance": self.instances[idx[r]], **events.labels} for r in hit]
            return
        for slot in (0, 1):
            pool_of = np.asarray([POOL_SLOTS[NODE_POOLS[self.pool[idx[r]]]][slot]
                                  for r in hit], dtype=int)
            online = np.asarray([WORKLOAD_POOLS[p].workload_class == "online" if p >= 0
                                 else False for p in pool_of])
            keep = (pool_of >= 0) & _pools_hit(events.pools, online, slot)
            if np.any(keep):
                rows = hit[keep]
                yield rows, [{"instance": self.instances[idx[r]], "pool": pool.name,
                              "class": pool.workload_class, **events.labels}
                             for r, pool in zip(rows, (WORKLOAD_POOLS[p] for p in
                                                       pool_of[keep]), strict=True)]

    def _memory_families(self, idx, t, s, want, counter, node_labels):
        """OOM kills, memory pressure and allocation stalls."""
        fx = s["effects"]
        n, m = len(idx), len(t)
        uptime = self.uptime_s[idx]
        kills = fx.node("oom_kill_rate", np.zeros((n, m)))
        if want("fleetscope_vmstat_oom_kills_total"):
            yield ("fleetscope_vmstat_oom_kills_total", node_labels(),
                   counter(kills, 2 + kills[:, -1] * 3600), np.arange(len(idx)))
        if want("fleetscope_oom_kills_logged_total"):
            for constraint in ("global", "memcg"):
                rate = kills if constraint == "memcg" else 0 * kills
                yield ("fleetscope_oom_kills_logged_total", node_labels(constraint=constraint),
                       counter(rate, rate[:, -1] * 3600), np.arange(len(idx)))
        stall = fx.node("memory_pressure", np.full((n, m), 0.004))
        stalls = fx.node("allocation_stall_rate", np.zeros((n, m)))
        if want("fleetscope_pressure_stall_seconds_total"):
            yield ("fleetscope_pressure_stall_seconds_total",
                   node_labels(resource="memory", stall="some"),
                   counter(stall, stall[:, -1] * uptime), np.arange(len(idx)))
        if want("fleetscope_memory_allocation_stalls_total"):
            yield ("fleetscope_memory_allocation_stalls_total", node_labels(),
                   counter(stalls, stalls[:, -1] * 3600), np.arange(len(idx)))

    def has_modules(self, idx: np.ndarray) -> np.ndarray:
        """Whether each node carries inference modules (its node pool's role)."""
        return np.isin(self.pool[idx], [NODE_POOLS.index(p) for p in MODULE_POOLS])

    def _module_families(self, idx, t, s, want, counter):
        """The fleetscope_accelerator_* series of the nodes with modules (none elsewhere)."""
        fx = s["effects"]
        seed = self.seed
        n, m = len(idx), len(t)
        tk = (t // STEP_S)[None, :]
        ii = idx[:, None]
        util = fx.node("accel_util", np.clip(0.35 + 0.4 * s["day"] + 0.05 * _noise(
            seed, 110, ii, tk), 0.05, 0.85))
        swing = fx.node("accel_util_swing", np.full((n, m), 0.04))
        memory = fx.node("accel_memory_ratio", np.full((n, m), 0.9))
        xid = fx.node("accel_last_xid", np.zeros((n, m)))
        ecc = fx.node("accel_ecc_uncorrected", np.zeros((n, m))) / 60
        listed = fx.node("accel_matrix_listed", np.ones((n, m)))
        # the swing: every other scrape above the mean, the rest below
        util = np.clip(util + swing / 2 * np.where(tk % 2 == 0, 1.0, -1.0), 0.0, 1.0)
        for arch, kind in MODULE_MODELS.items():
            rows = np.flatnonzero(self.has_modules(idx) & np.asarray(
                [CPU_MODELS[self.model[i]].arch == arch for i in idx]))
            if not len(rows):
                continue
            inst = [self.instances[idx[r]] for r in rows]
            for device in range(MODULES_PER_NODE):
                where = [{"instance": x, "vendor": kind.vendor, "device": str(device)}
                         for x in inst]
                first = device == 0
                spread = 0.03 * (device - (MODULES_PER_NODE - 1) / 2) / ((MODULES_PER_NODE - 1) / 2)
                values = {
                    "utilization_ratio": np.clip(util[rows] + spread, 0.0, 1.0),
                    "memory_used_bytes": kind.memory_bytes * (
                        memory[rows] if first else 0.9 + 0 * memory[rows] + 0.004 * device),
                    "memory_total_bytes": np.full((len(rows), m), kind.memory_bytes),
                }
                # uncorrected ECC: DCGM's DBE volatile total, npu-exporter's HBM double-bit
                values["ecc_uncorrected_errors"] = counter(ecc[rows] * first,
                                                           ecc[rows, -1] * first * 3600)
                if kind.vendor == "nvidia":
                    values["last_xid"] = xid[rows] * first
                else:
                    values["error_codes"] = (xid[rows] > 0) * first * 1.0
                    values["healthy"] = 1.0 - (xid[rows] > 0) * first
                for name, value in values.items():
                    if want(f"fleetscope_accelerator_{name}"):
                        yield f"fleetscope_accelerator_{name}", where, value, rows
                # each pair's series while the node runs it (the matrix judges the pair)
                for number, (driver, firmware) in enumerate(kind.pairs):
                    running = listed[rows] == (1 - number)
                    pair = [{**w, "model": kind.model, "driver": driver, "firmware": firmware}
                            for w in where]
                    if want("fleetscope_accelerator_info"):
                        yield ("fleetscope_accelerator_info",
                               [{**p, "source": kind.source} for p in pair],
                               np.where(running, 1.0, np.nan), rows)
                    if want("fleetscope_accelerator_matrix_listed"):
                        yield ("fleetscope_accelerator_matrix_listed", pair,
                               np.where(running, 1.0 - number, np.nan), rows)

    def _pool_families(self, idx, t, s, want, counter, node_labels):
        seed = self.seed
        fx = s["effects"]
        m = len(t)
        inst = [self.instances[i] for i in idx]
        ii = idx[:, None]
        tk = (t // STEP_S)[None, :]
        uptime = self.uptime_s[idx]
        physical = np.asarray([self.cores * CPU_MODELS[self.model[i]].physical_cores_ratio
                               for i in idx])
        for slot in (0, 1):
            pool_of = np.asarray([POOL_SLOTS[NODE_POOLS[self.pool[i]]][slot] for i in idx])
            rows = np.flatnonzero(pool_of >= 0)
            if not len(rows):
                continue
            pools = [WORKLOAD_POOLS[p] for p in pool_of[rows]]
            online = np.asarray([p.workload_class == "online" for p in pools])
            sub_inst = [inst[r] for r in rows]
            r_ii = ii[rows]

            def labels(with_class: bool = True, pools=pools, sub_inst=sub_inst, **extra):
                out = []
                for x, p in zip(sub_inst, pools, strict=True):
                    d = {"instance": x, "pool": p.name, **extra}
                    if with_class:
                        d["class"] = p.workload_class
                    out.append(d)
                return out

            procs = np.asarray([p.processes for p in pools], dtype=float)
            if slot == 1:
                procs = procs * 0 + 4

            def moved(signal: str, healthy, rows=rows, online=online, slot=slot, procs=procs):
                """The pools' signal with the faults' effects (fleet_sim.SIGNALS)."""
                return fx.pool(signal, healthy, rows, online, slot, procs[:, None])

            def const(value: float, rows=rows) -> np.ndarray:
                return np.full((len(rows), m), value)

            per_process = np.asarray([p.threads_per_process for p in pools])
            threads_now = procs[:, None] * moved("threads_per_process", per_process[:, None]) \
                + 0 * t
            if want("fleetscope_pool_processes"):
                yield "fleetscope_pool_processes", labels(), procs[:, None] + 0 * t, rows
            if want("fleetscope_pool_threads"):
                yield "fleetscope_pool_threads", labels(), threads_now.astype(float), rows
            if want("fleetscope_pool_process_starts_total"):
                rate = moved("process_start_rate", const(0.0005)) + 0 * t
                yield ("fleetscope_pool_process_starts_total", labels(),
                       counter(rate, np.floor(rate[:, -1] * uptime[rows] * 0.01)), rows)
            if want("fleetscope_pool_file_lock_waiters"):
                waiters = moved("lock_waiters", const(0.0)) + 0 * t
                yield "fleetscope_pool_file_lock_waiters", labels(), waiters, rows
            if want("fleetscope_pool_threads_per_core"):
                yield ("fleetscope_pool_threads_per_core", labels(),
                       threads_now / physical[rows][:, None], rows)
            if want("fleetscope_pool_threads_read"):  # every thread read: under the cap
                yield ("fleetscope_pool_threads_read", labels(),
                       np.minimum(threads_now, 1024.0).astype(float), rows)
            if want("fleetscope_pool_runnable_threads"):
                runnable = moved("runnable_share", 0.05 + 0.2 * s["busy_p50"][rows]) * threads_now
                yield ("fleetscope_pool_runnable_threads", labels(),
                       np.round(np.minimum(runnable, 1024.0)), rows)
            busy = s["busy_p50"][rows]
            delay = procs[:, None] * moved("run_delay_per_process", 0.003 + 0.004 * busy)
            if want("fleetscope_pool_run_delay_seconds_total"):
                yield ("fleetscope_pool_run_delay_seconds_total", labels(),
                       counter(delay, delay[:, -1] * uptime[rows]), rows)
            mixed_batch = (slot == 1)  # a small batch pool beside the online one
            cpu = moved("pool_cpu", np.where(online[:, None], busy * self.cores * 0.8,
                                             np.where(mixed_batch, 0.3,
                                                      busy * self.cores * 0.9)))
            if want("fleetscope_pool_cpu_seconds_total"):
                yield ("fleetscope_pool_cpu_seconds_total", labels(),
                       counter(cpu, cpu[:, -1] * uptime[rows]), rows)
            if want("fleetscope_pool_cgroup_cpu_pressure_stall_seconds_total"):
                pressure = moved("cgroup_cpu_pressure", 0.01 + 0.02 * busy)
                for stall, weight in (("some", 1.0), ("full", 0.3)):
                    rate = weight * pressure
                    yield ("fleetscope_pool_cgroup_cpu_pressure_stall_seconds_total",
                           labels(stall=stall), counter(rate, rate[:, -1] * uptime[rows]), rows)
            if want("fleetscope_pool_context_switches_total"):
                for kind, rate in (("voluntary", procs[:, None] * (40 + 30 * busy)),
                                   ("nonvoluntary", moved("nonvoluntary_switch_rate",
                                                          procs[:, None] * (0.5 + 2 * busy)))):
                    yield ("fleetscope_pool_context_switches_total", labels(kind=kind),
                           counter(rate, rate[:, -1] * uptime[rows]), rows)
            limit = moved("fd_limit", const(65535.0))
            open_fds = moved("open_fds", 200 + 600 * _uniform(seed, 41, r_ii))
            if want("fleetscope_pool_fd_usage_ratio"):
                yield "fleetscope_pool_fd_usage_ratio", labels(), open_fds / limit, rows
            if want("fleetscope_pool_fd_usage_open_fds"):
                yield "fleetscope_pool_fd_usage_open_fds", labels(), np.floor(open_fds), rows
            if want("fleetscope_pool_fd_usage_limit_fds"):
                yield "fleetscope_pool_fd_usage_limit_fds", labels(), limit + 0 * t, rows
            # CFS bandwidth: 10 periods of 100 ms a second.
            if want("fleetscope_pool_cgroup_cpu_periods_total"):
                periods = 10.0 + 0 * t + np.zeros((len(rows), 1))
                yield ("fleetscope_pool_cgroup_cpu_periods_total", labels(),
                       counter(periods, periods[:, -1] * uptime[rows]), rows)
            for metric, signal, quiet_rate in (
                    ("fleetscope_pool_cgroup_cpu_throttled_periods_total",
                     "throttled_periods_rate", 0.05),
                    ("fleetscope_pool_cgroup_cpu_throttled_seconds_total",
                     "throttled_seconds_rate", 0.001)):
                if want(metric):
                    rate = moved(signal, const(quiet_rate)) + 0 * t
                    yield metric, labels(), counter(rate, rate[:, -1] * uptime[rows]), rows
            if want("fleetscope_pool_cgroup_cpu_quota_cpus"):
                yield ("fleetscope_pool_cgroup_cpu_quota_cpus", labels(),
                       procs[:, None] * moved("cpu_quota_per_process", const(np.inf)) + 0 * t,
                       rows)
            pids_limit = moved("pids_limit", const(4096.0)) + 0 * t
            pids_now = moved("pids_current", np.minimum(threads_now + procs[:, None], 4000.0))
            if want("fleetscope_pool_cgroup_pids_usage_ratio"):
                yield ("fleetscope_pool_cgroup_pids_usage_ratio", labels(),
                       pids_now / pids_limit, rows)
            if want("fleetscope_pool_cgroup_pids_current"):
                yield "fleetscope_pool_cgroup_pids_current", labels(), pids_now, rows
            if want("fleetscope_pool_cgroup_pids_limit"):
                yield "fleetscope_pool_cgroup_pids_limit", labels(), pids_limit, rows
            if want("fleetscope_pool_cgroup_pids_limit_hits_total"):
                refused = moved("pid_limit_hit_rate", const(0.0)) + 0 * t
                yield ("fleetscope_pool_cgroup_pids_limit_hits_total", labels(),
                       counter(refused, refused[:, -1] * 3600), rows)
            if want("fleetscope_pool_nproc_limit"):
                yield ("fleetscope_pool_nproc_limit", labels(),
                       moved("nproc_limit", const(65535.0)), rows)
            remote = moved("numa_remote_ratio", 0.02 + 0.06 * _uniform(seed, 43, r_ii, tk))
            if want("fleetscope_pool_numa_remote_memory_ratio"):
                yield "fleetscope_pool_numa_remote_memory_ratio", labels(), remote, rows
            if want("fleetscope_pool_memory_bytes"):
                rss = procs[:, None] * 2.5e9 + 0 * t
                yield ("fleetscope_pool_memory_bytes", labels(locality="local"),
                       rss * (1 - remote), rows)
                yield ("fleetscope_pool_memory_bytes", labels(locality="remote"),
                       rss * remote, rows)
            # IRQs on the online pool's CPUs.
            on_rows = np.flatnonzero(online)
            if len(on_rows):
                irq_labels = [{"instance": sub_inst[r], "pool": pools[r].name} for r in on_rows]
                if want("fleetscope_irq_online_pool_overlap_cpus"):
                    yield ("fleetscope_irq_online_pool_overlap_cpus", irq_labels,
                           moved("irq_overlap_cpus", const(0.0))[on_rows], rows[on_rows])
                if want("fleetscope_irq_online_pool_cpus"):
                    yield ("fleetscope_irq_online_pool_cpus", irq_labels,
                           np.full((len(on_rows), len(t)), self.cores * 0.75), rows[on_rows])
                if want("fleetscope_irq_online_pool_irq_seconds_total"):
                    share = moved("irq_cpu_share", const(0.004))[on_rows] * self.cores * 0.75
                    yield ("fleetscope_irq_online_pool_irq_seconds_total", irq_labels,
                           counter(share, share[:, -1] * uptime[rows][on_rows]), rows[on_rows])
                if want("fleetscope_irq_online_pool_device_interrupts_total"):
                    rate = moved("device_interrupt_rate",
                                 20 + 20 * _uniform(seed, 45, r_ii, tk))[on_rows]
                    yield ("fleetscope_irq_online_pool_device_interrupts_total", irq_labels,
                           counter(rate, rate[:, -1] * uptime[rows][on_rows]), rows[on_rows])
            yield from self._agent_families(rows, r_ii, pools, moved, const, s, t, counter,
                                            labels(False), want)

    def _agent_families(self, rows, r_ii, pools, moved, const, s, t, counter, base_labels,
                        want):
        seed = self.seed
        m = len(t)
        tk = (t // STEP_S)[None, :]
        uptime = self.uptime_s[r_ii[:, 0]]

        def labels(**extra):
            return [{**d, **extra} for d in base_labels]

        def with_class(**extra):
            return [{**d, "class": p.workload_class, **extra}
                    for d, p in zip(base_labels, pools, strict=True)]
        day = s["day"][rows]
        sessions = np.asarray([p.sessions_per_second for p in pools])[:, None] * day
        depth = moved("queue_depth", np.floor(12 * _uniform(seed, 50, r_ii, tk)))
        if want("agent_queue_depth"):
            yield ("agent_queue_depth",
                   [{**d, "queue": p.queue} for d, p in zip(base_labels, pools, strict=True)],
                   depth, rows)
        waiting = moved("module_queue_depth", np.floor(3 * _uniform(seed, 52, r_ii, tk)))
        served = np.flatnonzero(self.has_modules(r_ii[:, 0]))
        if want("agent_module_queue_depth") and len(served):
            engines = [MODULE_MODELS[CPU_MODELS[self.model[i]].arch].module
                       for i in r_ii[served, 0]]
            yield ("agent_module_queue_depth",
                   [{**base_labels[r], "module": e} for r, e in zip(served, engines,
                                                                    strict=True)],
                   waiting[served], rows[served])
        age = moved("heartbeat_age", 0.2 + 6 * _uniform(seed, 51, r_ii, tk))
        if want("agent_task_heartbeat_age_seconds"):
            yield "agent_task_heartbeat_age_seconds", labels(), age, rows
        migrations = moved("session_migration_rate", const(0.001))
        if want("agent_session_migrations_total"):
            rate = migrations + np.zeros((len(rows), m))
            yield ("agent_session_migrations_total", labels(),
                   counter(rate, rate[:, -1] * uptime * 10), rows)
        if want("agent_tool_calls_total"):
            model_now = moved("tool_model",
                              np.asarray([p.model for p in pools], dtype=object)[:, None])
            for tool_number in range(2):
                has = np.asarray([len(p.tools) > tool_number for p in pools])
                sub = np.flatnonzero(has)
                if not len(sub):
                    continue
                for outcome, share in (("ok", 0.97), ("timeout", 0.01),
                                       ("bad_arguments", 0.01), ("error", 0.01)):
                    calls = sessions[sub] * 1.5
                    if outcome in ("timeout", "bad_arguments"):
                        rate = calls * moved(f"tool_{outcome}_share", const(share))[sub]
                    else:
                        rate = calls * share
                    yield ("agent_tool_calls_total",
                           [{**base_labels[r], "tool": pools[r].tools[tool_number],
                             "model": str(model_now[r, -1]), "outcome": outcome}
                            for r in sub],
                           counter(rate, rate[:, -1] * uptime[sub]), rows[sub])
        # Where session time goes, per stage; faults stretch the stage they hurt.
        stretch = {name: np.ones((len(rows), m)) for name in STAGES}
        cpu_bound = moved("cpu_stages_stretch", const(1.0))
        stretch["inference"] = cpu_bound
        stretch["context_assembly"] = cpu_bound
        for stage in ("queue_wait", "state_io", "tool_call", "other"):
            stretch[stage] = moved(f"{stage}_stretch", const(1.0))
        mean_total = np.zeros((len(rows), m))
        for stage in STAGES:
            mean = np.asarray([dict(p.stages).get(stage, 0.0) for p in pools])[:, None]
            mean = mean * stretch[stage] * (0.9 + 0.2 * _uniform(seed, 60 + STAGES.index(stage),
                                                                  r_ii, tk))
            count_rate = sessions + 0 * mean
            if stage == "model_load":
                count_rate = moved("model_load_rate", const(0.0)) + 0 * sessions
                mean = moved("model_load_seconds", const(0.0))
            mean_total += mean * (count_rate / np.maximum(sessions, 1e-9))
            if want("agent_stage_duration_seconds_count") or want(
                    "agent_stage_duration_seconds_sum"):
                base_count = np.where(count_rate[:, -1] > 0, count_rate[:, -1] * 3600,
                                      1.0 if stage == "model_load" else 0.0)
                base_count = base_count + sessions[:, -1] * uptime * (stage != "model_load")
                base_sum = base_count * np.maximum(mean[:, -1], 4.0 if stage == "model_load"
                                                   else 0.0)
                if want("agent_stage_duration_seconds_count"):
                    yield ("agent_stage_duration_seconds_count", labels(stage=stage),
                           counter(count_rate, base_count), rows)
                if want("agent_stage_duration_seconds_sum"):
                    yield ("agent_stage_duration_seconds_sum", labels(stage=stage),
                           counter(count_rate * mean, base_sum), rows)
        # Session time outside every stage (a step no stage measures).
        mean_total = mean_total + moved("unexplained_session_seconds", const(0.0))
        # Session latency: log-normal around the stages' sum; faults widen the tail.
        tail = moved("session_tail", const(0.45))
        median = mean_total / np.exp(tail ** 2 / 2)
        if want("agent_session_duration_seconds_bucket"):
            for le in (*SESSION_BUCKETS, math.inf):
                if math.isinf(le):
                    share = np.ones_like(median)
                else:
                    z = (np.log(le) - np.log(np.maximum(median, 1e-6))) / (tail * math.sqrt(2))
                    share = 0.5 * (1 + _erf(z))
                rate = sessions * share
                yield ("agent_session_duration_seconds_bucket",
                       with_class(le="+Inf" if math.isinf(le) else f"{le:g}"),
                       counter(rate, rate[:, -1] * uptime), rows)
        if want("agent_session_duration_seconds_count"):
            yield ("agent_session_duration_seconds_count", with_class(),
                   counter(sessions, sessions[:, -1] * uptime), rows)
        if want("agent_session_duration_seconds_sum"):
            rate = sessions * mean_total
            yield ("agent_session_duration_seconds_sum", with_class(),
                   counter(rate, rate[:, -1] * uptime), rows)
        # How sessions end, and the ones not ended yet (from their arrival).
        if want("agent_sessions_total"):
            failing = moved("session_error_share", const(0.0))
            for outcome, share in (("ok", 1 - failing), ("error", failing),
                                   ("timeout", 0 * failing)):
                rate = sessions * share
                yield ("agent_sessions_total", with_class(outcome=outcome),
                       counter(rate, rate[:, -1] * uptime), rows)
        oldest = moved("oldest_in_flight", median * np.exp(tail))  # the slowest in flight
        if want("agent_sessions_in_flight"):
            flying = np.round(sessions * mean_total)  # Little's law
            yield ("agent_sessions_in_flight", with_class(),
                   np.where(oldest > median * np.exp(tail), np.maximum(flying, 1), flying), rows)
        if want("agent_session_oldest_in_flight_seconds"):
            yield "agent_session_oldest_in_flight_seconds", with_class(), oldest, rows

    def _per_core(self, i: int, t: np.ndarray):
        """fleetscope_cpu_seconds_total{cpu, mode} for one node (full per-core mode)."""
        seed = self.seed
        s = self._signals(np.asarray([i]), t)
        cores = np.arange(self.cores)
        tk = (t // STEP_S)[None, :]
        p50, p90 = s["busy_p50"][0][None, :], s["busy_p90"][0][None, :]
        # Each core keeps its place in the distribution (affinity), with a little jitter.
        hog_share = s["hog_cores"][0][None, :]
        p90 = np.where(hog_share > 0, p50 + 0.1, p90)  # the hogs below make the node's p90
        rank = _uniform(seed, 80, np.asarray(i), cores)[:, None]
        z = np.sqrt(2) * _erfinv(2 * rank - 1)
        busy = p50 + (p90 - p50) / 1.2816 * (0.85 * z + 0.5 * _noise(seed, 81, cores[:, None],
                                                                       tk))
        busy = np.clip(busy, 0.0, 0.97)
        hogs = cores[:, None] < np.floor(self.cores * hog_share)
        busy = np.where(hogs, 0.985 + 0.01 * _uniform(seed, 82, cores[:, None], tk),
                        busy)
        irq_cores = (cores[:, None] % 8 == 0)
        softirq = busy * 0.05 + np.where(irq_cores, s["irq_core_softirq"][0][None, :], 0.0)
        busy = np.minimum(busy + softirq - busy * 0.05, 0.995)
        steal = np.broadcast_to(s["steal_p50"][0][None, :], busy.shape)
        shares = {"user": busy * 0.78 - np.minimum(steal, busy * 0.5), "nice": busy * 0.0,
                  "system": busy * 0.15, "irq": busy * 0.01, "softirq": softirq,
                  "steal": np.minimum(steal, busy * 0.5), "iowait": 0.003 + 0 * busy}
        shares["user"] = np.maximum(busy - shares["system"] - shares["irq"] - softirq
                                    - shares["steal"], 0.0)
        shares["idle"] = np.maximum(1 - sum(shares.values()), 0.0)
        uptime = self.uptime_s[i]
        for mode in MODES:
            rate = shares[mode]
            values = np.empty_like(rate)
            values[:, -1] = rate[:, -1] * uptime
            if len(t) > 1:
                back = np.cumsum(rate[:, :0:-1] * STEP_S, axis=1)
                values[:, :-1] = values[:, -1:] - back[:, ::-1]
            yield ("fleetscope_cpu_seconds_total",
                   [{"instance": self.instances[i], "cpu": str(c), "mode": mode}
                    for c in cores], values, cores)

    # -- output --------------------------------------------------------------------------
    def series(self, names: set[str] | None = None, nodes: np.ndarray | None = None) -> Series:
        """The fleet's last two scrapes (60 s apart) as one Series: every node, `instance`
        on every series; `names` limits it to those metrics."""
        idx = np.arange(self.size) if nodes is None else np.asarray(nodes)
        return _to_series(self._families(idx, self.times(1), names), self.times(1))

    def shards(self, names: set[str] | None = None, racks: range | None = None
               ) -> list[Series]:
        """The same as `series`, one Series per rack (for evaluating racks in turn); `racks`
        limits it to those racks (a node's series do not depend on which others are made)."""
        t = self.times(1)
        idx = np.arange(self.size)
        if racks is not None:
            idx = idx[(self.rack >= racks.start) & (self.rack < racks.stop)]
        if not len(idx):
            return []
        return _to_series(self._families(idx, t, names), t,
                          shard_of=self.rack[idx] - self.rack[idx[0]])

    def node_series(self, instance: str, minutes: int = 180, per_core: bool = True) -> Series:
        """One node's metrics over the last `minutes`, scraped every minute; `per_core` adds
        fleetscope_cpu_seconds_total{cpu, mode} (the exporter's `per_core: full`)."""
        i = self.position[instance]
        t = self.times(minutes)
        families = self._families(np.asarray([i]), t, None)
        if per_core:
            families = _chain(families, self._per_core(i, t))
        return _to_series(families, t)


def _erfinv(y: np.ndarray) -> np.ndarray:
    """Giles' single-precision approximation of the inverse error function."""
    y = np.clip(y, -0.999999, 0.999999)
    w = -np.log((1.0 - y) * (1.0 + y))
    small = w < 5.0
    ws = w - 2.5
    p_small = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
              -0.00417768164, 0.246640727, 1.50140941):
        p_small = c + p_small * ws
    wl = np.sqrt(np.maximum(w, 5.0)) - 3.0
    p_large = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
              0.00943887047, 1.00167406, 2.83297682):
        p_large = c + p_large * wl
    return np.where(small, p_small, p_large) * y


def _chain(*iterables):
    for iterable in iterables:
        yield from iterable


def _to_series(families, times: np.ndarray, shard_of: np.ndarray | None = None):
    """Families -> Series (or one Series per shard of nodes). Built column-wise: label pairs
    are interned (a fleet holds hundreds of thousands of series with the same few label
    values) and tuples are made by zip, so a 4,096-node fleet converts in about a second."""
    stamps = [int(x) * 1000 for x in times]
    interned: dict[tuple[str, str], tuple[str, str]] = {}
    shards = None if shard_of is None else \
        [Series() for _ in range(int(shard_of.max()) + 1)]
    out = Series()
    for name, label_rows, values, rows in families:
        if not label_rows:
            continue
        values = np.broadcast_to(np.asarray(values, dtype=float),
                                 (len(label_rows), len(stamps)))
        names = sorted(label_rows[0])
        columns = []
        for label in names:
            column = [row[label] for row in label_rows]
            pair_of = {v: interned.setdefault((label, v), (label, v)) for v in set(column)}
            columns.append([pair_of[v] for v in column])
        keys = list(zip(*columns, strict=True))
        if np.isnan(values).any():
            points = [[(t, v) for t, v in zip(stamps, row, strict=True) if v == v]
                      for row in values.tolist()]
        else:  # column by column: the tuples and lists are made in C
            by_time = [list(zip(repeat(t), values[:, j].tolist())) for j, t in enumerate(stamps)]
            points = list(map(list, zip(*by_time, strict=True)))
        if shards is None:
            out.by_name.setdefault(name, {}).update(
                (k, p) for k, p in zip(keys, points, strict=True) if p)
            continue
        owner = shard_of[np.asarray(rows)]
        edges = np.flatnonzero(np.diff(owner)) + 1
        for lo, hi in zip(np.r_[0, edges], np.r_[edges, len(owner)], strict=True):
            shards[int(owner[lo])].by_name.setdefault(name, {}).update(
                (k, p) for k, p in zip(keys[lo:hi], points[lo:hi], strict=True) if p)
    return out if shards is None else shards
