"""The Kubernetes part of the node config: pools matched by pod, and where the node keeps
what names its pods.

    pools:
      - {name: online, class: online, match: {qos: guaranteed}}
      - {name: batch, class: offline, match: {namespace: "batch-*", container: "etl*"}}
    kubernetes:                     # node paths (read under --root); these are the defaults
      pod_logs: /var/log/pods
      container_logs: /var/log/containers
      kubelet_root: /var/lib/kubelet
      runtime_state: [/run/containerd/io.containerd.runtime.v2.task/k8s.io,
                      /run/containers/storage/overlay-containers]

A pool's Kubernetes terms (`namespace`, `pod`, `container`: globs; `qos`: a QoS class) all
hold at once for a process to match them; a pool may name them beside `cgroup` and `cmdline`,
and a process matching any of the three matches the pool.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from .config_error import ConfigError

POD_KEYS = ("namespace", "pod", "container", "qos")
MATCH_KEYS = frozenset({"cgroup", "cmdline", *POD_KEYS})
QOS_VALUES = ("guaranteed", "burstable", "besteffort")
DEFAULT_RUNTIME_STATE = ("/run/containerd/io.containerd.runtime.v2.task/k8s.io",
                         "/run/containers/storage/overlay-containers")


@dataclass(frozen=True)
class KubernetesPaths:
    """Node paths, absolute as on the node; `relative(path)` is how a scrape reads them."""

    pod_logs: str = "/var/log/pods"
    container_logs: str = "/var/log/containers"
    kubelet_root: str = "/var/lib/kubelet"
    runtime_state: tuple[str, ...] = DEFAULT_RUNTIME_STATE
    configured: bool = False  # the config has a `kubernetes:` block

    @staticmethod
    def relative(path: str) -> str:
        return path.strip("/")


def pod_terms(where: str, match: dict) -> dict[str, str | None]:
    """Pool keyword arguments from a pool's `match` (validated: one-line errors)."""
    terms: dict[str, str | None] = {}
    for key in ("namespace", "pod", "container"):
        value = match.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{where}.match.{key} must be a non-empty glob string")
        terms[f"{key}_glob"] = value
    qos = match.get("qos")
    if qos is not None:
        if not isinstance(qos, str) or qos.lower() not in QOS_VALUES:
            raise ConfigError(f"{where}.match.qos must be one of {', '.join(QOS_VALUES)}, "
                         f"got {str(qos)[:40]!r}")
        qos = qos.lower()
    terms["qos"] = qos
    return terms


def _absolute(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.startswith("/") or ".." in value.split("/"):
        raise ConfigError(f"kubernetes.{key} must be an absolute path on the node, got "
                     f"{str(value)[:60]!r}")
    return value.rstrip("/") or "/"


def kubernetes_paths(raw: Any) -> KubernetesPaths:
    if raw is None:
        return KubernetesPaths()
    if not isinstance(raw, dict):
        raise ConfigError("kubernetes must be a mapping (pod_logs, container_logs, kubelet_root, "
                     "runtime_state)")
    known = {"pod_logs", "container_logs", "kubelet_root", "runtime_state"}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"kubernetes has unknown keys: {', '.join(sorted(map(str, unknown)))} "
                     f"(known: {', '.join(sorted(known))})")
    defaults = KubernetesPaths()
    state = raw.get("runtime_state", list(defaults.runtime_state))
    if not isinstance(state, list):
        raise ConfigError("kubernetes.runtime_state must be a list of directories")
    return KubernetesPaths(
        pod_logs=_absolute("pod_logs", raw.get("pod_logs", defaults.pod_logs)),
        container_logs=_absolute("container_logs",
                                 raw.get("container_logs", defaults.container_logs)),
        kubelet_root=_absolute("kubelet_root", raw.get("kubelet_root", defaults.kubelet_root)),
        runtime_state=tuple(_absolute("runtime_state", d) for d in state),
        configured=True)


def glob_match(pattern: str | None, value: str | None) -> bool:
    """A glob term holds when absent, or when the value is known and matches it."""
    return pattern is None or (value is not None and fnmatch.fnmatchcase(value, pattern))
