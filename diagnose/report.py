"""The readable diagnosis of `fleetscope diagnose` (without --json): one block per finding,
worst first, laid out for a terminal 80 to 120 columns wide. `--json` prints the document.

     1  CRITICAL  fd-exhaustion on kunpeng-920-128                          confidence 91%
        pool chat-online: a process uses 99% of its open-file limit
        subjects  pids 3080417
        evidence  open fds over RLIMIT_NOFILE (worst process)   98.9 %  needs over 90 %: met
                  its soft limit                             1,024 fds  needs under 65,535 fds: met
        cause     a process is close to its file-descriptor limit (RLIMIT_NOFILE, 1024
                  by default)
        action    raise nofile to >= 65535 (LimitNOFILE= in the unit, ulimit -n, the
                  container runtime) before deploying; look for fd leaks
        runbook   fleetscope runbook fd-exhaustion
                  /usr/lib/python3/dist-packages/fleetscope/runbooks/fd-exhaustion.md

Findings that say the same thing (one rule, the same summary but for its numbers, e.g. one
crash on 32 nodes) are one block naming every node. Values read in their units (GB/s, %, ms)
through the console's formatting layer; long words (paths, cgroups) are never split.
"""

from __future__ import annotations

import json
import re
import sys

from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from fleetscope.core import units
from fleetscope.rules.catalog import CATALOG, evidence_picks

from .harm_lines import harm_count, pool_harms

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan", "ok": "green",
          "unknown": "magenta"}
MIN_WIDTH, MAX_WIDTH = 80, 120
PIPE_WIDTH = 100  # a report piped into a file or a pager
INDENT = 4  # where a block's lines start, under its title
BODY_COLUMN = INDENT + 1 + 8 + 2  # where a block's values start: indent, label, gap
MIN_SIGNAL = 30  # columns an evidence signal keeps beside its numbers


def print_json(document: dict) -> None:
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _width(console: Console | None) -> Console:
    if console is not None:
        return console
    if not sys.stdout.isatty():
        return Console(width=PIPE_WIDTH)
    probe = Console()
    return Console(width=max(MIN_WIDTH, min(MAX_WIDTH, probe.width)))


def _same_kind(finding: dict) -> tuple:
    """Findings alike but for their numbers and their node are one block."""
    summary = re.sub(r"\d+(?:\.\d+)?", "#", finding["summary"].replace(finding["node"], "@"))
    return finding["rule"], finding["severity"], summary


def group_findings(findings: list[dict]) -> list[list[dict]]:
    """Findings grouped by `_same_kind`, in the order of each group's first (worst) one."""
    groups: dict[tuple, list[dict]] = {}
    for finding in findings:
        groups.setdefault(_same_kind(finding), []).append(finding)
    return list(groups.values())


