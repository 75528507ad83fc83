"""The rule engine: evaluates the catalog over recorded series and ranks the findings.

Every rule's condition is an expression that is also its exported PromQL
(rules/promql.py), so what the engine finds on a bundle is what Prometheus alerts on for
the same series. On top of the condition the engine adds what alerts cannot carry:
evidence values with their thresholds, a confidence, the subjects (pids, binaries, CPUs)
where the source has them, and `not_evaluated` for rules whose signals are absent.

Output is the diagnosis JSON of docs/diagnosis-json.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fleetscope.core.runbooks import runbook_path
from fleetscope.rules.catalog import CATALOG, NODE_LABELS, Rule
from fleetscope.rules.harm import HARM_SIGNALS, POOL_HARMS, HarmSignal, target_at
from fleetscope.rules.model import ENDED, EXPLAINS_NODE, EXPLAINS_POOL, ONGOING
from fleetscope.rules.promql import (
    Compare,
    Labels,
    Memo,
    Scalar,
    Selector,
    Series,
    Vector,
    strip_name,
)

DIAGNOSIS_FORMAT = "fleetscope-diagnosis/1"
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
MAX_ALSO = 3  # label sets named in a merged finding's summary
SUBJECT_KINDS = ("pids", "cgroups", "cpus", "numa_nodes", "interfaces", "devices", "binaries",
                 "pods")


@dataclass
class Finding:
    rule: Rule
    node: str
    labels: dict[str, str]
    value: float
    confidence: float
    evidence: list[dict] = field(default_factory=list)
    subjects: dict[str, list] = field(default_factory=lambda: {k: [] for k in SUBJECT_KINDS})
    extra_summary: str = ""  # added by enrichment, e.g. the antagonists' names
    severity: str = ""  # the tier that held (the rule's own severity unless a lesser tier)
    summary_template: str | None = None
    held_ratio: float = 1.0  # share of the window's steps the condition held at
    phase: str = ONGOING  # ENDED: an event that no longer acts (Tier.phase)
    # Every label set the condition held for on the node (the first is `labels`): the pools
    # a merged finding is about.
    label_sets: list[dict[str, str]] = field(default_factory=list)
    explains: list[str] = field(default_factory=list)  # the hurting pools it explains

    def __post_init__(self) -> None:
        self.severity = self.severity or self.rule.severity
        self.label_sets = self.label_sets or [self.labels]

    def pools(self) -> set[str]:
        """The pools its label sets name."""
        return {labels["pool"] for labels in self.label_sets if labels.get("pool")}

    def can_explain(self) -> bool:
        """An ongoing finding at warning or worse of a rule about a pool or the node: what
        Prometheus's ALERTS offers the rules reading them (rules/harm.py)."""
        return (self.phase == ONGOING and SEVERITY_RANK[self.severity] <= SEVERITY_RANK["warning"]
                and self.rule.explains in (EXPLAINS_POOL, EXPLAINS_NODE)
                and not reads_alerts(self.rule))

    def explains_harm_of(self, node: str, pool: str) -> bool:
        if not self.can_explain() or self.node != node:
            return False
        return self.rule.explains == EXPLAINS_NODE or pool in self.pools()

    def to_json(self) -> dict:
        rule = self.rule
        installed = runbook_path(rule.id)
        return {
            "rule": rule.id,
            "severity": self.severity,
            "node": self.node,
            "confidence": round(self.confidence, 3),
            "summary": rule.render_summary(self.labels, self.value, self.summary_template)
            + (f"; {self.extra_summary}" if self.extra_summary else ""),
            "cause": rule.cause,
            "action": rule.action,
            "runbook": f"runbooks/{rule.id}.md",
            # beside it, the file on this machine (`fleetscope runbook RULE` prints it)
            **({"runbook_path": str(installed)} if installed else {}),
            "evidence": self.evidence,
            "subjects": {kind: self.subjects.get(kind, []) for kind in SUBJECT_KINDS},
            # beside the contract's fields: whether it still acts, and whose harm it explains
            "phase": self.phase,
            "explains": self.explains,
        }


@dataclass
class PoolHarm:
    """A pool hurting on one harm signal over the window (rules/harm.py), and the findings
    that explain it."""

    node: str
    pool: str
    signal: HarmSignal
    value: float
    target: float
    since: float  # unix seconds: where the harm's run up to the window's end began
    explained_by: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"pool": self.pool, "node": self.node, "signal": self.signal.name,
                "title": self.signal.title, "unit": self.signal.unit,
                "value": round(self.value, 6), "target": self.target,
                "since": round(self.since, 3), "explained_by": self.explained_by}


