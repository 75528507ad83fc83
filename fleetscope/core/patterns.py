"""Regexes that a config or a bundle hands fleetscope, matched in a bounded time.

    pools: [{name: batch, class: offline, match: {cmdline: "etl|train"}}]
    redact: ["tenant-[0-9]+"]

Python's `re` backtracks without limit, so a pattern like `(a|aa)+$` against one command line
of 60 letters never returns. The `regex` package takes `re`'s syntax (its default VERSION0)
and stops a match at a timeout (issue #37). A match that times out counts as no match; the
first timeout of a pattern is logged once, and a pattern that keeps timing out is no longer
tried, so it costs a bounded time per command however many processes it meets.

The package's timeout is on the wall clock, and the node being diagnosed is often the one
whose CPUs are taken: a match preempted past its timeout is tried again with a longer one,
and only a match that spent its timeout on the CPU counts as timed out.
"""

from __future__ import annotations

import logging
import time

import regex

log = logging.getLogger("fleetscope.patterns")

MATCH_TIMEOUT_S = 0.05  # per match; the package checks the clock now and then, so up to ~4x
MAX_TIMEOUTS = 8  # then the pattern is given up for the rest of the process
STARVED_RETRIES = 3  # a match preempted past its timeout: tried again, 10 times longer each
error = regex.error


def _bounded(call):
    """call(timeout); TimeoutError only when the match itself used the CPU that long."""
    timeout = MATCH_TIMEOUT_S
    for _ in range(STARVED_RETRIES):
        cpu = time.thread_time()
        try:
            return call(timeout)
        except TimeoutError:
            if time.thread_time() - cpu >= MATCH_TIMEOUT_S / 2:
                raise
        timeout *= 10
    raise TimeoutError


def compile_checked(pattern: str):
    """The compiled pattern, or regex.error (the config's validation uses the same engine)."""
    return regex.compile(pattern)


class BoundedPattern:
    """One configured regex; `what` names where it came from (e.g. pools[1].match.cmdline)."""

    def __init__(self, pattern: str, what: str):
        self.pattern = pattern
        self.what = what
        self.compiled = compile_checked(pattern)
        self.timeouts = 0

    def _timed_out(self, text: str, outcome: str) -> None:
        self.timeouts += 1
        if self.timeouts == 1:
            log.warning("%s %r timed out (over %g s) on a %d-character string: %s; a pattern "
                        "that keeps timing out is no longer tried (said once)", self.what,
                        self.pattern[:60], MATCH_TIMEOUT_S, len(text), outcome)

    @property
    def given_up(self) -> bool:
        return self.timeouts >= MAX_TIMEOUTS

    def search(self, text: str) -> bool:
        """True when the pattern occurs in `text`; False when not, or when it timed out."""
        if self.given_up:
            return False
        try:
            return _bounded(lambda t: self.compiled.search(text, timeout=t)) is not None
        except TimeoutError:
            self._timed_out(text, "counted as not matching")
            return False

    def subn(self, replacement: str, text: str) -> tuple[str, int] | None:
        """`text` with every occurrence replaced and their count; None when timed out."""
        if self.given_up:
            return None
        try:
            return _bounded(lambda t: self.compiled.subn(replacement, text, timeout=t))
        except TimeoutError:
            self._timed_out(text, "the whole value is replaced")
            return None