def _shown(value):
    """The document as a terminal may show it: every string's control characters written as
    escapes (names from a node are data: units.printable)."""
    if isinstance(value, str):
        return units.printable(value)
    if isinstance(value, dict):
        return {key: _shown(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shown(item) for item in value]
    return value


def _plain(text: str) -> Text:
    """A cell as written: rich reads a str cell as markup, where a process named `[/]`
    raised an error and `[link=x]` hid the name."""
    return Text(text)


def _names(values: list[str], limit: int = 8) -> str:
    shown = ", ".join(values[:limit])
    return shown + (f" and {len(values) - limit} more" if len(values) > limit else "")


def _evidence_table(evidence: list[dict], width: int, picks: dict[str, str]) -> Table:
    """Signal, value and what its threshold needs with whether the value meets it, in three
    columns; where the numbers would leave the signal less than MIN_SIGNAL columns (a crash
    time against the look-back's start), each signal takes its own line with its numbers
    indented under it."""
    rows = []
    for item in evidence:
        pick = item.get("pick") or picks.get(item["signal"], "max")
        rows.append((item["signal"], units.format_value(item["value"], item["unit"]),
                     str(units.reading(item["value"], item["threshold"], item["unit"],
                                       pick))))
    numbers = max(len(value) for _, value, _ in rows) + 2 + max(len(t) for *_, t in rows)
    if width - numbers - 2 >= MIN_SIGNAL:
        table = Table.grid(padding=(0, 2))
        table.add_column(ratio=1)  # the signal wraps (with its indent); numbers never do
        table.add_column(no_wrap=True, justify="right")
        table.add_column(no_wrap=True, style="dim")
        for row in rows:
            table.add_row(*map(_plain, row))
        return table
    table = Table.grid()
    table.add_column(ratio=1)
    for signal, value, threshold in rows:
        table.add_row(_plain(signal))
        table.add_row(Padding(Text.assemble(value, "  ", (threshold, "dim")), (0, 0, 0, 2)))
    return table


def _block(number: int, group: list[dict], width: int) -> Group:
    first = group[0]
    nodes = list(dict.fromkeys(f["node"] for f in group))
    where = first["node"] if len(nodes) == 1 else f"{len(nodes)} nodes"
    head = Table.grid(expand=True, padding=(0, 2))
    head.add_column(width=3, justify="right")
    head.add_column(width=8, no_wrap=True)
    head.add_column(ratio=1)
    head.add_column(no_wrap=True, justify="right")
    confidence = f"confidence {first['confidence']:.0%}" if len(group) == 1 else \
        f"confidence {min(f['confidence'] for f in group):.0%}-" \
        f"{max(f['confidence'] for f in group):.0%}"
    head.add_row(str(number), Text(first["severity"].upper(), style=_STYLE[first["severity"]]),
                 Text.assemble((first["rule"], "bold"), f" on {where}"), Text(confidence,
                                                                                style="dim"))
    body = Table.grid(padding=(0, 2))
    body.add_column(width=8, no_wrap=True, style="dim")
    body.add_column(ratio=1, overflow="fold")
    summary = first["summary"] if len(group) == 1 else \
        f"{first['summary']} (and {len(group) - 1} alike)"
    body.add_row("", _plain(summary))
    if len(nodes) > 1:
        body.add_row("nodes", _plain(_names(nodes, 12)))
    subjects = [f"{kind} {_names([str(v) for v in values])}"
                for kind, values in first.get("subjects", {}).items() if values]
    if subjects:
        body.add_row("subjects", _plain("; ".join(subjects)))
    if first["evidence"]:
        body.add_row("evidence", _evidence_table(first["evidence"], width - BODY_COLUMN,
                                                 evidence_picks(first["rule"])))
    body.add_row("cause", _plain(first["cause"]))
    body.add_row("action", _plain(first["action"]))
    # The command reads it on any node; the path is the installed file on this one.
    body.add_row("runbook", Text(f"fleetscope runbook {first['rule']}", no_wrap=True,
                                 overflow="ignore"))
    if first.get("runbook_path"):
        body.add_row("", Text(first["runbook_path"], no_wrap=True, overflow="ignore"))
    return Group(head, Padding(body, (0, 0, 1, INDENT + 1), expand=False))


def _by_cause(items: list[dict]) -> dict[str, tuple[list[str], list[str]]]:
    """cause -> (the rules it leaves unevaluated, the signals it explains), the causes
    leaving most rules first; a rule lacking signals for two causes is under both. An item
    without `causes` (no samples, a partial answer) is its own reason's."""
    by_cause: dict[str, tuple[list[str], list[str]]] = {}
    for item in items:
        for entry in item.get("causes") or [{"cause": item["reason"], "signals": []}]:
            rules, signals = by_cause.setdefault(entry["cause"], ([], []))
            if item["rule"] not in rules:
                rules.append(item["rule"])
            signals.extend(name for name in entry["signals"] if name not in signals)
    return dict(sorted(by_cause.items(), key=lambda pair: -len(pair[1][0])))


def _not_evaluated(items: list[dict], verbose: bool = False) -> Table:
    """Rules not evaluated, one entry per cause: how many rules it leaves unevaluated and
    what to do (the collectors' words); with `verbose` the rules and the signals they lack
    under it (every rule's signals fill a screen on a node without pools)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True, justify="right")
    table.add_column(ratio=1, style="dim")
    for cause, (rules, signals) in _by_cause(items).items():
        table.add_row(units.count(len(rules), "rule"), _plain(cause))
        if verbose:
            table.add_row("", Text.assemble(("rules ", "bold"), ", ".join(rules)))
            if signals:
                table.add_row("", Text.assemble(("missing ", "bold"), ", ".join(signals)))
    return table


MAX_HARM_LINES = 12  # pools named in the report's harm block; the rest are counted


def print_harm(document: dict, console: Console) -> None:
    """What hurts now, pool by pool, and what explains it: the verdict leads with it. Over
    several nodes a count comes first (how many pools, how many explained, by what)."""
    entries = pool_harms(document)
    if not entries:
        return
    with_node = len({entry.node for entry in entries}) > 1 or len(document["nodes"]) > 1
    if with_node:
        console.print(Text.assemble(("harm: ", "bold"), harm_count(entries).text()))
    console.print(Text("Harm now (pools over their targets):", style="bold"))
    body = Table.grid(padding=(0, 1))
    body.add_column(width=2, no_wrap=True)
    body.add_column(ratio=1, overflow="fold")
    for entry in entries[:MAX_HARM_LINES]:
        style = "yellow" if entry.explained_by else "bold yellow"
        body.add_row(Text("*", style=style), _plain(entry.head(with_node)))
        body.add_row("", Text.assemble(("<- ", "dim"), entry.cause()))
    console.print(Padding(body, (0, 0, 0, 2), expand=False))
    if len(entries) > MAX_HARM_LINES:
        rest = entries[MAX_HARM_LINES:]
        console.print(Text(f"  and {units.count(len(rest), 'more pool')} on "
                           f"{units.count(len({e.node for e in rest}), 'node')} "
                           f"({sum(not e.explained_by for e in rest)} unexplained): --json "
                           "lists them", style="dim"))


def print_fleet_findings(document: dict, console: Console) -> None:
    """What the sick nodes share (`diagnose --fleet`), ahead of the per-node findings."""
    for entry in document.get("fleet_findings") or []:
        console.print(Text.assemble(("fleet:", _STYLE[entry["severity"]]), " ",
                                    entry["summary"]))


def print_accelerator_groups(document: dict, console: Console) -> None:
    """The fleet's inference modules by model and driver/firmware (`diagnose --fleet`), a
    pair missing from the operators' compatibility matrix first."""
    for group in document.get("accelerator_groups") or []:
        style = "yellow" if group["nodes_not_listed"] else "dim"
        console.print(Text.assemble(("modules: ", style), group["summary"]))


def print_report(document: dict, console: Console | None = None, verbose: bool = False
                 ) -> None:
    """The report; `verbose` names each rule not evaluated and the signals it lacks."""
    console = _width(console)
    document = _shown(document)
    if console.is_terminal:
        _print_report(document, console, verbose)
        return
    with console.capture() as captured:  # into a file: no padding spaces at line ends
        _print_report(document, console, verbose)
    console.file.write("\n".join(line.rstrip() for line in captured.get().splitlines()) + "\n")


def _print_report(document: dict, console: Console, verbose: bool) -> None:
    status = document["status"]
    nodes = ", ".join(document["nodes"]) or "?"
    window = document.get("window") or {}
    when = ""
    if window.get("end"):
        when = f", {units.time_window(window['start'], window['end'])}" \
            if window.get("start") and window["end"] > window["start"] else \
            f", {units.local_time(window['end'])}"
    findings = document["findings"]
    counts = {s: sum(f["severity"] == s for f in findings) for s in ("critical", "warning")}
    tally = f" — {len(findings)} finding{'s' * (len(findings) != 1)}" + "".join(
        f", {n} {s}" for s, n in counts.items() if n) if findings else ""
    kind = document["source"]
    if document.get("flight_recorder"):  # a bundle, the one the exporter keeps on the node
        kind = f"flight recorder in {document['flight_recorder']['state_dir']}"
    console.print(Text.assemble(("fleetscope diagnosis", "bold"),
                                f" of {nodes} ({kind}{when}): ",
                                (status.upper(), _STYLE[status]), tally))
    if document.get("partial"):
        console.print(Text("PARTIAL DATA: the query engine answered with warnings; rules "
                           "judged on part of it are not evaluated: "
                           + " | ".join(document.get("partial_reasons") or []), style="bold"))
    print_harm(document, console)
    print_fleet_findings(document, console)
    print_accelerator_groups(document, console)
    console.print()
    if findings:
        for number, group in enumerate(group_findings(findings), 1):
            console.print(_block(number, group, console.width))
        primary = findings[0]
        console.print(Text.assemble("Primary diagnosis: ", (primary["rule"], "bold"),
                                    f" on {primary['node']} — {primary['summary']}"))
    else:
        console.print("No finding of warning or worse." if status == "ok"
                      else "Nothing could be diagnosed from this source.")
    if document["not_evaluated"]:
        skipped = len({item["rule"] for item in document["not_evaluated"]})
        console.print(Text(f"Not evaluated: {skipped} of {units.count(len(CATALOG), 'rule')}, "
                           "by cause" + ("" if verbose else " (--verbose names the rules and "
                                                           "the signals they lack)") + ":",
                           style="dim"))
        console.print(Padding(_not_evaluated(document["not_evaluated"], verbose),
                              (0, 0, 0, 2), expand=False))

