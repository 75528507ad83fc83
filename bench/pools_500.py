#!/usr/bin/env python3
"""CPU time per scrape of the pools, irq and tuning collectors with 500 pool processes.

Starts 500 sleeping processes (the system's `sleep`, renamed through argv[0] so each pool's
cmdline regex matches its share), spread over four pools (two online, two offline, matched by
cmdline; a fifth pool matches by cgroup glob, so every process's /proc/<pid>/cgroup is read
as on a node whose config mixes both), then runs each collector over this machine's live
/proc in this process and reports the CPU time (time.process_time: user + system, the
kernel's /proc formatting included) per scrape. The budget for `pools` is 50 ms.

Then, for what counting every thread costs on top (/proc/<pid>/task/<tid>/status and
schedstat of each thread; the syscall file only of threads that ran since the last scrape),
it adds `--threaded` Python processes of `--threads` sleeping threads each to the first pool
and measures again.

    python bench/pools_500.py [--processes 500] [--scrapes 20] [--threaded 10 --threads 100]
    python bench/pools_500.py --waiting [--processes 500]
    python bench/pools_500.py --pods [--processes 500]

`--waiting` opens a 127.0.0.1 listener of the bench's own holding connections nobody
accepts: the TCP table then has a row where something waits that no pool holds, so the
connection metrics read every pool process's fd links each scrape, their costliest case (a
busy node whose other services always have a queue somewhere).

`--pods` puts each child in a pod of its own instead, laid out as the kubelet lays pods out on
a cgroup v1 node (cpu controller: kubepods/[burstable|besteffort/]pod<uid>/<container id>),
with each pod's log directory and log link under a temporary root, and pools matched by QoS
class and namespace (needs root; every cgroup it makes is removed at the end).

The children exit by themselves after 120 s and are killed when the bench ends. Prints the
medians; exit 0 whatever they are (benchmarks report, tests assert behaviour).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetscope.collectors import COLLECTORS, Scrape  # noqa: E402
from fleetscope.collectors.source import LiveHost  # noqa: E402
from fleetscope.core.config import parse_config  # noqa: E402

POOLS = ("chat-online", "tools-online", "batch-offline", "etl-offline")
LIFETIME_SECONDS = 120  # the children's own bound, whatever happens to this script


def start_children(count: int) -> list[subprocess.Popen]:
    sleep = shutil.which("sleep")
    if sleep is None:
        sys.exit("needs the `sleep` command")
    children = []
    for i in range(count):
        marker = f"fleetscope-bench-{POOLS[i % len(POOLS)]}"
        children.append(subprocess.Popen([marker, str(LIFETIME_SECONDS)], executable=sleep))
    return children


def unaccepted_listener(connections: int = 3) -> tuple[socket.socket, list[socket.socket]]:
    """A 127.0.0.1 listener with `connections` in its accept queue, never accepted."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(connections)
    clients = [socket.create_connection(listener.getsockname()) for _ in range(connections)]
    return listener, clients


KUBEPODS = Path("/sys/fs/cgroup/cpu/kubepods")
QOS = ("guaranteed", "burstable", "besteffort")


def start_pods(count: int, root: Path, made: list[Path]) -> list[subprocess.Popen]:
    """`count` sleeping children, each the one container of its own pod (a third per QoS
    class, namespaces bench-0 .. bench-9), with the pod's log directory and link under root."""
    sleep = shutil.which("sleep")
    children = []
    for i in range(count):
        qos, namespace = QOS[i % 3], f"bench-{i % 10}"
        uid, container_id = str(uuid.uuid4()), secrets.token_hex(32)
        pod, container = f"agent-{i}", "etl" if i % 2 else "agent"
        parent = KUBEPODS if qos == "guaranteed" else KUBEPODS / qos
        cgroup = parent / f"pod{uid}" / container_id
        for directory in (KUBEPODS, parent, cgroup.parent, cgroup):
            if not directory.exists():
                directory.mkdir()
                made.append(directory)
        (root / f"var/log/pods/{namespace}_{pod}_{uid}/{container}").mkdir(parents=True)
        (root / f"var/log/containers/{pod}_{namespace}_{container}-{container_id}.log").touch()
        procs = str(cgroup / "cgroup.procs")

        def enter(procs=procs) -> None:
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))
        children.append(subprocess.Popen(["fleetscope-bench-pod", str(LIFETIME_SECONDS)],
                                         executable=sleep, preexec_fn=enter))
    return children


def pod_config(root: Path):
    return parse_config({
        "pools": [
            {"name": "online", "class": "online", "match": {"qos": "guaranteed"}},
            {"name": "cs", "class": "online",
             "match": {"namespace": "bench-[1-4]", "qos": "burstable"}},
            {"name": "batch", "class": "offline", "match": {"qos": "besteffort"}},
            {"name": "analytics", "class": "offline",
             "match": {"namespace": "bench-9", "container": "etl*"}}],
        "kubernetes": {"pod_logs": f"{root}/var/log/pods",
                       "container_logs": f"{root}/var/log/containers"}})


