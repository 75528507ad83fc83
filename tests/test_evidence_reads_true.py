"""Evidence that reads true, on real diagnoses of the fixture bundles (and copies of them with
kernel log lines added in the kernel's own format): no evidence row of the report or of the
console's evidence table puts a value beside a condition it does not meet as if it met it
('21.6 min < 15 min', '05:16:37 UTC after 07:05:15 UTC', '28x below'), and a finding's summary
counts what its evidence lists ('1 kill' beside a kernel log of 5).

The verdicts are checked against the numbers themselves (the value, the threshold and the side
the rule fires on), and the counts against the lines the test wrote.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from fleetscope.core import units
from fleetscope.dashboard import evidence_frames
from fleetscope.diagnose.report import print_report
from fleetscope.rules.catalog import evidence_picks
from tests.conftest import BUNDLES, SCENARIOS

KILL_CGROUP = "/kubepods.slice/kubepods-burstable.slice/online/agent-chat-7d9f"


def diagnose(bundle: Path, *extra: str) -> tuple[int, str]:
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                             str(bundle), *extra], capture_output=True, text=True,
                            timeout=300, env={**os.environ, units.TIME_ZONE_ENV: "UTC"})
    assert result.returncode in (0, 1, 2), result.stderr
    return result.returncode, result.stdout


def document_of(bundle: Path) -> dict:
    return json.loads(diagnose(bundle, "--json")[1])


def render(document: dict, width: int = 100, **options) -> str:
    out = io.StringIO()
    print_report(document, Console(file=out, width=width, color_system=None), **options)
    return out.getvalue()


def meets(value: float, threshold: float, pick: str) -> bool:
    """Ground truth: the value is on the side of its threshold the rule fires on."""
    return value < threshold if pick == "min" else value > threshold


@pytest.fixture(scope="module")
def x86() -> dict:
    return document_of(BUNDLES / "x86-256")


@pytest.fixture(scope="module")
def kunpeng() -> dict:
    return document_of(BUNDLES / "kunpeng-128")


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv(units.TIME_ZONE_ENV, "UTC")


# -- what a threshold needs and whether the value meets it ---------------------------------
def test_a_value_the_condition_does_not_hold_for_reads_not_met_in_the_report(x86, kunpeng):
    """x86-256's earlier crashes (info): 'seconds since the last fatal trap  2.06 h  < 15 min'
    read as if 2.06 h were under 15 minutes."""
    checked = 0
    for document in (x86, kunpeng):
        text = render(document)
        for finding in document["findings"]:
            picks = evidence_picks(finding["rule"])
            for row in finding["evidence"]:
                if not row["threshold"] or row["unit"] == units.TIME_UNIT:
                    continue
                pick = picks.get(row["signal"], "max")
                side = "under" if pick == "min" else "over"
                verdict = "met" if meets(row["value"], row["threshold"], pick) else "not met"
                expected = (f"{units.format_value(row['value'], row['unit'])}  needs {side} "
                            f"{units.format_value(row['threshold'], row['unit'])}: {verdict}")
                assert expected in text, (finding["rule"], row)
                checked += 1
        assert not re.search(r"\d\s+[<>] \d", text)  # no bare inequality beside a value
    assert checked >= 8
    crash = next(f for f in x86["findings"] if f["rule"] == "crash-loop")
    age = next(r for r in crash["evidence"] if r["signal"] == "seconds since the last fatal trap")
    assert age["value"] > age["threshold"]  # the row the report read as under 15 min


def test_a_crash_time_says_how_far_it_is_from_the_look_back_it_misses(x86):
    """'2025-12-02 05:16:37 UTC  after 2025-12-02 07:05:15 UTC': a crash before the
    look-back's start, beside 'after' it."""
    text = " ".join(render(x86).split())
    rows = [r for f in x86["findings"] for r in f["evidence"] if r["unit"] == units.TIME_UNIT]
    assert len(rows) >= 3
    for row in rows:
        assert row["value"] < row["threshold"]  # every one of them before the look-back
        gap = units.duration(row["threshold"] - row["value"])
        assert (f"{units.local_time(row['value'])} needs after") in text
        start = re.escape(units.local_time(row["threshold"]).split(" ", 1)[1])  # time of day
        assert re.search(rf"needs after (\d{{4}}-\d\d-\d\d )?{start}: not met, "
                         rf"{re.escape(gap)} before it", text), (row, gap)


def test_the_console_evidence_table_says_met_on_the_side_that_fires(kunpeng):
    """The console's 'over threshold' column read '64x below' for 1,024 fds against a limit
    that fires under 65,535 fds, and '140x below' for a crash 6 s old against 15 minutes."""
    crash = document_of(SCENARIOS / "isa-mismatch")
    checked = 0
    for finding in kunpeng["findings"] + crash["findings"]:
        picks = evidence_picks(finding["rule"])
        frame = evidence_frames.evidence_frame(finding)
        for row, (_, shown) in zip(finding["evidence"], frame.iterrows(), strict=True):
            if not row["threshold"]:
                assert shown["threshold"] == shown[evidence_frames.MET] == "–"
                continue
            pick = picks.get(row["signal"], "max")
            ok = meets(row["value"], row["threshold"], pick)
            assert shown[evidence_frames.MET].startswith("met" if ok else "not met"), (
                finding["rule"], row, shown[evidence_frames.MET])
            assert shown["threshold"].startswith("needs ")
            assert "below" not in shown[evidence_frames.MET]
            checked += 1
    assert checked >= 10
    fds = next(f for f in kunpeng["findings"] if f["rule"] == "fd-exhaustion")
    limit = evidence_frames.evidence_frame(fds).set_index("signal").loc["its soft limit"]
    row = next(r for r in fds["evidence"] if r["signal"] == "its soft limit")
    assert limit["threshold"] == f"needs under {units.format_value(row['threshold'], 'fds')}"
    share = re.fullmatch(r"met, ([\d.]+) % of it", limit[evidence_frames.MET])
    assert share and float(share.group(1)) == pytest.approx(
        100 * row["value"] / row["threshold"], rel=0.05), limit[evidence_frames.MET]


