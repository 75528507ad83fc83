"""The inference-module rules on a real Prometheus: the exported rule file, as written, fires
on exporters that read a fake dcgm-exporter on 127.0.0.1 serving the scenario bundles' own
scrapes (the vendor's text format, tests/fixtures/make_scenarios.py), and stays silent on the
healthy look-alike.

    XID 79 on GPU 5 (accelerator-errors)            -> FleetscopeAcceleratorErrors, critical
    an unlisted driver/firmware pair, no harm       -> FleetscopeAcceleratorDriverMismatch, info
    a busy module with steady utilisation           -> no alert of any rule

`for:` is set to 0 in this copy of the rule file (the `for:` guard is Prometheus's, over
minutes; what is proven is the expressions), as tests/test_rules_promtool.py does.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from fleetscope.rules.export import rule_file
from tests.conftest import SCENARIOS, require_tool
from tests.test_accelerator_collector import _Vendor, vendor_endpoint  # noqa: F401 (fixture)
from tests.test_prometheus_scrape import _free_port, _query, _wait_for

MATRIX = Path(__file__).resolve().parent.parent / "examples" / "accelerator-matrix.yaml"
# the scenario whose last sample each fake endpoint serves
NODES = {"errors": "accelerator-errors", "mismatch": "accelerator-driver-mismatch",
         "steady": "healthy-module-steady"}


def test_module_alerts_fire_on_a_real_prometheus_and_not_on_the_look_alike(
        vendor_endpoint, exporter_factory, tmp_path, monkeypatch):  # noqa: F811
    binary = require_tool("prometheus")
    targets = {}
    for name, scenario in NODES.items():
        monkeypatch.setitem(_Vendor.routes, f"/{name}/metrics", SCENARIOS / scenario / "samples"
                            / "s0007" / "cmd" / "accelerator-exporter-0.prom")
        exporter = exporter_factory("/", {"accelerator_exporter_urls": [
                                              f"{vendor_endpoint}/{name}/metrics"],
                                          "accelerator_matrix": str(MATRIX),
                                          "collectors": ["accelerator"]})
        targets[name] = exporter.url.removeprefix("http://").removesuffix("/metrics")
    rules = rule_file()
    for rule in rules["groups"][0]["rules"]:
        rule.pop("for", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    port = _free_port()
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "scrape_configs": [{"job_name": "fleetscope",
                            "static_configs": [{"targets": sorted(targets.values())}]}]}))
    process = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        errors = _wait_for(base, 'ALERTS{alertname="FleetscopeAcceleratorErrors",'
                                 'alertstate="firing"}', 90)
        assert {(a["metric"]["instance"], a["metric"]["device"], a["metric"]["severity"])
                for a in errors} == {(targets["errors"], "5", "critical")}
        mismatch = _wait_for(base, 'ALERTS{alertname="FleetscopeAcceleratorDriverMismatch",'
                                   'alertstate="firing"}', 90)
        assert {(a["metric"]["instance"], a["metric"]["severity"], a["metric"]["driver"],
                 a["metric"]["firmware"]) for a in mismatch} == {
            (targets["mismatch"], "info", "525.105.03", "92.00.36.00.02")}
        # the look-alike: scraped and judged for a while (a minute's windows half full),
        # never an alert of any rule
        _wait_for(base, f'count_over_time(fleetscope_accelerator_utilization_ratio'
                        f'{{instance="{targets["steady"]}",device="0"}}[1m]) >= 15', 90)
        assert _query(base, f'ALERTS{{instance="{targets["steady"]}"}}') == []
        assert _query(base, f'max_over_time(ALERTS{{instance="{targets["steady"]}"}}[1m])') \
            == []
        assert _query(base, f'fleetscope_accelerator_matrix_listed'
                            f'{{instance="{targets["steady"]}"}} == 0') == []
    finally:
        process.terminate()
        process.wait(timeout=20)