@dataclass
class Verdict:
    """What the rules say of a window: the findings ranked harm first, the rules not
    evaluated, and the harm itself."""

    findings: list[Finding]
    not_evaluated: list[dict]
    harm: list[PoolHarm] = field(default_factory=list)


def _hint_owners() -> tuple[tuple[str, type], ...]:
    """(metric-name prefix, the collector that writes those series), from the collectors."""
    from fleetscope.collectors import COLLECTORS

    return tuple((prefix, collector) for collector in COLLECTORS.values()
                 for prefix, _ in collector.missing_hints)


SOURCE_AVAILABLE = "fleetscope_scrape_source_available"
# A source a collector could not read on the node at the window's end (value 0):
UNAVAILABLE = Compare("==", Selector(SOURCE_AVAILABLE), Scalar(0.0))


def unavailable_sources(vector: Vector) -> set[tuple[str, str]]:
    """(collector, source) pairs of an UNAVAILABLE vector of one node; none for several
    nodes (the reasons say what this node could not read)."""
    out, nodes = set(), set()
    for labels, _ in vector.items():
        found = dict(labels)
        nodes.add(found.get("instance"))
        if "collector" in found and "source" in found:
            out.add((found["collector"], found["source"]))
    return out if len(nodes) <= 1 else set()


# The cause of absent signals no collector claims (no missing_hints for them).
UNEXPLAINED = "signals absent from this source, and no collector says why"


def missing_causes(missing: list[str], present: set[str],
                   unavailable: set[tuple[str, str]] = frozenset()) -> dict[str, list[str]]:
    """The likeliest reason each absent signal's collector gives -> the signals it explains
    (in `missing`'s order), narrowed by the signals the source does have and by the
    sources that collector could not read on the node (`unavailable`, (collector, source)
    pairs): a configured endpoint that does not answer is not "set the endpoint". Signals
    no collector claims are left out."""
    causes: dict[str, list[str]] = {}
    for name in missing:
        owners = [(prefix, owner) for prefix, owner in _hint_owners() if name.startswith(prefix)]
        if owners:
            prefix, owner = max(owners, key=lambda item: len(item[0]))
            down = frozenset(source for collector, source in unavailable
                             if collector == owner.name)
            causes.setdefault(owner.why_missing(prefix, present, down), []).append(name)
    return causes


def _reason(missing: list[str], causes: dict[str, list[str]]) -> str:
    """A not_evaluated reason: the absent signals, and in brackets their causes."""
    reason = f"signals absent from this source: {', '.join(missing)}"
    return reason + (f" ({'; '.join(sorted(causes))})" if causes else "")


def not_evaluated_item(rule_id: str, missing: list[str], present: set[str],
                       unavailable: set[tuple[str, str]] = frozenset()) -> dict:
    """A rule the source lacks signals for: the contract's rule and reason, and beside them
    `causes`, each cause with the absent signals it explains (those no collector claims
    under UNEXPLAINED), so a report can group the rules by cause."""
    causes = missing_causes(missing, present, unavailable)
    claimed = {name for names in causes.values() for name in names}
    listed = [{"cause": cause, "signals": names} for cause, names in sorted(causes.items())]
    unclaimed = [name for name in missing if name not in claimed]
    if unclaimed:
        listed.append({"cause": UNEXPLAINED, "signals": unclaimed})
    return {"rule": rule_id, "reason": _reason(missing, causes), "causes": listed}


def _matches(finding_labels: dict[str, str], labels: tuple) -> bool:
    """An evidence sample belongs to a finding when their shared labels agree."""
    return all(finding_labels.get(k, v) == v for k, v in labels)


def _evidence_vectors(rule: Rule, series: Series, at_ms: int,
                      seen: dict[int, list[Vector]]) -> list[Vector]:
    """The rule's evidence expressions at `at_ms`, evaluated once per time (`seen`): a rack
    of 32 findings of one rule shares them; each finding then takes its own label sets."""
    if at_ms not in seen:
        seen[at_ms] = [item.expr.evaluate(series, at_ms) for item in rule.evidence]
    return seen[at_ms]


