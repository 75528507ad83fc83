"""Secrets kept out of bundles and reports: process command lines and config values.

    /proc/<pid>/cmdline   python\0agent.py\0--api-key=sk-live-123\0--db\0postgres://u:pw@db/x\0
                       -> python\0agent.py\0--api-key=<redacted>\0--db\0postgres://<redacted>@db/x\0

Redacted by default: the value of a credential-looking argument (`--api-key=V`,
`--password V`, `-token=V`), `KEY=VALUE` pairs whose key looks like a credential
(`AWS_SECRET_ACCESS_KEY=...`), URL userinfo (`scheme://user:pass@host`), `Bearer <token>`,
and whatever the config's `redact:` regexes match. Over-redacting a harmless `--sort-key` is
the accepted price of never shipping a live key in a ticket attachment.

Every step costs time linear in the argument's length: one argument may be as long as the
kernel lets a command line be (issue #37). A configured pattern that times out
(fleetscope.core.patterns) replaces the whole value: failing closed, never shipping it.
"""

from __future__ import annotations

import re
from collections import Counter

from fleetscope.core.patterns import BoundedPattern

MARK = "<redacted>"
# Option or variable names that carry credentials (matched against the name only).
SECRET_NAME = re.compile(
    r"(?i)(pass(word|wd|phrase)?|secret|token|credential|auth|api[-_]?key|private[-_]?key|"
    r"access[-_]?key|session[-_]?key|cookie|signature|^key$|[-_]key$)")
_OPTION_VALUE = re.compile(r"^(-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*)=(.*)$", re.S)
_OPTION = re.compile(r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PAIR = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)=(.*)$", re.S)
# URL userinfo is what `(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@` matches. That regex, searched,
# rescans the rest of a run like `a.a.a.a...` from every word start (quadratic), so
# redact_userinfo finds the same matches from each `://` outwards; these classes are its
# pieces, applied one character or one run at a time.
_SCHEME_FIRST = re.compile(r"(?i)[a-z]")
_SCHEME_CHAR = re.compile(r"(?i)[a-z0-9+.-]")
_WORD = re.compile(r"\w")
_USERINFO_RUN = re.compile(r"[^/@\s]+")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")


def redact_userinfo(value: str) -> tuple[str, int]:
    """`value` with each URL's userinfo replaced by MARK, and how many: the substitutions
    of the regex above, found in time linear in len(value)."""
    pieces: list[str] = []
    done = 0  # where the last match ended: matches never overlap
    at = value.find("://")
    while at != -1:
        user = _USERINFO_RUN.match(value, at + 3)
        end = user.end() if user else -1
        if end != -1 and end < len(value) and value[end] == "@":
            # The scheme runs back from `://` over scheme characters; the regex starts at
            # the leftmost letter of that run that begins a word.
            first = at
            while first > done and _SCHEME_CHAR.match(value, first - 1):
                first -= 1
            start = next((i for i in range(first, at) if _SCHEME_FIRST.match(value, i)
                          and (i == 0 or not _WORD.match(value, i - 1))), None)
            if start is not None:
                pieces += [value[done:at + 3], MARK, "@"]
                done = end + 1
                at = value.find("://", done)
                continue
        # No userinfo after this `://`, or no scheme before it: the next `://` starts
        # at least 3 characters on, past every character looked at here.
        at = value.find("://", at + 1)
    if not pieces:
        return value, 0
    return "".join(pieces) + value[done:], len(pieces) // 3


class Redactor:
    """Redacts strings and command lines, counting what it removed by kind (for the bundle's
    metadata and `bundle show`)."""

    def __init__(self, patterns: tuple[str, ...] = ()):
        self.patterns = [BoundedPattern(p, "redact") for p in patterns]
        self.counts: Counter[str] = Counter()

    def text(self, value: str, kind: str) -> str:
        """URL userinfo, bearer tokens and the configured patterns within free text."""
        value, n = redact_userinfo(value)
        self.counts[kind] += n
        value, n = _BEARER.subn(lambda m: f"{m.group(1)} {MARK}", value)
        self.counts[kind] += n
        for pattern in self.patterns:
            replaced = pattern.subn(MARK, value)
            value, n = replaced if replaced is not None else (MARK, 1)
            self.counts[kind] += n
        return value

    def argv(self, args: list[str], kind: str = "cmdline_args") -> list[str]:
        out: list[str] = []
        secret_next = False
        for arg in args:
            if secret_next and arg and not arg.startswith("-"):
                out.append(MARK)
                self.counts[kind] += 1
                secret_next = False
                continue
            secret_next = False
            match = _OPTION_VALUE.match(arg) or _PAIR.match(arg)
            if match and SECRET_NAME.search(match.group(1).lstrip("-")) and match.group(2):
                out.append(f"{match.group(1)}={MARK}")
                self.counts[kind] += 1
                continue
            if _OPTION.match(arg) and SECRET_NAME.search(arg.lstrip("-")):
                secret_next = True
            out.append(self.text(arg, kind))
        return out

    def cmdline(self, raw: bytes) -> bytes:
        """A /proc/<pid>/cmdline (NUL-separated argv) with its secrets redacted."""
        text = raw.decode("utf-8", "surrogateescape")
        trailing = text.endswith("\0")
        args = (text[:-1] if trailing else text).split("\0")
        if len(args) == 1 and " " in args[0]:
            # A process that rewrote its argv into one space-separated string (setproctitle).
            redacted = " ".join(self.argv(args[0].split(" ")))
            return (redacted + ("\0" if trailing else "")).encode("utf-8", "surrogateescape")
        joined = "\0".join(self.argv(args)) + ("\0" if trailing else "")
        return joined.encode("utf-8", "surrogateescape")

    def config(self, value, kind: str = "config_values"):
        """A copy of a loaded config with credential-named values and URL userinfo removed."""
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if isinstance(key, str) and SECRET_NAME.search(key) and \
                        isinstance(item, (str, int, float)) and key != "redact":
                    out[key] = MARK
                    self.counts[kind] += 1
                else:
                    out[key] = self.config(item, kind)
            return out
        if isinstance(value, list):
            return [self.config(item, kind) for item in value]
        if isinstance(value, str):
            return self.text(value, kind)
        return value
