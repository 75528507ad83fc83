"""`fleetscope diagnose`'s terminal report (diagnose/report.py) at 80 to 120 columns, on the
fixture bundles' real diagnoses: actions wrap a few lines with their indent, runbook paths
and long words are never split, alike findings are one block, and a bundle diagnosis shows
no "sampling" bar."""

from __future__ import annotations

import copy
import io
import json
import os
import re
import select
import subprocess
import sys
import time

import pytest
from rich.console import Console

from fleetscope.diagnose.report import group_findings, print_report
from tests.conftest import BUNDLES, SCENARIOS


def diagnosis_of(bundle) -> dict:
    """A real `diagnose --bundle --json` of a critical fixture bundle."""
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                             str(bundle), "--json"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def document() -> dict:
    return diagnosis_of(BUNDLES / "kunpeng-128")


@pytest.fixture(scope="module")
def crash_document() -> dict:
    return diagnosis_of(SCENARIOS / "isa-mismatch")


def render(document: dict, width: int) -> list[str]:
    out = io.StringIO()
    print_report(document, Console(file=out, width=width, color_system=None))
    return out.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 100, 120])
def test_every_line_fits_and_actions_take_a_few_lines(document, width):
    lines = render(document, width)
    assert max(len(line) for line in lines) <= width
    assert not [line for line in lines if line != line.rstrip()]  # no padding at line ends
    for finding in document["findings"]:
        start = next(i for i, line in enumerate(lines) if line.strip().startswith("action")
                     and finding["action"].split()[0] in line and i > lines.index(next(
                         x for x in lines if f"{finding['rule']} on" in x)))
        block = [lines[start]]
        for line in lines[start + 1:]:
            if line.strip().startswith("runbook"):
                break
            block.append(line)
        column = lines[start].index(finding["action"].split()[0])
        assert all(line[:column].strip() == "" for line in block[1:])  # indent kept
        words = len(finding["action"])
        assert len(block) <= max(2, 2 * words // (width - column) + 1), block


@pytest.mark.parametrize("width", [80, 100])
def test_runbook_paths_and_long_words_are_never_split(document, width):
    text = "\n".join(render(document, width))
    for finding in document["findings"]:
        assert re.search(rf"runbook\s+fleetscope runbook {finding['rule']}\n", text)
        path = finding.get("runbook_path")
        if path and len(path) < width - 20:
            assert re.search(rf"\n\s+{re.escape(path)}\n", text + "\n")
        for cgroup in finding["subjects"].get("cgroups", []):
            if len(cgroup) < width - 20:
                assert cgroup in text  # a path stays whole on one line


def test_evidence_reads_in_units(document):
    text = "\n".join(render(document, 100))
    assert re.search(r"online pool run-queue delay per process\s+\d+ ms/s\s+needs over 50 ms/s: "
                     r"met\n", text)
    # (a long signal wraps in its column: the value stands beside its first line)
    assert re.search(r"SIGILL crashes in the(\s+kernel log)?\s+\d+ crashes", text)
    assert "e+" not in text and "0.989258" not in text


def test_alike_findings_are_one_block_naming_every_node(document):
    crash = next(f for f in document["findings"] if f["rule"] == "isa-mismatch")
    fleet = copy.deepcopy(document)
    fleet["findings"] = [dict(copy.deepcopy(crash), node=f"r067n{n:02d}", summary=crash[
        "summary"], confidence=0.9 - n / 1000) for n in range(32)] + document["findings"][:1]
    fleet["nodes"] = [f"r067n{n:02d}" for n in range(32)]
    assert [len(g) for g in group_findings(fleet["findings"])] == [32, 1]
    lines = render(fleet, 100)
    titles = [line for line in lines if re.match(r"\s+\d+\s+(CRITICAL|WARNING|INFO)", line)]
    assert len(titles) == 2 and "isa-mismatch on 32 nodes" in titles[0]
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("nodes"))
    nodes = " ".join(lines[start:start + 3])
    assert "r067n00, r067n01" in nodes and "and 20 more" in nodes


AGENT_CAUSE = ("no agent runtime metrics: set agent_metrics_url / redis_queues (a bundle "
               "carries them as agent.prom)")


