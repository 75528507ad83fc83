"""The exporter on this machine's real /proc: a CPU hog pinned to one core must show."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import samples

MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# A busy loop pinned to one CPU; it stops by itself after 30 s whatever happens to the test.
HOG = "import os,sys,time\nos.sched_setaffinity(0,{int(sys.argv[1])})\nend=time.time()+30\n" \
      "while time.time()<end: pass\n"


@pytest.fixture
def pinned_hog():
    cpu = max(os.sched_getaffinity(0))
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(cpu)])
    time.sleep(0.5)  # let it reach its core
    yield cpu
    hog.kill()
    hog.wait()


def _busy_fraction(before: dict, after: dict, cpu: int) -> float:
    def ticks(s, mode):
        return s[f'fleetscope_cpu_seconds_total{{cpu="{cpu}",mode="{mode}"}}']
    delta = {m: ticks(after, m) - ticks(before, m) for m in MODES}
    total = sum(delta.values())
    return (total - delta["idle"] - delta["iowait"]) / total


@pytest.mark.live
def test_pinned_hog_shows_as_its_core_and_in_the_summary(exporter_factory, pinned_hog):
    exporter = exporter_factory("/", {"per_core": "full", "busy_interval_min_seconds": 1})
    first = samples(exporter.text())
    time.sleep(2.5)
    second = samples(exporter.text())

    assert _busy_fraction(first, second, pinned_hog) > 0.9
    assert second['fleetscope_cpu_core_busy_ratio{stat="max"}'] > 0.9
    assert second['fleetscope_cpu_core_busy_ratio{stat="p90"}'] > 0.9
    assert second["fleetscope_cpu_saturated_cores"] >= 1
    if len(os.sched_getaffinity(0)) > 1:
        # Another core may be busy too; the hog's core must be among the saturated ones.
        others = [c for c in os.sched_getaffinity(0) if c != pinned_hog]
        if all(_busy_fraction(first, second, c) < 0.9 for c in others):
            assert second["fleetscope_cpu_busiest_core"] == pinned_hog


@pytest.mark.live
def test_summary_mode_has_no_per_core_series(exporter_factory):
    full = samples(exporter_factory("/", {"per_core": "full"}).text())
    summary = samples(exporter_factory("/", None).text())  # summary is the default
    online = os.cpu_count()
    per_core_full = [k for k in full if k.startswith("fleetscope_cpu_seconds_total{")]
    assert len(per_core_full) == 8 * online
    assert not [k for k in summary if 'cpu="' in k]
    node_cpus = sum(v for k, v in summary.items() if k.startswith("fleetscope_cpu_numa_node_cpus"))
    assert node_cpus == online
