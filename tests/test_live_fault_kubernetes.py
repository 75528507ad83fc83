"""Live: offline-preemption on a node laid out as the kubelet lays it out, diagnosed by pod.

The kubelet's cgroups are made for real on this machine: the cgroupfs driver's
`kubepods/pod<uid>/<container id>` (a Guaranteed pod) and `kubepods/besteffort/pod<uid>/<id>`
on the cgroup v1 cpu controller, or the systemd driver's `kubepods.slice/kubepods-pod<uid>
.slice/cri-containerd-<id>.scope` and `kubepods-besteffort.slice/...` on the v2 hierarchy.
An online "pod" (a latency worker, on the CPU the static CPU manager gave its container: a
checkpoint under the test's root says so) and an offline "pod" (two CPU hogs whose affinity
includes that CPU) run in them, with the pod log directories and a containerd task spec
beside them. `fleetscope diagnose` must name both pods by namespace/name in the
offline-preemption finding and say that the online pod had exclusive CPUs and that the
offline work can run on them.

Names are unique per run (pod UIDs, container IDs, namespaces); every process is killed by
pid and every cgroup the test made is removed, `kubepods` itself only when the test made it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.test_live_accuracy import HOG, LIFETIME_S, ONLINE_WORKER, PINNED, _record

pytestmark = pytest.mark.live

V1_CPU = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup/unified")


class Cgroups:
    """Directories made by this test, removed deepest first (a parent only if made here)."""

    def __init__(self) -> None:
        self.made: list[Path] = []

    def make(self, path: Path) -> Path:
        missing = []
        for directory in [path, *path.parents]:
            if directory.exists():
                break
            missing.append(directory)
        for directory in reversed(missing):
            directory.mkdir()
            self.made.append(directory)
        return path

    def remove(self) -> None:
        for directory in reversed(self.made):
            for _ in range(50):  # a killed task leaves its cgroup a moment later
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def _layout(driver: str, cgroups: Cgroups, qos: str, uid: str, container_id: str) -> Path:
    if driver == "cgroupfs-v1":
        base = V1_CPU / "kubepods"
        pod = base / (f"pod{uid}" if qos == "guaranteed" else f"{qos}/pod{uid}")
        return cgroups.make(pod / container_id)
    base = V2 / "kubepods.slice"
    slice_uid = uid.replace("-", "_")
    pod = (base / f"kubepods-pod{slice_uid}.slice" if qos == "guaranteed" else
           base / f"kubepods-{qos}.slice" / f"kubepods-{qos}-pod{slice_uid}.slice")
    return cgroups.make(pod / f"cri-containerd-{container_id}.scope")


def _start_in(cgroup: Path, script: Path, *args) -> subprocess.Popen:
    procs = str(cgroup / "cgroup.procs")

    def enter() -> None:  # in the child before exec: it runs in its pod from the start
        with open(procs, "w") as handle:
            handle.write(str(os.getpid()))
    return subprocess.Popen([sys.executable, str(script), *map(str, args)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=enter)


def _write(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("driver", ["cgroupfs-v1", "systemd-v2"])
def test_offline_preemption_names_the_pods_and_the_cpu_managers_decision(driver, tmp_path):
    hierarchy = V1_CPU if driver == "cgroupfs-v1" else V2
    if os.geteuid() != 0 or not (hierarchy / "cgroup.procs").exists():
        pytest.skip(f"needs root and {hierarchy}")
    run = f"{os.getpid()}-{secrets.token_hex(3)}"
    online = {"namespace": f"chat-{run}", "pod": "agent-7d9f-x2", "container": "agent",
              "uid": str(uuid.uuid4()), "id": secrets.token_hex(32)}
    batch = {"namespace": f"batch-{run}", "pod": "etl-7f9c", "container": "etl",
             "uid": str(uuid.uuid4()), "id": secrets.token_hex(32)}
    root = tmp_path / "node"
    for pod in (online, batch):
        _write(root / f"var/log/pods/{pod['namespace']}_{pod['pod']}_{pod['uid']}/"
                      f"{pod['container']}/0.log")
    # The online container is named by its log link, the batch one by containerd's spec.
    _write(root / f"var/log/containers/{online['pod']}_{online['namespace']}_"
                  f"{online['container']}-{online['id']}.log")
    _write(root / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{batch['id']}/"
                  "config.json", json.dumps({"ociVersion": "1.1.0", "annotations": {
                      "io.kubernetes.cri.container-name": batch["container"],
                      "io.kubernetes.cri.sandbox-name": batch["pod"],
                      "io.kubernetes.cri.sandbox-namespace": batch["namespace"],
                      "io.kubernetes.cri.sandbox-uid": batch["uid"]}}))
    shared = sorted(set(os.sched_getaffinity(0)) - {PINNED})
    _write(root / "var/lib/kubelet/cpu_manager_state", json.dumps({
        "policyName": "static", "defaultCpuSet": ",".join(map(str, shared)),
        "entries": {online["uid"]: {online["container"]: str(PINNED)}}, "checksum": 1}))
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({
        "pools": [{"name": "chat-online", "class": "online",
                   "match": {"namespace": online["namespace"], "qos": "guaranteed"}},
                  {"name": "batch", "class": "offline",
                   "match": {"namespace": batch["namespace"], "qos": "besteffort"}}],
        "kubernetes": {"pod_logs": f"{root}/var/log/pods",
                       "container_logs": f"{root}/var/log/containers",
                       "kubelet_root": f"{root}/var/lib/kubelet",
                       "runtime_state": [f"{root}/run/containerd/io.containerd.runtime.v2."
                                         "task/k8s.io"]}}))
    (tmp_path / "online.py").write_text(ONLINE_WORKER)
    (tmp_path / "hog.py").write_text(HOG)
    cgroups = Cgroups()
    children: list[subprocess.Popen] = []
    try:
        on_cgroup = _layout(driver, cgroups, "guaranteed", online["uid"], online["id"])
        off_cgroup = _layout(driver, cgroups, "besteffort", batch["uid"], batch["id"])
        # The online worker on the CPU the checkpoint gives it; the offline pod's two
        # workers free to run anywhere, that CPU included (no cpuset confines them to the
        # shared pool): the fault this test shows.
        children.append(_start_in(on_cgroup, tmp_path / "online.py", LIFETIME_S, PINNED))
        for _ in range(2):
            children.append(_start_in(off_cgroup, tmp_path / "hog.py", LIFETIME_S))
        time.sleep(2)
        assert all(child.poll() is None for child in children)
        began = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--json",
                                 "--config", str(config)], capture_output=True, text=True,
                                timeout=300)
        wall = time.monotonic() - began
    finally:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            child.wait()
        cgroups.remove()
    assert not any(path.exists() for path in cgroups.made)
    assert result.returncode in (1, 2), result.stderr
    document = json.loads(result.stdout)
    findings = [f for f in document["findings"] if f["rule"] == "offline-preemption"]
    _record({"scenario": f"kubernetes-{driver}", "expected": "offline-preemption",
             "primary": document["findings"][0]["rule"] if document["findings"] else None,
             "correct": bool(findings), "wall_seconds": round(wall, 2),
             "findings": [(f["rule"], f["severity"]) for f in document["findings"]]})
    assert findings, [(f["rule"], f["summary"]) for f in document["findings"]]
    finding = findings[0]
    online_ref = f"{online['namespace']}/{online['pod']}/{online['container']}"
    batch_ref = f"{batch['namespace']}/{batch['pod']}/{batch['container']}"
    assert batch_ref in finding["subjects"]["pods"] and online_ref in finding["subjects"]["pods"]
    summary = finding["summary"]
    assert f"pod {batch['namespace']}/{batch['pod']} (BestEffort)" in summary
    assert (f"online pod {online['namespace']}/{online['pod']} (Guaranteed): exclusive CPUs "
            f"{PINNED} (static CPU manager)") in summary
    assert f"offline work runs on their exclusive CPUs {PINNED} (its CPU affinity" in summary
    kubelet = [e for e in finding["evidence"] if "kubelet CPU manager" in e["signal"]]
    assert kubelet and kubelet[0]["value"] == 1 == kubelet[0]["threshold"]
