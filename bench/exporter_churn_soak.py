#!/usr/bin/env python3
"""The exporter's memory under process and thread churn: RSS and every pid-keyed cache, flat.

Nodes start and end thousands of processes an hour. This runs the exporter (every default
collector, in this process, over this machine's live /proc) `--scrapes` times beside a churner
that keeps starting short-lived pool processes (the system's `sleep`, renamed through argv[0]
so the pools' cmdline regexes match, each living 0.2-1.5 s) and a threaded pool process whose
threads start and exit all the time. The scrapes run back to back, each one's clock
`--interval` seconds after the last (state kept for a time, such as a gone member's last
counter, expires as it would between real scrapes). Every `--every` scrapes it prints the RSS
of this process
and the size of every container an exporter object holds (each collector's dicts, sets and
lists, the process matcher's cgroup cache): a cache keyed by pid must forget the dead, so
none may grow with the scrapes.

    python bench/exporter_churn_soak.py [--scrapes 20000] [--every 1000] [--interval 15]
                                        [--spawn-per-second 20]

Bounded: the churner and its children end by themselves after `--seconds` (default 3600), and
are killed by pid when the soak ends. Prints the table and the growth from the first report
after warm-up to the last; exit 0 whatever it is (benchmarks report, tests assert behaviour).
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetscope.collectors import processes  # noqa: E402
from fleetscope.collectors.source import LiveHost  # noqa: E402
from fleetscope.core.config import parse_config  # noqa: E402
from fleetscope.core.exposition import render  # noqa: E402
from fleetscope.exporter import Exporter  # noqa: E402

CHURN_MARKER = "fs-soak-churn"
THREADS_MARKER = "fs_soak_threads"
CHURNER = """
import os, random, subprocess, sys, time
sleep, marker, per_second, end = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
children = []
while time.time() < end:                       # short-lived pool processes, all the time
    children.append(subprocess.Popen([marker, f"{random.uniform(0.2, 1.5):.2f}"],
                                     executable=sleep))
    children = [c for c in children if c.poll() is None]
    time.sleep(1.0 / per_second)
for child in children:
    child.kill()
    child.wait()
"""
THREADS = """
import random, sys, threading, time
end = float(sys.argv[1])
def work():                                    # a request's thread: a little work, then gone
    deadline = time.time() + random.uniform(0.05, 0.5)
    while time.time() < deadline:
        sum(range(2000))
        time.sleep(0.01)
while time.time() < end:
    for _ in range(8):
        threading.Thread(target=work, daemon=True).start()
    time.sleep(0.1)
