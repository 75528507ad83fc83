"""Parsers: kernel text in, typed records out. No I/O here.

Each parser takes the text of one file exactly as the kernel writes it and either returns
records or raises `ParseError` naming what was wrong. Collectors do the reading; keeping the
two apart lets the parsers be tested (and fuzzed) on inline strings.
"""


class ParseError(ValueError):
    """The text is not in the format the kernel writes (corrupt, truncated, foreign)."""


def parse_int(token: str, what: str) -> int:
    """A non-negative decimal integer as the kernel prints counters, or ParseError."""
    if not token.isdigit() or not token.isascii():
        raise ParseError(f"{what}: expected a non-negative integer, got {token[:40]!r}")
    return int(token)