def test_not_evaluated_rules_are_grouped_by_cause(document):
    """One entry per cause with how many rules it leaves unevaluated; the rules and their
    signals only with --verbose (22 rules with their signals filled 60 lines)."""
    items = document["not_evaluated"]
    # ground truth from the contract's reasons: the rules whose reason gives that cause
    agent = [item["rule"] for item in items if AGENT_CAUSE in item["reason"]]
    assert len(agent) >= 2
    text = "\n".join(render(document, 100))
    flat = " ".join(text.split())
    assert flat.count("no agent runtime metrics") == 1
    assert f"{len(agent)} rules {AGENT_CAUSE}" in flat
    assert "agent_queue_depth" not in text and "queue-backlog" not in text
    section = text[text.index("Not evaluated"):].splitlines()
    assert len(section) <= 2 + 3 * len({c["cause"] for i in items for c in i["causes"]})
    out = io.StringIO()
    print_report(document, Console(file=out, width=100, color_system=None), verbose=True)
    verbose = " ".join(out.getvalue().split())
    assert f"{len(agent)} rules {AGENT_CAUSE} rules {', '.join(agent)} missing " in verbose
    assert "agent_queue_depth" in verbose


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_a_bundle_diagnosis_shows_no_sampling_bar():
    """On a terminal the bar says what it does: a bundle is read, not sampled."""
    controller, terminal = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                             str(BUNDLES / "kunpeng-128")], stdout=terminal,
                            stderr=terminal, env=dict(os.environ, COLUMNS="100"))
    os.close(terminal)
    seen = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 1)
        if ready:
            try:
                chunk = os.read(controller, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout=60)
    os.close(controller)
    assert proc.returncode == 2
    assert b"sampling" not in seen
    assert b"reading the bundle" in seen


@pytest.mark.parametrize("width", [80, 120])
def test_a_crash_time_reads_as_a_time_beside_a_readable_signal(crash_document, width):
    """The isa-mismatch evidence holds a crash's time against the look-back's start: read as
    times (not 1,764,662,464 unix seconds), and long numbers put each signal on a line of its
    own rather than squeezing every signal into a 20-column strip."""
    lines = render(crash_document, width)
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= width
    assert "unix seconds" not in text
    # the look-back's start, on the crash's day, as a time of day; the crash inside it (the
    # reading may wrap under its time at 80 columns)
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ needs after \d\d:\d\d:\d\d \S+: "
                     r"met, [\d.]+ min after it", " ".join(text.split()))
    # "seconds since the last crash" must be below its threshold (crashing now: the last
    # 5 minutes): under 5 min, and it is
    assert re.search(r"\d s  needs under (5 min|300 s): met", text) \
        and "needs over" not in text
    for signal in ("SIGILL crashes in the kernel log", "seconds since the last SIGILL crash"):
        assert any(signal in line for line in lines), signal  # whole, on one line


def test_a_node_without_pools_gets_one_line_per_cause_and_the_signals_on_verbose(tmp_path):
    """kunpeng-128 diagnosed without its pools: 25 rules not evaluated filled 64 lines with
    their signals, three causes said over and over. Now one entry per cause, counted against
    the JSON's reasons, the pools' with where to read how to name them."""
    empty = tmp_path / "no-pools.yaml"
    empty.write_text("{}\n")
    command = [sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
               str(BUNDLES / "kunpeng-128"), "--config", str(empty)]
    document = json.loads(subprocess.run(command + ["--json"], capture_output=True, text=True,
                                         timeout=120).stdout)
    no_pools = [item["rule"] for item in document["not_evaluated"]
                if "no workload pools in the config" in item["reason"]]
    assert len(no_pools) >= 8
    text = subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
    section = text[text.index("Not evaluated"):]
    flat = " ".join(section.split())
    assert flat.count("no workload pools in the config") == 1
    assert f"{len(no_pools)} rules no workload pools in the config: add `pools:` to it" in flat
    assert "docs/exporter.md" in flat and "docs/kubernetes.md" in flat
    assert "fleetscope_pool_" not in section and "fd-exhaustion" not in section
    causes = {c["cause"] for item in document["not_evaluated"] for c in item["causes"]}
    assert len(section.splitlines()) <= 1 + 3 * len(causes) < 40
    verbose = subprocess.run(command + ["--verbose"], capture_output=True, text=True,
                             timeout=120).stdout
    flat = " ".join(verbose[verbose.index("Not evaluated"):].split())
    assert f"rules {', '.join(no_pools)} missing fleetscope_pool_" in flat


def test_pools_configured_are_not_called_missing(document):
    """kunpeng-128 names its pools; lock-contention lacked fleetscope_pool_file_lock_waiters
    (a bundle recorded without /proc/locks) and its reason said 'no workload pools in the
    config' beside findings about those pools."""
    assert any("pool chat-online" in f["summary"] for f in document["findings"])
    reasons = {item["rule"]: item["reason"] for item in document["not_evaluated"]}
    assert "no workload pools" not in reasons["lock-contention"]
    assert "pools configured, but none of their processes gave these series" in \
        reasons["lock-contention"]
