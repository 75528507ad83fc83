"""The `accelerator` collector on the vendors' real outputs (tests/fixtures/inference/):
a fake dcgm-exporter / npu-exporter on 127.0.0.1 serving the published scrapes, fake
`nvidia-smi` / `npu-smi` executables printing the published reports, a hanging tool and one
printing garbage; `bundle record` against them and the replay of what it wrote.

Expected values are read off the fixture files with regular expressions here, never through
the parsers the collector uses.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from fleetscope.collectors import COLLECTORS
from fleetscope.collectors.accelerator import AcceleratorCollector
from fleetscope.collectors.base import Scrape
from fleetscope.collectors.source import LiveHost, recorded_sample
from fleetscope.core.config import ConfigError, parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter

from .conftest import samples

FIXTURES = Path(__file__).parent / "fixtures" / "inference"
DCGM = FIXTURES / "dcgm-exporter" / "a800-sxm4-80gb-8gpu-mig.metrics"
NPU_EXPORTER = FIXTURES / "npu-exporter" / "prometheus_metrics"
NVIDIA_XML = FIXTURES / "nvidia-smi" / "a100-sxm4-80gb-v12.xml"
NPU_SMI = FIXTURES / "npu-smi" / "910-8npu-info.txt"
EXAMPLE_MATRIX = Path(__file__).parent.parent / "examples" / "accelerator-matrix.yaml"
MIB = 1 << 20
SPEC_PREFIX = "fleetscope_accelerator_"


# -- fixtures: a fake vendor endpoint, fake tools ------------------------------------------

class _Vendor(http.server.BaseHTTPRequestHandler):
    routes = {"/dcgm/metrics": DCGM, "/npu/metrics": NPU_EXPORTER}
    release = threading.Event()

    def do_GET(self):  # noqa: N802
        if self.path == "/slow/metrics":
            self.release.wait(20)  # held until the test ends (bounded)
        path = self.routes.get(self.path)
        if path is None:
            self.send_error(404)
            return
        body = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def vendor_endpoint():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Vendor)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Vendor.release.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Vendor.release.set()
    server.shutdown()
    server.server_close()
    thread.join(10)


def _tool(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def tool_path(tmp_path, monkeypatch):
    """A directory put first on PATH; tests add fake vendor tools to it."""
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', '')}")
    return directory


def _config(**raw):
    return parse_config(raw, tuple(COLLECTORS))


def _collect(collector, evidence) -> tuple[dict[str, float], Scrape]:
    scrape = Scrape(evidence)
    text = render(list(collector.collect(scrape)))
    return samples(text), scrape


def _accelerator_series(parsed: dict[str, float]) -> dict[str, float]:
    return {key: value for key, value in parsed.items()
            if key.startswith(SPEC_PREFIX) and "sample_age" not in key}


def _key(name: str, **label_pairs) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(label_pairs.items())) + "}"


# -- values read off the fixtures, independently of the parsers ----------------------------

def _dcgm_whole_gpus() -> dict[str, dict[str, float]]:
    """gpu -> {DCGM field: value} of the series without a MIG instance."""
    values: dict[str, dict[str, float]] = {}
    for line in DCGM.read_text().splitlines():
        match = re.match(r'(DCGM_FI_DEV_\w+)\{gpu="(\d+)",(.*)\} (\S+)$', line)
        if match and "GPU_I_ID" not in match.group(3):
            values.setdefault(match.group(2), {})[match.group(1)] = float(match.group(4))
    return values


def _npu_smi_rows() -> dict[str, dict[str, float]]:
    """NPU id -> power, temperature, AI core %, HBM used/total (MB) of the 910 table."""
    rows, current = {}, None
    for line in NPU_SMI.read_text().splitlines():
        first = re.match(r"\|\s*(\d+)\s+\S+\s*\|\s*OK\s*\|\s*([\d.]+)\s+(\d+)\s", line)
        if first:
            current = first.group(1)
            rows[current] = {"power": float(first.group(2)), "temp": float(first.group(3))}
            continue
        second = re.match(r"\|\s*(\d+)\s*\|\s*[0-9A-F:.]+\s*\|\s*(\d+)\s+\d+\s*/\s*\d+\s+"
                          r"(\d+)\s*/\s*(\d+)", line)
        if second and current is not None:
            rows[current].update(aicore=float(second.group(2)), hbm_used=float(second.group(3)),
                                 hbm_total=float(second.group(4)))
    return rows


# -- the exporter endpoints --------------------------------------------------------------------

def test_exporter_endpoints_through_the_exporter_process(vendor_endpoint, exporter_factory):
    """`fleetscope exporter` with the node's dcgm-exporter and npu-exporter on 127.0.0.1:
    its /metrics carries each GPU's values as the published scrape has them."""
    exporter = exporter_factory("/", {
        "accelerator_exporter_urls": [f"{vendor_endpoint}/dcgm/metrics",
                                      f"{vendor_endpoint}/npu/metrics"],
        "collectors": ["accelerator"]})
    parsed = samples(exporter.text())
    gpus = _dcgm_whole_gpus()
    assert len(gpus) == 7  # GPU 0 is in MIG mode: its series carry GPU_I_ID
    for gpu, fields in gpus.items():
        where = {"vendor": "nvidia", "device": gpu}
        assert parsed[_key(SPEC_PREFIX + "temperature_celsius", **where)] == \
            fields["DCGM_FI_DEV_GPU_TEMP"]
        assert parsed[_key(SPEC_PREFIX + "power_watts", **where)] == \
            pytest.approx(fields["DCGM_FI_DEV_POWER_USAGE"])
        assert parsed[_key(SPEC_PREFIX + "utilization_ratio", **where)] == \
            pytest.approx(fields["DCGM_FI_DEV_GPU_UTIL"] / 100)
        assert parsed[_key(SPEC_PREFIX + "memory_used_bytes", **where)] == \
            fields["DCGM_FI_DEV_FB_USED"] * MIB
        assert parsed[_key(SPEC_PREFIX + "memory_total_bytes", **where)] == \
            (fields["DCGM_FI_DEV_FB_USED"] + fields["DCGM_FI_DEV_FB_FREE"]) * MIB
        assert parsed[_key(SPEC_PREFIX + "last_xid", **where)] == \
            fields["DCGM_FI_DEV_XID_ERRORS"]
    driver = re.search(r'DCGM_FI_DRIVER_VERSION="([^"]+)"', DCGM.read_text()).group(1)
    model = re.search(r'modelName="([^"]+)"', DCGM.read_text()).group(1)
    assert parsed[_key(SPEC_PREFIX + "info", vendor="nvidia", device="3", model=model,
                       driver=driver, firmware="", source="dcgm-exporter")] == 1
    mig = set(re.findall(r'gpu="0",.*GPU_I_ID="(\d+)"', DCGM.read_text()))
    assert {f"0/mig{gi}" for gi in mig} == {
        re.search(r'device="([^"]+)"', key).group(1) for key in parsed
        if key.startswith(SPEC_PREFIX + "info") and "device=\"0/" in key}
    health = dict(re.findall(r'npu_chip_info_health_status\{id="(\d+)".*\} (\d+)',
                             NPU_EXPORTER.read_text()))
    assert health
    for chip, value in health.items():
        assert parsed[_key(SPEC_PREFIX + "healthy", vendor="huawei", device=chip)] == \
            (1 if value == "1" else 0)
    for index in (0, 1):
        assert parsed[_key("fleetscope_scrape_source_available", collector="accelerator",
                           source=f"accelerator-exporter-{index}")] == 1


