"""A simulated fleet for `fleetscope demo`: the exporter's metrics for thousands of nodes.

    fleet = Fleet(nodes=4096, cores=128)
    series = fleet.series()                 # every node, the last two scrapes (60 s apart)
    fleet.faults["roce-congestion"]         # the nodes where that fault was injected
    one = fleet.node_series("r007n12:9105") # one node over the last hours, per core too

The output is what the console reads from Prometheus: `rules.promql.Series` (metric name ->
label set -> [(t_ms, value)]) named as the exporter's metrics (README, collectors/*.py) and
the agent signals (docs/metrics-and-rules.md), each series carrying `instance`. Node metadata rides
on `fleetscope_cpu_info` as the target labels a fleet's scrape config would add (`rack`,
`node_pool`), beside the collector's own (`model_name`, `variant`/`revision` or
`family`/`model`/`stepping`). The faults are found by running the real rule engine on it.

The layout is a reference cluster of the kind fleetscope watches: racks of 32
2-socket nodes (Kunpeng 920 in three steppings, two x86 generations), pools for online chat,
code generation, offline batch and a mixed pool, 2 RoCE ports per node, diurnal load, and one
injected fault per rule id. Everything is a pure function of (seed, node, time): the last
scrape of `node_series` equals the one in `series`, and two runs give the same fleet. Values
are computed with numpy over all nodes at once; only the conversion to `Series` loops.

No streamlit here: the console's pages draw what this produces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from fleetscope.agent_runtime.schema import SESSION_BUCKETS, STAGES
from fleetscope.core.harm_targets import parse_harm_targets
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
BAD_QUANT_MODEL = "qwen2.5-7b-instruct-q2_k"
CRASHING_BINARY = "tool-runner"  # crash-loop: segfaults at start
NEW_BINARY = "llama-server"  # built with -march=native on a Kunpeng 920B: SVE everywhere

RDMA_COUNTERS = ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled",
                 "out_of_sequence", "packet_seq_err")
MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def faults() -> tuple[tuple[str, tuple[str, ...], int | str, int], ...]:
    """(rule id, node pools it lands on, nodes in a 4,096-node fleet or "rack" = one whole
    rack, minutes ago it started) of every registered rule that declares a fleet fault
    (rules/builtin/<rule>.py `fleet`). Sizes scale with the fleet; every fault gets at least
    one node. Whole-rack faults are placed first (they need racks no other fault took), the
    rest in rank order. How each fault moves the metrics is below, keyed by the rule id."""
    from fleetscope.rules.catalog import CATALOG

    placed = [(rule.id, rule.fleet.pools, rule.fleet.nodes, rule.fleet.minutes)
              for rule in CATALOG if rule.fleet is not None]
    return tuple(sorted(placed, key=lambda fault: fault[2] != "rack"))


STEAL_NODES = 4  # chat nodes on an oversold VM host: offline-preemption through steal


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
        self.faults: dict[str, np.ndarray] = {}
        self.fault_list = faults()  # the registry at the time the fleet is built
        self.onset_s = np.full((len(self.fault_list), n), np.inf)
        self._inject()

    # -- layout ------------------------------------------------------------------------
    def _inject(self) -> None:
        taken = np.zeros(self.size, dtype=bool)
        n = self.size
        order = np.argsort(_uniform(self.seed, 3, np.arange(n)), kind="stable")
        for number, (rule_id, pools, size, minutes) in enumerate(self.fault_list):
            allowed = np.isin(self.pool, [NODE_POOLS.index(p) for p in pools]) & ~taken
            if rule_id == "isa-mismatch":  # only the steppings without SVE crash
                allowed &= np.isin(self.model, [0, 1])
            if size == "rack":
                racks = [r for r in np.unique(self.rack[allowed])
                         if allowed[self.rack == r].all()]
                if not racks:
                    racks = list(np.unique(self.rack[allowed]))
                choose = allowed & (self.rack == racks[len(racks) // 2])
            else:
                want = max(1, int(round(size * n / 4096)))
                picked = [i for i in order if allowed[i]][:want]
                choose = np.zeros(n, dtype=bool)
                choose[picked] = True
            if not choose.any():
                raise ValueError(f"fleet too small to inject {rule_id}")
            taken |= choose
            self.faults[rule_id] = np.flatnonzero(choose)
            self.onset_s[number, choose] = self.end_s - minutes * 60 - 60 * _uniform(
                self.seed, 4 + number, np.flatnonzero(choose))
        # A few chat nodes on an oversold hypervisor: steal takes the online pool's CPU.
        allowed = (self.pool == NODE_POOLS.index("chat")) & ~taken
        want = max(1, int(round(STEAL_NODES * n / 4096)))
        picked = np.asarray([i for i in order if allowed[i]][:want])
        self.steal_nodes = picked
        self.steal_onset = np.full(n, np.inf)
        self.steal_onset[picked] = self.end_s - 55 * 60
        self.faults["offline-preemption"] = np.sort(np.concatenate(
            [self.faults["offline-preemption"], picked]))

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

    def _active(self, rule_id: str, idx: np.ndarray, t: np.ndarray) -> np.ndarray:
        number = [f[0] for f in self.fault_list].index(rule_id)
        return self.onset_s[number][idx][:, None] <= t[None, :]

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
        act = {rule: self._active(rule, idx, t) for rule, *_ in self.fault_list}
        steal = self.steal_onset[idx][:, None] <= tt
        preempt = act["offline-preemption"]
        p50 = base * day * self.load_scale[idx][:, None] + 0.03 * _noise(seed, 10, ii, tk)
        p50 = p50 + np.where(preempt, 0.25, 0.0)
        p50 = np.clip(p50, 0.03, 0.9)
        p90 = np.minimum(p50 + 0.09 + 0.03 * _uniform(seed, 11, ii, tk), 0.97)
        pmax = np.minimum(p90 + 0.05 + 0.03 * _uniform(seed, 12, ii, tk), 0.995)
        imbalance = act["core-imbalance"]
        p50 = np.where(imbalance, 0.22 + 0.03 * _uniform(seed, 13, ii, tk), p50)
        p90 = np.where(imbalance, 0.99, p90)
        pmax = np.where(imbalance, 1.0, pmax)
        saturation = act["cpu-saturation"]
        p50 = np.where(saturation, 0.97 + 0.02 * _uniform(seed, 46, ii, tk), p50)
        p90 = np.where(saturation, 0.995, p90)
        pmax = np.where(saturation, 1.0, pmax)
        s["psi_cpu"] = np.where(saturation, 0.68 + 0.1 * _uniform(seed, 47, ii, tk),
                                0.01 + 0.08 * p50 ** 4)
        s["core_wait_max"] = np.where(imbalance, 0.7 + 0.2 * _uniform(seed, 48, ii, tk),
                                      np.where(saturation, 0.6, 0.01 + 0.05 * p50 ** 3))
        s["busy_p50"], s["busy_p90"], s["busy_max"] = p50, p90, pmax
        s["busy_min"] = np.maximum(p50 - 0.2 - 0.05 * _uniform(seed, 14, ii, tk), 0.0)
        s["saturated"] = np.where(imbalance, self.cores // 8,
                                  np.where(pmax > 0.9, np.ceil((pmax - 0.9) * 40), 0))
        s["busiest"] = np.floor(_uniform(seed, 15, ii) * self.cores) + 0 * tt
        s["steal_p90"] = np.where(steal, 0.16 + 0.03 * _uniform(seed, 16, ii, tk),
                                  0.002 + 0.002 * _uniform(seed, 17, ii, tk))
        s["steal_p50"] = s["steal_p90"] * 0.7
        s["steal_max"] = s["steal_p90"] * 1.4
        s["steal_min"] = s["steal_p90"] * 0.2
        membw = act["memory-bandwidth-saturation"]
        s["bw_ratio"] = np.where(membw, 0.86 + 0.06 * _uniform(seed, 18, ii, tk),
                                 0.12 + 0.5 * p50 + 0.03 * _uniform(seed, 19, ii, tk))
        s["llc_miss"] = np.where(membw, 0.3 + 0.05 * _uniform(seed, 20, ii, tk),
                                 0.06 + 0.08 * _uniform(seed, 21, ii, tk))
        s["ipc"] = np.where(membw, 0.5 + 0.1 * _uniform(seed, 22, ii, tk),
                            1.2 + 0.6 * _uniform(seed, 23, ii, tk))
        roce = act["roce-congestion"]
        s["ecn_rate"] = np.where(roce, 1500 + 800 * _uniform(seed, 24, ii, tk),
                                 2 * _uniform(seed, 25, ii, tk))
        s["pfc_rate"] = np.where(roce, 900 + 600 * _uniform(seed, 26, ii, tk),
                                 0.5 * _uniform(seed, 27, ii, tk))
        s["port_bytes"] = 4e8 + 8e8 * p50
        s["numa_remote_pages"] = np.where(act["numa-remote-access"], 6e4, 1.5e3) * (
            0.8 + 0.4 * _uniform(seed, 28, ii, tk))
        s["irq_overlap"] = act["irq-core-overlap"]
        s["since"] = {rule: tt - self.onset_s[number][idx][:, None]
                      for number, (rule, *_) in enumerate(self.fault_list)}
        s["day"] = day
        s["act"] = act
        s["steal"] = steal
        return s

    # -- families ------------------------------------------------------------------------
    def _families(self, idx: np.ndarray, t: np.ndarray, names: set[str] | None):
        """Yield (metric, labels per row, values [rows, times], row -> node position)."""
        s = self._signals(idx, t)
        act = s["act"]
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
            runnable = self.cores * np.where(act["cpu-saturation"], 2.2, s["busy_p50"] * 0.9)
            yield "fleetscope_procs_running", node_labels(), np.round(runnable), rows
        if want("fleetscope_cpu_busiest_core"):
            yield "fleetscope_cpu_busiest_core", node_labels(), s["busiest"], rows
        numa = np.asarray([CPU_MODELS[self.model[i]].numa_nodes for i in idx])
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
                          "irq": busy * 0.01, "softirq": busy * 0.05 + 0.04 * s[
                              "irq_overlap"][sub], "steal": steal,
                          "iowait": 0.004 + 0 * busy}
                shares["idle"] = np.maximum(1 - sum(shares.values()), 0.0)
                for mode in MODES:
                    rate = shares[mode] * cpus
                    yield ("fleetscope_cpu_numa_node_seconds_total",
                           [{"instance": x, "numa_node": str(node), "mode": mode}
                            for x in sub_inst],
                           counter(rate, rate[:, -1] * uptime[sub]), sub)
            if want("fleetscope_schedstat_numa_node_waiting_seconds_total"):
                wait = cpus * (0.002 + 0.05 * busy ** 3 + 0.2 * act["offline-preemption"][sub])
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
        # Listen overflow: the gateway's listener (backlog 511) held full, handshakes dropped.
        overflow = act["listen-overflow"]
        for name in ("ListenOverflows", "ListenDrops"):
            if want("fleetscope_tcp_stats_total"):
                rate = np.where(overflow, 35 + 20 * _uniform(self.seed, 91, idx[:, None],
                                                              t // STEP_S), 0.0)
                yield ("fleetscope_tcp_stats_total",
                       node_labels(group="TcpExt", counter=name),
                       counter(rate, rate[:, -1] * uptime * 0.001), rows)
        if want("fleetscope_tcp_listen_queue_connections"):
            queue = np.where(overflow, 512.0, np.floor(3 * _uniform(self.seed, 92, idx[:, None],
                                                                     t // STEP_S)))
            yield ("fleetscope_tcp_listen_queue_connections",
                   node_labels(listener="0.0.0.0:8443"), queue, rows)
        if want("fleetscope_tcp_listen_backlog_connections"):
            yield ("fleetscope_tcp_listen_backlog_connections",
                   node_labels(listener="0.0.0.0:8443"), np.full((n, m), 511.0), rows)
        # SIGILL in the kernel log: only on nodes that ran the new binary.
        crashed = np.flatnonzero(act["isa-mismatch"][:, -1])
        if len(crashed):
            since = s["since"]["isa-mismatch"][crashed]
            binaries = [{"instance": inst[r], "binary": NEW_BINARY} for r in crashed]
            if want("fleetscope_sigill_crashes_total"):
                # The scheduler restarts the task every minute; each start dies at once.
                values = np.where(since >= 0, np.floor(since / STEP_S) + 1, np.nan)
                yield "fleetscope_sigill_crashes_total", binaries, values, crashed
            if want("fleetscope_sigill_last_crash_timestamp_seconds"):
                # the latest restart's crash: each node restarts the task every minute at
                # its own second, so the last crash is 5-45 s before the scrape
                offset = 5 + 40 * _uniform(self.seed, 90, idx[crashed])[:, None]
                last = np.where(since >= 0, np.floor(t[None, :] / STEP_S) * STEP_S
                                - np.minimum(offset, since), np.nan)
                yield "fleetscope_sigill_last_crash_timestamp_seconds", binaries, last, crashed
        # Segfaults in the kernel log (crash-loop): a new tool-runner build dies at start,
        # restarted by its supervisor every ~20 s.
        looping = np.flatnonzero(act["crash-loop"][:, -1])
        if len(looping):
            since = s["since"]["crash-loop"][looping]
            binaries = [{"instance": inst[r], "binary": CRASHING_BINARY} for r in looping]
            if want("fleetscope_fatal_trap_crashes_total"):
                values = np.where(since >= 0, np.floor(since / 20) + 1, np.nan)
                yield "fleetscope_fatal_trap_crashes_total", binaries, values, looping
            if want("fleetscope_fatal_trap_last_crash_timestamp_seconds"):
                offset = 1 + 18 * _uniform(self.seed, 91, idx[looping])[:, None]
                last = np.where(since >= 0, t[None, :] - np.minimum(offset, since), np.nan)
                yield ("fleetscope_fatal_trap_last_crash_timestamp_seconds", binaries, last,
                       looping)
        yield from self._memory_families(idx, t, s, want, counter, node_labels)
        yield from self._pool_families(idx, t, s, want, counter, node_labels)

    def _memory_families(self, idx, t, s, want, counter, node_labels):
        """oom-kill: a leaking worker killed at its cgroup's limit about every two minutes;
        memory-pressure: a cgroup at its limit, tasks stalled ~22 % of the time in reclaim."""
        act = s["act"]
        uptime = self.uptime_s[idx]
        oom, pressure = act["oom-kill"], act["memory-pressure"]
        kills = np.where(oom, 1 / 120, 0.0)
        if want("fleetscope_vmstat_oom_kills_total"):
            yield ("fleetscope_vmstat_oom_kills_total", node_labels(),
                   counter(kills, 2 + kills[:, -1] * 3600), np.arange(len(idx)))
        if want("fleetscope_oom_kills_logged_total"):
            for constraint in ("global", "memcg"):
                rate = kills if constraint == "memcg" else 0 * kills
                yield ("fleetscope_oom_kills_logged_total", node_labels(constraint=constraint),
                       counter(rate, rate[:, -1] * 3600), np.arange(len(idx)))
        killed = np.flatnonzero(oom[:, -1])
        if len(killed) and want("fleetscope_oom_kill_last_timestamp_seconds"):
            since = s["since"]["oom-kill"][killed]
            offset = 10 + 100 * _uniform(self.seed, 91, idx[killed])[:, None]
            last = np.where(since >= 0, t[None, :] - np.minimum(offset, since), np.nan)
            yield ("fleetscope_oom_kill_last_timestamp_seconds",
                   [{"instance": self.instances[idx[r]], "constraint": "memcg"} for r in killed],
                   last, killed)
        stall = np.where(pressure, 0.22, 0.004)
        stalls = np.where(pressure, 40.0, 0.0)
        if want("fleetscope_pressure_stall_seconds_total"):
            yield ("fleetscope_pressure_stall_seconds_total",
                   node_labels(resource="memory", stall="some"),
                   counter(stall, stall[:, -1] * uptime), np.arange(len(idx)))
        if want("fleetscope_memory_allocation_stalls_total"):
            yield ("fleetscope_memory_allocation_stalls_total", node_labels(),
                   counter(stalls, stalls[:, -1] * 3600), np.arange(len(idx)))

    def _pool_families(self, idx, t, s, want, counter, node_labels):
        seed = self.seed
        act = s["act"]
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

            def a(rule: str, rows=rows, online=online, slot=slot) -> np.ndarray:
                """Fault active on these rows (faults hit slot 0 unless said otherwise)."""
                on = act[rule][rows]
                if rule == "offline-preemption":
                    return on & online[:, None]
                if rule == "thread-oversubscription":
                    return on & ~online[:, None]
                return on & (slot == 0)

            procs = np.asarray([p.processes for p in pools], dtype=float)
            if slot == 1:
                procs = procs * 0 + 4
            threads = procs * np.asarray([p.threads_per_process for p in pools])
            over = a("thread-oversubscription")
            threads_now = np.where(over, (procs * 64)[:, None], threads[:, None]) + 0 * t
            if want("fleetscope_pool_processes"):
                yield "fleetscope_pool_processes", labels(), procs[:, None] + 0 * t, rows
            if want("fleetscope_pool_threads"):
                yield "fleetscope_pool_threads", labels(), threads_now.astype(float), rows
            if want("fleetscope_pool_process_starts_total"):  # crash-loop: a restart each 20 s
                rate = np.where(a("crash-loop"), 0.05, 0.0005) + 0 * t
                yield ("fleetscope_pool_process_starts_total", labels(),
                       counter(rate, np.floor(rate[:, -1] * uptime[rows] * 0.01)), rows)
            if want("fleetscope_pool_file_lock_waiters"):  # lock-contention: all but one wait
                waiters = np.where(a("lock-contention"), np.maximum(procs - 1, 1)[:, None],
                                   0.0) + 0 * t
                yield "fleetscope_pool_file_lock_waiters", labels(), waiters, rows
            if want("fleetscope_pool_threads_per_core"):
                yield ("fleetscope_pool_threads_per_core", labels(),
                       threads_now / physical[rows][:, None], rows)
            if want("fleetscope_pool_threads_read"):  # every thread read: under the cap
                yield ("fleetscope_pool_threads_read", labels(),
                       np.minimum(threads_now, 1024.0).astype(float), rows)
            if want("fleetscope_pool_runnable_threads"):
                runnable = np.where(over, 0.9, 0.05 + 0.2 * s["busy_p50"][rows]) * threads_now
                yield ("fleetscope_pool_runnable_threads", labels(),
                       np.round(np.minimum(runnable, 1024.0)), rows)
            busy = s["busy_p50"][rows]
            preempt = a("offline-preemption")
            stolen = s["steal"][rows] & online[:, None]
            delay = procs[:, None] * np.where(preempt, 0.12, np.where(stolen, 0.09, 0.003 + 0.004
                                                                     * busy))
            if want("fleetscope_pool_run_delay_seconds_total"):
                yield ("fleetscope_pool_run_delay_seconds_total", labels(),
                       counter(delay, delay[:, -1] * uptime[rows]), rows)
            mixed_batch = (slot == 1)
            cpu = np.where(online[:, None], busy * self.cores * 0.8,
                           np.where(mixed_batch, np.where(act["offline-preemption"][rows], 30.0,
                                                          0.3), busy * self.cores * 0.9))
            if want("fleetscope_pool_cpu_seconds_total"):
                yield ("fleetscope_pool_cpu_seconds_total", labels(),
                       counter(cpu, cpu[:, -1] * uptime[rows]), rows)
            if want("fleetscope_pool_cgroup_cpu_pressure_stall_seconds_total"):
                for stall, weight in (("some", 1.0), ("full", 0.3)):
                    rate = weight * np.where(preempt | stolen, 0.35, 0.01 + 0.02 * busy)
                    yield ("fleetscope_pool_cgroup_cpu_pressure_stall_seconds_total",
                           labels(stall=stall), counter(rate, rate[:, -1] * uptime[rows]), rows)
            if want("fleetscope_pool_context_switches_total"):
                for kind, rate in (("voluntary", procs[:, None] * (40 + 30 * busy)),
                                   ("nonvoluntary", np.where(over, 900.0, procs[:, None] * (
                                       0.5 + 2 * busy)))):
                    yield ("fleetscope_pool_context_switches_total", labels(kind=kind),
                           counter(rate, rate[:, -1] * uptime[rows]), rows)
            fd = a("fd-exhaustion")
            limit = np.where(fd, 1024.0, 65535.0)
            open_fds = np.where(fd, 980 + 30 * _uniform(seed, 40, r_ii, tk),
                                200 + 600 * _uniform(seed, 41, r_ii))
            if want("fleetscope_pool_fd_usage_ratio"):
                yield "fleetscope_pool_fd_usage_ratio", labels(), open_fds / limit, rows
            if want("fleetscope_pool_fd_usage_open_fds"):
                yield "fleetscope_pool_fd_usage_open_fds", labels(), np.floor(open_fds), rows
            if want("fleetscope_pool_fd_usage_limit_fds"):
                yield "fleetscope_pool_fd_usage_limit_fds", labels(), limit + 0 * t, rows
            # cpu-throttling: the pool's own quota (1 CPU a process) stops it in ~90 % of
            # its 100 ms periods; otherwise a few throttled periods at most.
            throttling = a("cpu-throttling")
            if want("fleetscope_pool_cgroup_cpu_periods_total"):
                periods = 10.0 + 0 * t + np.zeros((len(rows), 1))
                yield ("fleetscope_pool_cgroup_cpu_periods_total", labels(),
                       counter(periods, periods[:, -1] * uptime[rows]), rows)
            for metric, fault_rate, quiet_rate in (
                    ("fleetscope_pool_cgroup_cpu_throttled_periods_total", 9.1, 0.05),
                    ("fleetscope_pool_cgroup_cpu_throttled_seconds_total", 0.6, 0.001)):
                if want(metric):
                    rate = np.where(throttling, fault_rate, quiet_rate) + 0 * t
                    yield metric, labels(), counter(rate, rate[:, -1] * uptime[rows]), rows
            if want("fleetscope_pool_cgroup_cpu_quota_cpus"):
                yield ("fleetscope_pool_cgroup_cpu_quota_cpus", labels(),
                       np.where(throttling, procs[:, None] * 0.4, np.inf) + 0 * t, rows)
            # pid-exhaustion: a thread leak fills the pool's pids.max; forks refused since.
            leak = a("pid-exhaustion")
            pids_limit = np.where(leak, 256.0, 4096.0) + 0 * t
            pids_now = np.where(leak, 256.0, np.minimum(threads_now + procs[:, None], 4000.0))
            if want("fleetscope_pool_cgroup_pids_usage_ratio"):
                yield ("fleetscope_pool_cgroup_pids_usage_ratio", labels(),
                       pids_now / pids_limit, rows)
            if want("fleetscope_pool_cgroup_pids_current"):
                yield "fleetscope_pool_cgroup_pids_current", labels(), pids_now, rows
            if want("fleetscope_pool_cgroup_pids_limit"):
                yield "fleetscope_pool_cgroup_pids_limit", labels(), pids_limit, rows
            if want("fleetscope_pool_cgroup_pids_limit_hits_total"):
                refused = np.where(leak, 0.5, 0.0) + 0 * t
                yield ("fleetscope_pool_cgroup_pids_limit_hits_total", labels(),
                       counter(refused, refused[:, -1] * 3600), rows)
            if want("fleetscope_pool_nproc_limit"):
                yield "fleetscope_pool_nproc_limit", labels(), 65535.0 + 0 * t, rows
            remote = np.where(a("numa-remote-access"), 0.48 + 0.15 * _uniform(seed, 42, r_ii),
                              0.02 + 0.06 * _uniform(seed, 43, r_ii, tk))
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
                irq = a("irq-core-overlap")[on_rows]
                irq_labels = [{"instance": sub_inst[r], "pool": pools[r].name} for r in on_rows]
                if want("fleetscope_irq_online_pool_overlap_cpus"):
                    yield ("fleetscope_irq_online_pool_overlap_cpus", irq_labels,
                           np.where(irq, 16.0, 0.0), rows[on_rows])
                if want("fleetscope_irq_online_pool_cpus"):
                    yield ("fleetscope_irq_online_pool_cpus", irq_labels,
                           np.full((len(on_rows), len(t)), self.cores * 0.75), rows[on_rows])
                if want("fleetscope_irq_online_pool_irq_seconds_total"):
                    share = np.where(irq, 0.12, 0.004) * self.cores * 0.75
                    yield ("fleetscope_irq_online_pool_irq_seconds_total", irq_labels,
                           counter(share, share[:, -1] * uptime[rows][on_rows]), rows[on_rows])
                if want("fleetscope_irq_online_pool_device_interrupts_total"):
                    rate = np.where(irq, 5000 + 2000 * _uniform(seed, 44, r_ii[on_rows], tk),
                                    20 + 20 * _uniform(seed, 45, r_ii[on_rows], tk))
                    yield ("fleetscope_irq_online_pool_device_interrupts_total", irq_labels,
                           counter(rate, rate[:, -1] * uptime[rows][on_rows]), rows[on_rows])
            since = {rule: s["since"][rule][rows] for rule in s["since"]}
            yield from self._agent_families(rows, r_ii, pools, a, since, s, t, counter,
                                            labels(False), want)

    def _agent_families(self, rows, r_ii, pools, a, since, s, t, counter, base_labels, want):
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
        # Queue: grows by 3 tasks a minute since the backlog began.
        backlog = a("queue-backlog")
        depth = np.where(backlog, 20 + 3 * since["queue-backlog"] / 60,
                         np.floor(12 * _uniform(seed, 50, r_ii, tk)))
        if want("agent_queue_depth"):
            yield ("agent_queue_depth",
                   [{**d, "queue": p.queue} for d, p in zip(base_labels, pools, strict=True)],
                   depth, rows)
        blocked = a("worker-blocked-external-call")
        age = np.where(blocked, 125 + since["worker-blocked-external-call"],
                       0.2 + 6 * _uniform(seed, 51, r_ii, tk))
        if want("agent_task_heartbeat_age_seconds"):
            yield "agent_task_heartbeat_age_seconds", labels(), age, rows
        migrations = np.where(a("session-affinity-loss"), 0.22, 0.001)
        if want("agent_session_migrations_total"):
            rate = migrations + np.zeros((len(rows), m))
            yield ("agent_session_migrations_total", labels(),
                   counter(rate, rate[:, -1] * uptime * 10), rows)
        bad_quant = a("quantization-tool-errors")
        if want("agent_tool_calls_total"):
            for tool_number in range(2):
                has = np.asarray([len(p.tools) > tool_number for p in pools])
                sub = np.flatnonzero(has)
                if not len(sub):
                    continue
                for outcome, share in (("ok", 0.97), ("timeout", 0.01),
                                       ("bad_arguments", 0.01), ("error", 0.01)):
                    calls = sessions[sub] * 1.5
                    if outcome == "bad_arguments":
                        rate = calls * np.where(bad_quant[sub], 0.16, share)
                    elif outcome == "timeout":
                        rate = calls * np.where(blocked[sub], 0.25, share)
                    else:
                        rate = calls * share
                    models = [BAD_QUANT_MODEL if bad_quant[r, -1] else pools[r].model
                              for r in sub]
                    yield ("agent_tool_calls_total",
                           [{**base_labels[r], "tool": pools[r].tools[tool_number],
                             "model": model, "outcome": outcome}
                            for r, model in zip(sub, models, strict=True)],
                           counter(rate, rate[:, -1] * uptime[sub]), rows[sub])
        # Where session time goes, per stage; faults stretch the stage they hurt.
        stretch = {name: np.ones((len(rows), m)) for name in STAGES}
        cpu_bound = 1.0 + 0.8 * a("offline-preemption") + 0.7 * a(
            "memory-bandwidth-saturation") + 0.5 * a("numa-remote-access") + 0.5 * a(
            "thread-oversubscription") + 0.3 * a("core-imbalance")
        stretch["inference"] = cpu_bound
        stretch["context_assembly"] = cpu_bound
        stretch["queue_wait"] = 1.0 + 14 * backlog + 1.5 * a("offline-preemption")
        stretch["state_io"] = 1.0 + 7 * a("roce-congestion") + 0.4 * a("session-affinity-loss")
        stretch["tool_call"] = 1.0 + 3 * blocked + 0.3 * bad_quant + 12 * a("slow-dependency")
        stretch["other"] = 1.0 + 0.5 * a("irq-core-overlap")
        mean_total = np.zeros((len(rows), m))
        for stage in STAGES:
            mean = np.asarray([dict(p.stages).get(stage, 0.0) for p in pools])[:, None]
            mean = mean * stretch[stage] * (0.9 + 0.2 * _uniform(seed, 60 + STAGES.index(stage),
                                                                  r_ii, tk))
            count_rate = sessions + 0 * mean
            if stage == "model_load":
                cold = a("cold-start")
                count_rate = np.where(cold, 0.05, 0.0) + 0 * sessions
                mean = np.where(cold, 20 + 8 * _uniform(seed, 70, r_ii, tk), 0.0)
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
        # A step no stage measures (unexplained-harm): session time outside every stage.
        mean_total = mean_total + 1.5 * a("unexplained-harm")
        # Session latency: log-normal around the stages' sum; faults widen the tail.
        tail = 0.45 + 0.25 * (a("offline-preemption") | a("irq-core-overlap")
                              | a("roce-congestion")) + 0.2 * a("session-affinity-loss")
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

    def _per_core(self, i: int, t: np.ndarray):
        """fleetscope_cpu_seconds_total{cpu, mode} for one node (full per-core mode)."""
        seed = self.seed
        s = self._signals(np.asarray([i]), t)
        cores = np.arange(self.cores)
        tk = (t // STEP_S)[None, :]
        p50, p90 = s["busy_p50"][0][None, :], s["busy_p90"][0][None, :]
        # Each core keeps its place in the distribution (affinity), with a little jitter.
        imbalance = self._active("core-imbalance", np.asarray([i]), t)[0][None, :]
        p90 = np.where(imbalance, p50 + 0.1, p90)  # the hogs below make the node's p90
        rank = _uniform(seed, 80, np.asarray(i), cores)[:, None]
        z = np.sqrt(2) * _erfinv(2 * rank - 1)
        busy = p50 + (p90 - p50) / 1.2816 * (0.85 * z + 0.5 * _noise(seed, 81, cores[:, None],
                                                                       tk))
        busy = np.clip(busy, 0.0, 0.97)
        hogs = cores[:, None] < self.cores // 8
        busy = np.where(imbalance & hogs, 0.985 + 0.01 * _uniform(seed, 82, cores[:, None], tk),
                        busy)
        overlap = self._active("irq-core-overlap", np.asarray([i]), t)[0][None, :]
        irq_cores = (cores[:, None] % 8 == 0)
        softirq = busy * 0.05 + np.where(overlap & irq_cores, 0.3, 0.0)
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
