"""bench/process_scan_psutil.py compares like with like: on the same root, the pools' scan
and psutil's find the same pool processes (else its ratio would time different work)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from fleetscope.core.config import parse_config

BENCH = Path(__file__).resolve().parent.parent / "bench" / "process_scan_psutil.py"


def _bench():
    spec = importlib.util.spec_from_file_location("process_scan_psutil", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_scanners_find_the_same_pool_processes():
    bench = _bench()
    config = parse_config({"pools": bench.POOLS})
    root = bench.fixture_root(300)
    try:
        processes = [p for p in (Path(root) / "proc").iterdir() if p.name.isdigit()]
        assert len(processes) == 300
        found = bench.scan_fleetscope(root, config)
        assert found == bench.scan_psutil(root, config)
        # this test's own process is among the copies: python matches the agents pool
        assert found > 0
    finally:
        shutil.rmtree(root, ignore_errors=True)
