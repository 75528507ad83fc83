"""The inference-accelerator parsers (issue 26) on the vendors' public outputs, and on hostile
and corrupt ones.

The expected values are read by eye off the fixture files (tests/fixtures/inference/README.md
says where each comes from), never copied from a parser's output.
"""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest
from hypothesis import strategies as st

from fleetscope.collectors.parsers import (
    ParseError,
    accelerator,
    exporter_metrics,
    npu_smi,
    nvidia_smi_csv,
    nvidia_smi_xml,
)
from fleetscope.collectors.parsers.accelerator import MAX_OUTPUT_CHARS, MIB
from fleetscope.collectors.parsers.exporter_metrics import (
    exposition_samples,
    parse_dcgm_exporter,
    parse_npu_exporter,
)
from fleetscope.collectors.parsers.npu_smi import parse_npu_smi_info
from fleetscope.collectors.parsers.nvidia_smi_csv import QUERY_FIELDS, parse_query_gpu_csv
from fleetscope.collectors.parsers.nvidia_smi_xml import MAX_ELEMENTS, parse_nvidia_smi_xml
from tests.fuzzing import parser_fuzz_tests

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "inference"
A100_XML = (FIXTURES / "nvidia-smi" / "a100-sxm4-80gb-v12.xml").read_text()
RTX3080_XML = (FIXTURES / "nvidia-smi" / "rtx-3080-v13.xml").read_text()
H100_CSV = (FIXTURES / "nvidia-smi" / "h100-80gb-hbm3-query-gpu.csv").read_text()
NPU_SMI_910 = (FIXTURES / "npu-smi" / "910-8npu-info.txt").read_text()
DCGM_A800 = (FIXTURES / "dcgm-exporter" / "a800-sxm4-80gb-8gpu-mig.metrics").read_text()
NPU_EXPORTER = (FIXTURES / "npu-exporter" / "prometheus_metrics").read_text()
# Two chips per NPU, a Phy-ID column, and a chip whose power reads "-"
NPU_SMI_TWO_CHIPS = (FIXTURES / "npu-smi" / "two-chip-npu-issue-2534.txt").read_text()
# A Device column, no HBM column, power "NA", and a process table (a 310P3 card)
NPU_SMI_310P = (FIXTURES / "npu-smi" / "310p3-one-npu-driver-25.3.rc1.txt").read_text()


# -- nvidia-smi -q -x ------------------------------------------------------------------------

# Values read off each single-GPU nvidia-smi fixture; the parsers must give exactly these.
NVIDIA_SMI_FIXTURE_VALUES = {
    "a100-sxm4-80gb-v12.xml": (parse_nvidia_smi_xml, A100_XML, {
        "vendor": "nvidia", "index": 0, "model": "NVIDIA A100-SXM4-80GB",
        "bus_id": "00000000:01:00.0", "uuid": "GPU-513536b6-7d19-9063-b049-1e69664bb298",
        "driver_version": "535.54.03", "firmware_version": "92.00.36.00.02",
        "memory_used_bytes": 50 * MIB, "memory_free_bytes": 80999 * MIB,
        "memory_total_bytes": 81920 * MIB, "temperature_c": 27, "power_w": 67.03,
        "utilization_percent": None,  # <gpu_util>N/A</gpu_util>: MIG is on
        "ecc_corrected": 0, "ecc_uncorrected": 0}),
    "rtx-3080-v13.xml": (parse_nvidia_smi_xml, RTX3080_XML, {
        "model": "NVIDIA GeForce RTX 3080", "bus_id": "00000000:0C:00.0",
        "driver_version": "595.58.03", "firmware_version": "94.02.71.40.72",
        "utilization_percent": 65, "memory_used_bytes": 9184 * MIB,
        "memory_total_bytes": 10240 * MIB,
        "power_w": 142.33,  # v13 names it <instant_power_draw>
        "ecc_corrected": None, "ecc_uncorrected": None}),  # ECC N/A on a GeForce
    "h100-80gb-hbm3-query-gpu.csv": (parse_query_gpu_csv, H100_CSV, {
        "index": 0, "model": "NVIDIA H100 80GB HBM3", "bus_id": "00000000:00:09.0",
        "driver_version": "590.48.01", "firmware_version": "96.00.A5.00.01",
        "memory_used_bytes": 19818 * MIB, "memory_free_bytes": 61263 * MIB,
        "memory_total_bytes": 81559 * MIB, "utilization_percent": 100, "temperature_c": 59,
        "power_w": 631.95, "ecc_corrected": 0, "ecc_uncorrected": 0}),
}


