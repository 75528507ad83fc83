"""The console's commands name a finding's subjects as shell words and its Markdown shows
names as written.

Reproduced: a process named `x;reboot #` that crashed put `fleetscope isa check x;reboot #` in
the console's Action and runbook commands (placeholders were filled raw): an SRE who copied
it rebooted the node. A subject with a backtick ended its code span.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from fleetscope.dashboard.evidence_frames import subjects_line
from fleetscope.dashboard.rulebook import (
    code_span,
    fill_commands,
    placeholder_values,
    shell_word,
)

HOSTILE = ("x;reboot #", "$(reboot)", "a b", "it's", "`reboot`", "tab\there", "esc\x1b[2J",
           "ünïcode", "-rf", "*")


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_in_a_command_is_one_word_to_a_real_shell(name):
    """bash reads the filled command's argument back as exactly the name, nothing run."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    word = shell_word(name)
    printed = subprocess.run([bash, "-c", f"printf '%s' {word}"], capture_output=True,
                             timeout=30)
    assert printed.returncode == 0 and printed.stdout.decode() == name, (word, printed)
    assert "`" not in word and "\x1b" not in word, word  # safe in a code span, a terminal


def test_the_action_quotes_a_crashing_binarys_name():
    values = placeholder_values({"binaries": ["x;reboot #"], "pids": [6387]})
    action = fill_commands("fleetscope isa check BINARY names it; ls -l /proc/PID/fd",
                           values, code_only=False)
    assert action == "fleetscope isa check `'x;reboot #'` names it; ls -l /proc/6387/fd"
    runbook = fill_commands("Run `fleetscope isa check BINARY` on the node.\n\n```\n"
                            "fleetscope stacks PID\n```\nPID and BINARY in prose stay.", values)
    assert "`fleetscope isa check 'x;reboot #'`" in runbook
    assert "fleetscope stacks 6387" in runbook and "PID and BINARY in prose" in runbook


@pytest.mark.parametrize("text, span", [("plain", "`plain`"), ("a`b", "``a`b``"),
                                        ("`x`", "`` `x` ``"), ("a``b", "```a``b```")])
def test_a_code_span_holds_any_backticks(text, span):
    assert code_span(text) == span


def test_subjects_are_code_spans_whatever_they_hold():
    line = subjects_line({"binaries": ["a`b", "ok"], "pids": [1]})
    assert line == "**Subjects:** binaries: ``a`b``, `ok`; pids: `1`"