# -- summaries count what the evidence lists -----------------------------------------------
def _copy(bundle: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(bundle, tmp_path / bundle.name))


def _uptime_at_end(tree: Path) -> float:
    """Seconds since boot at the bundle's last sample (its time less /proc/stat btime)."""
    last = json.loads((tree / "meta.json").read_text())["samples"][-1]
    stat = (tree / last["dir"] / "proc" / "stat").read_text()
    boot = int(re.search(r"^btime (\d+)$", stat, re.M).group(1))
    return last["time"] - boot


def _oom_report(uptime: float, pid: int) -> str:
    """One memory-cgroup OOM kill as mm/oom_kill.c and mm/memcontrol.c print it."""
    stamp = f"[{uptime:12.6f}]"
    return (f"{stamp} memory: usage 2097152kB, limit 2097152kB, failcnt 6349\n"
            f"{stamp} oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=agent,"
            f"mems_allowed=0-3,oom_memcg={KILL_CGROUP},task_memcg={KILL_CGROUP},"
            f"task=agent-tool,pid={pid},uid=1000\n"
            f"{stamp} Memory cgroup out of memory: Killed process {pid} (agent-tool) "
            "total-vm:2503815kB, anon-rss:2091815kB, file-rss:25002kB, shmem-rss:0kB, UID:1000 "
            "pgtables:4188kB oom_score_adj:985\n")


def _with_kills(tmp_path: Path, ages_s: list[float]) -> Path:
    """kunpeng-128 with OOM kills `ages_s` seconds before its window's end, oldest first."""
    tree = _copy(BUNDLES / "kunpeng-128", tmp_path)
    end = _uptime_at_end(tree)
    with (tree / "static" / "dmesg.txt").open("a") as log:
        for number, age in enumerate(sorted(ages_s, reverse=True)):
            log.write(_oom_report(end - age, 4_100_000 + number))
    return tree


def test_kills_older_than_the_look_back_read_as_not_meeting_it(tmp_path):
    """The info tier: 'seconds since the last OOM kill  21.6 min  < 15 min'."""
    tree = _with_kills(tmp_path, [1296.0, 1500.0])
    document = json.loads(diagnose(tree, "--json")[1])
    oom = next(f for f in document["findings"] if f["rule"] == "oom-kill")
    assert oom["severity"] == "info"
    text = render(document)
    assert "21.6 min  needs under 15 min: not met" in text
    assert "< 15 min" not in text
    assert "2 kills in the kernel log, none in the look-back, latest agent-tool" in \
        oom["summary"]


def test_the_summary_counts_the_kills_the_evidence_counts(tmp_path):
    """'1 kill' in the summary beside 'OOM kills in the kernel log: 5 kills'."""
    tree = _with_kills(tmp_path, [3600.0, 3500.0, 3400.0, 3300.0, 5.0])
    document = json.loads(diagnose(tree, "--json")[1])
    oom = next(f for f in document["findings"] if f["rule"] == "oom-kill")
    logged = next(r for r in oom["evidence"] if r["signal"] == "OOM kills in the kernel log")
    assert logged["value"] == 5  # the lines written
    assert "1 kill in the look-back, 5 in the kernel log, latest agent-tool (pid 4100004" in \
        oom["summary"], oom["summary"]


def test_crashes_in_the_look_back_and_in_the_log_are_both_said(tmp_path):
    """crash-loop said 'crashed 5 times in the look-back' beside its evidence row of 7."""
    tree = _copy(SCENARIOS / "crash-loop", tmp_path)
    log = tree / "static" / "dmesg.txt"
    lines = log.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if "tool-runner[" in line)
    uptime = float(re.match(r"\[\s*([\d.]+)\]", lines[first]).group(1))
    older = [f"[{uptime - age:12.6f}] tool-runner[{pid}]: segfault at 0 ip 000055d0c1a594c9 sp "
             f"00007ffd3b2a1c40 error 4 in tool-runner[2e4c9,55d0c1a2b000+9b000] likely on CPU "
             "6 (core 6, socket 0)\n" for age, pid in ((7200.0, 600001), (3600.0, 600002))]
    log.write_text("".join(lines[:first] + older + lines[first:]))
    document = json.loads(diagnose(tree, "--json")[1])
    crash = next(f for f in document["findings"] if f["rule"] == "crash-loop")
    row = next(r for r in crash["evidence"] if r["signal"].startswith("fatal traps of "))
    assert row["value"] == 7  # the scenario's 5 and the 2 written
    assert "tool-runner crashed 5 times in the look-back (7 in the kernel log)" in \
        crash["summary"], crash["summary"]


def test_refused_forks_in_the_window_and_in_all_are_both_said():
    """pid-exhaustion said '35 forks refused so far' beside its evidence row of the window's
    11 (pids.events max: 0 .. 35 across the scenario's samples, the rate window the last)."""
    document = document_of(SCENARIOS / "pid-exhaustion")
    pids = document["findings"][0]
    row = next(r for r in pids["evidence"] if r["signal"].startswith("forks refused"))
    assert f"{row['value']:.0f} forks refused in the window, 35 since the cgroup was made " \
           "(pids.events max)" in pids["summary"], pids["summary"]
