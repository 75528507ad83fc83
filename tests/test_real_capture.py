"""The one real `fleetscope bundle record` capture committed (tests/fixtures/capture, how it was
made in its README.md): it diagnoses through the CLI and replays through the exporter."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import jsonschema

from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import FIXTURES, samples

CAPTURE = FIXTURES / "capture" / "record-2cpu-vm.tar.gz"
SCHEMA = json.loads((Path(__file__).parent / "schemas" / "diagnosis.schema.json").read_text())


def _meta() -> dict:
    with tarfile.open(CAPTURE) as tar:
        member = next(m for m in tar.getmembers() if Path(m.name).name == "meta.json")
        return json.load(tar.extractfile(member))


def test_capture_is_a_recorded_bundle_of_a_few_samples():
    meta = _meta()
    assert meta["format"] == "fleetscope-bundle/1"
    assert 2 <= len(meta["samples"]) <= 5
    times = [s["time"] for s in meta["samples"]]
    assert times == sorted(times)
    assert "redacted" in meta  # written by bundle record's redaction
    assert CAPTURE.stat().st_size < 512 * 1024


def test_capture_diagnoses():
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                             str(CAPTURE), "--json"], capture_output=True, text=True, timeout=300)
    document = json.loads(result.stdout)
    jsonschema.validate(document, SCHEMA)
    assert document["source"] == "bundle"
    assert document["nodes"] == [_meta()["hostname"]]
    expected = {"ok": 0, "warning": 1, "critical": 2, "unknown": 3}[document["status"]]
    assert result.returncode == expected, result.stderr
    assert "Traceback" not in result.stderr


def test_capture_replays_through_the_exporter(tmp_path):
    with tarfile.open(CAPTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    meta_path = next(tmp_path.rglob("meta.json"))
    meta = json.loads(meta_path.read_text())
    last = meta["samples"][-1]
    # a sample directory is a --root (its static/ files are found beside it), as for the exporter
    exporter = Exporter(str(meta_path.parent / last["dir"]), parse_config({}))
    parsed = samples(render(exporter.collect(now=last["time"])))
    for collector in ("cpu", "pressure"):
        assert parsed[f'fleetscope_scrape_collector_success{{collector="{collector}"}}'] == 1
    assert any(key.startswith("fleetscope_cpu") for key in parsed), sorted(parsed)[:20]
