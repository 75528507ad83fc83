"""A configured source that does not answer is said as such, never as "set it".

The rules a node cannot evaluate list the absent signals with the likeliest reason. When the
agent runtime's endpoint or a vendor exporter is configured but down (a real 127.0.0.1 port
where nothing listens), that reason was "set agent_metrics_url" / "no inference module": the
SRE would go and check a config that is already right. Live, from a bundle recorded on such
a node, and (tests/test_prometheus_scrape.py) from Prometheus.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import yaml


def _dead_url() -> str:
    """A 127.0.0.1 url where nothing listens (the port was free a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


def dead_sources_config(tmp_path) -> str:
    path = tmp_path / "dead-sources.yaml"
    path.write_text(yaml.safe_dump({"agent_metrics_url": _dead_url(),
                                    "accelerator_exporter_urls": [_dead_url()]}))
    return str(path)


def _reasons(*args: str) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--json", *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1, 2), done.stderr
    return {item["rule"]: item["reason"] for item in json.loads(done.stdout)["not_evaluated"]}


def assert_said_unread(reasons: dict[str, str]) -> None:
    assert "agent_metrics_url configured but not read" in reasons["queue-backlog"]
    assert "is the agent runtime up?" in reasons["queue-backlog"]
    assert "set agent_metrics_url" not in reasons["queue-backlog"]
    assert "accelerator-exporter-0 configured but not read" in reasons["accelerator-errors"]


def test_a_live_diagnosis_says_the_configured_endpoints_did_not_answer(tmp_path):
    assert_said_unread(_reasons("--seconds", "2", "--config", dead_sources_config(tmp_path)))
    # the same node with nothing configured still says what to configure
    plain = _reasons("--seconds", "2", "--config", str(_empty_config(tmp_path)))
    assert "set agent_metrics_url" in plain["queue-backlog"]
    assert "configured but not read" not in " ".join(plain.values())


def test_a_bundle_recorded_while_the_runtime_was_down_says_so(tmp_path):
    bundle = tmp_path / "bundle"
    subprocess.run([sys.executable, "-m", "fleetscope", "bundle", "record", "--seconds", "2",
                    "--interval", "1", "--config", dead_sources_config(tmp_path), "-o",
                    str(bundle)], check=True, capture_output=True, timeout=300)
    reason = _reasons("--bundle", str(bundle))["queue-backlog"]
    assert "the bundle holds no agent.prom that could be read" in reason
    assert "did not answer while it was recorded" in reason
    assert "set agent_metrics_url" not in reason


def _empty_config(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("{}\n")
    return path
