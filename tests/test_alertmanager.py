"""End to end with real parts: the exporter on a sick node's sample, a real Prometheus loading
`fleetscope rules export`, a real Alertmanager, and a webhook receiving the alert with the
contract's labels and its runbook."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from tests.conftest import BUNDLES, require_tool
from tests.test_prometheus_scrape import _free_port


class _Webhook(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    _Webhook.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, _Webhook.received
    server.shutdown()
    server.server_close()


def _start(argv, processes):
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    processes.append(process)
    return process


def test_alert_reaches_alertmanager_with_labels_and_runbook(tmp_path, exporter_factory,
                                                            webhook):
    prometheus = require_tool("prometheus")
    alertmanager = require_tool("prometheus-alertmanager")
    server, received = webhook
    bundle = BUNDLES / "kunpeng-128"
    recorded = json.loads((bundle / "meta.json").read_text())["config"]
    exporter = exporter_factory(bundle / "samples" / "s0001",
                                {**recorded, "numa_maps_min_interval_seconds": 0})
    target = exporter.url.removeprefix("http://").removesuffix("/metrics")

    rules = tmp_path / "fleetscope.rules.yml"
    exported = subprocess.run([sys.executable, "-m", "fleetscope", "rules", "export", "--for",
                               "0s", "--runbook-url-base", "https://runbooks.example/", "-o",
                               str(rules)], capture_output=True, text=True, timeout=60)
    assert exported.returncode == 0, exported.stderr

    am_port, prom_port = _free_port(), _free_port()
    (tmp_path / "am.yml").write_text(
        "route: {receiver: hook, group_by: [alertname, fleetscope_rule], group_wait: 1s,"
        " group_interval: 1s, repeat_interval: 1h}\n"
        f"receivers: [{{name: hook, webhook_configs: [{{url: "
        f"'http://127.0.0.1:{server.server_address[1]}/'}}]}}]\n")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{rules}']\n"
        "alerting: {alertmanagers: [{static_configs: "
        f"[{{targets: ['127.0.0.1:{am_port}']}}]}}]}}\n"
        f"scrape_configs: [{{job_name: node, static_configs: [{{targets: ['{target}']}}]}}]\n")
    processes: list[subprocess.Popen] = []
    try:
        _start([alertmanager, f"--config.file={tmp_path / 'am.yml'}",
                f"--storage.path={tmp_path / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
               processes)
        _start([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}"], processes)
        deadline = time.monotonic() + 90
        alert = None
        while time.monotonic() < deadline and alert is None:
            for message in list(received):
                for candidate in message.get("alerts", []):
                    if candidate["labels"].get("fleetscope_rule") == "fd-exhaustion":
                        alert = candidate
            time.sleep(0.5)
        assert alert is not None, f"no fd-exhaustion alert reached the webhook: {received}"
        assert alert["status"] == "firing"
        assert alert["labels"]["alertname"] == "FleetscopeFdExhaustion"
        assert alert["labels"]["severity"] == "critical"
        assert alert["labels"]["pool"] == "chat-online"
        assert alert["annotations"]["runbook_url"] == \
            "https://runbooks.example/fd-exhaustion.md"
        # The same sample's other causes arrive too, each under its own rule id.
        rules_seen = {a["labels"]["fleetscope_rule"] for m in received for a in m["alerts"]}
        assert {"numa-remote-access", "isa-mismatch"} <= rules_seen
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=20)


def _post_alerts(port: int, alerts: list[dict]) -> None:
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v2/alerts",
                                     data=json.dumps(alerts).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def _alerts(port: int) -> list[dict]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/alerts", timeout=10) as answer:
        return json.loads(answer.read())


def _alert(rule: str, severity: str, instance: str, pool: str | None = None,
           phase: str = "ongoing") -> dict:
    labels = {"alertname": "Fleetscope" + "".join(p.capitalize() for p in rule.split("-")),
              "fleetscope_rule": rule, "severity": severity, "fleetscope_phase": phase,
              "instance": instance}
    if pool:
        labels["pool"] = pool
    return {"labels": labels, "annotations": {"summary": rule}}


def test_a_cause_inhibits_the_unexplained_harm_of_its_own_pool_not_another(tmp_path, webhook):
    """A real Alertmanager loaded with `rules export --format alertmanager`: offline-preemption
    for pool chat on n1 inhibits n1's unexplained-harm of chat, not of codegen on n1, nor chat
    on n2; an ended event (an OOM kill of a removed cgroup) inhibits nothing; a cause about the
    whole node (cpu-saturation on n3) inhibits every pool's there. Its API says which."""
    alertmanager = require_tool("prometheus-alertmanager")
    server, _received = webhook
    exported = subprocess.run([sys.executable, "-m", "fleetscope", "rules", "export", "--format",
                               "alertmanager"], capture_output=True, text=True, timeout=60)
    assert exported.returncode == 0, exported.stderr
    config = {"route": {"receiver": "hook", "group_by": ["alertname", "instance", "pool"],
                        "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
              "receivers": [{"name": "hook", "webhook_configs": [
                  {"url": f"http://127.0.0.1:{server.server_address[1]}/"}]}],
              **yaml.safe_load(exported.stdout)}
    (tmp_path / "am.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    processes: list[subprocess.Popen] = []
    harmed = [("n1:9105", "chat"), ("n1:9105", "codegen"), ("n2:9105", "chat"),
              ("n3:9105", "chat"), ("n3:9105", "codegen"), ("n4:9105", "chat")]
    causes = [_alert("offline-preemption", "warning", "n1:9105", "chat"),
              _alert("cpu-saturation", "warning", "n3:9105"),
              _alert("oom-kill", "warning", "n4:9105", "chat", phase="ended")]
    expected = {("n1:9105", "chat"): True, ("n1:9105", "codegen"): False,
                ("n2:9105", "chat"): False, ("n3:9105", "chat"): True,
                ("n3:9105", "codegen"): True, ("n4:9105", "chat"): False}
    try:
        _start([alertmanager, f"--config.file={tmp_path / 'am.yml'}",
                f"--storage.path={tmp_path / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
               processes)
        deadline = time.monotonic() + 60
        while True:
            try:
                _alerts(port)
                break
            except OSError:
                assert time.monotonic() < deadline, "alertmanager did not start"
                time.sleep(0.3)
        _post_alerts(port, causes + [_alert("unexplained-harm", "warning", node, pool)
                                     for node, pool in harmed])
        # Inhibition is marked as the alerts go through the notification pipeline.
        seen: dict[tuple[str, str], bool] = {}
        while time.monotonic() < deadline:
            seen = {(a["labels"]["instance"], a["labels"]["pool"]):
                    bool(a["status"]["inhibitedBy"])
                    for a in _alerts(port)
                    if a["labels"]["fleetscope_rule"] == "unexplained-harm"
                    and a["status"]["state"] != "unprocessed"}
            if seen == expected:
                break
            time.sleep(0.5)
        assert seen == expected
        causes_state = {a["labels"]["fleetscope_rule"]: a["status"]["inhibitedBy"]
                        for a in _alerts(port) if a["labels"]["fleetscope_rule"] !=
                        "unexplained-harm"}
        assert causes_state == {"offline-preemption": [], "cpu-saturation": [], "oom-kill": []}
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=20)