def evidence_from(rule: Rule, finding_labels: dict, vectors: list[Vector]) -> list[dict]:
    """A finding's evidence from each evidence expression's vector (in-process, or answered
    by a query engine), the samples of other label sets left out."""
    out = []
    for item, vector in zip(rule.evidence, vectors, strict=True):
        values = [v for labels, v in vector.items() if _matches(finding_labels,
                                                                 strip_name(labels))]
        if not values:
            continue
        value = max(values) if item.pick == "max" else min(values)
        if not math.isfinite(value):  # NaN: a ratio with nothing under it says nothing;
            continue                  # +Inf (no limit) has no JSON number
        out.append({"signal": item.signal, "value": round(value, 6),
                    "threshold": item.threshold, "unit": item.unit})
    return out


def name_subjects(finding: Finding, vectors: list[Vector]) -> None:
    """Subjects named by the rule's evidence samples (Evidence.names) that match the
    finding and are above zero."""
    for item, vector in zip(finding.rule.evidence, vectors, strict=True):
        if item.names is None:
            continue
        kind, label = item.names
        for labels, value in sorted(vector.items()):
            found = dict(strip_name(labels))
            if value > 0 and label in found and _matches(finding.labels, tuple(found.items())):
                named = _subject_value(kind, found[label])
                if named not in finding.subjects[kind]:
                    finding.subjects[kind].append(named)


def _confidence(rule: Rule, evidence: list[dict]) -> float:
    """The rule's base confidence, raised by how far its first evidence passes its threshold."""
    if not evidence or not evidence[0]["threshold"]:
        return rule.confidence
    first = evidence[0]
    ratio = abs(first["value"] / first["threshold"]) if first["threshold"] else 1.0
    if rule.evidence[0].pick == "min":  # "below threshold" evidence
        ratio = abs(first["threshold"] / first["value"]) if first["value"] else 2.0
    return min(0.99, rule.confidence + (0.99 - rule.confidence) * max(0.0, min(1.0, ratio - 1)))


def missing_signals(rule: Rule, series: Series) -> list[str]:
    """Signals the rule lacks on this source ([] when any alternative is complete)."""
    present = series.names()
    if present.intersection(rule.present_if):
        return []
    missing = [sorted(side - present) for side in rule.alternatives()]
    if any(not names for names in missing):
        return []
    return sorted(set().union(*missing))


# Persistence, the engine's `for:`: a condition must hold at this share of the evaluation
# steps of the window (every sample with a full rate window behind it). One bursty interval
# neither makes a finding nor, on a real fault, hides one.
HOLD_FRACTION = 0.75


def rate_window_ms(timestamps: list[int]) -> int | None:
    """How far back rates look in-process: a quarter of the window, at least two sample
    intervals (never more than a rule's own window: Rate takes the smaller). Prometheus
    rates over the rule's window on its own scrape data; a 20 s live sample at 1 s rates
    over 5 s and so has 16 steps to judge persistence on."""
    if len(timestamps) < 2:
        return None
    span = timestamps[-1] - timestamps[0]
    step = span / (len(timestamps) - 1)
    return int(min(span, max(2 * step, span / 4)))


def evaluation_steps(timestamps: list[int], window_ms: int | None) -> list[int]:
    """The sample times with a full rate window behind them (the last one at least)."""
    if not timestamps:
        return []
    first = timestamps[0] + (window_ms or 0)
    return [t for t in timestamps if t >= first] or [timestamps[-1]]


@dataclass
class _Held:
    """A label set's record over the steps: how often its condition held, and where last."""

    steps: int = 0
    last_ms: int = 0
    value: float = 0.0


def held_label_sets(vectors: Iterable[tuple[int, Vector]], step_count: int,
                    hold: float = HOLD_FRACTION) -> dict[Labels, _Held]:
    """Label sets present at `hold` of `step_count` steps (at least one step), from the
    condition's vector at each step, steps ascending. The in-process engine evaluates the
    vectors itself; a query engine returns them from one range query (diagnose/remote.py)."""
    held: dict[Labels, _Held] = {}
    for at_ms, vector in vectors:
        for labels, value in vector.items():
            record = held.setdefault(strip_name(labels), _Held())
            record.steps += 1
            record.last_ms, record.value = at_ms, value
    need = max(1, math.ceil(hold * step_count))
    return {labels: record for labels, record in held.items() if record.steps >= need}


