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