"""


def soak_config():
    return parse_config({"pools": [
        {"name": "churn-online", "class": "online", "match": {"cmdline": CHURN_MARKER}},
        {"name": "threads-online", "class": "online", "match": {"cmdline": THREADS_MARKER}},
        # matches nothing here, but makes every process's cgroup read (and cached by pid), as
        # on a node whose config mixes cgroup and cmdline pools
        {"name": "batch", "class": "offline", "match": {"cgroup": "*/fs-soak-batch/*"}},
    ]})


def start_churn(workdir: Path, per_second: float, seconds: float) -> list[subprocess.Popen]:
    """The churner and the threaded process; each ends by itself after `seconds`."""
    sleep = shutil.which("sleep")
    if sleep is None:
        sys.exit("needs the `sleep` command")
    end = str(time.time() + seconds)
    churner = workdir / "fs_soak_churner.py"
    churner.write_text(CHURNER)
    threads = workdir / f"{THREADS_MARKER}.py"
    threads.write_text(THREADS)
    return [subprocess.Popen([sys.executable, str(churner), sleep, CHURN_MARKER,
                              str(per_second), end], start_new_session=True),
            subprocess.Popen([sys.executable, str(threads), end], start_new_session=True)]


def stop(children: list[subprocess.Popen]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def container_sizes(exporter: Exporter) -> dict[str, int]:
    """Every dict, set, list or deque an exporter object holds, by `collector.attribute`,
    one level into helper objects (a MonotonicSums' own dicts), and the process matcher's
    module-wide cgroup cache."""
    sizes: dict[str, int] = {"processes._CGROUPS": len(processes._CGROUPS.entries)}

    def walk(prefix: str, obj, depth: int) -> None:
        for name, value in vars(obj).items():
            if isinstance(value, (dict, set, list, frozenset)) or type(value).__name__ == "deque":
                if name not in ("config",):
                    sizes[f"{prefix}.{name}"] = len(value)
            elif depth and hasattr(value, "__dict__") and type(value).__module__.startswith(
                    "fleetscope"):
                walk(f"{prefix}.{name}", value, depth - 1)

    for collector in exporter.collectors:
        walk(collector.name, collector, 1)
    return sizes


def soak(scrapes: int, every: int, per_second: float, seconds: float, interval: float,
         report=print) -> list[tuple[int, float, dict[str, int], int]]:
    """Scrape `scrapes` times beside the churn, back to back, each scrape's clock `interval`
    seconds after the last (what the collectors' time-kept state sees: a Prometheus scraping
    every 15 s, so 20,000 scrapes are 83 hours of it); returns (scrape, rss MiB, sizes, pids
    alive) every `every` scrapes (and at the end)."""
    exporter = Exporter(LiveHost("/"), soak_config())
    clock = time.time()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fs-soak-") as workdir:
        children = start_churn(Path(workdir), per_second, seconds)
        deadline = time.monotonic() + seconds
        try:
            time.sleep(1.0)  # the churn under way before the first scrape
            for index in range(1, scrapes + 1):
                clock += interval
                render(exporter.collect(now=clock))
                if index % every == 0 or index == scrapes or time.monotonic() > deadline:
                    gc.collect()
                    alive = sum(1 for p in os.listdir("/proc") if p.isdigit())
                    rows.append((index, rss_bytes() / 2**20, container_sizes(exporter), alive))
                    report(rows[-1])
                if time.monotonic() > deadline:
                    break
        finally:
            stop(children)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=20_000)
    parser.add_argument("--every", type=int, default=1000)
    parser.add_argument("--spawn-per-second", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=15.0,
                        help="seconds each scrape's clock moves on (default 15, a "
                        "Prometheus scrape interval)")
    parser.add_argument("--seconds", type=float, default=3600.0,
                        help="the soak's and the churn's bound (default 3600)")
    args = parser.parse_args()
    started = time.monotonic()
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{'scrape':>7} {'RSS MiB':>8} {'pids':>5}  largest containers (size)")

    def report(row) -> None:
        index, rss, sizes, alive = row
        top = sorted(sizes.items(), key=lambda kv: -kv[1])[:6]
        print(f"{index:>7} {rss:>8.1f} {alive:>5}  " + ", ".join(f"{k} {v}" for k, v in top),
              flush=True)

    rows = soak(args.scrapes, args.every, args.spawn_per_second, args.seconds, args.interval,
                report)
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    done = rows[-1][0] if rows else 0
    print(f"\n{done} scrapes in {time.monotonic() - started:.0f} s "
          f"({cpu / max(done, 1) * 1000:.1f} ms CPU each)")
    if len(rows) >= 3:
        warm, last = rows[1], rows[-1]  # after the first report: imports and first reads done
        print(f"RSS: {warm[1]:.1f} MiB at scrape {warm[0]} -> {last[1]:.1f} MiB at scrape "
              f"{last[0]} ({last[1] - warm[1]:+.1f} MiB)")
        grown = {k: (warm[2].get(k, 0), v) for k, v in last[2].items()
                 if v > warm[2].get(k, 0) + 16}
        print("containers grown by more than 16 entries since then: "
              + (", ".join(f"{k} {a} -> {b}" for k, (a, b) in sorted(grown.items()))
                 or "none"))
        print("largest at the end: " + ", ".join(
            f"{k} {v}" for k, v in sorted(last[2].items(), key=lambda kv: -kv[1])[:10]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