def persistent(condition, series: Series, steps: list[int],
               hold: float = HOLD_FRACTION) -> dict[Labels, _Held]:
    """Label sets whose condition held at `hold` of the steps (at least one step)."""
    return held_label_sets(((at_ms, condition.evaluate(series, at_ms)) for at_ms in steps),
                           len(steps), hold)


def evaluate(series: Series, hostname: str, *,
             enrich: Callable[[Finding], None] | None = None,
             rules: tuple[Rule, ...] = CATALOG) -> tuple[list[Finding], list[dict]]:
    """(ranked findings, not_evaluated) of assess(), for callers that need not the harm."""
    verdict = assess(series, hostname, enrich=enrich, rules=rules)
    return verdict.findings, verdict.not_evaluated


def assess(series: Series, hostname: str, *,
           enrich: Callable[[Finding], None] | None = None,
           rules: tuple[Rule, ...] = CATALOG) -> Verdict:
    """Evaluate every rule over the window, and which pools hurt and why.

    A finding is a label set whose condition held across most of the window (see
    HOLD_FRACTION), reported with its value and evidence at the last step it held. Each
    node gets at most one finding per rule: its most severe tier, and of several label sets
    (pools, queues) the strongest, the others named in its summary. Harm is each pool's
    harm signal over its target across the same share of the window; a finding explains it
    when it is about that pool or the whole node, ongoing, at warning or worse. Findings
    are ranked harm first (rank_key)."""
    timestamps = series.timestamps()
    if not timestamps:
        return Verdict([], [{"rule": r.id, "reason": "no samples"} for r in rules])
    series.limit_windows(rate_window_ms(timestamps), (timestamps[-1] - timestamps[0]) or None)
    steps = evaluation_steps(timestamps, series.max_window_ms)
    with series.memoized():  # the rules share their signals' vectors
        findings, not_evaluated = _evaluate_rules(series, hostname, timestamps, steps, enrich,
                                                  rules)
        harm = pool_harms(series, steps, hostname)
    explain(harm, findings)
    findings.sort(key=rank_key(rules))
    return Verdict(findings, not_evaluated, harm)


def _evaluate_rules(series: Series, hostname: str, timestamps: list[int], steps: list[int],
                    enrich: Callable[[Finding], None] | None, rules: tuple[Rule, ...]
                    ) -> tuple[list[Finding], list[dict]]:
    findings: list[Finding] = []
    not_evaluated: list[dict] = []
    span_ms = timestamps[-1] - timestamps[0]
    alerts: Series | None = None
    unavailable: set[tuple[str, str]] | None = None  # read once, if a rule lacks signals
    for rule in sorted(rules, key=reads_alerts):  # stable: rules that read ALERTS go last
        series_read = series
        if reads_alerts(rule):
            if alerts is None:
                alerts = with_alerts(series, findings, timestamps)
            series_read = alerts
        missing = missing_signals(rule, series_read)
        if missing:
            if unavailable is None:
                unavailable = unavailable_sources(UNAVAILABLE.evaluate(series, timestamps[-1]))
            not_evaluated.append(not_evaluated_item(rule.id, missing, series.names(),
                                                    unavailable))
            continue
        if rule.needs_rates and span_ms <= 0:
            not_evaluated.append({"rule": rule.id,
                                  "reason": "one sample only: rates need at least two"})
            continue
        by_node: dict[str, list[Finding]] = {}
        evidence_at: dict[int, list[Vector]] = {}
        for level in rule.levels():
            # An event rule (for: 0, e.g. a crash or a cold model load in the look-back)
            # fires on one step; a state must persist.
            hold = HOLD_FRACTION if rule.for_seconds else 0.0
            for labels, held in sorted(persistent(level.condition, series_read, steps,
                                                 hold).items()):
                finding_labels = dict(labels)
                node = next((finding_labels[k] for k in NODE_LABELS if k in finding_labels),
                            hostname)
                found = by_node.setdefault(node, [])
                if found and found[0].severity != level.severity:
                    continue  # a more severe tier already holds on this node
                vectors = _evidence_vectors(rule, series_read, held.last_ms, evidence_at)
                evidence = evidence_from(rule, finding_labels, vectors)
                finding = Finding(rule, node, finding_labels, held.value,
                                  _confidence(rule, evidence), evidence,
                                  severity=level.severity, summary_template=level.summary,
                                  held_ratio=held.steps / len(steps), phase=level.phase)
                name_subjects(finding, vectors)
                for kind, label in rule.subject_labels.items():
                    if label in finding_labels:
                        finding.subjects[kind].append(_subject_value(kind,
                                                                     finding_labels[label]))
                found.append(finding)
        for node_findings in by_node.values():
            finding = _merge(node_findings)
            if enrich is not None:
                enrich(finding)
            findings.append(finding)
    return findings, not_evaluated


