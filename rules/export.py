"""`fleetscope rules export`: the catalog as a Prometheus rule file.

    groups:
      - name: fleetscope
        rules:
          - alert: FleetscopeNumaRemoteAccess
            expr: max by (instance, pool, class) (fleetscope_pool_numa_remote_memory_ratio) > 0.3
            for: 2m
            labels: {severity: warning, fleetscope_rule: numa-remote-access}
            annotations: {summary: ..., description: ..., runbook_url: .../numa-remote-access.md}

Generated from the same expressions the engine evaluates, so the two cannot drift; every
alert gets its `runbook_url` from one pattern, so none can lack it.
"""

from __future__ import annotations

import yaml

from .catalog import CATALOG, Rule

DEFAULT_RUNBOOK_BASE = "runbooks/"


def _duration(seconds: int) -> str:
    return f"{seconds // 60}m" if seconds % 60 == 0 and seconds else f"{seconds}s"


def parse_duration(text: str) -> int:
    """'90s', '2m', '1h' -> seconds (Prometheus duration units the export needs)."""
    units = {"s": 1, "m": 60, "h": 3600}
    if len(text) < 2 or text[-1] not in units or not text[:-1].isdigit():
        raise ValueError(f"duration must look like 30s, 2m or 1h, got {text!r}")
    return int(text[:-1]) * units[text[-1]]


def alert_rules(rule: Rule, runbook_base: str, for_seconds: int | None = None) -> list[dict]:
    """One alert per severity tier of the rule, under the rule's alert name: a lesser tier's
    expression excludes nodes where a more severe one holds (Rule.severities)."""
    hold = rule.for_seconds if for_seconds is None else for_seconds
    return [{
        "alert": rule.alert_name,
        "expr": condition.promql(),
        "for": _duration(hold),
        "labels": {"severity": severity, "fleetscope_rule": rule.id},
        "annotations": {
            "summary": f"{rule.symptom} ({rule.id}) on {{{{ $labels.instance }}}}",
            "description": f"Likely cause: {rule.cause}. Action: {rule.action}. "
                           f"Value: {{{{ $value }}}}.",
            "runbook_url": f"{runbook_base.rstrip('/')}/{rule.id}.md",
        },
    } for severity, condition, _ in rule.severities()]


def rule_file(runbook_base: str = DEFAULT_RUNBOOK_BASE, rules: tuple[Rule, ...] = CATALOG,
              for_seconds: int | None = None) -> dict:
    return {"groups": [{"name": "fleetscope",
                        "rules": [alert for r in rules
                                  for alert in alert_rules(r, runbook_base, for_seconds)]}]}


def export_yaml(runbook_base: str = DEFAULT_RUNBOOK_BASE, for_seconds: int | None = None
                ) -> str:
    return yaml.safe_dump(rule_file(runbook_base, for_seconds=for_seconds), sort_keys=False,
                          width=100)