@pytest.mark.parametrize("fixture", sorted(NVIDIA_SMI_FIXTURE_VALUES))
def test_nvidia_smi_fixture_values(fixture):
    parser, text, expected = NVIDIA_SMI_FIXTURE_VALUES[fixture]
    [gpu] = parser(text)
    assert {field: getattr(gpu, field) for field in expected} == expected


def test_nvidia_smi_xml_older_ecc_layout():
    """The single_bit/double_bit layout of telegraf's quadro-p2000-v12 sample (whose counts
    are all N/A; the counts here are made up) gives its volatile totals."""
    report = ("<nvidia_smi_log><gpu id='00000000:01:00.0'><ecc_errors><volatile>"
              "<single_bit><device_memory>2</device_memory><total>3</total></single_bit>"
              "<double_bit><total>1</total></double_bit></volatile></ecc_errors>"
              "<power_readings><power_draw>4.61 W</power_draw></power_readings>"
              "</gpu></nvidia_smi_log>")
    [gpu] = parse_nvidia_smi_xml(report)
    assert (gpu.ecc_corrected, gpu.ecc_uncorrected, gpu.power_w) == (3, 1, 4.61)


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [
  <!ENTITY lol "lol">
  <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
  <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
]>
<nvidia_smi_log><driver_version>&lol3;</driver_version></nvidia_smi_log>"""

EXTERNAL_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<nvidia_smi_log><driver_version>&secret;</driver_version></nvidia_smi_log>"""

UNDECLARED_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log><driver_version>&secret;</driver_version></nvidia_smi_log>"""


@pytest.mark.parametrize("report, reason", [
    (BILLION_LAUGHS, "internal subset"),
    (EXTERNAL_ENTITY, "internal subset"),
    (UNDECLARED_ENTITY, "undeclared entity"),
    (A100_XML[:len(A100_XML) // 2], "not well-formed"),
    ("<gpu id='0'/>", "not <nvidia_smi_log>"),
    ("", "not well-formed"),
    ("nvidia-smi has failed because it couldn't communicate with the NVIDIA driver", "XML"),
    ("<nvidia_smi_log>" + " " * MAX_OUTPUT_CHARS + "</nvidia_smi_log>", "characters"),
    ("<nvidia_smi_log>" + "<x/>" * (MAX_ELEMENTS + 1) + "</nvidia_smi_log>", "elements"),
])
def test_nvidia_smi_xml_refuses_hostile_and_corrupt(report, reason):
    with pytest.raises(ParseError, match=reason):
        parse_nvidia_smi_xml(report)


def test_nvidia_smi_xml_skips_a_gpu_it_cannot_name():
    report = A100_XML.replace("</nvidia_smi_log>", "<gpu><product_name>?</product_name></gpu>"
                                                  "</nvidia_smi_log>")
    assert [gpu.uuid for gpu in parse_nvidia_smi_xml(report)] == [
        "GPU-513536b6-7d19-9063-b049-1e69664bb298"]


# -- nvidia-smi --query-gpu --format=csv ------------------------------------------------------

def test_query_gpu_csv_noheader_nounits():
    """`--format=csv,noheader,nounits` with the caller's field list; [N/A] is no value."""
    row = ("3, NVIDIA H100 80GB HBM3, 00000000:00:09.0, GPU-1, 100, 19818, 61263, 81559, 59, "
           "[N/A], 590.48.01, 96.00.A5.00.01, 0, 0\n")
    [gpu] = parse_query_gpu_csv(row, QUERY_FIELDS)
    assert (gpu.index, gpu.memory_used_bytes, gpu.power_w) == (3, 19818 * MIB, None)


def test_query_gpu_csv_skips_bad_rows():
    text = ("index, name, memory.used [MiB]\n"
            "0, NVIDIA A800-SXM4-80GB, 2 MiB\n"
            "1, NVIDIA A800-SXM4-80GB\n"  # a column short: cut output
            "x, garbage, 3 MiB\n"  # index not a number
            "2, NVIDIA A800-SXM4-80GB, 10 MiB\n")
    assert [(gpu.index, gpu.memory_used_bytes) for gpu in parse_query_gpu_csv(text)] == [
        (0, 2 * MIB), (2, 10 * MIB)]


@pytest.mark.parametrize("text", [
    "", "\n\n", "No devices were found\n", "0, NVIDIA H100, 59\n",
    "index\n" + "0" * (MAX_OUTPUT_CHARS + 1),
])
def test_query_gpu_csv_refuses_what_has_no_header(text):
    with pytest.raises(ParseError):
        parse_query_gpu_csv(text)


