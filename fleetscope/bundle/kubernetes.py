"""What `bundle record` keeps of a Kubernetes node, so a bundle's diagnosis names the pods of
the processes it recorded (collectors/pods.py reads the same paths in a sample):

    var/log/pods/<namespace>_<pod>_<uid>/<container>/      the directories alone, no log file
    var/log/containers/<pod>_<namespace>_<container>-<id>.log   empty files (links on the node)
    <runtime state>/<id>/config.json        {"annotations": {...}}: the pod's names only,
                                            never the OCI spec's process environment
    var/lib/kubelet/cpu_manager_state, memory_manager_state   as the kubelet wrote them

Only the pods of recorded processes (pool members and top CPU users), and only on a node
that has them: a node without Kubernetes records nothing more. Names pass through the
config's `redact:` patterns (each name on its own, so the `_`-joined layout still parses).
"""

from __future__ import annotations

import json
import os

from fleetscope.bundle.files import copy_file
from fleetscope.bundle.redact import Redactor
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers.kubepods import (
    RECORDED_ANNOTATIONS,
    parse_container_log_link,
    parse_oci_annotations,
    parse_pod_cgroup,
    parse_pod_log_dir,
)
from fleetscope.collectors.pods import RUNTIME_SPEC_FILES
from fleetscope.collectors.shared import process_file
from fleetscope.collectors.source import NotAvailable, Reader
from fleetscope.core.config import Config

KUBELET_FILES = ("cpu_manager_state", "memory_manager_state")
MAX_SPEC_BYTES = 4 * 1024 * 1024  # an OCI spec is tens of KiB


def _listdir(reader: Reader, relative: str) -> list[str]:
    try:
        return reader.listdir(relative)
    except NotAvailable:
        return []


def _redact_joined(name: str, redactor: Redactor) -> str:
    return "_".join(redactor.text(part, "pod_names") for part in name.split("_"))


def capture_pods(reader: Reader, destination: str, config: Config, pids,
                 redactor: Redactor) -> None:
    """Record the pods of `pids` (their proc/<pid>/cgroup already copied to destination)."""
    uids: set[str] = set()
    container_ids: set[str] = set()
    for pid in pids:
        try:
            with open(os.path.join(destination, process_file(pid, "cgroup")), encoding="utf-8",
                      errors="replace") as handle:
                found = parse_pod_cgroup(handle.read())
        except (OSError, ParseError):
            continue
        if found is not None:
            uids.add(found.uid)
            if found.container_id:
                container_ids.add(found.container_id)
    if not uids:
        return
    paths = config.kubernetes
    pod_logs = paths.relative(paths.pod_logs)
    for entry in _listdir(reader, pod_logs):
        found = parse_pod_log_dir(entry)
        if found is None or found.uid not in uids:
            continue
        target = os.path.join(destination, pod_logs, _redact_joined(entry, redactor))
        os.makedirs(target, exist_ok=True)
        for container in _listdir(reader, f"{pod_logs}/{entry}"):
            os.makedirs(os.path.join(target, redactor.text(container, "pod_names")),
                        exist_ok=True)
    named: set[str] = set()
    container_logs = paths.relative(paths.container_logs)
    for entry in _listdir(reader, container_logs):
        link = parse_container_log_link(entry)
        if link is None or link.container_id not in container_ids:
            continue
        named.add(link.container_id)
        target = os.path.join(destination, container_logs)
        os.makedirs(target, exist_ok=True)
        redacted = _redact_joined(entry[:-len(f"-{link.container_id}.log")], redactor)
        with open(os.path.join(target, f"{redacted}-{link.container_id}.log"), "w"):
            pass
    for container_id in sorted(container_ids - named):
        _capture_annotations(reader, destination, config, container_id, redactor)
    kubelet = paths.relative(paths.kubelet_root)
    for name in KUBELET_FILES:
        copy_file(reader, f"{kubelet}/{name}", destination)


def _capture_annotations(reader: Reader, destination: str, config: Config, container_id: str,
                         redactor: Redactor) -> None:
    """The runtime's spec of a container the log links do not name, its pod annotations
    alone."""
    for directory in config.kubernetes.runtime_state:
        for name in RUNTIME_SPEC_FILES:
            relative = f"{config.kubernetes.relative(directory)}/{container_id}/{name}"
            try:
                text = reader.read_bytes(relative, MAX_SPEC_BYTES).decode("utf-8", "replace")
                if parse_oci_annotations(text) is None:
                    continue
                annotations = json.loads(text)["annotations"]
            except (NotAvailable, ParseError, ValueError, KeyError):
                continue
            kept = {key: redactor.text(str(annotations[key]), "pod_names")
                    for key in RECORDED_ANNOTATIONS if key in annotations}
            target = os.path.join(destination, relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w", encoding="utf-8") as out:
                json.dump({"annotations": kept}, out)
            return
