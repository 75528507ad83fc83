"""Names from a node are data: the report shows them as written, never as markup or terminal
commands.

Reproduced: any local user names its process (prctl PR_SET_NAME), and a SIGILL of a process
named `[/]` turned `fleetscope diagnose` into exit 3 "unexpected MarkupError" instead of the
critical isa-mismatch report (rich reads a str cell as markup); `[link=x]` made the name
vanish from the subjects line. A Prometheus `instance` label carrying ESC sequences (clear
screen, an OSC 52 clipboard write) reached the terminal raw.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from rich.console import Console

from fleetscope.core.units import printable
from fleetscope.diagnose.report import print_report
from tests.conftest import require_tool

CLEAR_AND_CLIPBOARD = "\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07"
HOSTILE = ("[/]", "[link=x]", "[bold red]", "\\[/]")

NAMED_CRASH_C = r"""
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
int main(int argc, char **argv) {
    /* ud2 in anonymous memory (as a JIT's code): the kernel's trap line has no file, and
       the process's name stands for the binary */
    static const unsigned char ud2[] = {0x0f, 0x0b};
    void *code = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED)
        return 1;
    memcpy(code, ud2, sizeof ud2);
    prctl(PR_SET_NAME, argv[1], 0, 0, 0);   /* the name the kernel logs with the trap */
    ((void (*)(void))code)();               /* SIGILL */
    return 0;
}
"""


def _document(name: str) -> dict:
    """A diagnosis of one isa-mismatch whose binary, node and pool carry `name`."""
    return {
        "format": 1, "source": "live", "nodes": [f"node{name}"], "status": "critical",
        "window": {"start": 1_764_633_600, "end": 1_764_633_620},
        "findings": [{
            "rule": "isa-mismatch", "node": f"node{name}", "severity": "critical",
            "confidence": 0.95, "summary": f"SIGILL crashes; {name} (pid 4242, 5 s ago)",
            "subjects": {"binaries": [name], "pids": [4242]},
            "evidence": [{"signal": f"SIGILL crashes of {name}", "value": 1.0,
                          "threshold": 0, "unit": "crashes"}],
            "cause": "a binary built for a newer ISA", "action": f"fleetscope isa check {name}",
            "phase": "ongoing", "explains": [f"pool{name}"]}],
        "not_evaluated": [],
        "harm": [{"node": f"node{name}", "pool": f"pool{name}", "signal": "x",
                  "title": "online processes started per minute", "value": 6.0,
                  "target": 2.0, "unit": "1/min", "since": 1_764_633_600,
                  "explained_by": ["isa-mismatch"]}],
        "fleet_findings": [{"severity": "warning", "summary": f"3 nodes share {name}"}],
    }


def _report(document: dict) -> str:
    out = io.StringIO()
    print_report(document, Console(file=out, width=120, color_system=None))
    return out.getvalue()


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_in_brackets_is_shown_as_written(name):
    text = _report(_document(name))
    assert text.count(name) >= 6, text  # header, harm, fleet line, summary, subjects, action
    assert f"subjects  binaries {name}; pids 4242" in text, text


def test_terminal_controls_in_a_name_are_shown_as_escapes():
    text = _report(_document(CLEAR_AND_CLIPBOARD))
    assert "\x1b" not in text and "\x07" not in text, repr(text)
    assert printable(CLEAR_AND_CLIPBOARD) in text, text
    assert printable(CLEAR_AND_CLIPBOARD) == "\\x1b[2J\\x1b]52;c;cm0gLXJmIH4=\\x07"


@pytest.mark.live
@pytest.mark.parametrize("name", ["[/]", "[link=x]"])
def test_a_crash_of_a_process_named_like_markup_is_diagnosed_live(name, tmp_path):
    """A real SIGILL of a process that named itself `name`: the live report is the critical
    isa-mismatch naming it, exit 2."""
    if os.uname().machine != "x86_64":
        pytest.skip("the crashing program runs x86-64 ud2")
    gcc = require_tool("gcc")
    source, binary = tmp_path / "named.c", tmp_path / f"fs_named_{os.getpid() % 10**6}"
    source.write_text(NAMED_CRASH_C)
    subprocess.run([gcc, "-O1", "-o", str(binary), str(source)], check=True,
                   capture_output=True, timeout=120)
    crashed = subprocess.run([str(binary), name], capture_output=True, timeout=30)
    assert crashed.returncode == -4, crashed  # SIGILL: the fault happened
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--seconds", "2"],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "isa-mismatch" in result.stdout and name in result.stdout, result.stdout
    assert "Error" not in result.stderr, result.stderr
