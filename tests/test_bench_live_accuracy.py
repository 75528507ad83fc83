"""bench/live_accuracy.py counts a scenario that errors as a wrong run, from pytest's own
JUnit report of a real run (a fixture error, an exception, a failed assertion, a pass)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCENARIOS = '''
import pytest

@pytest.fixture
def broken_lab():
    raise OSError("no cgroup here")

def test_setup_errors(broken_lab):
    pass

def test_body_raises():
    raise RuntimeError("redis-server did not start")

def test_wrong_answer():
    assert 1 == 2

def test_right_answer():
    assert 1 == 1
'''


def _bench():
    spec = importlib.util.spec_from_file_location("live_accuracy_bench",
                                                  ROOT / "bench" / "live_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_errored_scenarios_are_found_in_the_report(tmp_path):
    (tmp_path / "test_scenarios_here.py").write_text(SCENARIOS)
    junit = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={junit}", str(tmp_path / "test_scenarios_here.py")],
                   cwd=tmp_path, capture_output=True, timeout=120,
                   env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    errored = dict(_bench().errored_tests(junit))
    assert set(errored) == {"test_setup_errors", "test_body_raises"}
    assert "no cgroup here" in errored["test_setup_errors"]
    assert "redis-server did not start" in errored["test_body_raises"]


def test_a_run_without_a_report_is_an_error(tmp_path):
    assert _bench().errored_tests(tmp_path / "missing.xml") == [
        ("(pytest run)", "no report: the run itself failed")]


def test_a_record_without_false_alarms_is_tabled_not_a_crash(capsys):
    # Reproduced: a scenario that logged no false_alarms key stopped the table (KeyError)
    # before the scenarios after it were printed.
    entries = [
        {"scenario": "kubernetes-cgroupfs", "expected": "offline-preemption", "correct": True,
         "wall_seconds": 30.0, "primary": "offline-preemption", "findings": []},
        {"scenario": "oom-kill", "expected": "oom-kill", "correct": True, "wall_seconds": 25.0,
         "primary": "oom-kill", "false_alarms": ["cpu-saturation"], "findings": []},
    ]
    assert _bench().print_table(entries, {}) is False  # the false alarm after it counts
    table = capsys.readouterr().out
    assert "kubernetes-cgroupfs" in table and "oom-kill" in table
    assert "runs right: 1/2" in table
