"""Files a user names are opened without waiting on them (issue #37): a FIFO (or a device,
or a directory) given as --config, --web-config or the config's accelerator_matrix is refused
at once with one line, instead of blocking at open() until some writer appears.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.hostile_corpus import FIXTURE, run


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "config.yaml"
    os.mkfifo(path)
    return path


def _refused(result, *words: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode is not None, "hung (killed at the guard timeout)"
    assert result.returncode == 3, (result.returncode, result.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in result.stderr, lines
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("argv", [
    ["diagnose", "--bundle", str(FIXTURE), "--config"],
    ["exporter", "--listen", "127.0.0.1:0", "--config"],
    ["bundle", "record", "--seconds", "0", "-o", "{out}", "--config"],
    ["exporter", "--listen", "127.0.0.1:0", "--web-config"],
])
def test_a_fifo_as_a_config_file_is_refused_at_once(tmp_path, fifo, argv):
    argv = [part.replace("{out}", str(tmp_path / "out.tar.gz")) for part in argv]
    _refused(run([*argv, str(fifo)], timeout=30), "not a regular file")


@pytest.mark.parametrize(("path", "says"), [("/dev/zero", "not a regular file"),
                                             ("{tmp}", "Is a directory")])
def test_a_device_or_a_directory_as_config_is_refused(tmp_path, path, says):
    path = path.replace("{tmp}", str(tmp_path))
    _refused(run(["diagnose", "--bundle", str(FIXTURE), "--config", path], timeout=30), says)


def test_a_fifo_as_the_accelerator_matrix_is_not_available(fifo):
    """The live collector's read of the matrix file (a scrape must not block on it)."""
    probe = ("from fleetscope.collectors.accelerator import _read_file\n"
             "from fleetscope.collectors.base import NotAvailable\n"
             "try:\n"
             f"    _read_file({str(fifo)!r})\n"
             "except NotAvailable as err:\n"
             "    print(err)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=30, stdin=subprocess.DEVNULL)
    assert "not a regular file" in result.stdout, result.stderr[-2000:]