def test_a_slow_endpoint_costs_its_source_only_and_never_delays_the_scrape(vendor_endpoint):
    config = _config(accelerator_exporter_urls=[f"{vendor_endpoint}/slow/metrics",
                                                f"{vendor_endpoint}/dcgm/metrics"],
                     accelerator_timeout_seconds=0.5)
    collector = AcceleratorCollector(config)
    start = time.monotonic()
    parsed, scrape = _collect(collector, LiveHost("/"))
    waited = time.monotonic() - start
    assert waited < 15  # the slow endpoint holds its answer for 20 s
    ok, reason = scrape.sources[("accelerator", "accelerator-exporter-0")]
    assert not ok and "no answer within 0.5 s" in reason
    assert scrape.sources[("accelerator", "accelerator-exporter-1")] == (True, "")
    assert any(key.startswith(SPEC_PREFIX + "temperature_celsius") for key in parsed)


# -- the vendor tools --------------------------------------------------------------------------

def test_vendor_tools_on_path_report_the_published_outputs(tool_path):
    _tool(tool_path, "nvidia-smi", f'[ "$1 $2" = "-q -x" ] || exit 9\nexec cat "{NVIDIA_XML}"')
    _tool(tool_path, "npu-smi", f'[ "$1" = "info" ] || exit 9\nexec cat "{NPU_SMI}"')
    config = _config()  # accelerator_tools: auto, no exporter url
    assert AcceleratorCollector.wanted_on(config, LiveHost("/"))
    parsed, scrape = _collect(AcceleratorCollector(config), LiveHost("/"))
    xml = NVIDIA_XML.read_text()
    gpu_level = xml[xml.index("</mig_devices>"):]
    used = float(re.search(r"<fb_memory_usage>.*?<used>(\d+) MiB", gpu_level, re.S).group(1))
    total = float(re.search(r"<fb_memory_usage>\s*<total>(\d+) MiB", gpu_level).group(1))
    where = {"vendor": "nvidia", "device": "0"}
    assert parsed[_key(SPEC_PREFIX + "memory_used_bytes", **where)] == used * MIB
    assert parsed[_key(SPEC_PREFIX + "memory_total_bytes", **where)] == total * MIB
    assert parsed[_key(SPEC_PREFIX + "temperature_celsius", **where)] == \
        float(re.search(r"<gpu_temp>(\d+) C<", xml).group(1))
    assert parsed[_key(SPEC_PREFIX + "power_watts", **where)] == \
        float(re.search(r"<power_draw>([\d.]+) W<", xml).group(1))
    vbios = re.search(r"<vbios_version>([^<]+)<", xml).group(1)
    driver = re.search(r"<driver_version>([^<]+)<", xml).group(1)
    model = re.search(r"<product_name>([^<]+)<", xml).group(1)
    assert parsed[_key(SPEC_PREFIX + "info", vendor="nvidia", device="0", model=model,
                       driver=driver, firmware=vbios, source="nvidia-smi")] == 1
    rows = _npu_smi_rows()
    assert len(rows) == 8
    for npu, row in rows.items():
        where = {"vendor": "huawei", "device": f"{npu}/0"}
        assert parsed[_key(SPEC_PREFIX + "power_watts", **where)] == row["power"]
        assert parsed[_key(SPEC_PREFIX + "temperature_celsius", **where)] == row["temp"]
        assert parsed[_key(SPEC_PREFIX + "utilization_ratio", **where)] == row["aicore"] / 100
        assert parsed[_key(SPEC_PREFIX + "memory_used_bytes", **where)] == row["hbm_used"] * MIB
        assert parsed[_key(SPEC_PREFIX + "memory_total_bytes", **where)] == \
            row["hbm_total"] * MIB
        assert parsed[_key(SPEC_PREFIX + "healthy", **where)] == 1
    assert scrape.sources[("accelerator", "nvidia-smi")] == (True, "")
    assert scrape.sources[("accelerator", "npu-smi")] == (True, "")
    assert any(key.startswith(SPEC_PREFIX + "sample_age_seconds") for key in parsed)


