"""The node config file (`--config FILE`, YAML), validated into a `Config`.

    pools:
      - {name: chat-online, class: online, match: {cgroup: "*/online/*"}}
      - {name: batch, class: offline, match: {cmdline: "etl|train"}}
    per_core: summary            # or full: every core's 8 modes (node_exporter's shape)
    busy_interval_min_seconds: 5 # shortest interval the per-core busy distribution covers
    numa_maps_min_interval_seconds: 30  # pool NUMA locality: numa_maps is costly to read
    ethtool_interfaces: [eth0, "ens*"]  # ethtool -S these, besides the RDMA netdevs
    redact: ["tenant-[0-9]+", "sk-[A-Za-z0-9]{20,}"]  # regexes `bundle record` also redacts
    harm_targets: {online_session_p99_seconds: 1.0}  # where workloads hurt (harm_targets.py)
    binary_dirs: [/opt/agent/bin]  # where a binary the kernel names by its file name may be
    isa_scan_seconds: 30         # all ELF reads about SIGILL crashes of one command
    ring_interval_seconds: 15    # the flight recorder (`exporter --state-dir`): a sample
    ring_span_seconds: 1800      # every 15 s, kept 30 min, at most 256 MiB on disk
    ring_max_bytes: 268435456

Pools, agent endpoints, Redis queues and the platform block are the documented ones
(docs/exporter.md); the rest are fleetscope's own settings. Loaded with yaml.safe_load only.
Unknown keys are errors at every level (a typo, or an alias bomb parked under a key nobody
reads), and a document over MAX_CONFIG_NODES values or MAX_CONFIG_DEPTH levels is refused
before anything walks or serialises it.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import yaml

from .config_error import ConfigError
from .harm_targets import HarmTargetError, HarmTargets, parse_harm_targets
from .kubernetes_config import MATCH_KEYS, KubernetesPaths, kubernetes_paths, pod_terms
from .named_file import read_named_file
from .patterns import compile_checked
from .patterns import error as pattern_error


@dataclass(frozen=True)
class Pool:
    name: str
    workload_class: str  # "online" or "offline"
    cgroup_glob: str | None = None
    cmdline_regex: str | None = None
    # Kubernetes terms, all of them holding at once (fleetscope/core/kubernetes_config.py)
    namespace_glob: str | None = None
    pod_glob: str | None = None
    container_glob: str | None = None
    qos: str | None = None  # guaranteed | burstable | besteffort
    kubernetes: KubernetesPaths | None = None  # where a pod pool's names are read

    @property
    def by_pod(self) -> bool:
        return any((self.namespace_glob, self.pod_glob, self.container_glob, self.qos))


@dataclass(frozen=True)
class RedisQueue:
    key: str
    pool: str


@dataclass(frozen=True)
class Config:
    per_core: str = "summary"
    busy_interval_min_seconds: float = 5.0
    saturated_core_busy_ratio: float = 0.9
    numa_maps_min_interval_seconds: float = 30.0
    collectors: tuple[str, ...] | None = None  # None: every collector
    pools: tuple[Pool, ...] = ()
    agent_metrics_url: str | None = None
    redis_url: str | None = None
    redis_queues: tuple[RedisQueue, ...] = ()
    memory_peak_bytes_per_second: float | None = None
    # Platform facts perf cannot tell: bytes per HiSilicon DDRC flux count (Huawei's own
    # tooling uses 32; the kernel documents no unit).
    ddrc_bytes_per_count: float = 32.0
    perf_window_seconds: float = 5.0  # perf stat sampling window, in a background thread
    command_timeout_seconds: float = 10.0  # perf, ethtool: killed and reported past this
    agent_timeout_seconds: float = 2.0  # agent metrics endpoint and Redis, per scrape
    # Inference accelerators (collectors/accelerator.py, docs/accelerators.md): the local
    # dcgm-exporter / npu-exporter endpoints, else the vendor tools ("auto": those on PATH).
    accelerator_exporter_urls: tuple[str, ...] = ()
    accelerator_tools: str | tuple[str, ...] = "auto"
    accelerator_timeout_seconds: float = 5.0
    accelerator_matrix: str | None = None  # the operator's driver/firmware matrix (YAML)
    # A worker thread parked in one network call longer than this is blocked (the warning
    # tier of worker-blocked-external-call; the heartbeat's 120 s stays critical).
    blocked_call_seconds: float = 30.0
    # Peers ("ip:port", as /proc/net/tcp shows them) a worker waits on for its next task, not
    # for an answer: the work queue (the redis_url's address is added). A thread parked in
    # BLPOP/XREADGROUP there is idle, not blocked in an external call.
    work_queue_peers: tuple[str, ...] = ()
    # Where workloads hurt (fleetscope/core/harm_targets.py): published for the harm rules.
    harm_targets: HarmTargets = field(default_factory=lambda: parse_harm_targets(None))
    redact: tuple[str, ...] = ()  # extra regexes `bundle record` redacts (fleetscope.bundle.redact)
    kubernetes: KubernetesPaths = KubernetesPaths()  # where the node's pod evidence is
    # Directories a binary that died of SIGILL is looked for in, before PATH, the library
    # directories and the running processes (fleetscope/tools/isa.py locate_binary).
    binary_dirs: tuple[str, ...] = ()
    # All the ELF reads of one diagnosis or recording about SIGILL crashes together
    # (fleetscope/tools/isa_budget.py): past it, what was not read is named, not waited for.
    isa_scan_seconds: float = 30.0
    # The flight recorder (fleetscope/bundle/ring.py): how often it samples, how long and
    # how many bytes of samples it keeps (at most the bundle format's 10,000 samples).
    ring_interval_seconds: float = 15.0
    ring_span_seconds: float = 1800.0
    ring_max_bytes: int = 256 * 1024 * 1024
    raw: dict[str, Any] = field(default_factory=dict)  # as loaded, for a bundle's metadata


_KNOWN_KEYS = {
    "ethtool_interfaces",
    "numa_maps_min_interval_seconds",
    "perf_window_seconds",
    "command_timeout_seconds",
    "agent_timeout_seconds",
    "accelerator_exporter_urls",
    "accelerator_tools",
    "accelerator_timeout_seconds",
    "accelerator_matrix",
    "pools",
    "agent_metrics_url",
    "redis_url",
    "redis_queues",
    "platform",
    "per_core",
    "busy_interval_min_seconds",
    "saturated_core_busy_ratio",
    "collectors",
    "blocked_call_seconds",
    "work_queue_peers",
    "redact",
    "kubernetes",
    "harm_targets",
    "binary_dirs",
    "isa_scan_seconds",
    "ring_interval_seconds",
    "ring_span_seconds",
    "ring_max_bytes",
}
MAX_CONFIG_BYTES = 16 * 1024 * 1024
MAX_CONFIG_NODES = 100_000  # a config names pools and queues: thousands of values at most
MAX_CONFIG_DEPTH = 32
MAX_RING_SAMPLES = 10_000  # the samples a bundle may hold (fleetscope/bundle/read.py)


def _peer(host: str, port: int) -> str:
    """`host:port` as the TCP table prints it: IPv6 in brackets, IPv4-mapped as IPv4."""
    address = ipaddress.ip_address(host)
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def _work_queue_peers(raw: dict) -> tuple[str, ...]:
    peers: list[str] = []
    listed = raw.get("work_queue_peers") or []
    if not isinstance(listed, list):
        raise ConfigError("work_queue_peers must be a list of ip:port")
    for entry in listed:
        host, sep, port = str(entry).rpartition(":") if isinstance(entry, str) else ("", "", "")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        try:
            if not sep or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError
            peers.append(_peer(host, int(port)))
        except ValueError:
            raise ConfigError(f"work_queue_peers: {str(entry)[:60]!r} is not ip:port (an IP "
                              "address, as the node's TCP table shows the peer)") from None
    url = raw.get("redis_url")
    if isinstance(url, str) and url.startswith(("redis://", "rediss://")):
        try:
            parsed = urllib.parse.urlsplit(url)
            host, port = parsed.hostname, parsed.port or 6379
        except ValueError:
            host = None
        # Only an address can be matched: a host name would need a DNS lookup at start-up.
        hosts = ["127.0.0.1", "::1"] if host == "localhost" else [host] if host else []
        for name in hosts:
            try:
                peers.append(_peer(name, port))
            except ValueError:
                pass
    return tuple(dict.fromkeys(peers))


def check_bounded(raw: Any, what: str = "the config") -> None:
    """ConfigError when a loaded document is deeper or larger than any real config. YAML
    aliases count every time they are used, so a billion-laughs document stops here after
    MAX_CONFIG_NODES steps instead of filling memory when serialised."""
    stack = [(raw, 0)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_CONFIG_NODES:
            raise ConfigError(f"{what} has more than {MAX_CONFIG_NODES} values "
                              "(a YAML alias bomb?): refused")
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"{what} is nested more than {MAX_CONFIG_DEPTH} levels deep: "
                              "refused")
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for pair in value.items() for item in pair)
        elif isinstance(value, (list, tuple)):
            stack.extend((item, depth + 1) for item in value)


# A decimal number as YAML 1.2 and JSON write it: PyYAML (YAML 1.1) loads `409.6e9` or `1e9`,
# an exponent without a sign or a mantissa without a dot, as a string.
_YAML12_FLOAT = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+\Z")


def _numeric(value: Any) -> Any:
    """`value`, or the float of a string YAML 1.1 left unread (`409.6e9`)."""
    if isinstance(value, str) and _YAML12_FLOAT.match(value.strip()):
        return float(value)
    return value


def _number(raw: dict, key: str, default: float, low: float, high: float) -> float:
    value = _numeric(raw.get(key, default))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(f"{key} must be a number from {low} to {high}, got {value!r}")
    return float(value)


ACCELERATOR_TOOLS = ("nvidia-smi", "npu-smi")  # the vendor tools collectors/accelerator.py runs


def _accelerator_urls(raw: dict) -> tuple[str, ...]:
    urls = raw.get("accelerator_exporter_urls") or []
    if not isinstance(urls, list) or not all(isinstance(url, str) for url in urls):
        raise ConfigError("accelerator_exporter_urls must be a list of http(s) URLs")
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"accelerator_exporter_urls: {url[:80]!r} is not an http(s) URL")
    return tuple(urls)


def _accelerator_tools(raw: dict) -> str | tuple[str, ...]:
    tools = raw.get("accelerator_tools", "auto")
    if tools == "auto":
        return tools
    if tools is None:
        return ()
    if not isinstance(tools, list) or not all(tool in ACCELERATOR_TOOLS for tool in tools):
        raise ConfigError("accelerator_tools must be 'auto' or a list of "
                          f"{', '.join(ACCELERATOR_TOOLS)} (empty: none), got {str(tools)[:60]!r}")
    return tuple(dict.fromkeys(tools))


def _accelerator_matrix(raw: dict) -> str | None:
    path = raw.get("accelerator_matrix")
    if path is not None and (not isinstance(path, str) or not path or "\0" in path):
        raise ConfigError("accelerator_matrix must be the path of a YAML file")
    return path


def _harm_targets(raw: dict) -> HarmTargets:
    try:
        return parse_harm_targets(raw.get("harm_targets"))
    except HarmTargetError as err:
        raise ConfigError(str(err)) from None


def _pool(index: int, raw: Any) -> Pool:
    where = f"pools[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping with name, class and match")
    unknown = set(raw) - {"name", "class", "match"}
    if unknown:
        raise ConfigError(f"{where} has unknown keys: {', '.join(sorted(map(str, unknown)))} "
                          "(known: name, class, match)")
    name, workload_class, match = raw.get("name"), raw.get("class"), raw.get("match")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name must be a non-empty string")
    if workload_class not in ("online", "offline"):
        raise ConfigError(f"{where}.class must be 'online' or 'offline', got {workload_class!r}")
    unknown = set(match) - MATCH_KEYS if isinstance(match, dict) else set()
    if unknown:
        raise ConfigError(f"{where}.match has unknown keys: "
                          f"{', '.join(sorted(map(str, unknown)))} "
                          f"(known: {', '.join(sorted(MATCH_KEYS))})")
    if not isinstance(match, dict) or not (set(match) & MATCH_KEYS):
        raise ConfigError(f"{where}.match needs a 'cgroup' glob, a 'cmdline' regex or "
                          "Kubernetes terms (namespace, pod, container, qos)")
    for key in ("cgroup", "cmdline"):
        if key in match and not isinstance(match[key], str):
            raise ConfigError(f"{where}.match.{key} must be a string")
    if "cmdline" in match:
        try:
            compile_checked(match["cmdline"])
        except pattern_error as err:
            raise ConfigError(f"{where}.match.cmdline is not a valid regex: {err}") from None
    return Pool(name, workload_class, match.get("cgroup"), match.get("cmdline"),
                **pod_terms(where, match))


def _with_near_key(key: str, known) -> str:
    """'pool (did you mean pools?)' for a typo; the key alone when nothing is close."""
    near = difflib.get_close_matches(key, sorted(known), n=1)
    return f"{key} (did you mean {near[0]}?)" if near else key


def parse_config(raw: Any, known_collectors: tuple[str, ...] = ()) -> Config:
    """Validate a loaded YAML document. Unknown top-level keys are errors (typos hide)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("the config must be a YAML mapping")
    unknown = set(raw) - _KNOWN_KEYS
    if unknown:
        raise ConfigError("unknown config keys: " + ", ".join(
            _with_near_key(str(key), _KNOWN_KEYS) for key in sorted(map(str, unknown))))
    per_core = raw.get("per_core", "summary")
    if per_core not in ("summary", "full"):
        raise ConfigError(f"per_core must be 'summary' or 'full', got {per_core!r}")
    pools_raw = raw.get("pools", [])
    if not isinstance(pools_raw, list):
        raise ConfigError("pools must be a list")
    pools = tuple(_pool(i, p) for i, p in enumerate(pools_raw))
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise ConfigError("pool names must be unique")
    queues_raw = raw.get("redis_queues", [])
    if not isinstance(queues_raw, list) or not all(
        isinstance(q, dict) and isinstance(q.get("key"), str) and isinstance(q.get("pool"), str)
        for q in queues_raw
    ):
        raise ConfigError("redis_queues must be a list of {key: str, pool: str}")
    for index, queue in enumerate(queues_raw):
        if set(queue) - {"key", "pool"}:
            extra = ", ".join(sorted(map(str, set(queue) - {"key", "pool"})))
            raise ConfigError(f"redis_queues[{index}] has unknown keys: {extra} "
                              "(known: key, pool)")
    redact = raw.get("redact") or []
    if not isinstance(redact, list) or not all(isinstance(p, str) and p for p in redact):
        raise ConfigError("redact must be a list of regexes")
    for pattern in redact:
        try:
            compile_checked(pattern)
        except pattern_error as err:
            raise ConfigError(f"redact: {pattern[:60]!r} is not a valid regex: {err}") from None
    for key in ("agent_metrics_url", "redis_url"):
        if key in raw and not isinstance(raw[key], str):
            raise ConfigError(f"{key} must be a string URL")
    platform = raw.get("platform", {}) or {}
    if not isinstance(platform, dict):
        raise ConfigError("platform must be a mapping")
    unknown = set(platform) - {"memory_peak_bytes_per_second", "ddrc_bytes_per_count"}
    if unknown:
        raise ConfigError(f"platform has unknown keys: {', '.join(sorted(map(str, unknown)))}")
    ddrc = _number(platform, "ddrc_bytes_per_count", 32.0, 1.0, 4096.0)
    peak = _numeric(platform.get("memory_peak_bytes_per_second"))
    bad_peak = isinstance(peak, bool) or not isinstance(peak, (int, float)) or peak <= 0
    if peak is not None and bad_peak:
        raise ConfigError("platform.memory_peak_bytes_per_second must be a positive number")
    interfaces = raw.get("ethtool_interfaces", [])
    if interfaces is not None and (not isinstance(interfaces, list) or not all(
            isinstance(i, str) and i for i in interfaces)):
        raise ConfigError("ethtool_interfaces must be a list of interface names or globs")
    collectors = raw.get("collectors")
    if collectors is not None:
        if not isinstance(collectors, list) or not all(isinstance(c, str) for c in collectors):
            raise ConfigError("collectors must be a list of collector names")
        unknown = set(collectors) - set(known_collectors)
        if known_collectors and unknown:
            raise ConfigError(
                f"unknown collectors: {', '.join(sorted(unknown))} "
                f"(known: {', '.join(known_collectors)})"
            )
        collectors = tuple(collectors)
    binary_dirs = raw.get("binary_dirs") or []
    if not isinstance(binary_dirs, list) or not all(
            isinstance(d, str) and d.startswith("/") and "\0" not in d for d in binary_dirs):
        raise ConfigError("binary_dirs must be a list of absolute directory paths")
    check_bounded(raw)  # after the key checks: an unknown key is the clearer message
    paths = kubernetes_paths(raw.get("kubernetes"))
    pools = tuple(dataclasses.replace(p, kubernetes=paths) if p.by_pod else p for p in pools)
    ring_interval = _number(raw, "ring_interval_seconds", 15.0, 1.0, 3600.0)
    ring_span = _number(raw, "ring_span_seconds", 1800.0, 60.0, 7 * 86400.0)
    if ring_span / ring_interval > MAX_RING_SAMPLES:
        raise ConfigError(f"ring_span_seconds / ring_interval_seconds is "
                          f"{ring_span / ring_interval:g} samples, over the {MAX_RING_SAMPLES} "
                          "a bundle holds: sample less often or keep a shorter span")
    return Config(
        per_core=per_core,
        busy_interval_min_seconds=_number(raw, "busy_interval_min_seconds", 5.0, 0.0, 3600.0),
        saturated_core_busy_ratio=_number(raw, "saturated_core_busy_ratio", 0.9, 0.0, 1.0),
        numa_maps_min_interval_seconds=_number(
            raw, "numa_maps_min_interval_seconds", 30.0, 0.0, 86400.0
        ),
        collectors=collectors,
        pools=pools,
        agent_metrics_url=raw.get("agent_metrics_url"),
        redis_url=raw.get("redis_url"),
        redis_queues=tuple(RedisQueue(q["key"], q["pool"]) for q in queues_raw),
        memory_peak_bytes_per_second=float(peak) if peak is not None else None,
        ddrc_bytes_per_count=ddrc,
        perf_window_seconds=_number(raw, "perf_window_seconds", 5.0, 0.1, 3600.0),
        command_timeout_seconds=_number(raw, "command_timeout_seconds", 10.0, 0.1, 600.0),
        isa_scan_seconds=_number(raw, "isa_scan_seconds", 30.0, 0.1, 3600.0),
        ring_interval_seconds=ring_interval,
        ring_span_seconds=ring_span,
        ring_max_bytes=int(_number(raw, "ring_max_bytes", 256 * 1024 * 1024, 1024 * 1024,
                                   1024 ** 4)),
        agent_timeout_seconds=_number(raw, "agent_timeout_seconds", 2.0, 0.05, 60.0),
        accelerator_exporter_urls=_accelerator_urls(raw),
        accelerator_tools=_accelerator_tools(raw),
        accelerator_timeout_seconds=_number(raw, "accelerator_timeout_seconds", 5.0, 0.05, 60.0),
        accelerator_matrix=_accelerator_matrix(raw),
        blocked_call_seconds=_number(raw, "blocked_call_seconds", 30.0, 0.0, 86400.0),
        work_queue_peers=_work_queue_peers(raw),
        redact=tuple(redact),
        kubernetes=paths,
        harm_targets=_harm_targets(raw),
        binary_dirs=tuple(binary_dirs),
        raw=raw,
    )


