"""Parsers for what a Kubernetes node says about its pods without the API server.

    /proc/<pid>/cgroup    0::/kubepods.slice/kubepods-burstable.slice/
                              kubepods-burstable-pod4f2c..._9a1e.slice/cri-containerd-<id>.scope
                          4:cpu:/kubepods/besteffort/pod4f2c...-9a1e/<id>       (cgroupfs driver)
                          4:cpu:/kubepods/pod4f2c...-9a1e/<id>                  (Guaranteed)
    /var/log/pods/        <namespace>_<pod>_<uid>/<container>/0.log
    /var/log/containers/  <pod>_<namespace>_<container>-<container id>.log   (links into the above)
    <runtime state>/<id>/config.json   the OCI spec, its "annotations" naming the pod
    /var/lib/kubelet/cpu_manager_state     {"policyName":"static","defaultCpuSet":"0-7,16-55",
                                            "entries":{"<pod uid>":{"<container>":"8-15"}},
                                            "checksum":2824956018}
    /var/lib/kubelet/memory_manager_state  {"policyName":"Static","machineState":{...},
                                            "entries":{"<pod uid>":{"<container>":
                                            [{"numaAffinity":[0],"type":"memory","size":...}]}}}

Layouts as written by the kubelet (kubernetes v1.20-v1.35 checked: pkg/kubelet/cm/
cgroup_manager_linux.go and qos_container_manager_linux.go name the cgroups, `kubepods` /
`burstable` / `besteffort` / `pod<uid>` with the cgroupfs driver, each level a systemd slice
`kubepods-burstable-pod<uid with - as _>.slice` with the systemd one; pkg/kubelet/kuberuntime/
helpers.go BuildPodLogsDirectory and kuberuntime_container.go logSymlink name the log paths)
and by the runtimes (containerd v1.6-v2.0 `cri-containerd-<id>.scope` under systemd, or
`<id>` under cgroupfs, annotations `io.kubernetes.cri.sandbox-namespace`, `-sandbox-name`,
`-sandbox-uid`, `io.kubernetes.cri.container-name`; CRI-O v1.2x `crio-<id>.scope`, its
annotations `io.kubernetes.pod.namespace`, `io.kubernetes.pod.name`,
`io.kubernetes.pod.uid`, `io.kubernetes.container.name`; Docker via cri-dockerd or dockershim
`docker-<id>.scope`). The checkpoints are pkg/kubelet/cm/cpumanager/state/checkpoint.go
(CPUManagerCheckpointV2; V1's entries were keyed by container ID) and pkg/kubelet/cm/
memorymanager/state/checkpoint.go.

A namespace, pod or container name is a DNS label or subdomain: it never holds `_`, which is
why the kubelet can join them with it and these parsers can split on it.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from . import ParseError
from .sysfs import parse_cpulist

QOS_NAMES = {"guaranteed": "Guaranteed", "burstable": "Burstable", "besteffort": "BestEffort"}

# A pod UID: a UUID, or 32 hex digits for a static pod (the hash of its manifest).
_HEX = "[0-9a-fA-F]"
_UID = rf"{_HEX}{{8}}[-_]?{_HEX}{{4}}[-_]?{_HEX}{{4}}[-_]?{_HEX}{{4}}[-_]?{_HEX}{{12}}"
# cgroupfs driver: .../kubepods[/burstable|/besteffort]/pod<uid>[/<container>]
_CGROUPFS_POD = re.compile(rf"pod({_UID})")
# systemd driver: [prefix-]kubepods[-burstable|-besteffort]-pod<uid>.slice, with the
# container either as the next path element or, seen through a cgroup namespace or by
# runc's "slice:prefix:name" form, after ':' in the same element.
_SYSTEMD_POD = re.compile(
    rf"(?:[\w.-]*-)?kubepods(?:-(burstable|besteffort))?-pod({_UID})\.slice(?::([\w-]+):(\w+))?")
# The container's element: a runtime's systemd scope, or a bare ID under cgroupfs.
_CONTAINER = re.compile(r"(?:(cri-containerd|crio|docker|cri-dockerd)-)?([0-9a-f]{64})(?:\.scope)?")
_RUNTIME_NAMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker",
                  "cri-dockerd": "docker", None: ""}


class PodCgroup(NamedTuple):
    """Who a process is, as the kubelet's cgroup layout tells it."""

    qos: str  # guaranteed | burstable | besteffort
    uid: str  # the pod UID with dashes, as the API and /var/log/pods spell it
    container_id: str  # "" for a process in the pod's own cgroup (none of its containers)
    runtime: str  # containerd | cri-o | docker | "" (cgroupfs: the ID does not say)


