"""The rule engine: evaluates the catalog over recorded series and ranks the findings.

Every rule's condition is an expression that is also its exported PromQL
(rules/promql.py), so what the engine finds on a bundle is what Prometheus alerts on for
the same series. On top of the condition the engine adds what alerts cannot carry:
evidence values with their thresholds, a confidence, the subjects (pids, binaries, CPUs)
where the source has them, and `not_evaluated` for rules whose signals are absent.

Output is the diagnosis JSON of CONTRACT section 5.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fleetscope.rules.catalog import CATALOG, NODE_LABELS, Rule
from fleetscope.rules.promql import Series, strip_name

DIAGNOSIS_FORMAT = "fleetscope-diagnosis/1"
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
# Why a family of signals is usually missing, for not_evaluated reasons.
MISSING_HINTS = (
    ("fleetscope_pool_", "no workload pools in the config, or no process matched them"),
    ("fleetscope_irq_online_pool", "no online pool in the config, or no process matched it"),
    ("agent_", "no agent runtime metrics: set agent_metrics_url / redis_queues (a bundle "
               "carries them as agent.prom)"),
    ("fleetscope_memory_bandwidth", "perf cannot count memory traffic here: no uncore PMU "
                                    "access (VM, perf_event_paranoid) or perf missing"),
    ("fleetscope_llc_", "perf cannot count last-level cache events here"),
    ("fleetscope_rdma_", "no RDMA device"),
    ("fleetscope_nic_pfc", "no PFC counters: no ethtool -S output for a RoCE NIC"),
    ("fleetscope_sigill_", "kernel log not readable (dmesg / /dev/kmsg)"),
)
SUBJECT_KINDS = ("pids", "cgroups", "cpus", "numa_nodes", "interfaces", "devices", "binaries")


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

    def to_json(self) -> dict:
        rule = self.rule
        return {
            "rule": rule.id,
            "severity": rule.severity,
            "node": self.node,
            "confidence": round(self.confidence, 3),
            "summary": rule.render_summary(self.labels, self.value)
            + (f"; {self.extra_summary}" if self.extra_summary else ""),
            "cause": rule.cause,
            "action": rule.action,
            "runbook": f"runbooks/{rule.id}.md",
            "evidence": self.evidence,
            "subjects": {kind: self.subjects.get(kind, []) for kind in SUBJECT_KINDS},
        }


def _matches(finding_labels: dict[str, str], labels: tuple) -> bool:
    """An evidence sample belongs to a finding when their shared labels agree."""
    return all(finding_labels.get(k, v) == v for k, v in labels)


def _evidence(rule: Rule, finding_labels: dict, series: Series, at_ms: int) -> list[dict]:
    out = []
    for item in rule.evidence:
        vector = item.expr.evaluate(series, at_ms)
        values = [v for labels, v in vector.items() if _matches(finding_labels,
                                                                 strip_name(labels))]
        if not values:
            continue
        value = max(values) if item.pick == "max" else min(values)
        if value != value:  # NaN: a ratio with nothing under it says nothing
            continue
        out.append({"signal": item.signal, "value": round(value, 6),
                    "threshold": item.threshold, "unit": item.unit})
    return out


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


def evaluate(series: Series, hostname: str, *,
             enrich: Callable[[Finding], None] | None = None,
             rules: tuple[Rule, ...] = CATALOG) -> tuple[list[Finding], list[dict]]:
    """Evaluate every rule at the last sample; returns (ranked findings, not_evaluated)."""
    timestamps = series.timestamps()
    findings: list[Finding] = []
    not_evaluated: list[dict] = []
    if not timestamps:
        return [], [{"rule": r.id, "reason": "no samples"} for r in rules]
    at_ms = timestamps[-1]
    span_ms = timestamps[-1] - timestamps[0]
    for rule in rules:
        missing = missing_signals(rule, series)
        if missing:
            hints = sorted({hint for prefix, hint in MISSING_HINTS
                            if any(name.startswith(prefix) for name in missing)})
            reason = f"signals absent from this source: {', '.join(missing)}"
            not_evaluated.append({"rule": rule.id,
                                  "reason": reason + (f" ({'; '.join(hints)})" if hints
                                                      else "")})
            continue
        if rule.needs_rates and span_ms <= 0:
            not_evaluated.append({"rule": rule.id,
                                  "reason": "one sample only: rates need at least two"})
            continue
        for labels, value in sorted(rule.condition.evaluate(series, at_ms).items()):
            finding_labels = dict(strip_name(labels))
            node = next((finding_labels[k] for k in NODE_LABELS if k in finding_labels),
                        hostname)
            evidence = _evidence(rule, finding_labels, series, at_ms)
            finding = Finding(rule, node, finding_labels, value, _confidence(rule, evidence),
                              evidence)
            for kind, label in rule.subject_labels.items():
                if label in finding_labels:
                    finding.subjects[kind].append(_subject_value(kind, finding_labels[label]))
            if enrich is not None:
                enrich(finding)
            findings.append(finding)
    order = {rule.id: index for index, rule in enumerate(rules)}
    findings.sort(key=lambda f: (SEVERITY_RANK[f.rule.severity], -f.confidence,
                                 order[f.rule.id], f.node))
    return findings, not_evaluated


def _subject_value(kind: str, value: str):
    if kind in ("pids", "cpus", "numa_nodes") and value.isdigit():
        return int(value)
    return value


def diagnosis(source: str, nodes: list[str], window: tuple[float, float],
              findings: list[Finding], not_evaluated: list[dict], rule_count: int) -> dict:
    """The CONTRACT section 5 document."""
    if findings and any(f.rule.severity == "critical" for f in findings):
        status = "critical"
    elif any(f.rule.severity == "warning" for f in findings):
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
    }


def exit_code(document: dict) -> int:
    """CONTRACT section 6: 0 nothing of warning or worse, 1 warning, 2 critical, 3 unknown."""
    return {"ok": 0, "warning": 1, "critical": 2}.get(document["status"], 3)
