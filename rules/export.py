"""`fleetscope rules export`: the catalog as a Prometheus rule file, with the recording rules
of the console's per-node aggregates (rules/recording.py) in a second group.

    groups:
      - name: fleetscope
        rules:
          - alert: FleetscopeNumaRemoteAccess
            expr: max by (instance, pool, class) (fleetscope_pool_numa_remote_memory_ratio) > 0.3
            for: 2m
            labels: {severity: warning, fleetscope_rule: numa-remote-access,
                     fleetscope_phase: ongoing}
            annotations: {summary: ..., description: ..., runbook_url: .../numa-remote-access.md}

Generated from the same expressions the engine evaluates, so the two cannot drift; every
alert gets its `runbook_url` from one pattern, so none can lack it. `fleetscope_phase` says
whether the alert is of an event that still acts (`ongoing`) or one that ended (`ended`: a
kill whose cgroup is gone, a crash loop that stopped), for routing and inhibition.

`--format alertmanager` writes the inhibit rules that follow from what each rule's findings
are about (Rule.explains, rules/harm.py): a cause about a pool inhibits the unexplained-harm
alert of that pool on that node, not another pool's; a cause about the whole node inhibits
those of every pool on it. With `--console-url URL`
every alert also carries `console_url`, the console's deep link to its finding
(URL/findings?rule=ID&node=INSTANCE), for the page or the ticket.
"""

from __future__ import annotations

import yaml

from .catalog import CATALOG, Rule
from .harm import EXPLAINED_ON, POOL_HARMS, ExplainingAlerts
from .model import ONGOING
from .recording import recording_group
from .terms import terms_group

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


def runbook_url(rule: Rule, runbook_base: str, console_url: str | None = None,
                console_runbooks: bool = False) -> str:
    """base/<rule id>.md; with console_runbooks and a console, the console's page for the
    runbook (the console serves the runbooks installed with it)."""
    if console_runbooks and console_url:
        return f"{console_url.rstrip('/')}/runbook?rule={rule.id}"
    return f"{runbook_base.rstrip('/')}/{rule.id}.md"


def alert_rules(rule: Rule, runbook_base: str, for_seconds: int | None = None,
                console_url: str | None = None, console_runbooks: bool = False) -> list[dict]:
    """One alert per severity tier of the rule, under the rule's alert name: a lesser tier's
    expression excludes nodes where a more severe one holds (Rule.severities)."""
    hold = rule.for_seconds if for_seconds is None else for_seconds
    alerts = [{
        "alert": rule.alert_name,
        "expr": level.condition.promql(),
        "for": _duration(hold),
        "labels": rule.alert_labels(level),
        "annotations": {
            "summary": f"{rule.symptom} ({rule.id}) on {{{{ $labels.instance }}}}",
            "description": f"Likely cause: {rule.cause}. Action: {rule.action}. "
                           f"Value: {{{{ $value }}}}.",
            "runbook_url": runbook_url(rule, runbook_base, console_url, console_runbooks),
        },
    } for level in rule.levels()]
    if console_url:
        for alert in alerts:
            alert["annotations"]["console_url"] = console_link(console_url, rule)
    return alerts


def rule_file(runbook_base: str = DEFAULT_RUNBOOK_BASE, rules: tuple[Rule, ...] = CATALOG,
              for_seconds: int | None = None, console_url: str | None = None,
              recording: bool = True, console_runbooks: bool = False) -> dict:
    """The alerts (group `fleetscope`), then the recording rules the console reads
    (`fleetscope-recording`, rules/recording.py) and those that keep the conditions' terms
    evaluated for a diagnosis to read (`fleetscope-terms`, rules/terms.py)."""
    groups = [{"name": "fleetscope",
               "rules": [alert for r in rules
                         for alert in alert_rules(r, runbook_base, for_seconds, console_url,
                                                  console_runbooks)]}]
    if recording:
        groups.append(recording_group())
        groups.append(terms_group([level.condition for rule in rules
                                   for level in rule.levels()] + list(POOL_HARMS)))
    return {"groups": groups}


