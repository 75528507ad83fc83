"""The scenario kit prints the inference modules' sources in the vendors' real formats: given
the values of the published outputs in tests/fixtures/inference/, its printers give those
outputs back (npu-smi's table byte for byte, dcgm-exporter's lines verbatim), so the scenario
bundles go through the real parsers and collector as a node's outputs would."""

from __future__ import annotations

import re

from tests.conftest import FIXTURES
from tests.fixture_trees import load_generator

INFERENCE = FIXTURES / "inference"
KIT = load_generator("scenarios", "make_scenarios_formats_probe")


def test_npu_smi_table_is_the_published_one_for_its_values():
    published = (INFERENCE / "npu-smi" / "910-8npu-info.txt").read_text()
    lines = published.splitlines()
    readings = []
    for top, bottom in zip(lines[6::3], lines[7::3], strict=False):
        cells = [cell.split() for cell in top.split("|")[1:4]]
        below = [cell.split() for cell in bottom.split("|")[1:4]]
        readings.append({"health": cells[1][0], "power": float(cells[2][0]),
                         "temp": int(cells[2][1]), "util": int(below[2][0]),
                         "ddr": (int(below[2][1]), int(below[2][3])), "used": int(below[2][4]),
                         "total": int(below[2][6]), "bus": below[1][0]})
    assert len(readings) == 8
    plan = KIT.AcceleratorPlan(source="npu-smi", driver="24.1.0")
    assert KIT.npu_smi_info_text(plan, readings) == published


_DCGM = re.compile(r'(\w+)\{gpu="(\d)",UUID="([^"]+)",device="nvidia\d",modelName="[^"]+",'
                   r'Hostname="[^"]+",DCGM_FI_DRIVER_VERSION="[^"]+",'
                   r'DCGM_FI_PROCESS_NAME="[^"]+"\} (\S+)\Z')


def test_dcgm_exporter_lines_are_the_published_ones_for_their_values():
    published = (INFERENCE / "dcgm-exporter" / "a800-sxm4-80gb-8gpu-mig.metrics").read_text()
    values: dict[int, dict[str, str]] = {}
    uuids = ["GPU-unused"] * 8
    for line in published.splitlines():
        match = _DCGM.match(line)
        if match:  # the whole GPUs 1-7 (GPU 0 is in MIG mode: other labels)
            values.setdefault(int(match[2]), {})[match[1]] = match[4]
            uuids[int(match[2])] = match[3]
    assert sorted(values) == list(range(1, 8))
    readings = [{"temp": 0, "power": 0.0, "util": 0, "xid": 0, "used": 0, "total": 0}]
    for gpu in range(1, 8):
        got = values[gpu]
        used, free = int(got["DCGM_FI_DEV_FB_USED"]), int(got["DCGM_FI_DEV_FB_FREE"])
        readings.append({"temp": int(got["DCGM_FI_DEV_GPU_TEMP"]),
                         "power": float(got["DCGM_FI_DEV_POWER_USAGE"]),
                         "util": int(got["DCGM_FI_DEV_GPU_UTIL"]),
                         "xid": int(got["DCGM_FI_DEV_XID_ERRORS"]), "used": used,
                         "total": used + free})
    plan = KIT.AcceleratorPlan(driver="535.129.03", firmware="92.00.45.00.05")
    plan.model = "NVIDIA A800-SXM4-80GB"
    text = KIT.dcgm_exporter_text(plan, readings, "msxf-hpc-64-35-ai", uuids)
    # the kit adds the VBIOS as a configured label field; without it, every line printed for
    # GPUs 1-7 (and every HELP/TYPE line) is one of the published scrape's
    without_vbios = text.replace(',DCGM_FI_DEV_VBIOS_VERSION="92.00.45.00.05"', "")
    printed = [line for line in without_vbios.splitlines() if 'gpu="0"' not in line]
    assert len(printed) == 6 * 2 + 6 * 7
    assert set(printed) <= set(published.splitlines())
    assert text.count('DCGM_FI_DEV_VBIOS_VERSION="92.00.45.00.05"') == 6 * 8
