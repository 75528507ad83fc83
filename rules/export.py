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


def alert_rule(rule: Rule, runbook_base: str) -> dict:
    return {
        "alert": rule.alert_name,
        "expr": rule.condition.promql(),
        "for": _duration(rule.for_seconds),
        "labels": {"severity": rule.severity, "fleetscope_rule": rule.id},
        "annotations": {
            "summary": f"{rule.symptom} ({rule.id}) on {{{{ $labels.instance }}}}",
            "description": f"Likely cause: {rule.cause}. Action: {rule.action}. "
                           f"Value: {{{{ $value }}}}.",
            "runbook_url": f"{runbook_base.rstrip('/')}/{rule.id}.md",
        },
    }


def rule_file(runbook_base: str = DEFAULT_RUNBOOK_BASE, rules: tuple[Rule, ...] = CATALOG
              ) -> dict:
    return {"groups": [{"name": "fleetscope", "rules": [alert_rule(r, runbook_base)
                                                        for r in rules]}]}


def export_yaml(runbook_base: str = DEFAULT_RUNBOOK_BASE) -> str:
    return yaml.safe_dump(rule_file(runbook_base), sort_keys=False, width=100)
