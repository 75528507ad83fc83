#!/usr/bin/env python3
"""The exporter's scrape cost, one fleetscope install against another, in one run.

Each install's Python runs the same in-process loop (every collector but perf and agent, which
wait on a command or an endpoint): build the exporter on a root, scrape it `--scrapes` times,
exit. Runs alternate A B A B ..., so drift on a shared machine hits both alike; the CPU of each
run is the child's user + system time. Prints each side's median and the median of the
run-by-run ratios A/B.

    python -m venv /tmp/before && /tmp/before/bin/pip install <old checkout>   (and after)
    python bench/exporter_versions.py --a /tmp/after/bin/python --b /tmp/before/bin/python \\
        --root FIXTURE/samples/s0000 [--root /] [--scrapes 300] [--runs 9]

A root that is a bundle's sample uses the bundle's recorded config (its pools); `/` uses
none. Exit 0 whatever the numbers are (benchmarks report, tests assert behaviour).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys

# Run by each install's Python: fleetscope is imported from that install.
LOOP = r"""
import os, sys
from fleetscope.collectors import COLLECTORS
from fleetscope.core.bundle_format import sample_bundle
from fleetscope.collectors.source import LiveHost, recorded_sample
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
root, scrapes = sys.argv[1], int(sys.argv[2])
raw = {}
if root == "/":
    source = LiveHost("/")
else:
    source = recorded_sample(root)
    bundle = os.path.dirname(os.path.dirname(root))
    if sample_bundle(os.path.abspath(root)) is not None:  # a bundle's sample: its config
        from fleetscope.bundle.read import open_bundle
        with open_bundle(bundle) as opened:
            raw = opened.config_raw
wanted = [name for name in COLLECTORS if name not in ("perf", "agent")]
exporter = Exporter(source, parse_config({**raw, "collectors": wanted}, tuple(COLLECTORS)))
for _ in range(scrapes):
    render(exporter.collect())
"""


def child_cpu(python: str, root: str, scrapes: int) -> float:
    """CPU seconds (user + system) of one run of the loop under `python`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([python, "-c", LOOP, root, str(scrapes)], check=True, cwd="/",
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONWARNINGS": "ignore"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", required=True, help="the Python of install A (the change)")
    parser.add_argument("--b", required=True, help="the Python of install B (the baseline)")
    parser.add_argument("--root", action="append", required=True,
                        help="a bundle sample, fixture tree or / (repeatable)")
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    print(f"{'root':<60} {'A s':>7} {'B s':>7} {'A/B':>6} (min-max)")
    for root in args.root:
        child_cpu(args.a, root, 1)  # warm the page cache and both installs' bytecode
        child_cpu(args.b, root, 1)
        a_runs, b_runs, ratios = [], [], []
        for _ in range(args.runs):
            a = child_cpu(args.a, root, args.scrapes)
            b = child_cpu(args.b, root, args.scrapes)
            a_runs.append(a)
            b_runs.append(b)
            ratios.append(a / b)
        print(f"{root[-60:]:<60} {statistics.median(a_runs):7.3f} "
              f"{statistics.median(b_runs):7.3f} {statistics.median(ratios):6.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
