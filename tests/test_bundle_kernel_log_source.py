"""`bundle record` on a node where reading the kernel's ring buffer is refused
(kernel.dmesg_restrict, a container without CAP_SYSLOG) takes the journal's copy of the
kernel log (`journalctl -k`), and meta.json says which it used. This machine's journal is
empty and its dmesg works, so both are stood in for on PATH: dmesg as a restricted node
answers it, journalctl printing the records in its `-o short-iso` form (the form of
tests/fixtures/kmsg/README.md's journal samples), only when called with the arguments the
recorder must give."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fleetscope.bundle.record import KERNEL_LOG_COMMANDS

JOURNAL = ("2026-12-07T04:10:11+0000 node-7 kernel: traps: agent_worker[4242] trap invalid "
           "opcode ip:55d6cc46a139 sp:7ffd6c2b1e40 error:0 in agent_worker[55d6cc46a000+1000]\n")
REFUSED = ("#!/bin/sh\necho 'dmesg: read kernel buffer failed: Operation not permitted' >&2\n"
           "exit 1\n")


def _tool(directory, name: str, script: str) -> None:
    path = directory / name
    path.write_text(script)
    path.chmod(0o755)


def _record(tmp_path, path_dir) -> tuple[subprocess.CompletedProcess, dict, str | None]:
    output = tmp_path / "bundle"
    env = {**os.environ, "PATH": f"{path_dir}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-m", "fleetscope", "bundle", "record",
                             "--seconds", "0", "-o", str(output)], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    meta = json.loads((output / "meta.json").read_text())
    dmesg = output / "static" / "dmesg.txt"
    return result, meta, dmesg.read_text() if dmesg.exists() else None


def test_a_refused_dmesg_falls_back_to_the_journal_and_says_so(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    journal = tmp_path / "journal.txt"
    journal.write_text(JOURNAL)
    expected = " ".join(KERNEL_LOG_COMMANDS[1][1:])
    _tool(tools, "dmesg", REFUSED)
    _tool(tools, "journalctl", f'#!/bin/sh\n[ "$*" = "{expected}" ] || exit 1\n'
                               f"cat '{journal}'\n")
    result, meta, recorded = _record(tmp_path, tools)
    assert recorded == JOURNAL
    assert meta["kernel_log"] == "journalctl " + expected
    assert "journalctl -k" in result.stderr and "dmesg" in result.stderr


def test_neither_gives_a_log_then_the_bundle_has_none_and_says_nothing_false(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    _tool(tools, "dmesg", REFUSED)
    _tool(tools, "journalctl", "#!/bin/sh\nexit 0\n")  # no journal: -q prints nothing
    _result, meta, recorded = _record(tmp_path, tools)
    assert recorded is None and "kernel_log" not in meta


def test_a_readable_ring_buffer_is_what_is_recorded(tmp_path):
    if subprocess.run(["dmesg"], capture_output=True).returncode != 0:
        pytest.skip("dmesg is refused here")
    tools = tmp_path / "bin"
    tools.mkdir()
    _tool(tools, "journalctl", "#!/bin/sh\necho 'the journal must not be read' \n")
    _result, meta, recorded = _record(tmp_path, tools)
    assert meta["kernel_log"] == "dmesg"
    assert recorded and "the journal must not be read" not in recorded
