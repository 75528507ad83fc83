"""The record every inference-accelerator parser returns: one GPU, MIG instance or NPU chip.

The four sources (nvidia-smi XML and CSV, npu-smi's table, the dcgm-exporter and npu-exporter
scrapes) report overlapping facts in their own units; the parsers convert to bytes, degrees
Celsius, watts and percent, and leave a field None where their source does not say.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from . import ParseError

MIB = 1 << 20
# nvidia-smi -q -x of eight GPUs with their supported-clock lists is about 0.5 MB; a scrape of
# an exporter on a large node a few MB. Far above either, far below what would hurt to hold.
MAX_OUTPUT_CHARS = 8 * 1024 * 1024

# How the tools print "no value": nvidia-smi "N/A", "[N/A]", "[Not Supported]",
# "Requested functionality has been deprecated", "Unknown Error"; npu-smi "NA" and "-".
_NUMBER = re.compile(r"\s*([-+]?[0-9]{1,20}(?:\.[0-9]{1,20})?)\s*(?:[A-Za-z%]{1,4})?\s*\Z")


class AcceleratorDevice(NamedTuple):
    vendor: str  # "nvidia" or "huawei"
    index: int  # nvidia-smi's GPU index, DCGM's `gpu`, the NPU id of npu-smi / npu-exporter
    model: str | None = None  # "NVIDIA A100-SXM4-80GB", "910B", "910Awn-Ascend-V1"
    bus_id: str | None = None  # PCI address as the tool prints it ("00000000:01:00.0")
    uuid: str | None = None
    chip: int | None = None  # the chip within an Ascend NPU card (npu-smi's Chip column)
    gpu_instance: str | None = None  # MIG GPU instance id (DCGM's GPU_I_ID)
    utilization_percent: float | None = None  # GPU busy %, Ascend AI core %
    memory_used_bytes: int | None = None  # device memory: GPU framebuffer, Ascend HBM
    memory_free_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    driver_version: str | None = None
    firmware_version: str | None = None  # NVIDIA VBIOS
    healthy: bool | None = None  # the vendor's own verdict where it gives one
    ecc_corrected: int | None = None  # volatile counts (since the driver loaded)
    ecc_uncorrected: int | None = None
    last_xid: int | None = None  # DCGM: the last XID error the driver reported, 0 if none
    error_codes: tuple[int, ...] = ()  # Ascend error codes currently raised


def check_size(text: str, what: str) -> None:
    """ParseError for an output larger than any real one (see MAX_OUTPUT_CHARS)."""
    if len(text) > MAX_OUTPUT_CHARS:
        raise ParseError(f"{what}: {len(text)} characters, more than {MAX_OUTPUT_CHARS}")


def measure(text: str | None) -> float | None:
    """The number of a tool's value with or without its unit; None for the tools' "no value"
    words and for anything that is not a finite number.

    >>> measure("67.03 W"), measure("27 C"), measure("65 %"), measure("[N/A]"), measure("-")
    (67.03, 27.0, 65.0, None, None)
    """
    if text is None:
        return None
    match = _NUMBER.match(text)
    if not match:
        return None
    value = float(match.group(1))
    return value if math.isfinite(value) else None


def mebibytes(text: str | None) -> int | None:
    """Bytes of a MiB figure ("50 MiB", "19818"); None where there is no number or it is
    negative."""
    value = measure(text)
    return int(value * MIB) if value is not None and value >= 0 else None


def count(text: str | None) -> int | None:
    """A non-negative whole count ("0", "12"); None otherwise."""
    value = measure(text)
    return int(value) if value is not None and value >= 0 and value == int(value) else None