# -- npu-smi info -----------------------------------------------------------------------------

def test_npu_smi_info_910_eight_npus():
    chips = parse_npu_smi_info(NPU_SMI_910)
    assert [chip.index for chip in chips] == list(range(8))
    assert all(chip.chip == 0 and chip.model == "910B" and chip.healthy for chip in chips)
    assert all(chip.driver_version == "24.1.0" for chip in chips)
    first, second, last = chips[0], chips[1], chips[7]
    assert (first.power_w, first.temperature_c, first.bus_id) == (70.0, 34, "0000:C1:00.0")
    assert (first.memory_used_bytes, first.memory_total_bytes) == (1365 * MIB, 32768 * MIB)
    assert (second.bus_id, second.power_w, second.memory_used_bytes) == (
        "0000:81:00.0", 66.9, 4 * MIB)
    assert (last.power_w, last.temperature_c, last.bus_id) == (65.6, 33, "0000:02:00.0")
    assert first.utilization_percent == 0


def test_npu_smi_info_phy_id_layout_and_missing_power():
    first, second = parse_npu_smi_info(NPU_SMI_TWO_CHIPS)
    assert (first.index, first.chip, first.power_w, first.memory_used_bytes) == (
        0, 0, 178.5, 3416 * MIB)
    assert (second.index, second.chip, second.power_w, second.bus_id) == (
        0, 1, None, "0000:9F:00.0")
    assert second.memory_total_bytes == 65536 * MIB


def test_npu_smi_info_310p_without_hbm():
    [chip] = parse_npu_smi_info(NPU_SMI_310P)
    assert (chip.index, chip.model, chip.driver_version) == (6, "310P3", "25.3.rc1")
    assert chip.power_w is None  # "NA"
    assert (chip.memory_used_bytes, chip.memory_total_bytes) == (1839 * MIB, 21525 * MIB)


def test_npu_smi_info_skips_garbage_rows_keeps_the_rest():
    lines = NPU_SMI_910.splitlines()
    # NPU 2's second row (line 14) becomes noise; stray text lands between the rows of NPU 5
    lines[13] = "| 0                         | \x00\x01garbage     | ??? |"
    lines.insert(22, "npu-smi: warning: something the tool printed")
    chips = parse_npu_smi_info("\n".join(lines))
    assert [chip.index for chip in chips] == [0, 1, 3, 4, 5, 6, 7]
    assert chips[4].power_w == 66.3  # NPU 5 still read


def test_npu_smi_info_unhealthy_chip():
    table = NPU_SMI_910.replace("| 3     910B                | OK    ",
                                "| 3     910B                | Alarm ")
    chips = parse_npu_smi_info(table)
    assert [chip.index for chip in chips if not chip.healthy] == [3]


