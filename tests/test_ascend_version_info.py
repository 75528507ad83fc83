"""The Ascend packages' version files (tests/fixtures/inference/ascend-version-info, as Ascend's
fault-diagnosis guide prints them): the parser, the `accelerator` collector filling the NPU
firmware (and driver) of the npu-smi chips from them, the matrix verdict that needs the
firmware, and `bundle record` carrying the files so the replay gives the same series.

Expected versions are read off the fixture files by eye (the values in the constants below),
never through the parser the collector uses.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetscope.collectors import COLLECTORS
from fleetscope.collectors.accelerator import AcceleratorCollector
from fleetscope.collectors.base import Scrape
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers.ascend_version import (
    parse_driver_version_info,
    parse_firmware_version_info,
)
from fleetscope.collectors.source import recorded_sample
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter

from .conftest import samples

FIXTURES = Path(__file__).parent / "fixtures" / "inference"
DRIVER_FILE = FIXTURES / "ascend-version-info" / "driver-version.info"
FIRMWARE_FILE = FIXTURES / "ascend-version-info" / "firmware-version.info"
NPU_SMI = FIXTURES / "npu-smi" / "910-8npu-info.txt"
EXAMPLE_MATRIX = Path(__file__).parent.parent / "examples" / "accelerator-matrix.yaml"
INFO = "fleetscope_accelerator_info"
LISTED = "fleetscope_accelerator_matrix_listed"

# Read off the fixture files by eye.
DRIVER = "24.1.rc1"
FIRMWARE = "7.1.0.11.220"
NPU_SMI_BANNER_VERSION = "24.1.0"
# The example matrix's one 910B pair with driver 24.1.rc1 (Ascend HDK 24.1.RC1).
LISTED_FIRMWARE = "7.1.0.6.220"


def _npu_ids() -> list[str]:
    """The NPU ids of the npu-smi table's first rows (`| 0     910B  | OK |`)."""
    return re.findall(r"^\|\s*(\d+)\s+\S+\s*\|\s*OK\s*\|", NPU_SMI.read_text(), re.M)


# -- the parser ------------------------------------------------------------------------------

def test_the_published_files_parse_to_their_versions_and_declared_ranges():
    driver = parse_driver_version_info(DRIVER_FILE.read_text())
    assert driver.version == DRIVER
    assert driver.compatible == (("7.0.0", "7.2.99"),)
    assert driver.fields["ascendhal_version"] == "7.35.19"
    assert driver.fields["Innerversion"] == "V100R001C15SPC006B220"
    firmware = parse_firmware_version_info(FIRMWARE_FILE.read_text())
    assert firmware.version == FIRMWARE
    assert firmware.compatible == (("23.0.rc3", "23.0.rc3."), ("23.0.0", "23.0.0."))
    assert firmware.fields["package_version"] == "23.0.7"


def test_a_bad_line_or_range_costs_itself_only():
    text = ("garbage without an equals sign\n" + DRIVER_FILE.read_text()
            .replace("compatible_version_fw=[7.0.0,7.2.99]",
                     "compatible_version_fw=[7.0.0],[7.0.0,7.2.99],[x y,z]"))
    info = parse_driver_version_info(text)
    assert info.version == DRIVER
    assert info.compatible == (("7.0.0", "7.2.99"),)


@pytest.mark.parametrize("text, words", [
    ("", "no key=value line"),
    ("<html><body>404</body></html>\n", "no key=value line"),
    ("firmware_version=1.0\npackage_version=23.0.7\n", "no Version="),
    ("Version=\n", "no Version="),
    ("Version=" + "9" * 100 + "\n", "no Version="),
    ("Version=1\n" * 40_000, "more than"),
])
def test_garbage_is_one_parse_error(text, words):
    with pytest.raises(ParseError, match=words):
        parse_firmware_version_info(text)


def test_parser_docstring_examples():
    import doctest

    from fleetscope.collectors.parsers import ascend_version

    failures, tried = doctest.testmod(ascend_version)
    assert tried and not failures


# -- the collector on a fixture root -----------------------------------------------------------

def _tree(root: Path, driver: str | None, firmware: str | None) -> Path:
    """A recorded root: `npu-smi info` of the eight-NPU 910, the example matrix and the
    given version files' texts (None: no such file)."""
    (root / "cmd").mkdir(parents=True)
    (root / "proc").mkdir()
    (root / "cmd" / "npu-smi-info.txt").write_bytes(NPU_SMI.read_bytes())
    (root / "accelerator-matrix.yaml").write_text(EXAMPLE_MATRIX.read_text())
    for part, text in (("driver", driver), ("firmware", firmware)):
        if text is not None:
            (root / "usr/local/Ascend" / part).mkdir(parents=True)
            (root / "usr/local/Ascend" / part / "version.info").write_text(text)
    return root


def _collect(root: Path) -> tuple[dict[str, float], Scrape]:
    scrape = Scrape(recorded_sample(str(root)))
    collector = AcceleratorCollector(parse_config({}, tuple(COLLECTORS)))
    return samples(render(list(collector.collect(scrape)))), scrape


def _by_device(parsed: dict[str, float], name: str) -> dict[str, tuple[str, float]]:
    """device -> (the series' labels, value) of one family."""
    out = {}
    for key, value in parsed.items():
        if key.startswith(name + "{"):
            out[re.search(r'device="([^"]*)"', key).group(1)] = (key, value)
    return out


