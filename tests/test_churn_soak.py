"""The exporter's memory under process and thread churn (bench/exporter_churn_soak.py, short):
every container the collectors keep, the pid-keyed caches among them, stays flat while pool
processes and threads start and exit all the time, each scrape's clock 15 s after the last."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "exporter_churn_soak.py"

pytestmark = pytest.mark.live


def _bench():
    spec = importlib.util.spec_from_file_location("exporter_churn_soak", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_caches_keyed_by_pid_forget_the_dead_under_churn():
    bench = _bench()
    rows = bench.soak(scrapes=500, every=100, per_second=20.0, seconds=300.0, interval=15.0,
                      report=lambda row: None)
    assert len(rows) == 5, rows  # every scrape ran, inside the bound
    first, last = rows[1], rows[-1]  # after warm-up: the first reads and imports done
    # The caches keyed by pid are among what is measured.
    for cache in ("processes._CGROUPS", "pools._located", "memory._member_cgroups.entries",
                  "pools._voluntary._gone"):
        assert cache in last[2], sorted(last[2])
    # The churn was real: short-lived pool members came and went between reports.
    assert max(row[2]["pools._voluntary._gone"] for row in rows) > 20, rows
    # A container that leaks grows with every scrape, past what it held at every earlier
    # report. One kept for a span of the scrape clock (the `_gone` ones: what left in the last
    # 600 s) holds what left in that span, which follows how fast the scrapes ran: on a busy
    # machine one report may hold a little more than the first without anything leaking.
    earlier = rows[1:-1]
    grown = {name: (first[2].get(name, 0), size) for name, size in last[2].items()
             if size > max(row[2].get(name, 0) for row in earlier) + 16}
    assert not grown, grown
    assert last[1] - first[1] < 8, (first[1], last[1])  # MiB of RSS
