"""`fleetscope bundle record`: capture a node's raw evidence into a bundle (CONTRACT §3).

    fleetscope bundle record --seconds 30 --interval 5 -o /tmp/node17.tar.gz

Files are copied byte for byte from /proc and /sys (through `--root`), so anything that
reads through a root reads a sample exactly as it read the live node. What changes goes in
`samples/sNNNN/`, what does not in `static/`. Command outputs (`perf stat`, `ethtool -S`,
`dmesg`) and the agent runtime's metrics are stored as those tools print them. A file the
node lacks is simply absent: the rules that need it are then "not evaluated".

Node side: standard library, plus the collectors' own helpers for commands.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable

from fleetscope.collectors.base import BUNDLE_FORMAT, Scrape
from fleetscope.collectors.processes import pool_processes
from fleetscope.config import Config

STATIC_GLOBS = (
    "proc/cpuinfo", "proc/cmdline",
    "sys/devices/system/node/online", "sys/devices/system/node/node*/cpulist",
    "sys/devices/system/node/node*/distance", "sys/devices/system/node/node*/meminfo",
    "sys/devices/system/cpu/online", "sys/devices/system/cpu/cpu*/topology/*",
)
SAMPLE_GLOBS = (
    "proc/stat", "proc/loadavg", "proc/meminfo", "proc/vmstat", "proc/schedstat",
    "proc/pressure/cpu", "proc/pressure/memory", "proc/pressure/io", "proc/pressure/irq",
    "proc/net/dev", "proc/net/netstat", "proc/net/snmp", "proc/interrupts",
    "proc/irq/*/smp_affinity_list",
    "proc/sys/net/core/somaxconn", "proc/sys/net/ipv4/tcp_tw_reuse",
    "proc/sys/net/core/rmem_max", "proc/sys/net/core/wmem_max",
    "proc/sys/kernel/threads-max", "proc/sys/vm/max_map_count",
    "sys/devices/system/node/node*/numastat",
    "sys/class/infiniband/*/ports/*/counters/*", "sys/class/infiniband/*/ports/*/hw_counters/*",
    "sys/fs/cgroup/cgroup.controllers",
)
PID_FILES = ("stat", "status", "schedstat", "cgroup", "cmdline", "limits")
CGROUP_FILES = ("cpu.stat", "cpu.pressure", "cpu.max")
MAX_FILE_BYTES = 16 * 1024 * 1024  # numa_maps of a huge process can be big; bound it


class RecordError(Exception):
    """The bundle cannot be written; one line for the user."""


def _copy(root: str, relative: str, destination: str) -> bool:
    """Copy one /proc or /sys file as read (they report size 0: read, don't copy)."""
    try:
        with open(os.path.join(root, relative), "rb") as source:
            data = source.read(MAX_FILE_BYTES)
    except OSError:
        return False  # absent on this node, unreadable, or the process exited
    target = os.path.join(destination, relative)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as out:
        out.write(data)
    return True


def copy_globs(root: str, patterns, destination: str) -> None:
    for pattern in patterns:
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            if os.path.isfile(path):
                _copy(root, os.path.relpath(path, root), destination)


def _run(argv: list[str], timeout: float) -> str | None:
    """A command's output, or None if it is missing, fails or hangs (killed at timeout)."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                check=False)
    except (subprocess.TimeoutExpired, OSError):
        return None
    return result.stdout if result.returncode == 0 else None


TOP_CPU_PROCESSES = 20  # besides pool members: the heaviest CPU users (antagonists)


def _cpu_ticks(stat_text: bytes) -> int:
    fields = stat_text.rpartition(b")")[2].split()
    try:
        return int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return 0


def _capture_processes(root: str, destination: str, config: Config, now: float) -> None:
    """Per-process files for pool members and for the heaviest CPU users (a node's thousands
    of idle processes would only cost tens of thousands of files), numa_maps and fd counts for
    pool members, and the pool cgroups' CPU files."""
    scrape = Scrape((root,), now)
    pool_members = pool_processes(scrape, config.pools)
    members = {p.pid for p in pool_members}
    cgroups = {p.cgroup for p in pool_members if p.cgroup}
    usage = []
    for name in os.listdir(os.path.join(root, "proc")):
        if name.isdigit() and int(name) not in members:
            try:
                with open(os.path.join(root, "proc", name, "stat"), "rb") as handle:
                    usage.append((_cpu_ticks(handle.read()), int(name)))
            except OSError:
                continue  # exited
    usage.sort(reverse=True)
    chosen = sorted(members | {pid for ticks, pid in usage[:TOP_CPU_PROCESSES] if ticks > 0})
    for pid in chosen:
        base = f"proc/{pid}"
        if not _copy(root, f"{base}/stat", destination):
            continue  # exited
        for file_name in PID_FILES[1:]:
            _copy(root, f"{base}/{file_name}", destination)
        try:
            fd_count = len(os.listdir(os.path.join(root, base, "fd")))
        except OSError:
            fd_count = None
        if fd_count is not None:
            with open(os.path.join(destination, base, "fd_count"), "w") as out:
                out.write(f"{fd_count}\n")
        if pid in members:
            _copy(root, f"{base}/numa_maps", destination)
    for path in cgroups:
        for file_name in CGROUP_FILES:
            _copy(root, f"sys/fs/cgroup{path}/{file_name}", destination)
    _capture_threads(root, destination, scrape, pool_members)


TASK_FILES = ("stat", "status", "schedstat", "syscall", "wchan")


def _capture_threads(root: str, destination: str, scrape: Scrape, pool_members) -> None:
    """Pool members' threads as the pools collector reads them (the same threads, in the
    same order and bound: collectors/tasks.py), and what their network waits need where the
    live node has fd links and process memory: proc/<pid>/fd_sockets ("fd inode" lines),
    proc/<pid>/task/<tid>/pollfds (one polled fd a line), and the TCP tables."""
    from fleetscope.collectors.tasks import (
        TASKS_READ_PER_POOL,
        process_network_waits,
        task_dir,
        task_ids,
    )

    # Waits are found in what was just recorded (so the bundle agrees with itself), with the
    # live node behind it for the fd links, the memory and the TCP tables.
    recorded = Scrape((destination, root), scrape.time)
    budget = {p.pool.name: TASKS_READ_PER_POOL for p in pool_members}
    any_wait = False
    try:
        own_net = os.readlink(os.path.join(root, "proc/self/ns/net"))
    except OSError:
        own_net = None
    for process in pool_members:
        pid = process.pid
        base = f"proc/{pid}"
        for file_name in ("syscall", "wchan"):  # the leader's: task/<pid> is proc/<pid>
            _copy(root, f"{base}/{file_name}", destination)
        tids = [t for t in task_ids(scrape, pid) if t != pid][:budget[process.pool.name]]
        budget[process.pool.name] -= len(tids)
        for tid in tids:
            for file_name in TASK_FILES:
                _copy(root, f"{base}/task/{tid}/{file_name}", destination)
        waits = process_network_waits(recorded, pid, tids=tids)
        if not waits:
            continue
        any_wait = True
        with open(os.path.join(destination, base, "fd_sockets"), "w") as out:
            out.writelines(sorted({
                f"{w.fd} {w.inode}" + ("" if w.idle_seconds is None else
                                        f" {round(w.idle_seconds * 1000)}") + "\n"
                for w, _ in waits}))
        for wait, _ in waits:
            if wait.polled:
                with open(os.path.join(destination, task_dir(pid, wait.tid), "pollfds"),
                          "w") as out:
                    out.writelines(f"{fd}\n" for fd in wait.polled)
        try:
            other_net = os.readlink(os.path.join(root, f"{base}/ns/net")) != own_net
        except OSError:
            other_net = False
        if other_net:  # a container's workers: their own namespace's table
            for name in ("tcp", "tcp6"):
                _copy(root, f"{base}/net/{name}", destination)
    if any_wait:
        for name in ("tcp", "tcp6"):
            _copy(root, f"proc/net/{name}", destination)


def record(output: str, seconds: float, interval: float, config: Config, root: str = "/",
           progress: Callable[[int, int], None] | None = None) -> str:
    """Record a bundle; returns the path written."""
    from fleetscope.bundle_commands import CommandOutputs

    commands = CommandOutputs(config, root)
    try:
        return _record(output, seconds, interval, config, root, progress, commands)
    finally:
        commands.close()


def _record(output, seconds, interval, config, root, progress, commands) -> str:
    as_tar = output.endswith((".tar.gz", ".tgz"))
    if not as_tar and os.path.exists(output) and os.listdir(output):
        raise RecordError(f"{output} exists and is not empty")
    workdir = tempfile.mkdtemp(prefix="fleetscope-record-") if as_tar else output
    bundle_dir = os.path.join(workdir, "bundle") if as_tar else output
    os.makedirs(bundle_dir, exist_ok=True)
    try:
        static = os.path.join(bundle_dir, "static")
        copy_globs(root, STATIC_GLOBS, static)
        dmesg = _run(["dmesg"], config.command_timeout_seconds) if root == "/" else None
        if dmesg is None and os.path.isfile(os.path.join(root, "dmesg.txt")):
            with open(os.path.join(root, "dmesg.txt"), encoding="utf-8", errors="replace") as f:
                dmesg = f.read()
        if dmesg is not None:
            with open(os.path.join(static, "dmesg.txt"), "w", encoding="utf-8") as out:
                out.write(dmesg)
        commands.static(static, dmesg)
        count = max(1, int(seconds / interval) + 1)
        samples = []
        start = time.monotonic()
        for index in range(count):
            delay = start + index * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            now = time.time()
            relative = f"samples/s{index:04d}"
            sample_dir = os.path.join(bundle_dir, relative)
            os.makedirs(sample_dir, exist_ok=True)
            copy_globs(root, SAMPLE_GLOBS, sample_dir)
            if os.path.isdir(os.path.join(root, "proc")):
                _capture_processes(root, sample_dir, config, now)
            commands.sample(sample_dir, interval)
            samples.append({"dir": relative, "time": round(now, 3)})
            if progress:
                progress(index + 1, count)
        meta = {"format": BUNDLE_FORMAT, "hostname": socket.gethostname(),
                "interval_s": interval, "samples": samples, "config": config.raw}
        with open(os.path.join(bundle_dir, "meta.json"), "w", encoding="utf-8") as out:
            json.dump(meta, out, indent=2)
        if as_tar:
            with tarfile.open(output, "w:gz") as archive:
                archive.add(bundle_dir, arcname=".")
        return output
    except OSError as err:
        raise RecordError(f"cannot write the bundle: {err}") from None
    finally:
        if as_tar:
            shutil.rmtree(workdir, ignore_errors=True)
