"""The flight recorder (`exporter --state-dir DIR`, fleetscope/bundle/ring.py): a bounded ring of
the node's samples that is a readable bundle at every moment, survives `kill -9` with at most
the sample being written lost, and keeps within its span and byte bound."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from fleetscope.bundle.read import open_bundle
from fleetscope.bundle.ring import RING, FlightRecorder, RingUnavailable
from fleetscope.collectors import COLLECTORS
from fleetscope.collectors.source import recorded_sample
from fleetscope.core.config import ConfigError, parse_config

from .conftest import BUNDLES, ExporterProcess

SOURCE = BUNDLES / "x86-256" / "samples" / "s0000"
MIB = 1024 * 1024


def _config(**raw):
    recorded = json.loads((BUNDLES / "x86-256" / "meta.json").read_text())["config"]
    return parse_config({**recorded, **raw}, tuple(COLLECTORS))


def _recorder(state: Path, **raw) -> FlightRecorder:
    recorder = FlightRecorder(str(state), _config(**raw), recorded_sample(str(SOURCE)))
    recorder.open()
    return recorder


def _on_disk(ring: Path) -> set[str]:
    return {p.name for p in (ring / "samples").iterdir()} if (ring / "samples").exists() \
        else set()


def _named(ring: Path) -> list[dict]:
    return json.loads((ring / "meta.json").read_text())["samples"]


def test_the_ring_is_a_bundle_of_what_the_node_had(tmp_path):
    recorder = _recorder(tmp_path)
    start = time.time()
    try:
        for step in range(3):
            recorder.record_one(now=start + 15 * step)
    finally:
        recorder.close()
    ring = tmp_path / RING
    bundle = open_bundle(str(ring))
    assert [s.time for s in bundle.samples] == [round(start + 15 * k, 3) for k in range(3)]
    for sample in bundle.samples:
        assert (Path(sample.directory) / "proc" / "stat").read_bytes() == \
            (SOURCE / "proc" / "stat").read_bytes()
    assert (ring / "static" / "proc" / "cpuinfo").is_file()  # captured once
    assert all(entry["bytes"] > 0 for entry in _named(ring))


def test_it_keeps_its_span_and_its_bytes_over_a_long_run(tmp_path):
    """75 simulated minutes at 15 s (300 samples), kept 30 min and 4 MiB: after every sample
    the samples on disk are those meta.json names, none older than the span, their bytes
    within the bound."""
    recorder = _recorder(tmp_path, ring_max_bytes=4 * MIB, ring_span_seconds=1800)
    ring = tmp_path / RING
    start = time.time() - 300 * 15
    sizes = []
    try:
        for step in range(300):
            now = start + 15 * step
            entry = recorder.record_one(now=now)
            sizes.append(entry["bytes"])
            named = _named(ring)
            assert {Path(s["dir"]).name for s in named} == _on_disk(ring)
            assert named[0]["time"] >= now - 1800
            assert sum(s["bytes"] for s in named) <= 4 * MIB
            assert named[-1]["time"] == round(now, 3)
    finally:
        recorder.close()
    assert len(named) == min(121, 4 * MIB // max(sizes))  # the tighter bound held
    assert len(named) > 1


def test_a_second_recorder_on_the_same_directory_is_refused(tmp_path):
    first = _recorder(tmp_path)
    try:
        with pytest.raises(RingUnavailable, match="another exporter keeps the ring"):
            _recorder(tmp_path)
    finally:
        first.close()
    _recorder(tmp_path).close()  # free again once the first closed


def test_the_ring_continues_after_a_restart(tmp_path):
    recorder = _recorder(tmp_path)
    start = time.time()
    recorder.record_one(now=start)
    recorder.record_one(now=start + 15)
    recorder.close()
    again = _recorder(tmp_path)
    try:
        entry = again.record_one(now=start + 30)
    finally:
        again.close()
    assert entry["dir"] == "samples/s0002"
    assert [s["dir"] for s in _named(tmp_path / RING)] == \
        ["samples/s0000", "samples/s0001", "samples/s0002"]


def test_a_span_longer_than_a_bundle_holds_is_refused():
    with pytest.raises(ConfigError, match="over the 10000 a bundle holds"):
        parse_config({"ring_interval_seconds": 1, "ring_span_seconds": 86400},
                     tuple(COLLECTORS))


def test_kill_9_mid_write_loses_at_most_the_sample_being_written(tmp_path):
    """The real exporter, recording every second, killed with SIGKILL at random moments five
    times: each time the ring opens as a bundle, every sample it names is whole, nothing it
    does not name is left, and the next exporter continues after the last named sample."""
    state = tmp_path / "state"
    config = {**json.loads((BUNDLES / "x86-256" / "meta.json").read_text())["config"],
              "ring_interval_seconds": 1}
    rng = random.Random(7)
    seen = 0
    for _ in range(5):
        exporter = ExporterProcess(SOURCE, config, tmp_path, ("--state-dir", str(state)))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_named_or_none(state / RING)) <= seen:
            time.sleep(0.1)
        time.sleep(rng.uniform(0.0, 1.0))  # anywhere in the next sample's write
        exporter.proc.send_signal(signal.SIGKILL)
        exporter.proc.wait(timeout=10)
        exporter.stop()
        named = _named_or_none(state / RING)
        assert len(named) > seen, exporter.stderr()
        seen = len(named)
        bundle = open_bundle(str(state / RING))
        assert len(bundle.samples) == seen
        for sample in bundle.samples:
            assert (Path(sample.directory) / "proc" / "stat").read_bytes() == \
                (SOURCE / "proc" / "stat").read_bytes()
        numbers = [int(Path(s["dir"]).name[1:]) for s in named]
        assert numbers == list(range(numbers[0], numbers[0] + seen))  # none lost between
    # the next one removes what the last kill left unnamed
    recorder = FlightRecorder(str(state), _config(), recorded_sample(str(SOURCE)))
    recorder.open()
    recorder.close()
    assert _on_disk(state / RING) == {Path(s["dir"]).name for s in _named(state / RING)}


def _named_or_none(ring: Path) -> list[dict]:
    try:
        return _named(ring)
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def test_a_directory_that_cannot_hold_the_ring_is_one_warning(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    exporter = ExporterProcess(SOURCE, None, tmp_path, ("--state-dir", str(blocked / "state")))
    try:
        assert "fleetscope_scrape_collector_success" in exporter.text()
        warnings = [line for line in exporter.stderr().splitlines()
                    if "fleetscope.ring" in line]
        assert len(warnings) == 1 and "cannot keep the flight recorder's ring" in warnings[0]
    finally:
        exporter.stop()
    assert not os.path.exists(blocked / "state")


def _diagnose(capsys, *argv: str) -> tuple[int, str, str]:
    from fleetscope import cli

    code = cli.main(["diagnose", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_diagnose_reads_the_ring_of_a_state_directory_since_when_asked(tmp_path, capsys):
    recorder = _recorder(tmp_path)
    now = time.time()
    times = [now - 60 * k for k in (5, 4, 3, 2, 1, 0)]
    try:
        for at in times:
            recorder.record_one(now=at)
    finally:
        recorder.close()
    code, out, err = _diagnose(capsys, "--state-dir", str(tmp_path), "--since", "150s",
                               "--json")
    document = json.loads(out)
    assert code in (0, 1, 2), err
    assert document["source"] == "bundle"  # the contract's kind: the ring is a bundle
    assert document["flight_recorder"] == {"state_dir": str(tmp_path), "since_seconds": 150}
    kept = [round(at, 3) for at in times if at >= now - 150]
    assert len(kept) == 3
    assert (document["window"]["start"], document["window"]["end"]) == (kept[0], kept[-1])
    code, out, _ = _diagnose(capsys, "--state-dir", str(tmp_path), "--json")
    assert json.loads(out)["window"]["start"] == round(times[0], 3)  # all it keeps
    code, out, err = _diagnose(capsys, "--state-dir", str(tmp_path), "--since", "150s")
    assert f"(flight recorder in {tmp_path}," in " ".join(out.split())  # the first line


def test_diagnose_says_what_the_state_directory_lacks(tmp_path, capsys):
    code, out, err = _diagnose(capsys, "--state-dir", str(tmp_path), "--since", "5m")
    assert code == 3 and out == ""
    assert err.count("\n") == 1 and "holds no flight recorder ring" in err
    recorder = _recorder(tmp_path)
    try:
        recorder.record_one(now=time.time() - 600)
        recorder.record_one(now=time.time())
    finally:
        recorder.close()
    code, out, err = _diagnose(capsys, "--state-dir", str(tmp_path), "--since", "5m")
    assert code == 3 and "holds 1 sample(s) of the last 300 s" in err and err.count("\n") == 1
    code, _, err = _diagnose(capsys, "--bundle", str(tmp_path / RING), "--since", "5m")
    assert code == 2 and "--since goes with --state-dir" in err
    code, _, err = _diagnose(capsys, "--state-dir", str(tmp_path), "--since", "soon")
    assert code == 2 and "--since: a duration" in err