def _uid(raw: str) -> str:
    return raw.replace("_", "-").lower()


def parse_pod_path(path: str) -> PodCgroup | None:
    """The pod a cgroup path belongs to, or None when it is not a pod's cgroup.

    >>> parse_pod_path("/kubepods/besteffort/pod43b37e54-f9ee-4267-b992-2a516b0be3c8/"
    ...                "f0a3a171f445d2d3253ddf693a1c662e617b691874e2416360baf6eb690db240")
    ... # doctest: +ELLIPSIS
    PodCgroup(qos='besteffort', uid='43b37e54-f9ee-4267-b992-2a516b0be3c8', container_id='f0a3...
    >>> parse_pod_path("/user.slice/user-0.slice/session-1.scope") is None
    True
    """
    parts = [p for p in path.split("/") if p]
    for index, part in enumerate(parts):
        following = parts[index + 1] if index + 1 < len(parts) else ""
        match = _SYSTEMD_POD.fullmatch(part)
        if match:
            qos = match.group(1) or "guaranteed"
            if match.group(4):  # slice:prefix:name, one element
                runtime = _RUNTIME_NAMES.get(match.group(3), match.group(3))
                return PodCgroup(qos, _uid(match.group(2)), match.group(4), runtime)
            return _with_container(qos, match.group(2), following)
        match = _CGROUPFS_POD.fullmatch(part)
        if match and index > 0:
            parent = parts[index - 1]
            if parent in ("burstable", "besteffort"):
                if index < 2 or not parts[index - 2].endswith("kubepods"):
                    continue
                return _with_container(parent, match.group(1), following)
            if parent.endswith("kubepods"):
                return _with_container("guaranteed", match.group(1), following)
    return None


def _with_container(qos: str, uid: str, element: str) -> PodCgroup:
    match = _CONTAINER.fullmatch(element)
    if not match or element.startswith("crio-conmon-"):
        return PodCgroup(qos, _uid(uid), "", "")
    return PodCgroup(qos, _uid(uid), match.group(2), _RUNTIME_NAMES[match.group(1)])


def parse_pod_cgroup(text: str) -> PodCgroup | None:
    """The pod of a process from its /proc/<pid>/cgroup (v1 and v2 lines alike): the line
    naming a container wins over one naming the pod alone (on a cgroup v1 host a controller
    the runtime does not manage can show the pod's cgroup, or none).

    >>> parse_pod_cgroup("12:rdma:/\\n0::/kubepods.slice/kubepods-besteffort.slice/"
    ...     "kubepods-besteffort-pod2ca4a155_3599_498d_bb9d_4446693fa3ea.slice/"
    ...     "crio-0ba8ac17e4e7a31fb82279503552fe94e64bab4745bf6fd2ff231e7c8ca8bed0.scope\\n").uid
    '2ca4a155-3599-498d-bb9d-4446693fa3ea'
    """
    best: PodCgroup | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            if line:
                raise ParseError(f"/proc/<pid>/cgroup: malformed line {line[:40]!r}")
            continue
        found = parse_pod_path(parts[2])
        if found is None:
            continue
        if found.container_id:
            return found
        best = best or found
    return best


class PodLogDir(NamedTuple):
    namespace: str
    pod: str
    uid: str


