"""Which Kubernetes pod a process runs in, from what the node itself keeps (no API server,
no credentials): the kubelet's cgroup layout gives the QoS class, the pod UID and the
container ID (collectors/parsers/kubepods.py); the names come from

    var/log/pods/<namespace>_<pod>_<uid>/<container>/      uid -> namespace, pod (containers)
    var/log/containers/<pod>_<namespace>_<container>-<id>.log   container ID -> container
    <runtime state>/<id>/config.json, <id>/userdata/config.json  (containerd, CRI-O) the OCI
                                                            spec's annotations, read only for
                                                            a container the logs do not name

all read through the scrape (under --root, or from a bundle sample, which records the log
directories' names and the annotations alone). Paths are the config's `kubernetes:` block.
A pod whose names cannot be found is still known by UID and QoS class: it matches a `qos`
term, never a name glob.

For diagnoses, the kubelet's decisions about a pod, read the same way:

    var/lib/kubelet/cpu_manager_state     the static CPU manager's exclusive CPUs per container
    var/lib/kubelet/memory_manager_state  the memory manager's NUMA nodes per container
"""

from __future__ import annotations

import os
from typing import NamedTuple

from fleetscope.core.config import Config
from fleetscope.core.kubernetes_config import KubernetesPaths

from .base import NotAvailable, Scrape
from .parsers import ParseError
from .parsers.kubepods import (
    QOS_NAMES,
    CpuManagerState,
    MemoryManagerState,
    PodCgroup,
    RuntimeNames,
    parse_container_log_link,
    parse_cpu_manager_state,
    parse_memory_manager_state,
    parse_oci_annotations,
    parse_pod_cgroup,
    parse_pod_log_dir,
    parse_pod_path,
)

RUNTIME_SPEC_FILES = ("config.json", "userdata/config.json")  # containerd task, CRI-O
RUNTIME_CACHE_MAX = 16384  # containers' names read from the live runtime's state


class Pod(NamedTuple):
    qos: str
    uid: str
    container_id: str
    namespace: str | None = None
    name: str | None = None
    container: str | None = None

    @property
    def ref(self) -> str:
        """`namespace/pod[/container]` (the diagnosis's subjects.pods), or `pod <uid>`."""
        if self.namespace is None or self.name is None:
            return f"uid {self.uid}"
        return "/".join(p for p in (self.namespace, self.name, self.container) if p)

    @property
    def title(self) -> str:
        """`pod batch/etl-7f9c (BestEffort)`: how a summary names it."""
        who = f"{self.namespace}/{self.name}" if self.name else f"uid {self.uid}"
        return f"pod {who} ({QOS_NAMES.get(self.qos, self.qos)})"


class PodIndex(NamedTuple):
    pods: dict[str, tuple[str, str, str]]  # uid -> namespace, pod, its directory's name
    containers: dict[str, tuple[str, str, str]]  # container ID -> namespace, pod, container


MOUNT_HINT = "mount the node's {path} read-only at the same path under the exporter's --root"


def _read_index(scrape: Scrape, paths: KubernetesPaths) -> PodIndex:
    if not os.path.isdir(scrape.path(paths.relative(paths.pod_logs))):
        raise NotAvailable(f"{paths.pod_logs} does not exist: "
                           + MOUNT_HINT.format(path=paths.pod_logs))
    pods = {}
    for entry in scrape.listdir(paths.relative(paths.pod_logs)):
        found = parse_pod_log_dir(entry)
        if found is not None:
            pods[found.uid] = (found.namespace, found.pod, entry)
    containers = {}
    try:
        links = scrape.listdir(paths.relative(paths.container_logs))
    except NotAvailable:
        links = []
    for entry in links:
        link = parse_container_log_link(entry)
        if link is not None:
            containers[link.container_id] = (link.namespace, link.pod, link.container)
    return PodIndex(pods, containers)


def pod_index(scrape: Scrape, paths: KubernetesPaths) -> PodIndex:
    """The node's pod log directories, listed once per scrape. NotAvailable when the pod log
    directory is absent (the exporter's container needs it mounted read-only)."""
    return scrape.memo(f"pod_index:{paths.pod_logs}:{paths.container_logs}",
                       lambda: _read_index(scrape, paths))


