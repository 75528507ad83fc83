"""Property-based fuzzing shared by the parser tests: every parser returns records or raises
ParseError, nothing else, on arbitrary text and on real samples cut or corrupted at random.

    test_garbage, test_cut_and_corrupted = parser_fuzz_tests(PARSERS, procish)

PARSERS maps a name to (parser, real sample); the second argument is a text strategy shaped
like the parser's input (its digits, separators and keywords).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetscope.collectors.parsers import ParseError


def only_parse_error(parser, text) -> None:
    try:
        parser(text)
    except ParseError:
        pass


def parser_fuzz_tests(parsers: dict, shaped_text, examples: int = 300):
    names = sorted(parsers)

    @pytest.mark.parametrize("name", names)
    @settings(max_examples=examples, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(text=st.one_of(st.text(max_size=300), shaped_text))
    def test_garbage_raises_parse_error_only(name, text):
        only_parse_error(parsers[name][0], text)

    @pytest.mark.parametrize("name", names)
    @settings(max_examples=examples, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def test_cut_and_corrupted_real_samples(name, data):
        parser, sample = parsers[name]
        only_parse_error(parser, sample[:data.draw(st.integers(0, len(sample)))])
        position = data.draw(st.integers(0, len(sample) - 1))
        replacement = data.draw(st.text(max_size=4))
        only_parse_error(parser, sample[:position] + replacement + sample[position + 1:])

    return test_garbage_raises_parse_error_only, test_cut_and_corrupted_real_samples
