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
alert gets its `runbook_url` from one pattern, so none can lack it. With `--console-url URL`
every alert also carries `console_url`, the console's deep link to its finding
(URL/findings?rule=ID&node=INSTANCE), for the page or the ticket.
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


def console_link(console_url: str, rule: Rule) -> str:
    """The console's deep link to this alert's finding: /findings?rule=ID&node=INSTANCE, the
    node filled in by Prometheus's template from the alert's labels (URL-encoded)."""
    return (f"{console_url.rstrip('/')}/findings?rule={rule.id}"
            "&node={{ $labels.instance | urlquery }}")


def alert_rule(rule: Rule, runbook_base: str, for_seconds: int | None = None,
               console_url: str | None = None) -> dict:
    hold = rule.for_seconds if for_seconds is None else for_seconds
    alert = {
        "alert": rule.alert_name,
        "expr": rule.condition.promql(),
        "for": _duration(hold),
        "labels": {"severity": rule.severity, "fleetscope_rule": rule.id},
        "annotations": {
            "summary": f"{rule.symptom} ({rule.id}) on {{{{ $labels.instance }}}}",
            "description": f"Likely cause: {rule.cause}. Action: {rule.action}. "
                           f"Value: {{{{ $value }}}}.",
            "runbook_url": f"{runbook_base.rstrip('/')}/{rule.id}.md",
        },
    }
    if console_url:
        alert["annotations"]["console_url"] = console_link(console_url, rule)
    return alert


def rule_file(runbook_base: str = DEFAULT_RUNBOOK_BASE, rules: tuple[Rule, ...] = CATALOG,
              for_seconds: int | None = None, console_url: str | None = None) -> dict:
    return {"groups": [{"name": "fleetscope",
                        "rules": [alert_rule(r, runbook_base, for_seconds, console_url)
                                  for r in rules]}]}


def export_yaml(runbook_base: str = DEFAULT_RUNBOOK_BASE, for_seconds: int | None = None,
                console_url: str | None = None) -> str:
    return yaml.safe_dump(rule_file(runbook_base, for_seconds=for_seconds,
                                    console_url=console_url), sort_keys=False, width=100)