def parse_pod_log_dir(name: str) -> PodLogDir | None:
    """`<namespace>_<pod>_<uid>`, a directory of /var/log/pods; None for anything else.

    >>> parse_pod_log_dir("kube-system_kube-proxy-6xsx9_81e09ae0-12ec-4ec5-94b8-51cda7906370")
    ... # doctest: +NORMALIZE_WHITESPACE
    PodLogDir(namespace='kube-system', pod='kube-proxy-6xsx9',
              uid='81e09ae0-12ec-4ec5-94b8-51cda7906370')
    """
    parts = name.split("_")
    if len(parts) != 3 or not all(parts) or not re.fullmatch(_UID, parts[2]):
        return None
    return PodLogDir(parts[0], parts[1], parts[2].lower())


class ContainerLog(NamedTuple):
    namespace: str
    pod: str
    container: str
    container_id: str


def parse_container_log_link(name: str) -> ContainerLog | None:
    """`<pod>_<namespace>_<container>-<container id>.log`, an entry of /var/log/containers.
    The kubelet cuts names longer than 255 characters, and with them the ID: such an entry
    is skipped (the runtime's state still names its container).

    >>> parse_container_log_link("kube-proxy-6xsx9_kube-system_kube-proxy-"
    ...     "c269a18400e27b14085c57f8e36f5b4d5471c140eb27e8b0f632c056547555de.log").container
    'kube-proxy'
    """
    if not name.endswith(".log"):
        return None
    head, _, container_id = name[:-4].rpartition("-")
    parts = head.split("_")
    if len(parts) != 3 or not all(parts) or not re.fullmatch(r"[0-9a-f]{64}", container_id):
        return None
    return ContainerLog(parts[1], parts[0], parts[2], container_id)


class RuntimeNames(NamedTuple):
    namespace: str
    pod: str
    uid: str
    container: str  # "" for a pod sandbox (the pause container)


_ANNOTATION_KEYS = (  # (namespace, pod, uid, container) per runtime
    ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name",
     "io.kubernetes.cri.sandbox-uid", "io.kubernetes.cri.container-name"),  # containerd
    ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name", "io.kubernetes.pod.uid",
     "io.kubernetes.container.name"),  # CRI-O
)


def parse_oci_annotations(text: str) -> RuntimeNames | None:
    """The pod names in an OCI runtime spec's annotations (a containerd task's or a CRI-O
    container's config.json); None when it names no pod.

    >>> parse_oci_annotations('{"annotations": {"io.kubernetes.cri.container-name": "app",'
    ...     ' "io.kubernetes.cri.sandbox-name": "etl-7f9c", "io.kubernetes.cri.sandbox-namespace":'
    ...     ' "batch", "io.kubernetes.cri.sandbox-uid": "de7c6a0c-79c0-44dc-a099-69bb39f180af"}}')
    ... # doctest: +NORMALIZE_WHITESPACE
    RuntimeNames(namespace='batch', pod='etl-7f9c', uid='de7c6a0c-79c0-44dc-a099-69bb39f180af',
                 container='app')
    """
    try:
        spec = json.loads(text)
    except (ValueError, RecursionError):
        raise ParseError("config.json: not JSON") from None
    annotations = spec.get("annotations") if isinstance(spec, dict) else None
    if not isinstance(annotations, dict):
        return None
    for keys in _ANNOTATION_KEYS:
        values = [annotations.get(key) for key in keys]
        if isinstance(values[0], str) and isinstance(values[1], str) and values[0] and values[1]:
            container = values[3] if isinstance(values[3], str) and values[3] != "POD" else ""
            return RuntimeNames(values[0], values[1], str(values[2] or "").lower(), container)
    return None


# What of the OCI spec a bundle keeps: the pod's names, never the process environment.
RECORDED_ANNOTATIONS = tuple(key for keys in _ANNOTATION_KEYS for key in keys)


class CpuManagerState(NamedTuple):
    policy: str  # "none" or "static"
    default_cpus: frozenset[int]  # the shared pool
    exclusive: dict[str, dict[str, frozenset[int]]]  # pod uid -> container -> CPUs


