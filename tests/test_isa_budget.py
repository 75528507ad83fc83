"""The ELF reads about SIGILL crashes are bounded in time as a whole (issue #37): a big
library's whole-binary check (Python decodes a 16 MB one in ~8 s, a 100 MB one in a minute),
or many binaries, end at the command's `isa_scan_seconds` with the files not read named."""

from __future__ import annotations

import glob
import os
import time

import pytest

from fleetscope.bundle.commands import CommandOutputs
from fleetscope.collectors.source import LiveHost
from fleetscope.core.config import parse_config
from fleetscope.tools.isa import LIBRARY_DIRS
from fleetscope.tools.isa_budget import IsaBudget


def _big_libraries(count: int) -> list[str]:
    """This machine's largest root-owned ELF libraries in the usual directories."""
    found = set()
    for directory in LIBRARY_DIRS:
        for path in glob.glob(os.path.join(directory, "*.so*")):
            try:
                info = os.stat(path)
                with open(path, "rb") as handle:
                    elf = handle.read(4) == b"\x7fELF"
            except OSError:
                continue
            if elf and info.st_uid == 0 and info.st_size > 8 << 20:
                found.add(os.path.realpath(path))
    return sorted(found, key=os.path.getsize, reverse=True)[:count]


def _cpuinfo() -> str:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
        return handle.read()


def _sigill_log(names: list[str]) -> str:
    return "".join(f"[ 100.{i:06d}] traps: {name}[{10 + i}] trap invalid opcode "
                   f"ip:7f0000001234 sp:2 error:0 in {name}[7f0000000000+1000000]\n"
                   for i, name in enumerate(names))


def test_a_check_past_the_budget_is_stopped_and_named():
    libraries = _big_libraries(1)
    if not libraries:
        pytest.skip("no ELF library over 8 MiB on this machine")
    budget = IsaBudget(1.0)
    start = time.monotonic()
    assert budget.check(libraries[0], _cpuinfo(), "/proc/cpuinfo") is None
    assert time.monotonic() - start < 2.5
    reason = budget.reason()
    assert os.path.basename(libraries[0]) in reason, reason
    assert "1 s budget" in reason and "isa_scan_seconds" in reason, reason


def test_a_check_inside_the_budget_answers_as_unbounded():
    budget = IsaBudget(60.0)
    document = budget.check("/bin/true", _cpuinfo(), "/proc/cpuinfo")
    from fleetscope.tools.isa import check_against_cpuinfo

    assert document == check_against_cpuinfo("/bin/true", _cpuinfo(), "/proc/cpuinfo")
    assert budget.reason() == ""


def test_bundle_records_checks_of_many_big_binaries_within_the_budget(tmp_path):
    """`bundle record`'s whole-binary checks of the binaries the kernel log saw die: three
    big libraries take a minute or more unbounded; with isa_scan_seconds: 2 they end in it,
    and what they did not cover is not written."""
    libraries = _big_libraries(3)
    if len(libraries) < 2:
        pytest.skip("fewer than two ELF libraries over 8 MiB on this machine")
    names = [os.path.basename(path) for path in libraries]
    config = parse_config({"isa_scan_seconds": 2})
    commands = CommandOutputs(config, LiveHost())
    start = time.monotonic()
    commands.static(str(tmp_path), _sigill_log(names))
    assert time.monotonic() - start < 4.0
    assert not glob.glob(str(tmp_path / "cmd" / f"isa-check-{names[0]}.json"))