DEFAULT_CONFIG = "/etc/fleetscope/config.yaml"


def default_config_path() -> str | None:
    """The node's config when no --config is given: $FLEETSCOPE_CONFIG, else
    /etc/fleetscope/config.yaml if it exists (so `fleetscope diagnose` at 3 a.m. knows the
    node's pools without flags)."""
    from_env = os.environ.get("FLEETSCOPE_CONFIG")
    if from_env:
        return from_env
    return DEFAULT_CONFIG if os.path.isfile(DEFAULT_CONFIG) else None


def load_config(path: str | None, known_collectors: tuple[str, ...] = ()) -> Config:
    """Read and validate a config file; no file means the defaults."""
    if path is None:
        return parse_config({}, known_collectors)
    try:
        raw = yaml.safe_load(read_named_file(path, MAX_CONFIG_BYTES).decode("utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot read config {path}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config {path} is not valid YAML{where}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config {path} is not UTF-8 text") from None
    except RecursionError:
        raise ConfigError(f"config {path} is nested too deeply to be a config: refused") from None
    try:
        return parse_config(raw, known_collectors)
    except ConfigError as err:
        # Name the file, and where its name came from when no --config was given.
        origin = " (named by $FLEETSCOPE_CONFIG)" if path == os.environ.get(
            "FLEETSCOPE_CONFIG") else ""
        raise ConfigError(f"config {path}{origin}: {err}") from None