def _checkpoint(text: str, what: str) -> dict:
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        raise ParseError(f"{what}: not JSON") from None
    if not isinstance(document, dict) or not isinstance(document.get("policyName"), str):
        raise ParseError(f"{what}: no policyName (not a kubelet checkpoint)")
    return document


def parse_cpu_manager_state(text: str) -> CpuManagerState:
    """The kubelet's CPU manager checkpoint. The V1 format's entries (container ID -> CPUs)
    are kept under the pod key "" (the ID stands for the container).

    >>> state = parse_cpu_manager_state('{"policyName":"static","defaultCpuSet":"0-7,16-55",'
    ...     '"entries":{"b0e4cb0d-47b0-4ed3-b707-4baf7eb0875a":{"nf-97cb":"8-15,56-63"}},'
    ...     '"checksum":2824956018}')
    >>> pod = state.exclusive["b0e4cb0d-47b0-4ed3-b707-4baf7eb0875a"]
    >>> state.policy, len(state.default_cpus), sorted(pod["nf-97cb"])[:3]
    ('static', 48, [8, 9, 10])
    """
    what = "cpu_manager_state"
    document = _checkpoint(text, what)
    default = document.get("defaultCpuSet") or ""
    if not isinstance(default, str):
        raise ParseError(f"{what}: defaultCpuSet is not a CPU list")
    entries = document.get("entries")
    entries = {} if entries is None else entries
    if not isinstance(entries, dict):
        raise ParseError(f"{what}: entries is not a mapping")
    exclusive: dict[str, dict[str, frozenset[int]]] = {}
    for key, value in entries.items():
        if isinstance(value, str):  # V1: container ID -> CPUs
            exclusive.setdefault("", {})[str(key)] = frozenset(parse_cpulist(value))
        elif isinstance(value, dict):
            exclusive[str(key).lower()] = {
                str(name): frozenset(parse_cpulist(cpus)) for name, cpus in value.items()
                if isinstance(cpus, str)}
        else:
            raise ParseError(f"{what}: entry {str(key)[:40]!r} is neither a CPU list nor a "
                             "mapping of containers")
    return CpuManagerState(document["policyName"],
                           frozenset(parse_cpulist(default)) if default.strip() else frozenset(),
                           exclusive)


class MemoryManagerState(NamedTuple):
    policy: str  # "None" or "Static"
    numa_nodes: dict[str, dict[str, frozenset[int]]]  # pod uid -> container -> NUMA nodes


def parse_memory_manager_state(text: str) -> MemoryManagerState:
    """The kubelet's memory manager checkpoint: each container's NUMA nodes (the union over
    its memory and hugepages blocks).

    >>> parse_memory_manager_state('{"policyName":"Static","machineState":{},"entries":'
    ...     '{"fb4f2c0e-1c37-4a4b-8d39-3a1c7f0b9e21":{"worker":[{"numaAffinity":[1],'
    ...     '"type":"memory","size":2147483648}]}},"checksum":1}').numa_nodes
    {'fb4f2c0e-1c37-4a4b-8d39-3a1c7f0b9e21': {'worker': frozenset({1})}}
    """
    what = "memory_manager_state"
    document = _checkpoint(text, what)
    entries = document.get("entries")
    entries = {} if entries is None else entries
    if not isinstance(entries, dict):
        raise ParseError(f"{what}: entries is not a mapping")
    nodes: dict[str, dict[str, frozenset[int]]] = {}
    for uid, containers in entries.items():
        if not isinstance(containers, dict):
            raise ParseError(f"{what}: entry {str(uid)[:40]!r} is not a mapping of containers")
        for name, blocks in containers.items():
            found: set[int] = set()
            for block in blocks if isinstance(blocks, list) else []:
                affinity = block.get("numaAffinity") if isinstance(block, dict) else None
                if isinstance(affinity, list):
                    found.update(n for n in affinity if isinstance(n, int))
            nodes.setdefault(str(uid).lower(), {})[str(name)] = frozenset(found)
    return MemoryManagerState(document["policyName"], nodes)
