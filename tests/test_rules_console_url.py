"""`fleetscope rules export --console-url URL`: every alert's annotations carry the console's
deep link to its finding, rendered by Prometheus's own templating (promtool test rules)."""

from __future__ import annotations

import subprocess
import sys

import yaml

from fleetscope.rules.catalog import by_id
from fleetscope.rules.export import alert_rules, rule_file
from tests.conftest import require_tool

CONSOLE = "http://127.0.0.1:8501/"


def test_without_a_console_url_no_alert_has_one():
    for group in rule_file()["groups"]:
        for rule in group["rules"]:
            assert "console_url" not in rule.get("annotations", {})


def test_every_alert_links_to_its_finding_in_the_console():
    for group in rule_file(console_url=CONSOLE)["groups"]:
        for rule in (r for r in group["rules"] if "alert" in r):  # not the recording rules
            link = rule["annotations"]["console_url"]
            assert link == (f"http://127.0.0.1:8501/findings?rule={rule['labels']['fleetscope_rule']}"
                            "&node={{ $labels.instance | urlquery }}")


def test_the_flag_and_a_bad_url(tmp_path):
    out = tmp_path / "rules.yml"
    ok = subprocess.run([sys.executable, "-m", "fleetscope", "rules", "export", "--console-url",
                         CONSOLE, "-o", str(out)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    alerts = yaml.safe_load(out.read_text())["groups"][0]["rules"]
    assert all(a["annotations"]["console_url"].startswith(CONSOLE + "findings?rule=")
               for a in alerts)
    bad = subprocess.run([sys.executable, "-m", "fleetscope", "rules", "export",
                          "--console-url", "console:8501"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_prometheus_renders_the_link_with_the_node_url_encoded(tmp_path):
    promtool = require_tool("promtool")
    rule = by_id("fd-exhaustion")
    (alert,) = alert_rules(rule, "runbooks/", for_seconds=60, console_url=CONSOLE)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(
        {"groups": [{"name": "fleetscope", "rules": [alert]}]}, sort_keys=False))
    labels = {"instance": "r004n05:9105", "pool": "chat-online", "class": "online"}
    series = "fleetscope_pool_fd_usage_ratio{" + ",".join(
        f'{k}="{v}"' for k, v in labels.items()) + "}"
    annotations = {
        "summary": alert["annotations"]["summary"].replace("{{ $labels.instance }}",
                                                           labels["instance"]),
        "description": alert["annotations"]["description"].replace("{{ $value }}", "0.95"),
        "runbook_url": "runbooks/fd-exhaustion.md",
        "console_url": "http://127.0.0.1:8501/findings?rule=fd-exhaustion&node=r004n05%3A9105",
    }
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": series, "values": "0.95x5"}],
        "alert_rule_test": [{"eval_time": "3m", "alertname": rule.alert_name, "exp_alerts": [{
            "exp_labels": {**labels, **rule.alert_labels(rule.levels()[0])},
            "exp_annotations": annotations}]}]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
