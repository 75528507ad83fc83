"""The evidence source: a live host or a recorded sample, decided once by the caller.

The container layout (a root whose proc/, sys/ and dev/ are the host's, here as links) is a
live host: the exporter runs perf and ethtool and asks the agent endpoint. The same directory
read as a recorded sample runs nothing and contacts nothing. Fake `perf` and `ethtool`
scripts record every call, so "never ran" is observed, not inferred from missing metrics.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fleetscope.collectors import NotAvailable, Scrape
from fleetscope.collectors.nic import NicCollector
from fleetscope.collectors.perf import PerfCollector
from fleetscope.collectors.source import (
    LiveHost,
    RecordedSample,
    evidence_source,
    holds_recorded_evidence,
)
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import FIXTURES, require_tool, samples, scrape_until_perf_ran
from tests.test_perf import _bundle as perf_bundle

PERF_LIVE = 'fleetscope_scrape_source_available{collector="perf",source="perf stat"}'
PERF_RECORDED = 'fleetscope_scrape_source_available{collector="perf",source="cmd/perf-stat.csv"}'


def _linked_root(tmp_path: Path) -> Path:
    """The container layout without a container: proc, sys and dev link to the host's."""
    root = tmp_path / "host"
    root.mkdir()
    for name in ("proc", "sys", "dev"):
        (root / name).symlink_to(f"/{name}")
    return root


def _interfaces() -> list[str]:
    return sorted(n for n in os.listdir("/sys/class/net") if n != "lo")


def _recording_tool(bindir: Path, name: str, calls: Path, output: str) -> Path:
    """A fake tool that appends its argv to `calls` and prints `output`."""
    bindir.mkdir(exist_ok=True)
    script = bindir / name
    script.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\nprintf "{output}"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


class _Endpoint:
    """An agent metrics endpoint on 127.0.0.1 that counts its requests."""

    def __init__(self):
        endpoint = self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                endpoint.requests += 1
                body = b'# TYPE agent_queue_depth gauge\nagent_queue_depth{pool="p",queue="q"} 3\n'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    server = _Endpoint()
    yield server
    server.close()


def _bundle_sample(tmp_path: Path, interval: float = 7.0) -> Path:
    return perf_bundle(tmp_path, "", interval)


# -- which source a root is ------------------------------------------------------------------

def test_auto_takes_host_layouts_as_live_and_recordings_as_recorded(tmp_path):
    assert isinstance(evidence_source("/"), LiveHost)
    linked = _linked_root(tmp_path)
    assert isinstance(evidence_source(str(linked)), LiveHost)
    assert not holds_recorded_evidence(str(linked))

    sample = _bundle_sample(tmp_path)
    recorded = evidence_source(str(sample))
    assert isinstance(recorded, RecordedSample) and not recorded.live
    assert recorded.roots == (str(sample), str(sample.parent.parent / "static"))
    assert recorded.interval_s == 7.0
    # A fixture tree with recorded command outputs, and a tree of plain files (no procfs).
    assert isinstance(evidence_source(str(FIXTURES / "perf" / "intel-2s")), RecordedSample)
    plain = tmp_path / "plain"
    (plain / "proc").mkdir(parents=True)
    (plain / "proc" / "stat").write_text("cpu  1 2 3 4 5 6 7 0 0 0\n")
    assert isinstance(evidence_source(str(plain)), RecordedSample)
    # A tree of links with a recorded command output is a recording (fixtures win).
    (linked / "cmd").mkdir()
    assert isinstance(evidence_source(str(linked)), RecordedSample)


