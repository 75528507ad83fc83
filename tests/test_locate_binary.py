"""A crash names a binary by its file name; live `diagnose` and `bundle record` then read the
file of that name they find. Any local user can put a path on a command line (a process's
argv is theirs to choose): only regular files of a bounded size, owned by root or by the user
whose process named them, are read; a FIFO never (its open blocks), an enormous file never.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from fleetscope.tools.isa import MAX_BINARY_BYTES, locate_binary

NOBODY = 65534
SLEEPER = "sleep 30; :"  # a shell waiting: its argv names the path ($0), nothing runs it


def _needs_root():
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")


def _named_on_a_command_line(path, uid: int | None = None) -> subprocess.Popen:
    """A process (of `uid`, root's by default) whose argv holds `path`: as a supervisor
    restarting a worker names it."""
    def drop():
        if uid is not None:
            os.setgid(uid)
            os.setuid(uid)
    sleeper = subprocess.Popen(["/bin/sh", "-c", SLEEPER, str(path)], preexec_fn=drop)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until its argv is the sleeper's, not the fork's
        with open(f"/proc/{sleeper.pid}/cmdline", "rb") as argv:
            if str(path).encode() in argv.read():
                return sleeper
        time.sleep(0.05)
    sleeper.kill()
    raise AssertionError("the process never showed its argv")


@pytest.mark.live
def test_a_path_on_a_command_line_is_read_only_when_its_owner_may_name_it(tmp_path):
    _needs_root()
    tmp_path.chmod(0o755)
    binary = tmp_path / f"fs_loc_{os.getpid()}"
    binary.write_bytes(b"\x7fELF" + b"\0" * 60)
    os.chown(binary, NOBODY, NOBODY)
    nobody_process = _named_on_a_command_line(binary, NOBODY)
    try:  # nobody's own file, but no program: a file named as an argument is not a binary
        assert locate_binary(binary.name) is None
    finally:
        nobody_process.kill()
        nobody_process.wait()
    binary.chmod(0o755)
    root_process = _named_on_a_command_line(binary)
    try:
        assert locate_binary(binary.name) is None  # root's process, nobody's file
    finally:
        root_process.kill()
        root_process.wait()
    nobody_process = _named_on_a_command_line(binary, NOBODY)
    try:
        assert locate_binary(binary.name) == str(binary)  # nobody names nobody's own file
    finally:
        nobody_process.kill()
        nobody_process.wait()
    os.chown(binary, 0, 0)
    root_process = _named_on_a_command_line(binary)
    try:
        assert locate_binary(binary.name) == str(binary)  # root's own
    finally:
        root_process.kill()
        root_process.wait()


def test_a_fifo_or_an_enormous_file_is_never_read(tmp_path):
    fifo = tmp_path / "fs_loc_fifo"
    os.mkfifo(fifo)
    assert locate_binary(fifo.name, directories=(str(tmp_path),)) is None
    huge = tmp_path / "fs_loc_huge"
    with open(huge, "wb") as sparse:  # sparse: no disk used
        sparse.truncate(MAX_BINARY_BYTES + 1)
    assert locate_binary(huge.name, directories=(str(tmp_path),)) is None
    fine = tmp_path / "fs_loc_fine"
    fine.write_bytes(b"\x7fELF")
    assert locate_binary(fine.name, directories=(str(tmp_path),)) == str(fine)
