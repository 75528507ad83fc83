"""The harm of a diagnosis in words: one line per hurting pool, what hurts against its target
and since when, then what explains it. The report, `--fleet` and the console's node page lead
with these lines (docs/how-verdicts-are-reached.md, Harm first).

    pool chat-online: online sessions' P99 1.1 s (target 1 s) since 02:14:05 UTC
        <- offline-preemption: pool chat-online: online processes wait 380 ms/s for a CPU ...
    pool codegen: tool calls not ok 12 % (target 5 %) since 02:10:00 UTC
        <- no rule explains it (unexplained-harm: start from its strongest deviations)

Reads the diagnosis document (docs/diagnosis-json.md): its `harm` items and `findings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from fleetscope.core import units


@dataclass
class PoolHarmText:
    node: str
    pool: str
    signals: list[str] = field(default_factory=list)  # "online sessions' P99 1.1 s (target 1 s)"
    since: float = 0.0
    explained_by: list[dict] = field(default_factory=list)  # the explaining findings

    def head(self, with_node: bool) -> str:
        where = f"pool {self.pool}" if self.pool else "the node's workloads"
        if with_node:
            where += f" on {self.node}"
        return f"{where}: {'; '.join(self.signals)} since {clock(self.since)}"

    def cause(self) -> str:
        if not self.explained_by:
            return "no rule explains it (unexplained-harm: start from its strongest deviations)"
        first = self.explained_by[0]
        more = len(self.explained_by) - 1
        return (f"{first['rule']}: {first['summary']}"
                + (f" (and {units.count(more, 'other finding')})" if more else ""))


@dataclass
class HarmCount:
    """Several nodes' harm counted, as `--fleet` and the console's Fleet page lead with it:
    'harm: 5 pools on 4 nodes over their targets; explained: crash-loop 2,
    offline-preemption 2; 1 unexplained'."""

    pools: int
    nodes: int
    causes: list[tuple[str, int]]  # the rule explaining each pool's harm first, most first
    unexplained: int

    def text(self) -> str:
        said = ", ".join(f"{rule} {count}" for rule, count in self.causes)
        return (f"{units.count(self.pools, 'pool')} on {units.count(self.nodes, 'node')} "
                "over their targets; " + (f"explained: {said}" if said else "none explained")
                + (f"; {self.unexplained} unexplained" if self.unexplained else ""))


def harm_count(entries: list[PoolHarmText]) -> HarmCount:
    """How many pools hurt on how many nodes, by the first rule explaining each (most pools
    first), and how many no rule explains."""
    causes: dict[str, int] = {}
    for entry in entries:
        if entry.explained_by:
            rule = entry.explained_by[0]["rule"]
            causes[rule] = causes.get(rule, 0) + 1
    return HarmCount(len(entries), len({entry.node for entry in entries}),
                     sorted(causes.items(), key=lambda item: -item[1]),
                     sum(not entry.explained_by for entry in entries))


def clock(epoch_s: float) -> str:
    """A time of day with its zone, as the report's header reads its window."""
    zone = units.console_zone()
    moment = datetime.fromtimestamp(float(epoch_s), zone)
    name = moment.tzname() or ""
    if name.startswith(("+", "-")):
        name = f"UTC{name}"
    return f"{moment.strftime('%H:%M:%S')} {name}".strip()


def pool_harms(document: dict) -> list[PoolHarmText]:
    """The document's harm, one entry per hurting pool (its signals together), in the order
    the findings explaining them rank; unexplained harm after explained harm."""
    findings = document.get("findings") or []
    rank = {(f["rule"], f["node"]): index for index, f in enumerate(findings)}
    by_key = {(f["rule"], f["node"]): f for f in findings}
    pools: dict[tuple[str, str], PoolHarmText] = {}
    for item in document.get("harm") or []:
        key = (item["node"], item["pool"])
        entry = pools.setdefault(key, PoolHarmText(item["node"], item["pool"],
                                                   since=item["since"]))
        entry.signals.append(f"{item['title']} {units.format_value(item['value'], item['unit'])}"
                             f" (target {units.format_value(item['target'], item['unit'])})")
        entry.since = min(entry.since, item["since"])
        for rule in item["explained_by"]:
            finding = by_key.get((rule, item["node"]))
            if finding is not None and finding not in entry.explained_by:
                entry.explained_by.append(finding)
    for entry in pools.values():
        entry.explained_by.sort(key=lambda f: rank[(f["rule"], f["node"])])
    return sorted(pools.values(), key=lambda e: (
        rank[(e.explained_by[0]["rule"], e.node)] if e.explained_by else len(rank),
        e.node, e.pool))