_RUNTIME_NAMES: dict[tuple[tuple[str, ...], str], RuntimeNames | None] = {}


def _runtime_names(scrape: Scrape, paths: KubernetesPaths, container_id: str
                   ) -> RuntimeNames | None:
    """The container's names from the runtime's OCI spec. A container's annotations never
    change, so a live node reads each once."""
    key = (scrape.roots, container_id)
    if scrape.evidence.live and key in _RUNTIME_NAMES:
        return _RUNTIME_NAMES[key]
    found = None
    for directory in paths.runtime_state:
        for name in RUNTIME_SPEC_FILES:
            try:
                found = parse_oci_annotations(scrape.read_text(
                    f"{paths.relative(directory)}/{container_id}/{name}"))
            except (NotAvailable, ParseError):
                continue
            if found is not None:
                break
        if found is not None:
            break
    if scrape.evidence.live:
        if len(_RUNTIME_NAMES) >= RUNTIME_CACHE_MAX:
            _RUNTIME_NAMES.clear()
        _RUNTIME_NAMES[key] = found
    return found


def _pod_containers(scrape: Scrape, paths: KubernetesPaths, entry: str) -> list[str]:
    relative = f"{paths.relative(paths.pod_logs)}/{entry}"
    try:
        return scrape.memo(f"pod_containers:{relative}", lambda: scrape.listdir(relative))
    except NotAvailable:
        return []


def name_pod(scrape: Scrape, paths: KubernetesPaths, found: PodCgroup) -> Pod:
    """The pod of a cgroup, its names added where the node has them."""
    try:
        index = pod_index(scrape, paths)
    except (NotAvailable, ParseError):
        index = PodIndex({}, {})
    namespace = name = container = None
    if found.container_id in index.containers:  # the log link names all three
        namespace, name, container = index.containers[found.container_id]
        return Pod(found.qos, found.uid, found.container_id, namespace, name, container)
    if found.uid in index.pods:
        namespace, name, entry = index.pods[found.uid]
        if found.container_id:
            containers = _pod_containers(scrape, paths, entry)
            if len(containers) == 1:  # a pod of one container: no need to ask further
                container = containers[0]
    if found.container_id and (container is None or name is None):
        names = _runtime_names(scrape, paths, found.container_id)
        if names is not None:
            namespace, name = names.namespace, names.pod
            container = names.container or None
    return Pod(found.qos, found.uid, found.container_id, namespace, name, container)


def pod_of(scrape: Scrape, paths: KubernetesPaths, cgroup_text: str) -> Pod | None:
    """The pod of a process from its /proc/<pid>/cgroup text; None outside any pod."""
    found = parse_pod_cgroup(cgroup_text)
    return None if found is None else name_pod(scrape, paths, found)


# -- diagnoses: the pods a finding names, and what the kubelet decided for them ----------

MAX_PODS = 10  # pods a finding names


def cpulist(cpus) -> str:
    """`2-3,8`: a CPU set as the kernel and the kubelet print it."""
    out, run = [], []
    for cpu in sorted(cpus):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [cpu]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def process_pod(scrape: Scrape, config: Config, pid: int) -> Pod | None:
    """The pod a process runs in (None: not in a pod, or gone)."""
    def read() -> Pod | None:
        try:
            return pod_of(scrape, config.kubernetes, scrape.read_text(f"proc/{pid}/cgroup"))
        except (NotAvailable, ParseError):
            return None
    return scrape.memo(f"pod_of:{pid}", read)


def cgroup_pod(scrape: Scrape, config: Config, cgroup: str) -> Pod | None:
    found = parse_pod_path(cgroup)
    return None if found is None else name_pod(scrape, config.kubernetes, found)


def add_pod_subjects(scrapes: tuple[Scrape, ...], config: Config, finding) -> None:
    """subjects.pods from the finding's pids and cgroups (the last sample first: a process
    that exited during the window is looked up in the first)."""
    pods = finding.subjects.setdefault("pods", [])
    for pid in finding.subjects.get("pids", []):
        pod = next((p for p in (process_pod(s, config, pid) for s in scrapes) if p), None)
        if pod is not None and pod.name and pod.ref not in pods:
            pods.append(pod.ref)
    for cgroup in finding.subjects.get("cgroups", []):
        pod = cgroup_pod(scrapes[0], config, cgroup)
        if pod is not None and pod.name and not any(p == pod.ref or p.startswith(pod.ref + "/")
                                       for p in pods):
            pods.append(pod.ref)
    del pods[MAX_PODS:]


