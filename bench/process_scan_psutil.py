#!/usr/bin/env python3
"""The pools collector's process scan beside psutil's, on the same /proc, in one run.

What is timed is what every scrape does first: find the processes of the config's pools.
fleetscope lists /proc, reads each process's cmdline and, for the pools matched by cgroup,
its cgroup file, through the evidence source (collectors/processes.py, so a bundle replays
it). psutil does the same with `process_iter(["cmdline"])` and `psutil.PROCFS_PATH` set to
the root's proc; it has no cgroup field, so that file is read beside it, and both match with
the same PoolMatcher. Both keep what they keep between scrapes as they do on a node
(fleetscope's cgroup cache on a live host, psutil's Process table).

Two roots: this machine's /proc, and a fixture root of `--processes` processes (default
2,000) made of this machine's own /proc files (cmdline, cgroup, stat, status of each
process, copied again under new pids until there are enough), as a 128-core node's process
table is.

    python bench/process_scan_psutil.py [--scans 30] [--processes 2000]
    python bench/process_scan_psutil.py --make-fixture DIR [--processes 2000]
    python bench/process_scan_psutil.py --scanner psutil --root DIR --scans 200   # one side

Prints the median milliseconds per scan of each, the ratio psutil / fleetscope and the
processes each found in the pools (they must agree). Needs psutil (`pip install psutil`);
exit 0 whatever the times are (benchmarks report, tests assert behaviour).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetscope.collectors import Scrape  # noqa: E402
from fleetscope.collectors.parsers.process import parse_cgroup  # noqa: E402
from fleetscope.collectors.processes import matcher_for, pool_processes  # noqa: E402
from fleetscope.collectors.source import evidence_source  # noqa: E402
from fleetscope.core.config import parse_config  # noqa: E402

# Two pools by cmdline, one by cgroup glob: every process with a cmdline has its cgroup
# file read too, as on a node whose config mixes both.
POOLS = [{"name": "agents", "class": "online", "match": {"cmdline": "python|agent|worker"}},
         {"name": "batch", "class": "offline", "match": {"cmdline": "sleep|etl|train"}},
         {"name": "services", "class": "online", "match": {"cgroup": "*.service"}}]
PROCESS_FILES = ("cmdline", "cgroup", "stat", "status")


def fixture_root(processes: int, root: str | None = None) -> str:
    """A root whose proc holds `processes` processes copied from this machine's /proc."""
    root = root or tempfile.mkdtemp(prefix="fleetscope-scan-")
    proc = Path(root, "proc")
    proc.mkdir()
    for name in ("stat", "uptime", "loadavg", "meminfo"):
        shutil.copyfile(f"/proc/{name}", proc / name)
    models = []
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
        try:
            models.append({f: Path("/proc", pid, f).read_bytes() for f in PROCESS_FILES})
        except OSError:
            continue
    for index in range(processes):
        directory = proc / str(100_000 + index)
        directory.mkdir()
        for file_name, content in models[index % len(models)].items():
            if file_name == "stat":  # the pid field is the directory's
                content = f"{100_000 + index}".encode() + content[content.index(b" "):]
            (directory / file_name).write_bytes(content)
    return root


def scan_fleetscope(root: str, config) -> int:
    source = evidence_source(root, "auto")
    return len(pool_processes(Scrape(source, time.time()), config.pools))


def scan_psutil(root: str, config) -> int:
    import psutil

    psutil.PROCFS_PATH = os.path.join(root, "proc")
    matcher = matcher_for(config.pools)
    found = 0
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        cgroup = ""
        if matcher.needs_cgroup and cmdline:
            try:
                with open(os.path.join(psutil.PROCFS_PATH, str(process.pid), "cgroup")) as f:
                    cgroup = parse_cgroup(f.read())
            except OSError:
                continue
        found += matcher.match(cmdline, cgroup) is not None
    return found


SCANNERS = {"fleetscope": scan_fleetscope, "psutil": scan_psutil}


def timed(scanner, root: str, config, scans: int) -> tuple[float, int]:
    """Median milliseconds per scan (process time: user + system) and the pool processes
    the last scan found."""
    found = scanner(root, config)  # warm: caches as they are between scrapes
    times = []
    for _ in range(scans):
        began = time.process_time()
        found = scanner(root, config)
        times.append((time.process_time() - began) * 1000)
    return statistics.median(times), found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scans", type=int, default=30)
    parser.add_argument("--processes", type=int, default=2000)
    parser.add_argument("--scanner", choices=("both", *SCANNERS), default="both")
    parser.add_argument("--root", help="one root only (default: / and a fixture root)")
    parser.add_argument("--make-fixture", metavar="DIR", help="write the fixture root into "
                        "the empty or new directory DIR and end (to time each side alone)")
    args = parser.parse_args()
    if args.make_fixture:
        os.makedirs(args.make_fixture, exist_ok=True)
        fixture_root(args.processes, args.make_fixture)
        return 0
    try:
        import psutil
    except ImportError:
        print("needs psutil: pip install psutil", file=sys.stderr)
        return 2
    config = parse_config({"pools": POOLS})
    made = None
    roots = [args.root] if args.root else ["/", made := fixture_root(args.processes)]
    try:
        for root in roots:
            label = "this machine" if root == "/" else root
            if root == made:
                label = f"fixture root, {args.processes} processes"
            names = list(SCANNERS) if args.scanner == "both" else [args.scanner]
            result = {name: timed(SCANNERS[name], root, config, args.scans) for name in names}
            listed = len([p for p in os.listdir(os.path.join(root, "proc")) if p.isdigit()])
            print(f"{label} ({listed} in proc, psutil {psutil.__version__}):")
            for name, (ms, found) in result.items():
                print(f"  {name:<10} {ms:8.2f} ms per scan, {found} pool processes found")
            if len(result) == 2:
                ratio = result["psutil"][0] / max(result["fleetscope"][0], 1e-9)
                print(f"  psutil / fleetscope: {ratio:.2f}x")
    finally:
        if made:
            shutil.rmtree(made, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
