"""End to end: the exporter process on the fixture bundles, scraped over HTTP.

The golden files in tests/fixtures/e2e/ are the reviewed output (as node_exporter's
collector/fixtures/e2e-output.txt) and double as the metric reference. After a deliberate
change, rewrite them with FLEETSCOPE_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import difflib
import gzip
import json
import os
import re
import shutil
import subprocess
import threading

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om

from tests.conftest import BUNDLES, FIXTURES, require_tool, samples

GOLDEN = FIXTURES / "e2e"
# Lines that depend on the machine running the test, not on the fixture.
NONDETERMINISTIC = re.compile(
    r"^(# (HELP|TYPE) )?(process_|fleetscope_scrape_collector_duration_seconds|"
    r"fleetscope_cpu_core_interval_seconds)"
)


def replay(exporter_factory, tmp_path, bundle, config):
    """Start the exporter on sample s0000 of a bundle copy, then move the root to s0001, the
    way a live /proc moves on: the next scrape covers the interval between the samples."""
    copy = tmp_path / bundle
    shutil.copytree(BUNDLES / bundle, copy)
    live = copy / "samples" / "live"
    live.symlink_to("s0000")
    exporter = exporter_factory(live, config)
    live.unlink()
    live.symlink_to("s0001")
    return exporter


@pytest.mark.parametrize("bundle", ["x86-256", "kunpeng-128"])
@pytest.mark.parametrize("per_core", ["full", "summary"])
def test_golden_output(exporter_factory, tmp_path, bundle, per_core):
    recorded = json.loads((BUNDLES / bundle / "meta.json").read_text())["config"]
    exporter = replay(exporter_factory, tmp_path, bundle,
                      {**recorded, "per_core": per_core, "busy_interval_min_seconds": 0,
                       "numa_maps_min_interval_seconds": 0})
    text = exporter.text()
    got = "".join(line + "\n" for line in text.splitlines() if not NONDETERMINISTIC.match(line))
    golden = GOLDEN / f"{bundle}-{per_core}.txt"
    if os.environ.get("FLEETSCOPE_UPDATE_GOLDEN"):
        golden.write_text(got)
    expected = golden.read_text()
    if got != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), got.splitlines(True),
                                            str(golden), "scraped", n=1))
        pytest.fail(f"output differs from {golden.name}:\n{diff[:6000]}")

    # The reference is also valid by Prometheus's own linter.
    promtool = require_tool("promtool")
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_summary_mode_has_at_most_a_quarter_of_full_mode_series(exporter_factory, tmp_path):
    full = samples(replay(exporter_factory, tmp_path / "a", "x86-256",
                          {"per_core": "full", "busy_interval_min_seconds": 0}).text())
    summary = samples(replay(exporter_factory, tmp_path / "b", "x86-256",
                             {"busy_interval_min_seconds": 0}).text())
    assert len([k for k in full if k.startswith("fleetscope_cpu_seconds_total")]) == 256 * 8
    assert len(summary) * 4 <= len(full)
    # What summary keeps: the hog cores of the fixture (7 and 200, 100 % user) are visible.
    assert summary['fleetscope_cpu_core_busy_ratio{stat="max"}'] == 1.0
    assert summary["fleetscope_cpu_busiest_core"] == 7
    assert summary["fleetscope_cpu_saturated_cores"] >= 2
    # ... and the per-NUMA counters are exactly the per-core counters summed.
    for node, cpus in (("0", [*range(0, 64), *range(128, 192)]),
                       ("1", [*range(64, 128), *range(192, 256)])):
        for mode in ("user", "idle", "steal", "iowait"):
            per_core = sum(full[f'fleetscope_cpu_seconds_total{{cpu="{c}",mode="{mode}"}}']
                           for c in cpus)
            per_node = summary[f'fleetscope_cpu_numa_node_seconds_total{{mode="{mode}",'
                               f'numa_node="{node}"}}']
            assert per_node == pytest.approx(per_core)


def test_openmetrics_and_gzip_when_asked(exporter_factory):
    exporter = exporter_factory(BUNDLES / "kunpeng-128" / "samples" / "s0000")
    status, headers, body = exporter.scrape({
        "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        "Accept-Encoding": "gzip",
    })
    assert status == 200
    assert headers["Content-Encoding"] == "gzip"
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    text = gzip.decompress(body).decode()
    assert text.endswith("# EOF\n")
    names = {family.name for family in parse_om(text)}  # strict parser: valid OpenMetrics
    assert {"fleetscope_cpu_numa_node_seconds", "fleetscope_pressure_stall_seconds",
            "process_cpu_seconds"} <= names


def test_fifty_concurrent_scrapes_all_succeed(exporter_factory):
    exporter = exporter_factory(BUNDLES / "x86-256" / "samples" / "s0001",
                                {"per_core": "full"})
    results: list[object] = [None] * 50
    barrier = threading.Barrier(50)

    def scrape(i):
        barrier.wait(timeout=30)
        try:
            status, _, body = exporter.scrape()
            results[i] = (status, body.decode())
        except Exception as err:  # recorded and asserted below
            results[i] = err

    threads = [threading.Thread(target=scrape, args=(i,)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    failures = [r for r in results if not (isinstance(r, tuple) and r[0] == 200)]
    assert not failures, failures[:3]
    for _, body in results:
        parsed = samples(body)
        assert parsed['fleetscope_scrape_collector_success{collector="cpu"}'] == 1
        assert len([k for k in parsed if k.startswith("fleetscope_cpu_seconds_total")]) == 2048


def test_kunpeng_kernel_specifics(exporter_factory):
    # openEuler 22.03 (5.10): cpu PSI has no `full` line, there is no irq PSI file.
    exporter = exporter_factory(BUNDLES / "kunpeng-128" / "samples" / "s0001")
    parsed = samples(exporter.text())
    assert 'fleetscope_pressure_stall_seconds_total{resource="cpu",stall="some"}' in parsed
    assert not [k for k in parsed if 'resource="cpu",stall="full"' in k]
    assert parsed['fleetscope_scrape_source_available{collector="pressure",'
                  'source="proc/pressure/irq"}'] == 0
    assert parsed['fleetscope_scrape_collector_success{collector="pressure"}'] == 1
    nodes = {k for k in parsed if k.startswith("fleetscope_cpu_numa_node_cpus")}
    assert len(nodes) == 4
    assert all(parsed[k] == 32 for k in nodes)
    assert "irq not available" in exporter.stderr() or "pressure/irq" in exporter.stderr()


def test_corrupt_source_over_http_still_answers_200(exporter_factory, tmp_path):
    # A flat root with /proc/stat cut mid-line and PSI garbage: cpu fails, the rest serves.
    root = tmp_path / "root"
    shutil.copytree(BUNDLES / "kunpeng-128" / "static", root)
    shutil.copytree(BUNDLES / "kunpeng-128" / "samples" / "s0000", root, dirs_exist_ok=True)
    stat = (root / "proc" / "stat").read_text()
    (root / "proc" / "stat").write_text(stat[: len(stat) // 2].rsplit(" ", 1)[0])
    (root / "proc" / "pressure" / "io").write_bytes(b"\x00\xffsome avg10=nan\n")
    exporter = exporter_factory(root)
    for _ in range(2):  # and again: a failing collector does not wedge the exporter
        status, _, body = exporter.scrape()
        assert status == 200
        parsed = samples(body.decode())
        assert parsed['fleetscope_scrape_collector_success{collector="cpu"}'] == 0
        assert parsed['fleetscope_scrape_collector_success{collector="numa"}'] == 1
        assert parsed['fleetscope_scrape_source_available{collector="pressure",'
                      'source="proc/pressure/io"}'] == 0
        assert 'fleetscope_pressure_stall_seconds_total{resource="cpu",stall="some"}' in parsed
        assert "fleetscope_load1" in parsed
    assert "Traceback" not in exporter.stderr()
