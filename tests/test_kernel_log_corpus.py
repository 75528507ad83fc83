"""Issue 38's corpus: kernel-log excerpts as fleets write them, copied from public issues, each
read through the parsers the collectors and rules use, every field checked against the truth
read off the text by hand (tests/fixtures/kmsg/corpus/cases.json; tests/kernel_log_corpus.py
reads them); negatives yield no event at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import kernel_log_corpus as corpus

CASES = corpus.cases()
DOC = Path(__file__).parent.parent / "docs" / "kernel-log-corpus.md"


@pytest.mark.parametrize("case", CASES, ids=[case["file"] for case in CASES])
def test_every_case_is_read_right(case):
    got = corpus.read_case(case)
    want = corpus.expected(case)
    assert [e["event"] for e in got] == [e["event"] for e in want], case["origin"]
    for read, truth in zip(got, want, strict=True):
        for field, value in truth.items():
            if field == "time" and value is not None:
                assert read["time"] == pytest.approx(value, abs=1e-6), (case["file"], truth)
            else:
                assert read[field] == value, (case["file"], field, truth)


def test_negatives_are_never_counted():
    negatives = [case for case in CASES if case["kind"] == "negative"]
    assert len(negatives) >= 5
    for case in negatives:
        assert case["events"] == [] and corpus.read_case(case) == [], case["file"]


def test_the_manifest_is_whole():
    files = {path.name for path in corpus.CORPUS.iterdir() if path.suffix == ".txt"}
    assert files == {case["file"] for case in CASES}
    for case in CASES:
        assert case["kind"] in corpus.KINDS, case["file"]
        assert case["origin"] and case["form"] and case["kernel"] and case["arch"]
        assert all(event["event"] in corpus.EVENTS for event in case["events"])
        if case["kind"] != "negative":
            assert case["events"], case["file"]
        if any(isinstance(event["time"], str) for event in case["events"]):
            assert "clock" in case, f"{case['file']}: wall-clock stamps need the case's clock"


def test_the_corpus_spans_arches_kernels_and_kinds():
    assert len(CASES) >= 60
    arches = {case["arch"] for case in CASES}
    assert {"x86-64", "aarch64"} <= arches
    # both arches for each kind a public aarch64 excerpt was found of (none yet of an OOM kill
    # with its `Killed process` line, nor of a 4.19+ arm64 SIGILL line)
    for kind in ("sigill", "segfault-or-trap", "pid-exhaustion", "hung-task", "soft-lockup",
                 "negative"):
        assert {case["arch"] for case in CASES if case["kind"] == kind} >= {"x86-64", "aarch64"}, \
            kind
    versions = [v for v in map(corpus.kernel_version, CASES) if v is not None]
    assert min(versions) <= (3, 10) and max(versions) >= (6, 0)
    assert {major for major, _ in versions} >= {3, 4, 5, 6}
    assert len({case["form"] for case in CASES}) >= 10
    assert len({case["origin"] for case in CASES}) >= 60


def test_the_committed_table_is_what_the_generator_prints():
    assert DOC.read_text() == corpus.table(), \
        "regenerate: python -m tests.kernel_log_corpus --table > docs/kernel-log-corpus.md"