def test_the_caller_can_say_which_and_nothing_else_is_accepted(tmp_path):
    linked = _linked_root(tmp_path)
    assert isinstance(evidence_source(str(linked), "recorded"), RecordedSample)
    assert isinstance(evidence_source(str(_bundle_sample(tmp_path)), "live"), LiveHost)
    with pytest.raises(ValueError, match="auto, live, recorded"):
        evidence_source("/", "maybe")
    result = subprocess.run([sys.executable, "-m", "fleetscope", "exporter", "--evidence",
                             "maybe"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--evidence" in result.stderr


def test_a_recorded_sample_cannot_run_a_command(tmp_path):
    sample = RecordedSample(str(tmp_path))
    with pytest.raises(NotAvailable, match="runs no commands"):
        sample.spawn(["true"])
    results = sample.run_commands({"x": ("true", ["true"])}, 1.0)
    assert isinstance(results["x"], NotAvailable)
    live = LiveHost().run_commands({"ok": ("echo hi", ["echo", "hi"]),
                                    "bad": ("false", ["false"])}, 10.0)
    assert live["ok"] == b"hi\n" and "false exited 1" in str(live["bad"])


def test_bundle_replay_takes_the_perf_window_from_the_source_not_meta_json(tmp_path):
    """The sample's interval comes with its source: the collector reads no meta.json."""
    csv = (FIXTURES / "perf" / "amd-2s" / "cmd" / "perf-stat.csv").read_text()
    sample = tmp_path / "sample"
    (sample / "cmd").mkdir(parents=True)
    (sample / "cmd" / "perf-stat.csv").write_text(csv)
    config = parse_config({"collectors": ["perf"]}, ("perf",))
    exporter = Exporter(RecordedSample(str(sample), interval_s=10.0), config)
    assert samples(render(exporter.collect()))["fleetscope_perf_window_seconds"] == 10
    without = samples(render(Exporter(RecordedSample(str(sample)), config).collect()))
    assert without[PERF_RECORDED] == 0  # no window length: says so, never guesses one


# -- the same directory, live and recorded ---------------------------------------------------

def test_the_linked_root_read_as_recorded_runs_no_command(tmp_path, monkeypatch):
    linked = _linked_root(tmp_path)
    calls = tmp_path / "calls"
    bindir = tmp_path / "bin"
    perf = _recording_tool(bindir, "perf", calls, "")
    _recording_tool(bindir, "ethtool", calls, "NIC statistics:\\n     rx_prio3_pause: 7\\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FLEETSCOPE_PERF", str(perf))
    config = parse_config({"ethtool_interfaces": ["*"], "perf_window_seconds": 0.1})
    source = evidence_source(str(linked), "recorded")
    perf_collector, nic = PerfCollector(config), NicCollector(config)
    for _ in range(2):
        scrape = Scrape(source)
        got = samples(render([*perf_collector.collect(scrape), *nic.collect(scrape)]))
        time.sleep(0.3)  # a sampler, had one started, would have run perf by now
    assert not calls.exists(), calls.read_text()
    assert scrape.sources[("perf", "cmd/perf-stat.csv")][0] is False
    assert ("perf", "perf stat") not in scrape.sources
    assert not any(k.startswith("fleetscope_perf_runs_total") for k in got)
    assert scrape.sources[("nic", "ethtool")][0] is False
    assert perf_collector._live is None


@pytest.mark.live
def test_exporter_on_a_root_linked_to_the_host_runs_perf_and_ethtool_live(
        exporter_factory, tmp_path, monkeypatch, endpoint):
    require_tool("perf")
    interfaces = _interfaces()
    if not interfaces:
        pytest.skip("no network interface besides lo")
    linked = _linked_root(tmp_path)
    calls = tmp_path / "ethtool-calls"
    bindir = tmp_path / "bin"
    _recording_tool(bindir, "ethtool", calls, "NIC statistics:\\n     rx_prio3_pause: 7\\n")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("FLEETSCOPE_PERF", raising=False)
    config = {"ethtool_interfaces": [interfaces[0]], "perf_window_seconds": 0.2,
              "agent_metrics_url": endpoint.url,
              "collectors": ["cpu", "perf", "nic", "agent"]}
    exporter = exporter_factory(linked, config)  # --evidence auto: the layout says live
    got, runs = scrape_until_perf_ran(exporter)
    # perf: the background sampler ran the real perf here (whatever this machine's PMU
    # answers: a VM's `<not supported>` hardware events are a completed run too).
    assert runs >= 1, "perf stat never completed a run under the linked root"
    assert got[PERF_LIVE] == 1 and PERF_RECORDED not in got
    assert got['fleetscope_scrape_collector_success{collector="perf"}'] == 1
    assert 'fleetscope_perf_available{event_group="instructions"}' in got
    # ethtool: run live on the host's interface (the fake on PATH logged the call).
    iface = interfaces[0]
    assert f"-S {iface}" in calls.read_text().splitlines()
    assert got[f'fleetscope_scrape_source_available{{collector="nic",'
               f'source="ethtool -S {iface}"}}'] == 1
    assert got[f'fleetscope_nic_pfc_pause_frames_total{{direction="rx",interface="{iface}",'
               'priority="3"}'] == 7
    # the agent endpoint was asked, and the files read through the links
    assert endpoint.requests >= 1
    assert got['agent_queue_depth{pool="p",queue="q"}'] == 3
    assert got['fleetscope_scrape_collector_success{collector="cpu"}'] == 1

    # The same directory told to be a recording: nothing runs, nothing is asked.
    calls.unlink()
    asked = endpoint.requests
    recorded = exporter_factory(linked, config, ["--evidence", "recorded"])
    time.sleep(0.5)
    got = samples(recorded.text())
    assert not calls.exists()
    assert endpoint.requests == asked
    assert got[PERF_RECORDED] == 0 and PERF_LIVE not in got
    assert not any(k.startswith("fleetscope_perf_runs_total") for k in got)
    assert got['fleetscope_scrape_source_available{collector="nic",source="ethtool"}'] == 0