@pytest.mark.parametrize("text", [
    "", "dcmi model initialized failed, because the device is used. ret is -8020\n",
    NPU_SMI_910.replace("| NPU   Name", "| XPU   Name"),
    "| NPU Name | Health |\n" * (MAX_OUTPUT_CHARS // 20 + 1),
])
def test_npu_smi_info_refuses_what_is_not_its_table(text):
    with pytest.raises(ParseError):
        parse_npu_smi_info(text)


# -- dcgm-exporter and npu-exporter scrapes -----------------------------------------------------

def test_dcgm_exporter_a800_eight_gpus_one_in_mig():
    devices = parse_dcgm_exporter(DCGM_A800)
    assert [(d.index, d.gpu_instance) for d in devices] == [
        (0, "3"), (0, "5"), (0, "6"), (1, None), (2, None), (3, None), (4, None), (5, None),
        (6, None), (7, None)]
    assert all(d.model == "NVIDIA A800-SXM4-80GB" and d.driver_version == "535.129.03"
               and d.last_xid == 0 for d in devices)
    mig = {d.gpu_instance: d for d in devices if d.index == 0}
    assert mig["6"].power_w == pytest.approx(78.446)
    assert mig["3"].memory_free_bytes == 19957 * MIB and mig["3"].memory_used_bytes == 10 * MIB
    assert mig["3"].utilization_percent is None  # no DCGM_FI_DEV_GPU_UTIL for MIG
    gpu1, gpu7 = devices[3], devices[9]
    assert gpu1.uuid == "GPU-9e5b8fec-61bf-5124-a0a9-079af1b65cc6"
    assert (gpu1.temperature_c, gpu1.power_w, gpu1.utilization_percent) == (27, 55.942, 0)
    assert (gpu1.memory_used_bytes, gpu1.memory_free_bytes) == (2 * MIB, 81226 * MIB)
    assert gpu1.memory_total_bytes is None  # DCGM_FI_DEV_FB_TOTAL not in this scrape
    assert (gpu7.temperature_c, gpu7.power_w) == (29, pytest.approx(55.011))


def test_npu_exporter_golden_output():
    chips = parse_npu_exporter(NPU_EXPORTER)
    assert [chip.index for chip in chips] == list(range(8))
    assert all(chip.model == "910Awn-Ascend-V1" and chip.healthy for chip in chips)
    assert all(chip.bus_id is None and chip.uuid is None for chip in chips)  # labels are ""
    assert all(chip.memory_total_bytes == 0 and chip.error_codes == () for chip in chips)
    assert ("machine_npu_nums", {}, 8.0) in exposition_samples(NPU_EXPORTER, "npu-exporter")


def test_npu_exporter_error_codes_hbm_and_health():
    scrape = ('npu_chip_info_health_status{id="2",model_name="910B"} 0\n'
              'npu_chip_info_error_code{id="2",model_name="910B"} 2350927360\n'
              'npu_chip_info_error_code_1{id="2",model_name="910B"} 2350927361\n'
              'npu_chip_info_hbm_used_memory{id="2",model_name="910B"} 3416\n'
              'npu_chip_info_used_memory{id="2",model_name="910B"} 1197\n')
    [chip] = parse_npu_exporter(scrape)
    assert chip.healthy is False
    assert chip.error_codes == (2350927360, 2350927361)
    assert chip.memory_used_bytes == 3416 * MIB  # HBM before the control CPU's DDR


def test_exporter_scrapes_skip_series_they_cannot_place():
    scrape = ('DCGM_FI_DEV_GPU_TEMP{UUID="GPU-x"} 40\n'  # no gpu label
              'DCGM_FI_DEV_GPU_TEMP{gpu="one"} 41\n'
              'DCGM_FI_DEV_GPU_TEMP{gpu="0"} NaN\n'
              'DCGM_FI_DEV_FB_USED{gpu="0"} -5\n'
              'DCGM_FI_DEV_POWER_USAGE{gpu="0"} 70\n'
              'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-y"} 80\n')
    [gpu] = parse_dcgm_exporter(scrape)
    assert (gpu.index, gpu.temperature_c, gpu.memory_used_bytes, gpu.power_w) == (
        0, None, None, 70)


@pytest.mark.parametrize("parser", [parse_dcgm_exporter, parse_npu_exporter])
@pytest.mark.parametrize("text", [
    'DCGM_FI_DEV_GPU_TEMP{gpu="0" 40\n', "<html>502 Bad Gateway</html>\n",
    "# TYPE x gauge\n" + "x 1\n" * (MAX_OUTPUT_CHARS // 4 + 1),
])
def test_exporter_scrapes_refuse_what_is_not_prometheus_text(parser, text):
    with pytest.raises(ParseError):
        parser(text)


# -- fuzzing and docstrings -------------------------------------------------------------------

PARSERS = {
    "nvidia_smi_xml": (parse_nvidia_smi_xml, RTX3080_XML[:6000] + "</gpu></nvidia_smi_log>"),
    "nvidia_smi_csv": (parse_query_gpu_csv, H100_CSV),
    "npu_smi_info": (parse_npu_smi_info, NPU_SMI_910),
    "dcgm_exporter": (parse_dcgm_exporter, DCGM_A800[:3000]),
    "npu_exporter": (parse_npu_exporter, NPU_EXPORTER[:3000]),
}

# Text shaped like these outputs: tags, table borders, CSV separators, label syntax, digits.
TOOL_TOKENS = list("0123456789 \n|+=-/.,:<>\"{}_&;![]%") + [
    "<gpu>", "</gpu>", "<nvidia_smi_log>", "<!DOCTYPE", "NPU", "Health", "OK", "MiB", " W",
    "DCGM_FI_DEV_GPU_TEMP", "gpu=", "npu_chip_info_power", "id=", "index", "Version:"]
toolish = st.lists(st.sampled_from(TOOL_TOKENS), max_size=150).map("".join)

test_fuzz_garbage, test_fuzz_cut_and_corrupted = parser_fuzz_tests(PARSERS, toolish)


@pytest.mark.parametrize("module", [accelerator, nvidia_smi_xml, nvidia_smi_csv, npu_smi,
                                    exporter_metrics])
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0
