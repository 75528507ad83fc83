"""Regexes an input controls cost a bounded time (issue #37).

A pool's `match: {cmdline: REGEX}` comes from a config or from the config a bundle recorded;
`redact:` regexes from a config; the built-in URL-userinfo redaction runs over every argument
of every recorded process. None of them may hang a command on a hostile string.
"""

from __future__ import annotations

import json
import re
import shutil
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetscope.bundle import redact
from fleetscope.bundle.redact import MARK, Redactor
from fleetscope.core.config import parse_config
from tests.hostile_corpus import FIXTURE, run


def _bundle_with_pool_regex(tmp_path, pattern: str, cmdline: str):
    bundle = tmp_path / "bundle"
    shutil.copytree(FIXTURE, bundle)
    meta = json.loads((bundle / "meta.json").read_text())
    meta["config"]["pools"][1]["match"] = {"cmdline": pattern}
    (bundle / "meta.json").write_text(json.dumps(meta))
    for sample in meta["samples"]:
        (bundle / sample["dir"] / "proc" / "2034" / "cmdline").write_text(cmdline + "\0")
    return bundle


def test_backtracking_pool_regex_in_a_bundle_does_not_hang(tmp_path):
    """`(a+)+$` against one 41-character command line: Python's re backtracks 2**40 times."""
    bundle = _bundle_with_pool_regex(tmp_path, "(a+)+$", "a" * 40 + "!")
    result = run(["diagnose", "--bundle", str(bundle), "--json"], timeout=60)
    assert result.returncode in (0, 1, 2), (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    assert json.loads(result.stdout)["source"] == "bundle"


def test_a_pool_regex_that_times_out_is_no_match_said_once(tmp_path):
    """A pattern no engine finishes (`(a|aa)+$` even with the regex package's optimisations)
    costs its own match: the process is in no pool, the rest is diagnosed, one warning."""
    bundle = _bundle_with_pool_regex(tmp_path, "(a|aa)+$", "a" * 60 + "!")
    result = run(["diagnose", "--bundle", str(bundle), "--json"], timeout=60)
    assert result.returncode in (0, 1, 2), (result.returncode, result.stderr[-2000:])
    warned = [line for line in result.stderr.splitlines() if "timed out" in line]
    assert len(warned) == 1, result.stderr[-2000:]
    assert "pools[1].match.cmdline" in warned[0] and "not matching" in warned[0]


def test_a_redact_pattern_that_times_out_redacts_the_whole_value():
    """Failing closed: a value the pattern could not finish on is not shipped."""
    redactor = Redactor(parse_config({"redact": ["(a|aa)+$"]}).redact)
    assert redactor.argv(["agent", "a" * 60 + "!"]) == ["agent", MARK]


def test_config_regexes_are_validated_with_the_engine_that_runs_them():
    from fleetscope.core.config import ConfigError

    for raw in ({"redact": ["(unclosed"]},
                {"pools": [{"name": "p", "class": "online", "match": {"cmdline": "(x"}}]}):
        try:
            parse_config(raw)
        except ConfigError as err:
            assert "not a valid regex" in str(err)
        else:
            raise AssertionError(f"accepted {raw}")


def _best_of(repeat: int, action) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return best


def test_url_userinfo_redaction_is_linear():
    """One 120,000-character argument costs about what 120 arguments of 1,000 characters
    cost together (same total length). A pattern that rescans the rest of the argument from
    every word start (quadratic) makes the long one about 120 times dearer."""
    unit = "a." * 500  # every 'a' starts a word and a candidate URL scheme
    short = ["agent"] + [unit] * 120
    long = ["agent", unit * 120]
    for args in (short, long):  # and the output is right on them
        assert Redactor().argv(args) == args
    baseline = _best_of(3, lambda: Redactor().argv(short))
    for _ in range(3):  # a busy machine may slow one run; a quadratic scan is slow in all
        measured = _best_of(1, lambda: Redactor().argv(long))
        if measured < 15 * baseline:
            break
    assert measured < 15 * baseline, (measured, baseline)


def test_url_userinfo_redaction_still_finds_userinfo_in_a_long_argument():
    arg = "x." * 60_000 + " postgres://u:pw@db/x " + "a-" * 60_000
    out = Redactor().text(arg, "cmdline_args")
    assert "u:pw" not in out and f"postgres://{MARK}@db/x" in out


# The pattern the scan replaces: its substitutions are the definition the scan keeps.
_REGEX_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@")
_URLISH = st.text(alphabet=st.sampled_from(list("ab:/@.+-_ \t\u017f\u212aé1Z")), max_size=60)


@settings(max_examples=3000, deadline=None)
@given(_URLISH)
def test_userinfo_scan_agrees_with_the_regex(value):
    expected = _REGEX_USERINFO.subn(lambda m: f"{m.group(1)}{MARK}@", value)
    assert redact.redact_userinfo(value) == expected


def test_a_match_preempted_past_its_timeout_is_tried_again():
    """The timeout is on the wall clock; on a node whose CPUs are taken a quick match can
    be preempted past it. Only a match that used the CPU that long counts as timed out."""
    from fleetscope.core import patterns

    calls = []

    def starved(timeout):  # no CPU used: preempted, then it matches
        calls.append(timeout)
        if len(calls) == 1:
            raise TimeoutError
        return "match"

    assert patterns._bounded(starved) == "match"
    assert calls[1] > calls[0]

    def slow(timeout):  # the pattern itself burns its timeout
        end = time.thread_time() + timeout
        while time.thread_time() < end:
            pass
        raise TimeoutError

    try:
        patterns._bounded(slow)
    except TimeoutError:
        pass
    else:
        raise AssertionError("a match that used its timeout on the CPU was retried to success")