def pool_harms(series: Series, steps: list[int], hostname: str,
               hold: float = HOLD_FRACTION) -> list[PoolHarm]:
    """Each pool's harm signals over their targets at `hold` of the steps (held_harm)."""
    out = []
    for signal, condition in zip(HARM_SIGNALS, POOL_HARMS, strict=True):
        vectors = [(at_ms, condition.evaluate(series, at_ms)) for at_ms in steps]
        out += held_harm(signal, vectors, len(steps), hostname, hold,
                         lambda at_ms, labels, s=signal: target_at(series, at_ms, s, labels))
    return out


def held_harm(signal: HarmSignal, vectors: list[tuple[int, Vector]], step_count: int,
              hostname: str, hold: float, target_of: Callable[[int, dict], float]
              ) -> list[PoolHarm]:
    """A signal's pools over target at `hold` of `step_count` steps, from its per-pool
    condition's vector at each step (steps ascending; in-process, or a query engine's range
    answer): the value at the last step it held, the target then (`target_of(at_ms,
    labels)`), and where its run up to the window's end began."""
    out = []
    for labels, held in sorted(held_label_sets(vectors, step_count, hold).items()):
        found = dict(labels)
        since = held.last_ms
        for at_ms, vector in reversed(vectors):
            if not any(strip_name(key) == labels for key in vector):
                break
            since = at_ms
        node = next((found[k] for k in NODE_LABELS if k in found), hostname)
        out.append(PoolHarm(node, found.get("pool", ""), signal, held.value,
                            target_of(held.last_ms, found), since / 1000))
    return out


def explain(harm: list[PoolHarm], findings: list[Finding]) -> None:
    """Ties each harm to the findings that explain it, and each finding to the pools whose
    harm it explains."""
    for item in harm:
        for finding in findings:
            if finding.explains_harm_of(item.node, item.pool):
                if finding.rule.id not in item.explained_by:
                    item.explained_by.append(finding.rule.id)
                if item.pool not in finding.explains:
                    finding.explains.append(item.pool)


def reads_alerts(rule: Rule) -> bool:
    """A rule about the other rules' findings (harm no rule explains): evaluated after them.
    Asked for every finding and pool of a fleet: the walk of its conditions is kept."""
    known = _READS_ALERTS.get(id(rule))
    if known is None or known[0] is not rule:
        known = _READS_ALERTS[id(rule)] = (rule, any(
            "ALERTS" in condition.metrics() for _, condition, _ in rule.severities()))
    return known[1]


_READS_ALERTS: dict[int, tuple[Rule, bool]] = {}  # by the rule's identity, the rule kept


def drop_explained(findings: list[Finding]) -> list[Finding]:
    """Without the label sets of rules reading ALERTS (a pool's unexplained harm) that
    another finding explains (Finding.explains_harm_of), and without such a finding once
    none is left: a query engine that does not evaluate the exported rules has no ALERTS,
    and would judge the harm without its causes."""
    kept = []
    for finding in findings:
        if not reads_alerts(finding.rule):
            kept.append(finding)
            continue
        unexplained = [labels for labels in finding.label_sets if not any(
            other.explains_harm_of(finding.node, labels.get("pool", "")) for other in findings)]
        if unexplained:
            finding.label_sets = unexplained
            finding.labels = unexplained[0]
            kept.append(finding)
    return kept


def with_alerts(series: Series, findings: list[Finding], timestamps: list[int]) -> Series:
    """The series plus Prometheus's ALERTS for every warning-or-worse finding so far, one per
    label set it held for, firing at every step of the window (a finding held across it):
    what a rule reading ALERTS sees in Prometheus, where the rules it reads are evaluated
    before it in the same group."""
    out = Series()
    out.memo = Memo()  # read by this pass's last rules only, and dropped with it
    out.by_name = dict(series.by_name)  # shared families: ALERTS is the only one added
    out.max_window_ms, out.max_lookback_ms = series.max_window_ms, series.max_lookback_ms
    out.by_name["ALERTS"] = {}
    for finding in findings:
        if SEVERITY_RANK[finding.severity] > SEVERITY_RANK["warning"]:
            continue
        level = next(level for level in finding.rule.levels()
                     if (level.severity, level.phase) == (finding.severity, finding.phase))
        for labels in finding.label_sets:
            alert = {**labels, "alertname": finding.rule.alert_name, "alertstate": "firing",
                     **finding.rule.alert_labels(level)}
            for at_ms in timestamps:
                out.add("ALERTS", alert, at_ms, 1.0)
    return out


