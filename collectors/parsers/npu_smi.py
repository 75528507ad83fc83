"""Parser for the table `npu-smi info` prints: one AcceleratorDevice per Ascend NPU chip.

The table, from npu-smi 24.1.0 on an eight-card 910 (tests/fixtures/inference/npu-smi; here
with its padding narrowed):

    | npu-smi 24.1.0         Version: 24.1.0                                    |
    | NPU   Name     | Health       | Power(W)  Temp(C)  Hugepages-Usage(page) |
    | Chip           | Bus-Id       | AICore(%) Memory-Usage(MB)  HBM-Usage(MB) |
    +================+==============+==========================================+
    | 0     910B     | OK           | 70.0      34       0    / 0              |
    | 0              | 0000:C1:00.0 | 0         1197 / 13553      1365 / 32768  |

Each chip takes two rows: NPU id, name, health, power, temperature, huge pages; then chip
id (and, on newer cards, its Phy-ID or Device number), PCI address, AI core %, the control
CPU's DDR (Memory-Usage) and the HBM (HBM-Usage). 310P tables have no HBM column: there
Memory-Usage is the device memory. Power reads "NA" or "-" where a chip does not report it
(the second chip of a two-chip 910 card). A process table may follow; it is not read here.

npu-smi prints MB for sizes that are MiB: a 32 GiB HBM reads 32768 MB, a 64 GiB one 65536.
A row that cannot be read is skipped with its pair; a text with no table header is a
ParseError.
"""

from __future__ import annotations

import re

from . import ParseError
from .accelerator import AcceleratorDevice, check_size, count, measure, mebibytes

WHAT = "npu-smi info"
_BANNER = re.compile(r"npu-smi\s+\S+\s+Version:\s*(\S{1,40})")
_USED_OF = re.compile(r"([0-9]{1,12})\s*/\s*([0-9]{1,12})")
_HEALTH = re.compile(r"[A-Za-z]{1,20}\Z")
_BUS_ID = re.compile(r"[0-9A-Fa-fx]{4,8}:[0-9A-Fa-fx]{2}:[0-9A-Fa-fx]{2}\.[0-9A-Fa-f]\Z")


def parse_npu_smi_info(text: str) -> list[AcceleratorDevice]:
    """The chips of an `npu-smi info` table, with the version of its banner as the driver's
    (npu-smi is installed with, and versioned as, the driver package).

    >>> table = ("| NPU   Name   | Health | Power(W)  Temp(C)  Hugepages-Usage(page) |\\n"
    ...          "| Chip         | Bus-Id | AICore(%) Memory-Usage(MB) HBM-Usage(MB)  |\\n"
    ...          "| 3     910B   | OK     | 67.2      33       0    / 0              |\\n"
    ...          "| 0            | 0000:01:00.0 | 0   2472 / 15567   3    / 32768     |\\n")
    >>> chip = parse_npu_smi_info(table)[0]
    >>> chip.index, chip.model, chip.healthy, chip.power_w, chip.memory_total_bytes
    (3, '910B', True, 67.2, 34359738368)
    """
    check_size(text, WHAT)
    driver = None
    header_seen = in_processes = False
    first_row: tuple[int, str | None, str, str] | None = None
    devices = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            continue  # borders (+----, +====) and whatever else surrounds the table
        banner = _BANNER.search(line)
        if banner:
            driver = banner.group(1)
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0].startswith("NPU") and "Health" in line:
            header_seen, in_processes, first_row = True, False, None
            continue
        if "Process id" in line or "No running processes" in line:
            in_processes, first_row = True, None
            continue
        if not header_seen or in_processes or cells[0].startswith("Chip"):
            continue
        if len(cells) == 3 and _HEALTH.match(cells[1]):
            first_row = _first_row(cells)
        elif len(cells) == 3 and first_row is not None:
            device = _device(first_row, cells, driver)
            if device is not None:
                devices.append(device)
            first_row = None
        else:
            first_row = None
    if not header_seen:
        raise ParseError(f"{WHAT}: no device table header (| NPU  Name | Health | ...)")
    return devices


def _first_row(cells: list[str]) -> tuple[int, str | None, str, str] | None:
    """(NPU id, name, health, the power/temperature cell) of a chip's first row."""
    npu, _, name = cells[0].partition(" ")
    index = count(npu)
    if index is None:
        return None
    return index, name.strip() or None, cells[1], cells[2]


def _device(first_row: tuple[int, str | None, str, str], cells: list[str],
            driver: str | None) -> AcceleratorDevice | None:
    index, name, health, power_and_temperature = first_row
    power, temperature = (power_and_temperature.split() + ["", ""])[:2]
    chip = count(cells[0].split()[0]) if cells[0] else None
    if chip is None:
        return None
    usage = cells[2].split(maxsplit=1)
    memories = _USED_OF.findall(usage[1]) if len(usage) == 2 else []
    if not usage or not memories:
        return None
    used, total = memories[-1]  # HBM where the table has it, else the device's only memory
    return AcceleratorDevice(
        vendor="huawei", index=index, chip=chip, model=name,
        bus_id=cells[1] if _BUS_ID.match(cells[1]) else None,
        utilization_percent=measure(usage[0]),
        memory_used_bytes=mebibytes(used), memory_total_bytes=mebibytes(total),
        temperature_c=measure(temperature), power_w=measure(power),
        driver_version=driver, healthy=health == "OK")