def export_yaml(runbook_base: str = DEFAULT_RUNBOOK_BASE, for_seconds: int | None = None,
                console_url: str | None = None, console_runbooks: bool = False) -> str:
    return yaml.safe_dump(rule_file(runbook_base, for_seconds=for_seconds,
                                    console_url=console_url,
                                    console_runbooks=console_runbooks),
                          sort_keys=False, width=100)


PROMETHEUS_RULE_HEADER = (
    "# Generated by `fleetscope rules export --format prometheusrule`: the rule catalog as a\n"
    "# prometheus-operator PrometheusRule. Do not edit; export it again.\n"
)


def export_prometheus_rule(runbook_base: str = DEFAULT_RUNBOOK_BASE,
                           for_seconds: int | None = None,
                           console_url: str | None = None,
                           console_runbooks: bool = False) -> str:
    """The same groups as export_yaml, wrapped as a prometheus-operator PrometheusRule
    (monitoring.coreos.com/v1) for `kubectl apply`."""
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "fleetscope", "namespace": "monitoring",
                     "labels": {"app.kubernetes.io/name": "fleetscope",
                                "app.kubernetes.io/part-of": "fleetscope"}},
        "spec": rule_file(runbook_base, for_seconds=for_seconds, console_url=console_url,
                          console_runbooks=console_runbooks),
    }
    return PROMETHEUS_RULE_HEADER + yaml.safe_dump(resource, sort_keys=False, width=100)


def _matcher(label: str, values: list[str]) -> str:
    if len(values) == 1:
        return f'{label}="{values[0]}"'
    return f'{label}=~"{"|".join(values)}"'


def inhibit_rules(rules: tuple[Rule, ...] = CATALOG) -> list[dict]:
    """Alertmanager inhibit rules: the ongoing alerts (warning or worse) of the rules whose
    findings explain a pool's harm inhibit the alerts of the rules reading ALERTS (harm no
    rule explains) that carry the same labels (`instance`, and `pool` for a cause about a
    pool): the same relation the exported unexplained-harm condition holds with `unless`."""
    targets = sorted(rule.id for rule in rules
                     if any("ALERTS" in level.condition.metrics() for level in rule.levels()))
    out = []
    for scope, on in EXPLAINED_ON.items():
        sources = [rule_id for rule_id in ExplainingAlerts(scope).rule_ids()
                   if any(rule.id == rule_id for rule in rules)]
        if not sources or not targets:
            continue
        out.append({"source_matchers": [_matcher("fleetscope_rule", sources),
                                        'severity=~"warning|critical"',
                                        f'fleetscope_phase="{ONGOING}"'],
                    "target_matchers": [_matcher("fleetscope_rule", targets)],
                    "equal": list(on)})
    return out


ALERTMANAGER_HEADER = (
    "# Generated by `fleetscope rules export --format alertmanager`: Alertmanager inhibit\n"
    "# rules for fleetscope's alerts. A cause about a pool (its processes, cgroups, queues)\n"
    "# inhibits the unexplained-harm alert of that pool on that node; a cause about the whole\n"
    "# node (its CPUs, memory, network plane, modules) those of every pool on it. Paste the\n"
    "# list under `inhibit_rules:` of your alertmanager.yml; export it again after an upgrade.\n"
)


def export_alertmanager(*_ignored) -> str:
    """The inhibit rules as the `inhibit_rules:` section of an Alertmanager config."""
    return ALERTMANAGER_HEADER + yaml.safe_dump({"inhibit_rules": inhibit_rules()},
                                                sort_keys=False, width=100)


def markdown_table(link_prefix: str = "") -> str:
    """The catalog as the markdown table of runbooks/README.md (`fleetscope rules list
    --format markdown`): id linked to its runbook, severity, symptom, likely cause."""
    rows = ["| id | severity | symptom | likely cause |", "|---|---|---|---|"]
    for rule in CATALOG:
        cells = [f"[{rule.id}]({link_prefix}{rule.id}.md)", rule.severity, rule.symptom,
                 rule.cause]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"
