"""What hurts, as the console's pages lead with it: the snapshot's `harm` items and findings
(docs/diagnosis-json.md) in the words of the report (diagnose/harm_lines.py), so the Node
page and `diagnose` say one thing, and the Fleet page counts what `--fleet` counts. No
streamlit here.

    {"pool": "chat-online", "node": "r000n00:9105", "signal": "online_process_starts_per_minute",
     "title": "online pool processes started per minute", "unit": "1/min", "value": 3.0,
     "target": 2.0, "since": 1764615600.0, "explained_by": ["<rule id>"]}
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from fleetscope.diagnose.harm_lines import (
    HarmCount,
    PoolHarmText,
    clock,
    harm_count,
    pool_harms,
)
from fleetscope.rules.model import ENDED

UNEXPLAINED = "no rule explains it"


@dataclass
class PoolHarmView:
    """One hurting pool of a node: what hurts against its target since when, and the
    findings that explain it, worst first (none: no rule explains it)."""

    node: str
    pool: str
    head: str  # "pool chat-online: online sessions' P99 1.1 s (target 1 s) since 02:14:05 UTC"
    causes: list[dict] = field(default_factory=list)  # {rule, severity, summary}
    cause: str = ""  # the report's line under it: the first cause, or why none


def _document(findings: list[dict], harm: list[dict], nodes: set[str] | None = None) -> dict:
    """The parts of a diagnosis document the harm lines read, narrowed to `nodes`."""
    if nodes is not None:
        findings = [f for f in findings if f["node"] in nodes]
        harm = [item for item in harm if item["node"] in nodes]
    return {"findings": findings, "harm": harm}


def _entries(findings: list[dict], harm: list[dict] | None,
             nodes: set[str] | None = None) -> list[PoolHarmText]:
    return pool_harms(_document(findings, harm or [], nodes))


def node_harm(findings: list[dict], harm: list[dict] | None, node: str) -> list[PoolHarmView]:
    """The node's hurting pools, explained harm first (in the order of the findings that
    explain it), as the report lists them."""
    return [PoolHarmView(entry.node, entry.pool, entry.head(with_node=False),
                         [{"rule": f["rule"], "severity": f["severity"],
                           "summary": f["summary"]} for f in entry.explained_by],
                         entry.cause())
            for entry in _entries(findings, harm, {node})]


def ongoing_first(findings: list[dict]) -> list[dict]:
    """A node's findings with the events that ended after everything still acting, and
    info last, as the verdict orders them (docs/how-verdicts-are-reached.md, Order); the
    engine's rank kept otherwise (a query engine's alerts come in their own)."""
    return sorted(findings, key=lambda f: (f["severity"] == "info", ended(f)))


def ended(finding: dict) -> bool:
    """An event that no longer acts (an OOM kill in a cgroup since removed, crashes that
    stopped): it explains no harm of now."""
    return finding.get("phase") == ENDED


def fleet_count(findings: list[dict], harm: list[dict] | None,
                nodes: set[str] | None = None) -> HarmCount | None:
    """The hurting pools counted as `diagnose --fleet` leads with them (its text: '3 pools on
    3 nodes over their targets; explained: <rule> 2; 1 unexplained'); None when no pool
    hurts."""
    entries = _entries(findings, harm, nodes)
    return harm_count(entries) if entries else None


HARM_COLUMNS = ["node", "pool", "harm", "explained by"]


def harm_table(findings: list[dict], harm: list[dict] | None,
               nodes: set[str] | None = None) -> pd.DataFrame:
    """Every hurting pool, a row each, in the report's order: its node, what hurts since
    when, and the rules explaining it (or that none does)."""
    rows = [{"node": entry.node, "pool": entry.pool or "the node's workloads",
             "harm": f"{'; '.join(entry.signals)} since {clock(entry.since)}",
             "explained by": ", ".join(f["rule"] for f in entry.explained_by) or UNEXPLAINED}
            for entry in _entries(findings, harm, nodes)]
    return pd.DataFrame(rows, columns=HARM_COLUMNS)
