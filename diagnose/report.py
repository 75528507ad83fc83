"""The readable diagnosis: a table per finding (what, how sure, evidence, action, runbook)
and the rules that could not be evaluated, with why. `--json` prints the document itself."""

from __future__ import annotations

import json
import sys

from rich import box
from rich.console import Console
from rich.table import Table

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan", "ok": "green",
          "unknown": "magenta"}


def print_json(document: dict) -> None:
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _evidence_text(evidence: list[dict]) -> str:
    lines = []
    for item in evidence:
        lines.append(f"{item['signal']}: {item['value']:g} {item['unit']} "
                     f"(threshold {item['threshold']:g})")
    return "\n".join(lines) or "-"


def print_fleet_findings(document: dict, console: Console) -> None:
    """What the sick nodes share (`diagnose --fleet`), ahead of the per-node findings."""
    for entry in document.get("fleet_findings") or []:
        console.print(f"[{_STYLE[entry['severity']]}]fleet:[/] {entry['summary']}")


def print_report(document: dict, console: Console | None = None) -> None:
    # Piped into a file or a pager, keep the table readable rather than 80 columns wide.
    console = console or (Console() if sys.stdout.isatty() else Console(width=140))
    status = document["status"]
    nodes = ", ".join(document["nodes"]) or "?"
    console.print(f"[bold]fleetscope diagnosis[/] of {nodes} ({document['source']}): "
                  f"[{_STYLE[status]}]{status.upper()}[/]")
    print_fleet_findings(document, console)
    findings = document["findings"]
    if findings:
        table = Table(box=box.SIMPLE_HEAVY, show_lines=True, expand=True)
        for column in ("#", "finding", "severity", "evidence", "action", "runbook"):
            table.add_column(column, overflow="fold")
        for index, finding in enumerate(findings, 1):
            subjects = "; ".join(f"{kind}: {', '.join(map(str, values))}"
                                 for kind, values in finding["subjects"].items() if values)
            what = f"[bold]{finding['rule']}[/] on {finding['node']}\n{finding['summary']}"
            if subjects:
                what += f"\n{subjects}"
            what += f"\nconfidence {finding['confidence']:.0%}"
            table.add_row(str(index), what,
                          f"[{_STYLE[finding['severity']]}]{finding['severity']}[/]",
                          _evidence_text(finding["evidence"]),
                          f"{finding['cause']}\n→ {finding['action']}", finding["runbook"])
        console.print(table)
        console.print(f"Primary diagnosis: [bold]{findings[0]['rule']}[/] — "
                      f"{findings[0]['summary']}")
    else:
        console.print("No finding of warning or worse." if status == "ok"
                      else "Nothing could be diagnosed from this source.")
    if document["not_evaluated"]:
        console.print(f"[dim]Not evaluated ({len(document['not_evaluated'])}):[/]")
        for item in document["not_evaluated"]:
            console.print(f"[dim]  {item['rule']}: {item['reason']}[/]")
