"""A fault younger than its rule's `for:` on a real Prometheus: the console says it is pending.

A fresh Prometheus evaluating `fleetscope rules export` over a backfilled node with the
unexplained-harm fault (its rule waits 5 minutes) and a healthy one. In its first minutes
the alert is pending: the console showed "No rule fires on this node" in green, the Fleet
page "No rule fires at warning or worse". The ground truth is what Prometheus itself says
(GET /api/v1/rules) and the fault written into the data.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from fleetscope.dashboard import data
from tests.conftest import fleet_bench, require_tool
from tests.test_dashboard_app import run_app

SICK, WELL = "node-00000:9105", "node-00001:9105"
RULE = "unexplained-harm"  # for: 5m, the catalog's longest: the most time to look


def _alerts(url: str, state: str) -> set[tuple[str, str]]:
    with urllib.request.urlopen(f"{url}/api/v1/rules?type=alert", timeout=10) as answer:
        groups = json.load(answer)["data"]["groups"]
    return {(a["labels"].get("fleetscope_rule"), a["labels"].get("instance"))
            for g in groups for r in g["rules"] for a in r.get("alerts", [])
            if a.get("state") == state}


@pytest.fixture
def fresh_prometheus(tmp_path):
    require_tool("promtool")
    require_tool("prometheus")
    bench = fleet_bench()
    profiles = bench.load_profiles()
    fleet = [bench.Node(SICK, RULE, "r000", "pool-a", "r1p1"),
             bench.Node(WELL, "healthy-idle", "r000", "pool-a", "r1p1")]
    points = 30 * 60 // bench.STEP_S + 1
    # the data runs 20 minutes past now, so "now" is inside it however slow the start
    start_s = int((time.time() + 1200) // bench.STEP_S * bench.STEP_S) - (
        points - 1) * bench.STEP_S
    bench.write_samples(tmp_path / "fleet.om", fleet, profiles, start_s, points, True)
    rule_file = tmp_path / "fleetscope.rules.yml"
    subprocess.run([sys.executable, "-m", "fleetscope", "rules", "export", "-o",
                    str(rule_file)], check=True, timeout=120)
    started = time.time()
    engine = bench.start_prometheus(tmp_path / "fleet.om", tmp_path, rule_file, "1s")
    try:
        yield engine.url, started
    finally:
        engine.stop()


def test_a_pending_alert_is_not_read_as_nothing_firing(monkeypatch, fresh_prometheus):
    url, started = fresh_prometheus
    deadline = time.monotonic() + 120
    while (RULE, SICK) not in _alerts(url, "pending"):
        assert time.monotonic() < deadline, "Prometheus never made the alert pending"
        time.sleep(1)
    snap = data.load(f"prometheus:{url}")
    pending = {(p["rule"], p["node"]): p for p in snap.pending}
    assert (RULE, SICK) in pending, snap.pending
    assert not [f for f in snap.findings if f["rule"] == RULE], "pending read as firing"
    # as Prometheus says: what it has pending, on the node the fault was written into
    assert set(pending) <= _alerts(url, "pending") | _alerts(url, "firing")
    assert all(node == SICK for _, node in pending)
    item = pending[(RULE, SICK)]
    assert started - 5 <= item["since"] <= time.time() and item["for_seconds"] == 300

    app = run_app(monkeypatch, f"prometheus:{url}", "node", {"node": SICK})
    warned = " ".join(w.value for w in app.warning)
    assert f"**{RULE}** (warning) on {SICK} since" in warned and "pending" in warned
    assert not any("No rule fires" in s.value for s in app.success)
    app = run_app(monkeypatch, f"prometheus:{url}", "node", {"node": WELL})
    assert any("No rule fires on this node" in s.value for s in app.success)
    assert not app.warning
    app = run_app(monkeypatch, f"prometheus:{url}", "fleet")
    assert any("pending on 1 node" in w.value and RULE in w.value for w in app.warning)
    assert not any("No rule fires at warning or worse" in s.value for s in app.success)