# Harm first (docs/how-verdicts-are-reached.md): what explains a pool's ongoing harm, then
# harm no rule explains, then risks without harm yet, then events that ended, then info.
EXPLAINS_HARM, UNEXPLAINED_HARM, RISK, ENDED_EVENT, INFO = range(5)


def standing(finding: Finding) -> int:
    """Where a finding stands in the verdict (EXPLAINS_HARM ... INFO)."""
    if finding.severity == "info":
        return INFO
    if finding.phase == ENDED:
        return ENDED_EVENT
    if finding.explains:
        return EXPLAINS_HARM
    if reads_alerts(finding.rule):
        return UNEXPLAINED_HARM
    return RISK


def rank_key(rules: tuple[Rule, ...] = CATALOG):
    """Most important first: where it stands (harm first, see `standing`), then severity,
    then causes before symptoms, then confidence, then catalog order (causes the catalog
    lists first win ties)."""
    order = {rule.id: index for index, rule in enumerate(rules)}
    return lambda f: (standing(f), SEVERITY_RANK[f.severity], f.rule.kind != "cause",
                      -f.confidence, order.get(f.rule.id, len(order)), f.node)


def _merge(same_node: list[Finding]) -> Finding:
    """One finding per rule and node: the strongest label set, the others in its summary and
    subjects."""
    # A label set inside another (the node-wide view of a pool's crashes) names nothing new:
    # never the primary, never named beside it.
    sets = [finding.labels for finding in same_node]
    covered = {id(finding) for finding in same_node if any(
        finding.labels != labels and finding.labels.items() <= labels.items()
        for labels in sets)}
    same_node.sort(key=lambda f: (id(f) in covered, -f.confidence, -abs(f.value)))
    primary, others = same_node[0], same_node[1:]
    primary.label_sets = [primary.labels] + [other.labels for other in others]
    others_named = [other for other in others if id(other) not in covered]
    if others_named:
        described = [", ".join(f"{k} {v}" for k, v in sorted(o.labels.items())
                               if k not in NODE_LABELS) or "another series"
                     for o in others_named]
        primary.extra_summary = "also " + "; ".join(described[:MAX_ALSO]) + (
            f" and {len(described) - MAX_ALSO} more" if len(described) > MAX_ALSO else "")
    for other in others:
        for kind, values in other.subjects.items():
            primary.subjects[kind] += [v for v in values if v not in primary.subjects[kind]]
    return primary


def _subject_value(kind: str, value: str):
    if kind in ("pids", "cpus", "numa_nodes") and value.isdigit():
        return int(value)
    return value


def diagnosis(source: str, nodes: list[str], window: tuple[float, float],
              findings: list[Finding], not_evaluated: list[dict], rule_count: int,
              harm: list[PoolHarm] | None = None) -> dict:
    """The document of docs/diagnosis-json.md."""
    if findings and any(f.severity == "critical" for f in findings):
        status = "critical"
    elif any(f.severity == "warning" for f in findings):
        status = "warning"
    elif len(not_evaluated) == rule_count:
        status = "unknown"  # nothing could be checked: never report that as healthy
    else:
        status = "ok"
    return {
        "format": DIAGNOSIS_FORMAT,
        "source": source,
        "nodes": nodes,
        "window": {"start": window[0], "end": window[1]},
        "status": status,
        "findings": [f.to_json() for f in findings],
        "not_evaluated": not_evaluated,
        # beside the contract's fields: which pools hurt, and the findings that explain it
        "harm": [item.to_json() for item in harm or []],
    }


def exit_code(document: dict) -> int:
    """docs/exit-codes.md: 0 nothing of warning or worse, 1 warning, 2 critical, 3 unknown."""
    return {"ok": 0, "warning": 1, "critical": 2}.get(document["status"], 3)