def bench_pods(args) -> None:
    if os.geteuid() != 0 or not (KUBEPODS.parent / "cgroup.procs").exists():
        sys.exit(f"--pods needs root and the cgroup v1 cpu controller at {KUBEPODS.parent}")
    made: list[Path] = []
    children: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="fleetscope-bench-pods-") as tmp:
        root = Path(tmp)
        (root / "var/log/containers").mkdir(parents=True)
        try:
            children = start_pods(args.processes, root, made)
            time.sleep(1.0)
            times, matched, _ = measure(pod_config(root), args.scrapes)
            print(f"pods: {args.processes}, pool processes matched: {matched:.0f}")
            report(times)
        finally:
            for child in children:
                child.kill()
            for child in children:
                child.wait()
            for directory in reversed(made):
                for _ in range(50):  # a killed task leaves its cgroup a moment later
                    with contextlib.suppress(FileNotFoundError):
                        try:
                            directory.rmdir()
                            break
                        except OSError:
                            time.sleep(0.1)


THREADED = """
import sys, threading, time
never = threading.Event()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=never.wait, daemon=True).start()
print("ready", flush=True)
time.sleep(float(sys.argv[2]))
"""


def start_threaded(count: int, threads: int) -> list[subprocess.Popen]:
    children = []
    for _ in range(count):
        # argv[0] is the pool's marker, as for the sleeping children
        children.append(subprocess.Popen(
            [f"fleetscope-bench-{POOLS[0]}", "-c", THREADED, str(threads),
             str(LIFETIME_SECONDS)], executable=sys.executable, stdout=subprocess.PIPE,
            text=True))
    for child in children:
        child.stdout.readline()
    return children


def measure(config, scrapes: int) -> tuple[dict[str, list[float]], float, float]:
    """CPU seconds per scrape of each collector; the pool processes and threads matched."""
    collectors = [COLLECTORS[name](config) for name in ("pools", "irq", "tuning")]
    for collector in collectors:  # warm-up: imports, regex compilation, first totals
        list(collector.collect(Scrape(LiveHost("/"))))
    times: dict[str, list[float]] = {c.name: [] for c in collectors}
    times["pools+irq+tuning"] = []
    matched = threads = 0.0
    for _ in range(scrapes):
        scrape = Scrape(LiveHost("/"))  # one scrape, the live node, as the exporter has it
        total = 0.0
        for collector in collectors:
            start = time.process_time()
            families = list(collector.collect(scrape))
            spent = time.process_time() - start
            times[collector.name].append(spent)
            total += spent
            if collector.name == "pools":
                found = {f.name: sum(v for _, v in f.samples) for f in families}
                matched = found.get("fleetscope_pool_processes", 0)
                threads = found.get("fleetscope_pool_threads_read", 0)
        times["pools+irq+tuning"].append(total)
    return times, matched, threads


def report(times: dict[str, list[float]]) -> None:
    for name, values in times.items():
        print(f"{name:18s} CPU per scrape: median {statistics.median(values) * 1000:.1f} ms, "
              f"max {max(values) * 1000:.1f} ms over {len(values)} scrapes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--processes", type=int, default=500)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--threaded", type=int, default=10,
                        help="multi-threaded processes added for the second measure (0: none)")
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--pods", action="store_true",
                        help="each child a pod of its own, pools by QoS class and namespace")
    parser.add_argument("--waiting", action="store_true",
                        help="a listener of no pool holds connections nobody accepts")
    args = parser.parse_args()
    if args.pods:
        bench_pods(args)
        return
    pools = [
        {"name": name, "class": name.rsplit("-", 1)[1],
         "match": {"cmdline": f"^fleetscope-bench-{name} "}}
        for name in POOLS
    ]
    pools.append({"name": "k8s-online", "class": "online", "match": {"cgroup": "*/online/*"}})
    config = parse_config({"pools": pools})
    listener, clients = unaccepted_listener() if args.waiting else (None, [])
    children = start_children(args.processes)
    try:
        time.sleep(1.0)  # let every child exec
        times, matched, threads = measure(config, args.scrapes)
        print(f"pool processes matched: {matched:.0f} (of {args.processes} started), "
              f"threads read: {threads:.0f}")
        report(times)
        if args.threaded and args.threads:
            children += start_threaded(args.threaded, args.threads)
            with_threads, matched, threads = measure(config, args.scrapes)
            print(f"\nwith {args.threaded} more processes of {args.threads} threads: "
                  f"{matched:.0f} processes, threads read: {threads:.0f}")
            report(with_threads)
            extra = (statistics.median(with_threads["pools"])
                     - statistics.median(times["pools"])) * 1000
            print(f"every thread's accounting adds {extra:.1f} ms a scrape for "
                  f"{args.threaded * args.threads} threads "
                  f"({extra * 1000 / (args.threaded * args.threads):.1f} us a thread)")
    finally:
        for child in children:
            child.kill()
        for child in children:
            child.wait()
        for sock in [listener, *clients] if listener else []:
            sock.close()


if __name__ == "__main__":
    main()