def test_a_hanging_tool_is_unavailable_within_the_timeout_and_killed(tool_path):
    _tool(tool_path, "nvidia-smi", "exec sleep 60")
    _tool(tool_path, "npu-smi", f'exec cat "{NPU_SMI}"')
    collector = AcceleratorCollector(_config(accelerator_timeout_seconds=0.5))
    start = time.monotonic()
    parsed, scrape = _collect(collector, LiveHost("/"))
    assert time.monotonic() - start < 30  # the tool would sleep for 60 s
    ok, reason = scrape.sources[("accelerator", "nvidia-smi")]
    assert not ok and "0.5 s" in reason
    assert not any('vendor="nvidia"' in key for key in parsed)
    # The hung run is killed at the timeout; a later scrape says so (bounded wait).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        parsed, scrape = _collect(collector, LiveHost("/"))
        ok, reason = scrape.sources[("accelerator", "nvidia-smi")]
        if "killed" in reason:
            break
        time.sleep(0.2)
    assert not ok and "did not finish within 0.5 s" in reason and "killed" in reason
    assert scrape.sources[("accelerator", "npu-smi")] == (True, "")
    assert any(key.startswith(SPEC_PREFIX + "power_watts") and "huawei" in key
               for key in parsed)


def test_a_tool_printing_garbage_costs_its_source_only(tool_path):
    _tool(tool_path, "nvidia-smi", "echo 'NVIDIA-SMI has failed <not xml'")
    _tool(tool_path, "npu-smi", f'exec cat "{NPU_SMI}"')
    config = _config(collectors=["accelerator", "cpu"])
    exporter = Exporter(LiveHost("/"), config)
    parsed = samples(render(exporter.collect()))
    assert parsed[_key("fleetscope_scrape_source_available", collector="accelerator",
                       source="nvidia-smi")] == 0
    assert parsed[_key("fleetscope_scrape_source_available", collector="accelerator",
                       source="npu-smi")] == 1
    assert parsed[_key("fleetscope_scrape_collector_success", collector="cpu")] == 1
    assert not any('vendor="nvidia"' in key for key in parsed)
    assert len([key for key in parsed if key.startswith(SPEC_PREFIX + "info")]) == 8
    assert any(key.startswith("fleetscope_cpu_") for key in parsed)


