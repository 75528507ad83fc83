"""`bundle record --root TREE` of a recorded tree copies only what is inside the tree.

A recorded tree (a fixture, a bundle sample) is read as recorded evidence: only regular files
resolving inside the root. Recording one copies through the same reads, so a link out of the
tree (to a file holding a secret), a FIFO where a /proc file should be, or a directory linked
out is left out of the bundle, and the recording ends. Each hazard is planted in a Kubernetes
node tree and recorded in a child with a timeout (a FIFO opened for reading waits for a
writer for good). The reads it copies with are checked on their own at the end.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from fleetscope.collectors.source import LiveHost, NotAvailable, RecordedSample, RefusedPath
from tests.hostile_corpus import run
from tests.test_kubernetes_pods import BATCH_CID, BATCH_UID, POD_POOLS, RUNTIME, kube_tree
from tests.test_pools import write

SECRET = "outside-the-tree-5f3c9e"
RECORD_TIMEOUT_SECONDS = 30.0  # a recording of this tree takes a second or two


def _secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "secret.txt"
    write(path, f"{SECRET}\n")
    return path


def _emptied(root: Path, relative: str) -> Path:
    """root/relative, with whatever the tree had there removed (its directory made)."""
    path = root / relative
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _link_out(root: Path, relative: str, target: Path) -> None:
    _emptied(root, relative).symlink_to(target)


def _file_linked_out(relative: str):
    """A planting of a link at `relative` to a file outside holding the secret."""
    def plant(root: Path, tmp_path: Path) -> str:
        _link_out(root, relative, _secret_file(tmp_path))
        return f"samples/s0000/{relative}"
    return plant


def _fifo_at(relative: str):
    """A planting of a FIFO at `relative` (nothing ever writes to it)."""
    def plant(root: Path, tmp_path: Path) -> str:
        os.mkfifo(_emptied(root, relative))
        return f"samples/s0000/{relative}"
    return plant


def _mountinfo_linked_out(root: Path, tmp_path: Path) -> str:
    outside = _secret_file(tmp_path)
    outside.write_text(f"30 1 0:26 / /sys/fs/cgroup rw - cgroup2 {SECRET} rw\n")
    _link_out(root, "proc/self/mountinfo", outside)
    return "static/proc/self/mountinfo"


def _node_dir_linked_out(root: Path, tmp_path: Path) -> str:
    outside = tmp_path / "outside" / "node"
    write(outside / "node0" / "numastat", f"numa_hit {SECRET}\n")
    write(outside / "node0" / "cpulist", "0-3\n")
    _link_out(root, "sys/devices/system/node", outside)
    return "samples/s0000/sys/devices/system/node"


def _pod_logs_linked_out(root: Path, tmp_path: Path) -> str:
    outside = tmp_path / "outside" / "pods"
    (outside / f"{SECRET}_etl-7f9c_{BATCH_UID}" / "etl").mkdir(parents=True)
    _link_out(root, "var/log/pods", outside)
    return "samples/s0000/var/log/pods"


def _runtime_spec_linked_out(root: Path, tmp_path: Path) -> str:
    outside = _secret_file(tmp_path)
    outside.write_text('{"annotations": {"io.kubernetes.cri.sandbox-namespace": "batch", '
                       '"io.kubernetes.cri.sandbox-name": "etl-7f9c", '
                       f'"io.kubernetes.cri.sandbox-uid": "{BATCH_UID}", '
                       f'"io.kubernetes.cri.container-name": "{SECRET}"}}}}')
    _link_out(root, f"{RUNTIME}/{BATCH_CID}/config.json", outside)
    return f"samples/s0000/{RUNTIME}/{BATCH_CID}/config.json"


HAZARDS = {
    "proc/stat linked out": _file_linked_out("proc/stat"),
    "proc/loadavg a FIFO": _fifo_at("proc/loadavg"),
    "proc/<pid>/cmdline linked out": _file_linked_out("proc/200/cmdline"),
    "proc/<pid>/cmdline a FIFO": _fifo_at("proc/200/cmdline"),
    # sshd (pid 400) is in no pool: only the scan for the heaviest CPU users opens it.
    "a scanned proc/<pid>/stat a FIFO": _fifo_at("proc/400/stat"),
    "proc/self/mountinfo linked out": _mountinfo_linked_out,
    "a globbed directory linked out": _node_dir_linked_out,
    "the kubelet's state linked out": _file_linked_out("var/lib/kubelet/cpu_manager_state"),
    "the pod log directory linked out": _pod_logs_linked_out,
    "a runtime spec linked out": _runtime_spec_linked_out,
}


def _recorded_tree(tmp_path: Path) -> Path:
    """The Kubernetes node tree, made a recording beyond doubt (cmd/: recorded outputs)."""
    root = kube_tree(tmp_path)
    (root / "cmd").mkdir()
    write(root / "proc/stat", "cpu  10 0 10 100 0 0 0 0 0 0\nbtime 1700000000\n")
    write(root / "proc/loadavg", "0.50 0.40 0.30 1/200 4242\n")
    write(root / "proc/self/mountinfo", "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    write(root / "sys/devices/system/node/node0/numastat", "numa_hit 1\n")
    write(root / "sys/devices/system/node/node0/cpulist", "0-3\n")
    return root


def _record_tree(root: Path, tmp_path: Path) -> tuple[Path, object]:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"pools": POD_POOLS}))
    out = tmp_path / "bundle"
    result = run(["bundle", "record", "--root", str(root), "--seconds", "0", "--interval", "1",
                  "-o", str(out), "--config", str(config)], timeout=RECORD_TIMEOUT_SECONDS)
    return out, result


def _secret_in(bundle: Path) -> list[str]:
    """Bundle paths whose name or content carries the secret."""
    found = []
    for path in bundle.rglob("*"):
        if SECRET in str(path.relative_to(bundle)) or (
                path.is_file() and SECRET in path.read_text(errors="replace")):
            found.append(str(path.relative_to(bundle)))
    return found


@pytest.mark.parametrize("plant", HAZARDS.values(), ids=HAZARDS.keys())
def test_recording_a_recorded_tree_leaves_its_hazards_out(tmp_path, plant):
    root = _recorded_tree(tmp_path)
    planted = plant(root, tmp_path)
    out, result = _record_tree(root, tmp_path)
    assert result.returncode is not None, \
        f"bundle record still running after {RECORD_TIMEOUT_SECONDS:g} s: {result.stderr}"
    assert result.returncode == 0, result.stderr
    assert _secret_in(out) == []
    assert not os.path.lexists(out / planted)
    sample = out / "samples" / "s0000"
    # Everything else is recorded as from any tree.
    assert (sample / "proc/200/stat").is_file() and (sample / "proc/100/cgroup").is_file()
    assert (out / "static" / "proc" / "self" / "mountinfo").is_file() or \
        planted == "static/proc/self/mountinfo"


def test_recording_a_clean_recorded_tree_copies_it_as_it_is(tmp_path):
    root = _recorded_tree(tmp_path)
    write(root / "proc/200/fd_count", "57\n")  # a bundle holds the count, not the fds
    out, result = _record_tree(root, tmp_path)
    assert result.returncode == 0, result.stderr
    sample = out / "samples" / "s0000"
    for relative in ("proc/stat", "proc/loadavg", "proc/200/stat", "proc/300/stat",
                     "proc/200/fd_count",
                     "sys/devices/system/node/node0/numastat",
                     "var/lib/kubelet/cpu_manager_state"):
        assert (sample / relative).read_bytes() == (root / relative).read_bytes(), relative
    assert (sample / "proc/200/cmdline").read_bytes() == b"python3\0etl_job.py\0"
    assert (out / "static/proc/self/mountinfo").read_bytes() == \
        (root / "proc/self/mountinfo").read_bytes()
    assert (sample / f"{RUNTIME}/{BATCH_CID}/config.json").is_file()
    assert (sample / f"var/log/pods/batch_etl-7f9c_{BATCH_UID}/etl").is_dir()


def test_the_copy_reads_refuse_only_under_a_recorded_root(tmp_path):
    """What bundle record copies with: a recorded tree's reader refuses a link out and a
    FIFO and lists no directory linked out; a live host's reader reads its root as it is."""
    root = tmp_path / "tree"
    write(root / "proc/meminfo", "MemTotal: 1 kB\n")
    _link_out(root, "proc/stat", _secret_file(tmp_path))
    os.mkfifo(root / "proc/loadavg")
    for fd in "012":
        write(root / "proc/1/fd" / fd, "")
    write(tmp_path / "outside/node/node0/numastat", f"numa_hit {SECRET}\n")
    _link_out(root, "sys/devices/system/node", tmp_path / "outside/node")
    recorded = RecordedSample(str(root)).reader()
    live = LiveHost(str(root)).reader()
    assert recorded.read_bytes("proc/meminfo", 8) == live.read_bytes("proc/meminfo", 8) == \
        b"MemTotal"
    with pytest.raises(RefusedPath, match="a link out"):
        recorded.read_bytes("proc/stat", 4096)
    with pytest.raises(RefusedPath, match="not a regular file"):
        recorded.read_bytes("proc/loadavg", 4096)
    with pytest.raises(NotAvailable, match="does not exist"):
        recorded.read_bytes("proc/vmstat", 4096)
    assert live.read_bytes("proc/stat", 4096) == f"{SECRET}\n".encode()
    numastat = "sys/devices/system/node/node*/numastat"
    assert recorded.files_matching(numastat) == []
    assert live.files_matching(numastat) == ["sys/devices/system/node/node0/numastat"]
    assert recorded.files_matching("proc/*") == ["proc/meminfo"]
    assert recorded.entries("sys/devices/system/node") is None
    assert live.entries("sys/devices/system/node") == ["node0"]
    assert recorded.entries("proc/1/fd") == ["0", "1", "2"]
    assert recorded.entries("proc/2/fd") is None and recorded.listdir("proc/2/fd") == []
