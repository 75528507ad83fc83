"""Parser for `nvidia-smi --query-gpu=FIELDS --format=csv`: one AcceleratorDevice per row.

With `--format=csv` nvidia-smi prints a header naming each field with its unit and values
with theirs; `nounits` drops both units, `noheader` the header line:

    index, name, memory.used [MiB], power.draw [W]
    0, NVIDIA H100 80GB HBM3, 19818 MiB, 631.95 W

A value it cannot give is `[N/A]`, `[Not Supported]` or another bracketed message. The
fields are the caller's choice; QUERY_FIELDS are the ones the record uses (`nvidia-smi
--help-query-gpu` lists them all).
"""

from __future__ import annotations

import csv
import io
import re

from . import ParseError
from .accelerator import AcceleratorDevice, check_size, count, measure, mebibytes

WHAT = "nvidia-smi --query-gpu"
QUERY_FIELDS = ("index", "name", "pci.bus_id", "uuid", "utilization.gpu", "memory.used",
                "memory.free", "memory.total", "temperature.gpu", "power.draw",
                "driver_version", "vbios_version", "ecc.errors.corrected.volatile.total",
                "ecc.errors.uncorrected.volatile.total")
# Newer drivers also offer power.draw.instant and power.draw.average; power.draw is the first
# of them a row carries.
_POWER_FIELDS = ("power.draw", "power.draw.instant", "power.draw.average")
_FIELD = re.compile(r"[a-z_][a-zA-Z0-9_.]{0,99}\Z")


def parse_query_gpu_csv(text: str, fields: tuple[str, ...] | None = None
                        ) -> list[AcceleratorDevice]:
    """The GPUs of a query-gpu CSV. `fields` names the columns of a `noheader` output;
    without it the first line must be the header. A row whose column count differs from
    the header's, or whose `index` is not a number, is skipped.

    >>> parse_query_gpu_csv("index, name, memory.used [MiB], temperature.gpu\\n"
    ...                     "0, NVIDIA H100 80GB HBM3, 19818 MiB, 59\\n")[0][:3]
    ('nvidia', 0, 'NVIDIA H100 80GB HBM3')
    """
    check_size(text, WHAT)
    try:
        rows = [row for row in csv.reader(io.StringIO(text, newline=""), skipinitialspace=True)
                if any(cell.strip() for cell in row)]
    except csv.Error as err:
        raise ParseError(f"{WHAT}: not CSV ({err})") from None
    if fields is None:
        if not rows:
            raise ParseError(f"{WHAT}: no header line")
        names = tuple(cell.strip().split(" [")[0] for cell in rows[0])
        rows = rows[1:]
    else:
        names = tuple(fields)
    if not names or not all(_FIELD.match(name) for name in names):
        raise ParseError(f"{WHAT}: not a header of query-gpu field names: {names[:4]!r}")
    devices = []
    for position, row in enumerate(rows):
        if len(row) != len(names):
            continue
        values = {name: cell.strip() for name, cell in zip(names, row, strict=True)}
        index = count(values["index"]) if "index" in values else position
        if index is None:
            continue
        devices.append(AcceleratorDevice(
            vendor="nvidia", index=index, model=_known(values.get("name")),
            bus_id=_known(values.get("pci.bus_id")), uuid=_known(values.get("uuid")),
            utilization_percent=measure(values.get("utilization.gpu")),
            memory_used_bytes=mebibytes(values.get("memory.used")),
            memory_free_bytes=mebibytes(values.get("memory.free")),
            memory_total_bytes=mebibytes(values.get("memory.total")),
            temperature_c=measure(values.get("temperature.gpu")),
            power_w=next((watts for watts in (measure(values.get(name)) for name in _POWER_FIELDS)
                          if watts is not None), None),
            driver_version=_known(values.get("driver_version")),
            firmware_version=_known(values.get("vbios_version")),
            ecc_corrected=count(values.get("ecc.errors.corrected.volatile.total")),
            ecc_uncorrected=count(values.get("ecc.errors.uncorrected.volatile.total"))))
    return devices


def _known(value: str | None) -> str | None:
    """A text value, None for nvidia-smi's bracketed "no value" messages and "N/A"."""
    if not value or value.startswith("[") or value == "N/A":
        return None
    return value