def _state(scrape: Scrape, config: Config, name: str, parser):
    path = f"{config.kubernetes.relative(config.kubernetes.kubelet_root)}/{name}"
    try:
        return parser(scrape.read_text(path)), ""
    except NotAvailable:
        return None, (f"{config.kubernetes.kubelet_root}/{name} not available (mount it "
                      "read-only under the exporter's root)")
    except ParseError as err:
        return None, f"{config.kubernetes.kubelet_root}/{name} unreadable: {err}"


def cpu_manager(scrape: Scrape, config: Config) -> tuple[CpuManagerState | None, str]:
    """(the CPU manager's checkpoint, "") or (None, why not)."""
    return scrape.memo("cpu_manager_state", lambda: _state(
        scrape, config, "cpu_manager_state", parse_cpu_manager_state))


def memory_manager(scrape: Scrape, config: Config) -> tuple[MemoryManagerState | None, str]:
    return scrape.memo("memory_manager_state", lambda: _state(
        scrape, config, "memory_manager_state", parse_memory_manager_state))


def exclusive_cpus(state: CpuManagerState | None, pod: Pod) -> frozenset[int]:
    """The CPUs the static CPU manager gave the pod's container (all its containers when the
    container is not known); empty when it has none."""
    if state is None:
        return frozenset()
    containers = state.exclusive.get(pod.uid, {})
    if pod.container:
        return containers.get(pod.container, frozenset())
    if pod.container_id and pod.container_id in state.exclusive.get("", {}):
        return state.exclusive[""][pod.container_id]  # V1 checkpoint: keyed by container ID
    return frozenset().union(*containers.values()) if containers else frozenset()


def memory_nodes(state: MemoryManagerState | None, pod: Pod) -> frozenset[int]:
    if state is None:
        return frozenset()
    containers = state.numa_nodes.get(pod.uid, {})
    if pod.container:
        return containers.get(pod.container, frozenset())
    return frozenset().union(*containers.values()) if containers else frozenset()


def describe_cpus(state: CpuManagerState | None, why: str, pod: Pod) -> str:
    """`exclusive CPUs 2-3 (static CPU manager)` / `no exclusive CPUs (...)`: what the
    kubelet decided for the pod, for a summary."""
    if state is None:
        return f"exclusive CPUs unknown: {why}"
    cpus = exclusive_cpus(state, pod)
    if cpus:
        return f"exclusive CPUs {cpulist(cpus)} (static CPU manager)"
    if state.policy != "static":
        return (f"no exclusive CPUs (CPU manager policy {state.policy}: the kubelet's "
                "--cpu-manager-policy=static gives Guaranteed pods with integer CPU requests "
                "their own cores)")
    return ("no exclusive CPUs (static CPU manager; not a Guaranteed pod with an integer CPU "
            "request)")


def describe_memory(state: MemoryManagerState | None, pod: Pod) -> str:
    """`memory on NUMA node 0 (memory manager)`, or "" when the memory manager placed none."""
    nodes = memory_nodes(state, pod)
    if not nodes:
        return ""
    return f"memory on NUMA node {cpulist(nodes)} (memory manager)"


def pod_notes(ctx, pids, memory: bool = False, most: int = 3) -> list[str]:
    """`pod ns/name (QoS): exclusive CPUs 2-3 (static CPU manager)[, memory on ...]` for the
    pods of `pids` (an Enricher `ctx`), at most `most` pods."""
    found = list(dict.fromkeys(p for p in (ctx.pod(pid) for pid in pids) if p is not None))
    if not found:
        return []
    state, why = ctx.cpu_manager()
    memory_state = ctx.memory_manager()[0] if memory else None
    notes = []
    for pod in found[:most]:
        parts = [describe_cpus(state, why, pod), describe_memory(memory_state, pod)]
        notes.append(f"{pod.title}: {', '.join(filter(None, parts))}")
    return notes
