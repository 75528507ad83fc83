"""The rule catalog and its runbooks as the console shows them: the Rules page's table and
exported YAML, each runbook with its links to other runbooks kept inside the console, and the
commands of a runbook or an action filled with a finding's own subjects. No streamlit here."""

from __future__ import annotations

import re
import shlex

import pandas as pd

from fleetscope.core.runbooks import runbook_dir
from fleetscope.rules.catalog import CATALOG

RUNBOOKS = runbook_dir()


def rule_table() -> pd.DataFrame:
    return pd.DataFrame([{
        "rule": rule.id, "severity": rule.severity, "symptom": rule.symptom,
        "cause": rule.cause, "action": rule.action, "alert": rule.alert_name,
        "for": f"{rule.for_seconds}s", "condition (PromQL)": rule.condition.promql(),
    } for rule in CATALOG])


def rules_yaml() -> str:
    from fleetscope.rules.export import export_yaml

    return export_yaml()


def runbook(rule_id: str) -> str:
    path = RUNBOOKS / f"{rule_id}.md"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return f"(runbook {path.name} not found beside the console: see runbooks/ in the " \
               f"fleetscope repository)"


_RUNBOOK_LINK = re.compile(r"\]\((?:\.?/?runbooks/)?([a-z0-9-]+)\.md(#[^)]*)?\)")


# Placeholders in commands (runbooks, actions) -> the subject kind that names them.
PLACEHOLDERS = {"PID": "pids", "ONLINE_PID": "pids", "BINARY": "binaries",
                "IFACE": "interfaces", "POD": "pods"}
_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
_PLAIN_WORD = re.compile(r"[\w.:-]+")  # a pid, a pod or interface name: as is in prose


def shell_word(value: str) -> str:
    """`value` as one shell word an SRE can copy: quoted where it has anything the shell
    reads (`x;reboot #` -> `'x;reboot #'`); a backtick or a control character in ANSI-C
    quoting ($'...\\x60...') so no code span or terminal reads it either."""
    if not any(c == "`" or not c.isprintable() for c in value):
        return shlex.quote(value)
    def escaped(c: str) -> str:
        if c in "\\'":
            return "\\" + c
        return c if c.isprintable() and c != "`" else f"\\x{ord(c):02x}" if ord(c) < 256 \
            else f"\\u{ord(c):04x}"
    return "$'" + "".join(map(escaped, value)) + "'"


def code_span(text: str) -> str:
    """`text` as a Markdown code span, whatever backticks it holds (CommonMark: a fence
    longer than any run inside it)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def placeholder_values(subjects: dict) -> dict[str, str]:
    """What a finding's subjects say each command placeholder is: PID -> its first pid, as
    a shell word (a name from the node is data: quoted, never run)."""
    out = {}
    for word, kind in PLACEHOLDERS.items():
        values = subjects.get(kind) or []
        if values:
            value = str(values[0])
            out[word] = shell_word(value.rsplit("/", 1)[-1] if kind == "pods" else value)
    return out


def fill_commands(markdown: str, values: dict[str, str], code_only: bool = True) -> str:
    """The commands of a text with their placeholders replaced by the finding's own values:
    `fleetscope stacks PID` -> `fleetscope stacks 6387`. A runbook's prose keeps its words
    (code spans and blocks only); a rule's one-line action is all commands and names, each
    value a code span there (shown as written, not read as Markdown)."""
    if not values:
        return markdown
    word = re.compile(r"\b(" + "|".join(sorted(values, key=len, reverse=True)) + r")\b")

    def fill(text: str, spans: bool) -> str:
        return word.sub(lambda w: code_span(values[w.group(1)])
                        if spans and not _PLAIN_WORD.fullmatch(values[w.group(1)])
                        else values[w.group(1)], text)

    if not code_only:
        return fill(markdown, True)
    return _CODE.sub(lambda match: fill(match.group(0), False), markdown)


def _known_runbooks() -> set[str]:
    """What a runbook link may name: a catalog rule or a page in the runbooks folder."""
    return {rule.id for rule in CATALOG} | {p.stem for p in RUNBOOKS.glob("*.md")}


def runbook_markdown(rule_id: str, base: str = "/runbook") -> str:
    """The runbook with its links to other runbooks pointing inside the console
    (`[x](x.md)` -> `[x](/runbook?rule=x)`), so "Related" never opens "Page not found"."""
    known = _known_runbooks()

    def link(match: re.Match) -> str:
        name = match.group(1)
        if name not in known:
            return match.group(0)
        return f"]({base}?rule={name})"

    return _RUNBOOK_LINK.sub(link, runbook(rule_id))


def related_runbooks(rule_id: str) -> list[str]:
    """The rule ids the runbook links to, in order (its "Related" section first)."""
    text = runbook(rule_id)
    known = _known_runbooks()
    head, _, related = text.partition("## Related")
    out: list[str] = []
    for part in (related, head):
        for match in _RUNBOOK_LINK.finditer(part):
            name = match.group(1)
            if name in known and name != rule_id and name not in out:
                out.append(name)
    return out


def runbook_ids() -> list[str]:
    """Every runbook the console can show: the catalog's rules first, then other pages."""
    ids = [rule.id for rule in CATALOG if (RUNBOOKS / f"{rule.id}.md").is_file()]
    return ids + sorted(p.stem for p in RUNBOOKS.glob("*.md")
                        if p.stem not in ids and p.stem != "README")
