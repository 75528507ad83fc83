"""The operator's driver/firmware compatibility matrix (config `accelerator_matrix`), a YAML
file whose format docs/accelerators.md defines; examples/accelerator-matrix.yaml is one built
from the vendors' published release notes:

    format: fleetscope-accelerator-matrix/1
    matrix:
      - vendor: nvidia
        model: "NVIDIA A100*80GB*"        # glob on the model name the device reports
        driver: ["535.*", {from: "525.85.12", to: "525.105.03"}]
        firmware: ["92.00.45.00.05"]      # absent: any firmware
        source: "NVIDIA Data Center GPU driver release notes 525.85.12"

Read with yaml.safe_load; anything else than that shape is a ParseError of one line naming
the entry. A device is listed when one entry of its vendor matches its model, its driver and,
where the entry names firmware, its firmware.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Any, NamedTuple

from . import ParseError

FORMAT = "fleetscope-accelerator-matrix/1"
VENDORS = ("nvidia", "huawei")
MAX_MATRIX_CHARS = 1024 * 1024  # a matrix names some hundreds of pairs
MAX_ENTRIES = 10_000
_ENTRY_KEYS = {"vendor", "model", "driver", "firmware", "source"}
_TOKEN = re.compile(r"[0-9]+|[A-Za-z]+")


class VersionRange(NamedTuple):
    low: str | None
    high: str | None


Version = str | VersionRange  # an exact version, a glob ("535.*") or an inclusive range


class MatrixEntry(NamedTuple):
    vendor: str
    model: str
    drivers: tuple[Version, ...]
    firmware: tuple[Version, ...] | None  # None: any firmware


def version_key(version: str) -> tuple:
    """Order of versions as the vendors number them: numbers as numbers (535.54 before
    535.104), words ("rc") after numbers, case-insensitive.

    >>> version_key("535.54.03") < version_key("535.104.05") < version_key("535.129.03")
    True
    """
    return tuple((0, int(token), "") if token.isdigit() else (1, 0, token.lower())
                 for token in _TOKEN.findall(version))


def _matches(version: str, allowed: tuple[Version, ...]) -> bool:
    for item in allowed:
        if isinstance(item, VersionRange):
            key = version_key(version)
            if (item.low is None or version_key(item.low) <= key) and \
                    (item.high is None or key <= version_key(item.high)):
                return True
        elif fnmatchcase(version.lower(), item.lower()):
            return True
    return False


def listed(matrix: tuple[MatrixEntry, ...], vendor: str, model: str | None,
           driver: str | None, firmware: str | None) -> bool | None:
    """Whether the device's driver/firmware pair is in the matrix; None when it cannot be
    told: no driver version, or no firmware version where every entry for the model and
    driver names firmware.

    >>> m = parse_matrix('matrix: [{vendor: huawei, model: "910*", driver: [24.1.rc1], '
    ...                  'firmware: [7.1.0.6.220]}]')
    >>> listed(m, "huawei", "910B", "24.1.rc1", "7.1.0.6.220"), listed(m, "huawei", "910B",
    ...        "23.0.3", "7.1.0.6.220"), listed(m, "huawei", "910B", "24.1.rc1", None)
    (True, False, None)
    """
    if not driver:
        return None
    unknown = False
    for entry in matrix:
        if entry.vendor != vendor or not fnmatchcase((model or "").lower(), entry.model.lower()):
            continue
        if not _matches(driver, entry.drivers):
            continue
        if entry.firmware is None:
            return True
        if not firmware:
            unknown = True
        elif _matches(firmware, entry.firmware):
            return True
    return None if unknown else False


def _versions(raw: Any, where: str) -> tuple[Version, ...]:
    if not isinstance(raw, list) or not raw:
        raise ParseError(f"{where} must be a non-empty list of versions, globs or "
                         "{from: V, to: V} ranges")
    items: list[Version] = []
    for item in raw:
        if isinstance(item, (str, int, float)) and not isinstance(item, bool) and str(item):
            items.append(str(item))
        elif isinstance(item, dict) and item and set(item) <= {"from", "to"} and all(
                isinstance(v, (str, int, float)) and not isinstance(v, bool)
                for v in item.values()):
            low, high = item.get("from"), item.get("to")
            items.append(VersionRange(None if low is None else str(low),
                                      None if high is None else str(high)))
        else:
            raise ParseError(f"{where}: {str(item)[:60]!r} is not a version, a glob or a "
                             "{from: V, to: V} range")
    return tuple(items)


def parse_matrix(text: str) -> tuple[MatrixEntry, ...]:
    """The entries of a matrix file's text (module docstring), or ParseError."""
    import yaml

    if len(text) > MAX_MATRIX_CHARS:
        raise ParseError(f"accelerator matrix: larger than {MAX_MATRIX_CHARS} characters")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ParseError(f"accelerator matrix: not valid YAML{where}") from None
    except RecursionError:
        raise ParseError("accelerator matrix: nested too deeply") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("matrix"), list):
        raise ParseError("accelerator matrix: must be a mapping with a `matrix:` list")
    if set(raw) - {"format", "matrix"}:
        extra = ", ".join(sorted(map(str, set(raw) - {"format", "matrix"})))
        raise ParseError(f"accelerator matrix: unknown keys {extra} (known: format, matrix)")
    if raw.get("format", FORMAT) != FORMAT:
        raise ParseError(f"accelerator matrix: format must be {FORMAT}, got "
                         f"{str(raw['format'])[:40]!r}")
    if len(raw["matrix"]) > MAX_ENTRIES:
        raise ParseError(f"accelerator matrix: more than {MAX_ENTRIES} entries")
    entries = []
    for index, item in enumerate(raw["matrix"]):
        where = f"accelerator matrix entry {index}"
        if not isinstance(item, dict):
            raise ParseError(f"{where} must be a mapping with vendor, model, driver")
        unknown = set(item) - _ENTRY_KEYS
        if unknown:
            raise ParseError(f"{where}: unknown keys {', '.join(sorted(map(str, unknown)))} "
                             f"(known: {', '.join(sorted(_ENTRY_KEYS))})")
        if item.get("vendor") not in VENDORS:
            raise ParseError(f"{where}: vendor must be one of {', '.join(VENDORS)}")
        model = item.get("model", "*")
        if not isinstance(model, str) or not model:
            raise ParseError(f"{where}: model must be a glob string")
        firmware = item.get("firmware")
        entries.append(MatrixEntry(
            item["vendor"], model, _versions(item.get("driver"), f"{where}: driver"),
            None if firmware is None else _versions(firmware, f"{where}: firmware")))
    return tuple(entries)
