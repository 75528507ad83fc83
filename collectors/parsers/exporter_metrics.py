"""Which metrics of the vendors' Prometheus exporters mean what, and their scrapes as records.

GPU fleets run NVIDIA's dcgm-exporter, Ascend fleets Huawei's npu-exporter; their metric and
label names are the contract. The names below are the exporters' own: dcgm-exporter's
`etc/default-counters.csv` and `etc/dcp-metrics-included.csv` (fields such as
DCGM_FI_DEV_VBIOS_VERSION or the ECC totals are there but commented out: an operator turns
them on) and its label template (`internal/pkg/rendermetrics`); npu-exporter's collectors in
Ascend/mind-cluster (`component/npu-exporter/collector/metrics/collector_for_npu.go`,
`collector_for_hbm.go`). Sources and fixtures: tests/fixtures/inference/README.md.

The text is read with prometheus_client's parser, as the agent runtime's endpoint is
(collectors/agent.py); a text it cannot read is a ParseError, a series without a usable
device label is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from . import ParseError
from .accelerator import MIB, AcceleratorDevice, check_size

# record field -> metric names, the first present wins
DCGM_METRICS: dict[str, tuple[str, ...]] = {
    "utilization_percent": ("DCGM_FI_DEV_GPU_UTIL",),  # %, not reported for MIG instances
    "memory_used_bytes": ("DCGM_FI_DEV_FB_USED",),  # MiB
    "memory_free_bytes": ("DCGM_FI_DEV_FB_FREE",),  # MiB
    "memory_total_bytes": ("DCGM_FI_DEV_FB_TOTAL",),  # MiB, where configured
    "temperature_c": ("DCGM_FI_DEV_GPU_TEMP",),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE",),
    "last_xid": ("DCGM_FI_DEV_XID_ERRORS",),  # value of the last XID, 0 for none
    "ecc_corrected": ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",),  # single-bit, volatile
    "ecc_uncorrected": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",),  # double-bit, volatile
}
# record field -> label names; `UUID` is spelled `uuid` in dcgm-exporter's 1.x-compatible
# mode. The node's name is in `Hostname` (`hostname` in current releases).
DCGM_LABELS: dict[str, tuple[str, ...]] = {
    "index": ("gpu",),
    "uuid": ("UUID", "uuid"),
    "bus_id": ("pci_bus_id",),
    "model": ("modelName",),
    "gpu_instance": ("GPU_I_ID",),
    "driver_version": ("DCGM_FI_DRIVER_VERSION",),
    "firmware_version": ("DCGM_FI_DEV_VBIOS_VERSION",),
}

NPU_EXPORTER_METRICS: dict[str, tuple[str, ...]] = {
    "utilization_percent": ("npu_chip_info_utilization",),  # AI core %
    # HBM where the chip has it (910 series), else the chip's DDR (310P); MB that are MiB
    "memory_used_bytes": ("npu_chip_info_hbm_used_memory", "npu_chip_info_used_memory"),
    "memory_total_bytes": ("npu_chip_info_hbm_total_memory", "npu_chip_info_total_memory"),
    "temperature_c": ("npu_chip_info_temperature",),
    "power_w": ("npu_chip_info_power",),
    "healthy": ("npu_chip_info_health_status",),  # 1 healthy, 0 not (getHealthCode)
    "ecc_corrected": ("npu_chip_info_hbm_ecc_single_bit_error_cnt",),
    "ecc_uncorrected": ("npu_chip_info_hbm_ecc_double_bit_error_cnt",),
}
NPU_EXPORTER_LABELS: dict[str, tuple[str, ...]] = {
    "index": ("id",),
    "model": ("model_name",),
    "bus_id": ("pcie_bus_info",),
    "uuid": ("vdie_id",),  # the die's unique id
}
# npu_chip_info_error_code, then npu_chip_info_error_code_1 ... for further raised codes
NPU_ERROR_CODE = "npu_chip_info_error_code"

_MEMORY_FIELDS = {"memory_used_bytes", "memory_free_bytes", "memory_total_bytes"}
_COUNT_FIELDS = {"last_xid", "ecc_corrected", "ecc_uncorrected"}
_LARGEST_COUNT = 2.0 ** 63  # the exporters' counters are 64-bit


def exposition_samples(text: str, what: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    check_size(text, what)
    try:
        return [(sample.name, dict(sample.labels), float(sample.value))
                for family in text_string_to_metric_families(text)
                for sample in family.samples]
    except (ValueError, IndexError, KeyError, TypeError) as err:
        raise ParseError(f"{what}: not in the Prometheus text format: {str(err)[:120]}") from None


def parse_dcgm_exporter(text: str) -> list[AcceleratorDevice]:
    """One record per GPU, and per MIG instance (GPU_I_ID), of a dcgm-exporter scrape.

    >>> scrape = 'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-9e",modelName="A800"} 27\\n'
    >>> [(d.index, d.uuid, d.temperature_c) for d in parse_dcgm_exporter(scrape)]
    [(1, 'GPU-9e', 27.0)]
    """
    samples = exposition_samples(text, "dcgm-exporter")
    return _devices(samples, "nvidia", DCGM_METRICS, DCGM_LABELS,
                    key=lambda labels: (labels.get("gpu"), labels.get("GPU_I_ID")))


def parse_npu_exporter(text: str) -> list[AcceleratorDevice]:
    """One record per Ascend chip (label `id`) of an npu-exporter scrape.

    >>> scrape = 'npu_chip_info_health_status{id="0",model_name="910B"} 1\\n'
    >>> [(d.index, d.model, d.healthy) for d in parse_npu_exporter(scrape)]
    [(0, '910B', True)]
    """
    samples = exposition_samples(text, "npu-exporter")
    devices = _devices(samples, "huawei", NPU_EXPORTER_METRICS, NPU_EXPORTER_LABELS,
                       key=lambda labels: (labels.get("id"),))
    codes: dict[int, list[int]] = {}
    for name, labels, value in samples:
        index = _index(labels.get("id"))
        if index is not None and (name == NPU_ERROR_CODE or name.startswith(NPU_ERROR_CODE + "_")) \
                and math.isfinite(value) and value > 0:
            codes.setdefault(index, []).append(int(value))
    return [device._replace(error_codes=tuple(codes.get(device.index, ()))) for device in devices]


def _devices(samples: list[tuple[str, dict[str, str], float]], vendor: str,
             metrics: dict[str, tuple[str, ...]], label_names: dict[str, tuple[str, ...]],
             key: Callable[[dict[str, str]], tuple]) -> list[AcceleratorDevice]:
    field_of = {name: field for field, names in metrics.items() for name in names}
    rank = {name: names.index(name) for names in metrics.values() for name in names}
    found: dict[tuple, dict] = {}
    for name, labels, value in samples:
        field = field_of.get(name)
        index = _index(labels.get(label_names["index"][0]))
        if field is None or index is None or not math.isfinite(value):
            continue
        device = found.setdefault(key(labels), {"index": index, "_rank": {}})
        for attribute, names in label_names.items():
            if attribute != "index" and attribute not in device:
                text = next((labels[label] for label in names if labels.get(label)), None)
                if text is not None:
                    device[attribute] = text
        # the first sample of the preferred metric wins; a later duplicate series does not
        if field in device["_rank"] and device["_rank"][field] <= rank[name]:
            continue
        converted = _convert(field, value)
        if converted is not None:
            device[field] = converted
            device["_rank"][field] = rank[name]
    records = []
    for fields in found.values():
        fields.pop("_rank")
        records.append(AcceleratorDevice(vendor=vendor, **fields))
    return sorted(records, key=lambda device: (device.index, device.gpu_instance or ""))


def _index(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() and text.isascii() and len(text) < 7 else None


def _convert(field: str, value: float) -> float | int | bool | None:
    if field in _MEMORY_FIELDS:
        value *= MIB
    if field in _MEMORY_FIELDS or field in _COUNT_FIELDS:
        return int(value) if 0 <= value < _LARGEST_COUNT else None
    if field == "healthy":
        return value == 1
    return value
