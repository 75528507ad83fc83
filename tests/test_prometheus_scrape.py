"""A real Prometheus (Debian's) scrapes the exporter and stores what it serves."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from tests.conftest import BUNDLES, require_tool


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prometheus(tmp_path):
    """Start Prometheus on 127.0.0.1 scraping the targets given; stopped after the test."""
    binary = require_tool("prometheus")
    started = []

    def start(target: str) -> str:
        port = _free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: fleetscope\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        started.append(process)
        return f"http://127.0.0.1:{port}"

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=20)


def _query(base: str, promql: str) -> list:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]["result"]


def _wait_for(base: str, promql: str, seconds: float = 60) -> list:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            result = _query(base, promql)
            if result:
                return result
        except OSError:
            pass  # Prometheus still starting
        time.sleep(0.5)
    raise AssertionError(f"Prometheus never returned {promql}")


def test_prometheus_scrapes_and_stores_the_exporter(exporter_factory, prometheus):
    exporter = exporter_factory(BUNDLES / "kunpeng-128" / "samples" / "s0001",
                                {"per_core": "full"})
    target = exporter.url.removeprefix("http://").removesuffix("/metrics")
    base = prometheus(target)

    up = _wait_for(base, 'up{job="fleetscope"} == 1')
    assert up[0]["value"][1] == "1"
    nodes = _wait_for(base, "fleetscope_cpu_numa_node_cpus")
    assert sorted(r["metric"]["numa_node"] for r in nodes) == ["0", "1", "2", "3"]
    per_core = _wait_for(base, 'count(fleetscope_cpu_seconds_total{mode="user"})')
    assert per_core[0]["value"][1] == "128"
    # Prometheus dropped nothing it scraped: every sample we serve was accepted.
    scraped = _wait_for(base, 'scrape_samples_scraped{job="fleetscope"}')
    stored = _wait_for(base, 'scrape_samples_post_metric_relabeling{job="fleetscope"}')
    assert scraped[0]["value"][1] == stored[0]["value"][1]
    assert int(scraped[0]["value"][1]) > 1000


def test_diagnose_from_prometheus(exporter_factory, prometheus, tmp_path):
    """`fleetscope diagnose --prometheus URL --node NAME` reads the same rules' inputs back
    from a real Prometheus that scraped a sick node's exporter."""
    import subprocess
    import sys

    bundle = BUNDLES / "kunpeng-128"
    recorded = json.loads((bundle / "meta.json").read_text())["config"]
    exporter = exporter_factory(bundle / "samples" / "s0001",
                                {**recorded, "numa_maps_min_interval_seconds": 0})
    target = exporter.url.removeprefix("http://").removesuffix("/metrics")
    base = prometheus(target)
    _wait_for(base, "count_over_time(fleetscope_pool_fd_usage_ratio[1m]) >= 3")

    def diagnose(*scope):
        result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--prometheus",
                                 base, *scope, "--seconds", "60", "--json"],
                                capture_output=True, text=True, timeout=120)
        return result.returncode, json.loads(result.stdout)

    code, document = diagnose("--node", target)
    assert document["source"] == "prometheus" and document["nodes"] == [target]
    fd = [f for f in document["findings"] if f["rule"] == "fd-exhaustion"]
    assert fd and fd[0]["node"] == target
    assert code == 2
    # Across the fleet the same node shows up by its instance label.
    code, fleet = diagnose("--fleet")
    assert target in fleet["nodes"]
    assert {f["rule"] for f in fleet["findings"]} >= {"fd-exhaustion", "numa-remote-access"}
    # A node Prometheus has never seen (a host name, where --node takes the instance
    # label): one line naming the instances that exist, in either evaluation.
    for evaluate in ("engine", "local"):
        result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--prometheus",
                                 base, "--node", "nowhere", "--evaluate", evaluate,
                                 "--seconds", "60"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 3 and result.stdout == ""
        line, = result.stderr.strip().splitlines()
        assert line.startswith("fleetscope diagnose: error: ") and "nowhere" in line
        assert f"the exporters there nearest to it are: {target}" in line


def test_diagnose_from_prometheus_says_a_configured_endpoint_did_not_answer(
        exporter_factory, prometheus, tmp_path):
    """The live exporter with agent_metrics_url and an exporter url where nothing listens:
    a diagnosis from Prometheus, by the engine or here, says they were configured but not
    read, not "set agent_metrics_url" (tests/test_unread_source_reason.py: live, bundle)."""
    import subprocess
    import sys

    import yaml

    from tests.test_unread_source_reason import assert_said_unread, dead_sources_config

    config = yaml.safe_load(open(dead_sources_config(tmp_path)))
    exporter = exporter_factory("/", config)
    target = exporter.url.removeprefix("http://").removesuffix("/metrics")
    base = prometheus(target)
    _wait_for(base, 'count_over_time(fleetscope_scrape_source_available'
                    '{source="agent_metrics_url"}[1m]) >= 3')
    for evaluate in ("engine", "local"):
        result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--prometheus",
                                 base, "--node", target, "--evaluate", evaluate, "--seconds",
                                 "60", "--json"], capture_output=True, text=True, timeout=120)
        assert result.returncode in (0, 1, 2), result.stderr
        document = json.loads(result.stdout)
        assert_said_unread({item["rule"]: item["reason"]
                            for item in document["not_evaluated"]})
