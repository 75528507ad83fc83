"""Parser for the version files the Ascend driver and firmware packages install,
/usr/local/Ascend/driver/version.info and /usr/local/Ascend/firmware/version.info: the NPU
firmware version no npu-smi table or npu-exporter scrape reports. Ascend's fault-diagnosis
guide collects both with `cat` (tests/fixtures/inference/ascend-version-info):

    Version=24.1.rc1                            (driver/version.info)
    ascendhal_version=7.35.19
    Innerversion=V100R001C15SPC006B220
    compatible_version=[V100R001C30],[V100R001C13],[V100R001C15],[V100R001C17]
    compatible_version_fw=[7.0.0,7.2.99]

    Version=7.1.0.11.220                        (firmware/version.info)
    package_version=23.0.7
    compatible_version_drv=[23.0.rc3,23.0.rc3.],[23.0.0,23.0.0.]

One `key=value` a line. `Version` is the package's version; each file also declares the range
of the other side's versions it was released for, as `[low,high]` pairs kept verbatim here
(the trailing "." of "23.0.rc3." is the package's own notation). A line that is not
`key=value`, or a range that is not `[low,high]`, costs that line or range only; a text with
no `key=value` line or no `Version` is a ParseError.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from . import ParseError

MAX_VERSION_INFO_CHARS = 64 * 1024  # the files are a dozen short lines
_LINE = re.compile(r"([A-Za-z][A-Za-z0-9_]{0,63})=(.{0,1024})\Z")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}\Z")
_RANGE = re.compile(r"\[([A-Za-z0-9._+-]{1,64}),([A-Za-z0-9._+-]{1,64})\]")


class VersionInfo(NamedTuple):
    version: str  # the package's Version=
    compatible: tuple[tuple[str, str], ...]  # the other side's [low, high] ranges it declares
    fields: dict[str, str]  # every key=value line, as written


def _parse(text: str, what: str, compatible_key: str) -> VersionInfo:
    if len(text) > MAX_VERSION_INFO_CHARS:
        raise ParseError(f"{what}: {len(text)} characters, more than {MAX_VERSION_INFO_CHARS}")
    fields: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match:
            fields.setdefault(match.group(1), match.group(2).strip())
    if not fields:
        raise ParseError(f"{what}: no key=value line")
    version = fields.get("Version", "")
    if not _VERSION.match(version):
        raise ParseError(f"{what}: no Version= line with a version")
    ranges = []
    for item in fields.get(compatible_key, "").split("],"):
        item = item.strip()
        match = _RANGE.fullmatch(item if item.endswith("]") else item + "]")
        if match:
            ranges.append((match.group(1), match.group(2)))
    return VersionInfo(version, tuple(ranges), fields)


def parse_driver_version_info(text: str) -> VersionInfo:
    """driver/version.info: the driver's Version and the firmware ranges it declares
    (`compatible_version_fw`).

    >>> info = parse_driver_version_info("Version=24.1.rc1\\n"
    ...                                  "compatible_version_fw=[7.0.0,7.2.99]\\n")
    >>> info.version, info.compatible
    ('24.1.rc1', (('7.0.0', '7.2.99'),))
    """
    return _parse(text, "driver/version.info", "compatible_version_fw")


def parse_firmware_version_info(text: str) -> VersionInfo:
    """firmware/version.info: the firmware's Version and the driver ranges it declares
    (`compatible_version_drv`)."""
    return _parse(text, "firmware/version.info", "compatible_version_drv")
