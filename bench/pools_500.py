#!/usr/bin/env python3
"""CPU time per scrape of the pools, irq and tuning collectors with 500 pool processes.

Starts 500 sleeping processes (the system's `sleep`, renamed through argv[0] so each pool's
cmdline regex matches its share), spread over four pools (two online, two offline, matched by
cmdline; a fifth pool matches by cgroup glob, so every process's /proc/<pid>/cgroup is read
as on a node whose config mixes both), then runs each collector over this machine's live
/proc in this process and reports the CPU time (time.process_time: user + system, the
kernel's /proc formatting included) per scrape. The budget for `pools` is 50 ms.

    python bench/pools_500.py [--processes 500] [--scrapes 20]

The children exit by themselves after 120 s and are killed when the bench ends. Prints the
medians; exit 0 whatever they are (benchmarks report, tests assert behaviour).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetscope.collectors import COLLECTORS, Scrape  # noqa: E402
from fleetscope.config import parse_config  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--processes", type=int, default=500)
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args()
    pools = [
        {"name": name, "class": name.rsplit("-", 1)[1],
         "match": {"cmdline": f"^fleetscope-bench-{name} "}}
        for name in POOLS
    ]
    pools.append({"name": "k8s-online", "class": "online", "match": {"cgroup": "*/online/*"}})
    config = parse_config({"pools": pools})
    children = start_children(args.processes)
    try:
        time.sleep(1.0)  # let every child exec
        collectors = [COLLECTORS[name](config) for name in ("pools", "irq", "tuning")]
        for collector in collectors:  # warm-up: imports, regex compilation, first totals
            list(collector.collect(Scrape(("/",))))
        times: dict[str, list[float]] = {c.name: [] for c in collectors}
        times["pools+irq+tuning"] = []
        matched = 0
        for _ in range(args.scrapes):
            scrape = Scrape(("/",))  # one scrape: the process list is shared, as in the exporter
            total = 0.0
            for collector in collectors:
                start = time.process_time()
                families = list(collector.collect(scrape))
                spent = time.process_time() - start
                times[collector.name].append(spent)
                total += spent
                if collector.name == "pools":
                    matched = sum(v for f in families if f.name == "fleetscope_pool_processes"
                                  for _, v in f.samples)
            times["pools+irq+tuning"].append(total)
        print(f"pool processes matched: {matched} (of {args.processes} started)")
        for name, values in times.items():
            print(f"{name:18s} CPU per scrape: median {statistics.median(values) * 1000:.1f} ms, "
                  f"max {max(values) * 1000:.1f} ms over {len(values)} scrapes")
    finally:
        for child in children:
            child.kill()
        for child in children:
            child.wait()


if __name__ == "__main__":
    main()