def test_the_version_files_give_every_npu_its_firmware_and_a_matrix_verdict(tmp_path):
    parsed, scrape = _collect(_tree(tmp_path / "t", DRIVER_FILE.read_text(),
                                    FIRMWARE_FILE.read_text()))
    info = _by_device(parsed, INFO)
    assert sorted(info) == sorted(f"{npu}/0" for npu in _npu_ids())
    assert len(info) == 8
    for key, _ in info.values():
        assert 'vendor="huawei"' in key and 'source="npu-smi"' in key
        assert f'firmware="{FIRMWARE}"' in key
        assert f'driver="{DRIVER}"' in key  # the driver package's file over npu-smi's banner
    # The example matrix pairs 24.1.rc1 with 7.1.0.6.220 only: this pair is not listed.
    verdicts = _by_device(parsed, LISTED)
    assert sorted(verdicts) == sorted(info)
    assert {value for _, value in verdicts.values()} == {0.0}
    assert scrape.sources[("accelerator", "ascend-driver-version")] == (True, "")
    assert scrape.sources[("accelerator", "ascend-firmware-version")] == (True, "")


def test_a_pair_the_example_matrix_lists_is_listed(tmp_path):
    firmware = FIRMWARE_FILE.read_text().replace(f"Version={FIRMWARE}",
                                                 f"Version={LISTED_FIRMWARE}")
    assert LISTED_FIRMWARE in firmware
    parsed, _ = _collect(_tree(tmp_path / "t", DRIVER_FILE.read_text(), firmware))
    verdicts = _by_device(parsed, LISTED)
    assert len(verdicts) == 8
    assert {value for _, value in verdicts.values()} == {1.0}
    assert all(f'firmware="{LISTED_FIRMWARE}"' in key for key, _ in verdicts.values())


def test_without_the_files_nothing_changes_and_nothing_fails(tmp_path):
    parsed, scrape = _collect(_tree(tmp_path / "t", None, None))
    info = _by_device(parsed, INFO)
    assert len(info) == 8
    for key, _ in info.values():
        assert f'driver="{NPU_SMI_BANNER_VERSION}"' in key and 'firmware=""' in key
    assert not any(source.startswith("ascend-") for _, source in scrape.sources)
    assert "accelerator" not in scrape.errors


def test_a_corrupt_firmware_file_costs_the_firmware_only(tmp_path):
    parsed, scrape = _collect(_tree(tmp_path / "t", DRIVER_FILE.read_text(),
                                    "\x00\x01 not a version file\n"))
    info = _by_device(parsed, INFO)
    assert len(info) == 8
    for key, _ in info.values():
        assert f'driver="{DRIVER}"' in key and 'firmware=""' in key
    ok, reason = scrape.sources[("accelerator", "ascend-firmware-version")]
    assert not ok and "firmware/version.info" in reason
    assert scrape.sources[("accelerator", "ascend-driver-version")] == (True, "")


@pytest.mark.parametrize("scrape_file, vendor, filled", [
    ("npu-exporter/prometheus_metrics", "huawei", True),
    ("dcgm-exporter/a800-sxm4-80gb-8gpu-mig.metrics", "nvidia", False),
])
def test_exporter_chips_are_filled_and_gpus_left_alone(tmp_path, scrape_file, vendor, filled):
    root = tmp_path / "t"
    for part, fixture in (("driver", DRIVER_FILE), ("firmware", FIRMWARE_FILE)):
        (root / "usr/local/Ascend" / part).mkdir(parents=True)
        (root / "usr/local/Ascend" / part / "version.info").write_bytes(fixture.read_bytes())
    (root / "cmd").mkdir()
    (root / "cmd" / "accelerator-exporter-0.prom").write_bytes(
        (FIXTURES / scrape_file).read_bytes())
    parsed, _ = _collect(root)
    info = [key for key in parsed if key.startswith(INFO + "{")]
    assert info and all(f'vendor="{vendor}"' in key for key in info)
    assert all((f'firmware="{FIRMWARE}"' in key) is filled for key in info)
    assert all((f'driver="{DRIVER}"' in key) is filled for key in info)
    if filled:  # the eight chips `id` 0-7 of the npu-exporter golden file
        assert len(info) == len(set(re.findall(r'npu_chip_info_health_status\{[^}]*id="(\d+)"',
                                                 (FIXTURES / scrape_file).read_text())))


# -- bundle record and replay ------------------------------------------------------------------

def test_bundle_record_carries_the_files_and_replays_the_same_series(tmp_path):
    tree = _tree(tmp_path / "t", DRIVER_FILE.read_text(), FIRMWARE_FILE.read_text())
    out = tmp_path / "out"
    recorded = subprocess.run(
        [sys.executable, "-m", "fleetscope", "bundle", "record", "--root", str(tree),
         "--seconds", "0", "--interval", "1", "-o", str(out)],
        capture_output=True, text=True, timeout=300)
    assert recorded.returncode == 0, recorded.stderr
    for part, fixture in (("driver", DRIVER_FILE), ("firmware", FIRMWARE_FILE)):
        copy = out / "static" / "usr/local/Ascend" / part / "version.info"
        assert copy.read_bytes() == fixture.read_bytes()
    config = parse_config({}, tuple(COLLECTORS))

    def accelerator_series(directory: Path) -> dict[str, float]:
        parsed = samples(render(Exporter(recorded_sample(str(directory)), config).collect()))
        return {key: value for key, value in parsed.items()
                if key.startswith("fleetscope_accelerator_")}

    replayed = accelerator_series(out / "samples" / "s0000")
    assert replayed == accelerator_series(tree)
    assert len(_by_device(replayed, LISTED)) == 8
    assert all(f'firmware="{FIRMWARE}"' in key for key in replayed if key.startswith(INFO))
