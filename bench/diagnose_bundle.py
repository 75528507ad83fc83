#!/usr/bin/env python3
"""Time `fleetscope diagnose --bundle` on a 60-sample bundle (the issue's target: under 2 s).

Records a 60-sample bundle of this machine with pools matching its Python processes (every
collector, cgroups and per-process files included; 0.2 s apart to keep the recording short),
then runs the diagnosis several times as a whole process and reports wall and CPU seconds.

    python bench/diagnose_bundle.py [--samples 60] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """pools:
  - {name: agents, class: online, match: {cmdline: "python"}}
  - {name: batch, class: offline, match: {cmdline: "etl|train"}}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetscope-bench-") as work:
        config = Path(work) / "node.yaml"
        config.write_text(CONFIG)
        bundle = Path(work) / "bundle.tar.gz"
        interval = 0.2
        subprocess.run([sys.executable, "-m", "fleetscope", "bundle", "record", "--seconds",
                        str((args.samples - 1) * interval), "--interval", str(interval),
                        "--config", str(config), "-o", str(bundle)], check=True,
                       stdout=subprocess.DEVNULL)
        walls, cpus = [], []
        for _ in range(args.runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                                     str(bundle), "--json"], capture_output=True, text=True)
            walls.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            document = json.loads(result.stdout)
        print(f"bundle: {args.samples} samples of this node, {bundle.stat().st_size / 1e6:.1f} MB "
              f"compressed; {len(document['findings'])} findings, "
              f"{len(document['not_evaluated'])} rules not evaluated")
        print(f"diagnose --bundle, whole process, {args.runs} runs: "
              f"wall median {statistics.median(walls):.2f} s (min {min(walls):.2f}, "
              f"max {max(walls):.2f}); CPU median {statistics.median(cpus):.2f} s; "
              f"target < 2 s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