# -- no module, no cost --------------------------------------------------------------------------

@pytest.mark.skipif(os.path.exists("/dev/nvidia0") or bool(
    [p for p in os.listdir("/dev") if p.startswith("davinci")]),
    reason="this machine has an inference module")
def test_a_node_without_a_module_runs_no_accelerator_collector(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no vendor tool on PATH
    exporter = Exporter(LiveHost("/"), _config())
    assert "accelerator" not in [collector.name for collector in exporter.collectors]
    assert not AcceleratorCollector.wanted(_config())
    parsed = samples(render(exporter.collect()))
    assert not any(key.startswith(SPEC_PREFIX) for key in parsed)
    assert not any('collector="accelerator"' in key for key in parsed)
    # an explicit empty tool list with no url: nothing either, even where a tool exists
    assert not AcceleratorCollector.wanted_on(_config(accelerator_tools=[]), LiveHost("/"))


# -- bundle record and replay ------------------------------------------------------------------

def _run(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetscope", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_bundle_record_then_diagnose_and_replay_give_the_live_series(
        vendor_endpoint, tool_path, tmp_path):
    _tool(tool_path, "nvidia-smi", f'exec cat "{NVIDIA_XML}"')
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(EXAMPLE_MATRIX.read_text())
    raw = {"accelerator_exporter_urls": [f"{vendor_endpoint}/dcgm/metrics",
                                         f"{vendor_endpoint}/npu/metrics"],
           "accelerator_tools": ["nvidia-smi"], "accelerator_matrix": str(matrix)}
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    bundle = tmp_path / "bundle"
    recorded = _run("bundle", "record", "--seconds", "0", "--interval", "1", "-o", str(bundle),
                    "--config", str(config_path))
    assert recorded.returncode == 0, recorded.stderr
    sample = bundle / "samples" / "s0000"
    assert (sample / "cmd" / "accelerator-exporter-0.prom").read_bytes() == DCGM.read_bytes()
    assert (sample / "cmd" / "accelerator-exporter-1.prom").read_bytes() == \
        NPU_EXPORTER.read_bytes()
    assert (sample / "cmd" / "nvidia-smi-q-x.xml").read_bytes() == NVIDIA_XML.read_bytes()
    assert (bundle / "static" / "accelerator-matrix.yaml").read_text() == matrix.read_text()
    assert json.loads((bundle / "meta.json").read_text())["config"]["accelerator_tools"] == \
        ["nvidia-smi"]

    diagnosis = _run("diagnose", "--bundle", str(bundle), "--json")
    assert diagnosis.returncode in (0, 1, 2), diagnosis.stderr
    assert json.loads(diagnosis.stdout)["source"] == "bundle"

    config = _config(**raw, collectors=["accelerator"])
    live, _ = _collect(AcceleratorCollector(config), LiveHost("/"))
    matrix.write_text("matrix: not a list\n")  # replay must use the bundle's copy
    replay_exporter = Exporter(recorded_sample(str(sample)), config)
    replayed = samples(render(replay_exporter.collect()))
    live_series = _accelerator_series(live)
    assert any(key.startswith(SPEC_PREFIX + "matrix_listed") for key in live_series)
    assert live_series == _accelerator_series(replayed)

    # the exporter process on the sample, its config recorded without a url or tool: the
    # outputs in the sample are enough to run the collector
    replay = _run_exporter_once(sample, tmp_path)
    assert _accelerator_series(replay) == live_series


def _run_exporter_once(root: Path, tmp_path: Path) -> dict[str, float]:
    from .conftest import ExporterProcess

    process = ExporterProcess(root, {"accelerator_tools": "auto"}, tmp_path)
    try:
        return samples(process.text())
    finally:
        process.stop()


def test_replay_reads_the_recorded_files_and_runs_nothing(tmp_path, tool_path):
    _tool(tool_path, "nvidia-smi", f"touch '{tmp_path}/ran'; exec cat '{NVIDIA_XML}'")
    sample = tmp_path / "sample"
    (sample / "cmd").mkdir(parents=True)
    (sample / "cmd" / "npu-smi-info.txt").write_bytes(NPU_SMI.read_bytes())
    config = _config(accelerator_exporter_urls=["http://127.0.0.1:9/metrics"],
                     accelerator_tools=["nvidia-smi"])
    parsed, scrape = _collect(AcceleratorCollector(config), recorded_sample(str(sample)))
    assert not (tmp_path / "ran").exists()
    ok, reason = scrape.sources[("accelerator", "accelerator-exporter-0")]
    assert not ok and "recorded without it" in reason
    assert len([key for key in parsed if key.startswith(SPEC_PREFIX + "info")]) == \
        len(_npu_smi_rows())


# -- the matrix and the config -----------------------------------------------------------------

def test_the_example_matrix_parses_and_judges_the_fixture_devices(tmp_path):
    from fleetscope.collectors.parsers.accelerator_matrix import listed, parse_matrix

    matrix = parse_matrix(EXAMPLE_MATRIX.read_text())
    assert {entry.vendor for entry in matrix} == {"nvidia", "huawei"}
    # Ascend's install guide pairs CANN 8.0.RC1 with 910b driver 24.1.rc1 and firmware
    # 7.1.0.6.220 (the fixture README cites it); the matrix must say so, and not the reverse
    assert listed(matrix, "huawei", "910B", "24.1.rc1", "7.1.0.6.220") is True
    assert listed(matrix, "huawei", "910B", "24.1.rc1", "7.1.0.5.220") is False


@pytest.mark.parametrize("text, words", [
    ("matrix: [{vendor: amd, driver: [1]}]\n", "vendor must be one of"),
    ("matrix: [{vendor: nvidia}]\n", "driver must be a non-empty list"),
    ("matrix: [{vendor: nvidia, driver: [{from: 1, upto: 2}]}]\n", "not a version"),
    ("matrix: [{vendor: nvidia, driver: [1], colour: red}]\n", "unknown keys colour"),
    ("- just a list\n", "must be a mapping with a `matrix:` list"),
    ("matrix: [unclosed\n", "not valid YAML at line"),
])
def test_a_bad_matrix_is_one_clear_line_and_an_unavailable_source(tmp_path, text, words):
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    config = _config(accelerator_matrix=str(path), accelerator_tools=[])
    collector = AcceleratorCollector(config)
    _, scrape = _collect(collector, LiveHost("/"))
    ok, reason = scrape.sources[("accelerator", "accelerator_matrix")]
    assert not ok and words in reason and "\n" not in reason


@pytest.mark.parametrize("raw, words", [
    ({"accelerator_exporter_urls": "http://127.0.0.1:9400/metrics"}, "must be a list"),
    ({"accelerator_exporter_urls": ["127.0.0.1:9400"]}, "is not an http(s) URL"),
    ({"accelerator_tools": ["nvidia-smi", "rm"]}, "accelerator_tools must be 'auto' or"),
    ({"accelerator_tools": "yes"}, "accelerator_tools must be 'auto' or"),
    ({"accelerator_timeout_seconds": 0}, "accelerator_timeout_seconds must be a number"),
    ({"accelerator_matrix": ["a.yaml"]}, "accelerator_matrix must be the path"),
    ({"accelerator_url": "x"}, "did you mean"),
])
def test_bad_accelerator_config_is_one_line(raw, words):
    with pytest.raises(ConfigError) as err:
        parse_config(raw, tuple(COLLECTORS))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_matrix_docstring_examples():
    import doctest

    from fleetscope.collectors.parsers import accelerator_matrix

    failures, tried = doctest.testmod(accelerator_matrix)
    assert tried > 0 and failures == 0
