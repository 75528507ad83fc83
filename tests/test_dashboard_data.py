"""The console's sources and frames (dashboard/data.py, the *_frames.py modules) and the
simulated fleet, with pandas."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from fleetscope.dashboard import (
    data,
    evidence_views,
    fleet_eval,
    fleet_frames,
    frames,
    latency_frames,
    node_frames,
    rulebook,
)
from fleetscope.dashboard.fleet_sim import Fleet, faults
from fleetscope.diagnose import engine
from fleetscope.rules.catalog import CATALOG, RULE_IDS
from fleetscope.rules.promql import Series
from fleetscope.rules.recording import RECORDINGS
from tests.conftest import BUNDLES


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return Fleet(nodes=256)


@pytest.fixture(scope="module")
def snapshot() -> data.Snapshot:
    return data.load("demo:256")


def test_every_injected_fault_is_found_by_the_rule_engine_on_exactly_its_nodes(fleet):
    findings, not_evaluated = fleet_eval.evaluate_sharded(fleet.shards(set(data.FLEET_METRICS)))
    found: dict[str, set[str]] = {}
    for finding in findings:
        found.setdefault(finding.rule.id, set()).add(finding.node)
    expected = fleet.expected_findings()
    assert set(expected) == set(RULE_IDS) == {rule for rule, *_ in faults()}
    for rule_id in RULE_IDS:
        assert found.get(rule_id) == expected[rule_id], rule_id
    assert not_evaluated == []


def test_sharded_evaluation_equals_one_evaluation_of_the_whole_fleet():
    small = Fleet(nodes=64)
    whole = small.series(set(data.FLEET_METRICS))
    stamps = whole.timestamps()
    whole.max_window_ms = stamps[-1] - stamps[0]
    one, _ = engine.evaluate(whole, "?")
    sharded, _ = fleet_eval.evaluate_sharded(small.shards(set(data.FLEET_METRICS)))
    key = [(f.rule.id, f.node, tuple(sorted(f.labels.items())), round(f.value, 9),
            round(f.confidence, 9)) for f in one]
    assert key == [(f.rule.id, f.node, tuple(sorted(f.labels.items())), round(f.value, 9),
                    round(f.confidence, 9)) for f in sharded]
    assert len(key) > len(RULE_IDS)


def _same_answer(got: fleet_eval.FleetAnswer, want: fleet_eval.FleetAnswer) -> None:
    assert got.findings == want.findings
    assert got.not_evaluated == want.not_evaluated
    assert got.tables.by_name == want.tables.by_name
    assert got.series_evaluated == want.series_evaluated
    assert set(got.aggregates) == set(want.aggregates)
    for record, vector in want.aggregates.items():
        assert set(got.aggregates[record]) == set(vector), record
        assert [got.aggregates[record][k] for k in vector] == pytest.approx(
            list(vector.values()), nan_ok=True), record


@pytest.fixture(scope="module")
def one_process_answer() -> tuple[int, fleet_eval.FleetAnswer]:
    end = data.demo_end()
    return end, fleet_eval.evaluate_fleet(Fleet(64, 16, end_s=end), processes=1)


def test_the_demo_in_worker_processes_answers_exactly_what_one_process_does(
        one_process_answer):
    end, one = one_process_answer
    several = fleet_eval.evaluate_fleet(Fleet(64, 16, end_s=end), processes=3)
    assert several.processes == 3 and several.notes == []
    _same_answer(several, one)
    assert {f["rule"] for f in one.findings} == set(RULE_IDS)


def test_the_demo_recordings_equal_the_recording_rules_over_the_whole_fleet(
        one_process_answer):
    end, answer = one_process_answer
    whole = Fleet(nodes=64, cores=16, end_s=end).series(set(data.FLEET_METRICS))
    stamps = whole.timestamps()
    whole.max_window_ms = stamps[-1] - stamps[0]
    for recording in RECORDINGS:
        expected = recording.expr.evaluate(whole, stamps[-1])
        got = answer.aggregates[recording.record]
        assert expected and set(got) == set(expected), recording.record
        assert [got[k] for k in expected] == pytest.approx(list(expected.values()),
                                                            nan_ok=True), recording.record
    # and the findings are those of one evaluation of the whole fleet
    findings, _ = engine.evaluate(whole, "?")
    assert [(f["rule"], f["node"], f["severity"]) for f in answer.findings] == \
        [(f.rule.id, f.node, f.severity) for f in findings]


WORKER_FAILURES = {
    "exits with an error": "import sys; sys.stderr.write('MemoryError\\n'); sys.exit(3)",
    "writes no JSON": "print('{\"rules\": [')",
    "runs another rule catalog": "import json; print(json.dumps({'rules': ['x']}))",
}


@pytest.mark.parametrize("failure", list(WORKER_FAILURES))
def test_a_failed_worker_costs_time_never_racks(failure, one_process_answer, monkeypatch):
    end, one = one_process_answer

    def failing_worker(*_args):  # a real process that fails the way named
        return subprocess.Popen([sys.executable, "-c", WORKER_FAILURES[failure]],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    monkeypatch.setattr(fleet_eval, "_worker", failing_worker)
    answer = fleet_eval.evaluate_fleet(Fleet(64, 16, end_s=end), processes=2)
    _same_answer(answer, one)
    assert len(answer.notes) == 1
    assert re.fullmatch(r"a worker for racks \d+-15 failed \(.+\); evaluated in the "
                        r"console's process", answer.notes[0]), answer.notes
    if failure == "exits with an error":
        assert "exit 3: MemoryError" in answer.notes[0]


def test_an_error_in_the_console_process_leaves_no_worker_running(monkeypatch):
    started = []
    real_worker = fleet_eval._worker

    def recorded_worker(*args):
        started.append(real_worker(*args))
        return started[-1]

    def failing_part(fleet, racks):
        raise RuntimeError("a bug in this process")
    monkeypatch.setattr(fleet_eval, "_worker", recorded_worker)
    monkeypatch.setattr(fleet_eval, "evaluate_part", failing_part)
    with pytest.raises(RuntimeError):
        fleet_eval.evaluate_fleet(Fleet(64, 16, end_s=data.demo_end()), processes=2)
    assert len(started) == 1 and started[0].returncode is not None  # ended, not left running


def test_a_large_demo_fleet_uses_the_other_cpus_a_small_one_stays_in_process():
    assert fleet_eval.default_processes(256) == 1
    cpus = len(os.sched_getaffinity(0))
    assert fleet_eval.default_processes(4096) == min(cpus, fleet_eval.MAX_WORKERS)
    assert fleet_eval._parts(128, 2) == [range(0, 71), range(71, 128)]
    assert fleet_eval._parts(16, 3) == [range(0, 6), range(6, 11), range(11, 16)]


def test_the_fleet_is_deterministic_and_a_node_history_ends_on_the_fleet_scrape(fleet):
    again = Fleet(nodes=256)
    name = fleet.instances[fleet.faults["roce-congestion"][0]]
    assert fleet.series({"fleetscope_nic_pfc_pause_frames_total"}).by_name == \
        again.series({"fleetscope_nic_pfc_pause_frames_total"}).by_name
    snapshot = fleet.series(nodes=[fleet.position[name]])
    history = fleet.node_series(name, minutes=30)
    for metric, family in snapshot.by_name.items():
        for labels, points in family.items():
            tail = history.by_name[metric][labels][-2:]
            assert [t for t, _ in tail] == [t for t, _ in points], metric
            assert [v for _, v in tail] == pytest.approx([v for _, v in points]), metric
    assert len(history.timestamps()) == 31


def test_the_fleet_has_pools_racks_and_several_cpu_models_and_steppings(snapshot):
    nodes = fleet_frames.node_table(snapshot)
    assert len(nodes) == 256
    assert set(nodes["node_pool"]) == {"chat", "codegen", "batch", "mixed"}
    assert nodes["rack"].nunique() == 16
    assert {"aarch64", "x86_64"} <= set(nodes["arch"])
    assert nodes["stepping"].nunique() >= 4
    assert "0xd01 r1p0" in set(nodes["stepping"])


def test_node_signals_show_the_faults_where_they_were_injected(snapshot, fleet):
    signals = fleet_frames.node_signals(snapshot)
    assert list(signals.columns) == list(fleet_frames.SIGNALS)
    congested = {fleet.instances[i] for i in fleet.faults["roce-congestion"]}
    pauses = signals["PFC pauses /s"]
    assert pauses[list(congested)].min() > 100 > pauses.drop(list(congested)).max()
    saturated = [fleet.instances[i] for i in fleet.faults["memory-bandwidth-saturation"]]
    assert signals.loc[saturated, "memory bandwidth % of peak"].min() > 0.8
    p99 = signals["P99 session latency (online)"]
    assert p99.notna().sum() > 100 and (p99.dropna() > 0).all()
    backlog = [fleet.instances[i] for i in fleet.faults["queue-backlog"]]
    assert signals.loc[backlog, "queue depth"].min() > 50


def test_rates_and_latest_read_series_like_prometheus():
    series = Series()
    for t, v in ((0, 10.0), (60_000, 70.0), (120_000, 10.0)):  # a reset at the end
        series.add("x_total", {"instance": "n"}, t, v)
    series.add("g", {"instance": "n", "stat": "p50"}, 0, 0.5)
    assert frames.last_rate(series, "x_total")["value"].iloc[0] == pytest.approx(10 / 60)
    assert frames.latest(series, "g", {"stat": "p50"})["value"].iloc[0] == 0.5
    assert frames.latest(series, "g", {"stat": "max"}).empty
    frame = frames.timeline(series, "x_total")
    assert frame["value"].tolist() == pytest.approx([1.0, 10 / 60])


def _agreement_series() -> Series:
    """One node, 15 s scrapes for 5 minutes: a PFC counter that resets (a NIC driver reload)
    two scrapes before the end and pauses at an uneven pace, and an online session-latency
    histogram whose counters reset too (nothing slower than 4 s)."""
    series = Series()
    pauses = 0.0
    buckets = {"0.25": 0.0, "1": 0.0, "4": 0.0, "+Inf": 0.0}
    for step in range(21):
        t = step * 15_000
        pauses = 900.0 if step == 19 else pauses + 2_000 + 300 * (step % 3)
        series.add("fleetscope_nic_pfc_pause_frames_total",
                   {"instance": "n1", "interface": "eth0", "priority": "3"}, t, pauses)
        if step == 18:
            buckets = dict.fromkeys(buckets, 0.0)
        added = 0.0
        for le, grow in zip(buckets, (20 + step % 4, 9, 3 + step % 2, 0), strict=True):
            added += grow
            buckets[le] += added
            series.add("agent_session_duration_seconds_bucket",
                       {"instance": "n1", "pool": "chat", "class": "online", "le": le},
                       t, buckets[le])
    return series


def test_console_tiles_and_rules_read_the_same_number():
    """A tile and a rule over the same series agree, across a counter reset and for a
    histogram quantile: both are rules.promql expressions with the engine's rate window."""
    from fleetscope.rules.catalog import WINDOW, by_id
    from fleetscope.rules.promql import HistogramQuantile, Rate, Selector, Sum

    series = _agreement_series()
    found, _ = engine.evaluate(series, "n1", rules=(by_id("roce-congestion"),))
    assert [f.rule.id for f in found] == ["roce-congestion"]
    rule_value = next(e["value"] for e in found[0].to_json()["evidence"]
                      if e["signal"] == "PFC pause frames")
    snapshot = data.Snapshot("bundle", "n1", series, [], [], (0, 300))
    signals = fleet_frames.node_signals(snapshot)
    tile = signals.loc["n1", "PFC pauses /s"]
    assert tile == pytest.approx(rule_value, rel=1e-6)
    # Prometheus's rate over the rule's 60 s window ending at the last scrape: the reset
    # counts from 0, so the increase is (last before reset - first) + what came after.
    points = series.by_name["fleetscope_nic_pfc_pause_frames_total"]
    (values,) = ([v for t, v in pts if t >= 240_000] for pts in points.values())
    assert tile == pytest.approx((values[-3] - values[0] + values[-2] + (values[-1] -
                                  values[-2])) / 60)
    # The last two samples alone (the console's old rate) say something else.
    assert tile != pytest.approx((values[-1] - values[-2]) / 15)

    p99 = HistogramQuantile(0.99, Sum(Rate(Selector("agent_session_duration_seconds_bucket",
                                                    {"class": "online"}), WINDOW),
                                      by=("instance", "pool", "le")))
    (rule_p99,) = p99.evaluate(series, 300_000).values()
    assert signals.loc["n1", "P99 session latency (online)"] == pytest.approx(rule_p99)
    assert 1 < rule_p99 < 4  # the rank falls in the (1, 4] bucket: interpolated, not a bound
    assert frames.latest(series, "fleetscope_nic_pfc_pause_frames_total")["value"].tolist() == \
        [values[-1]]


def test_findings_counts_and_health_worst_first(snapshot):
    findings = fleet_frames.findings_frame(snapshot.findings)
    counts = fleet_frames.rule_counts(findings)
    assert set(counts["rule"]) == set(RULE_IDS)
    assert (counts["nodes"] > 0).all()
    severities = counts["severity"].tolist()
    assert severities == sorted(severities, key=fleet_frames.SEVERITY_ORDER.get)
    nodes = fleet_frames.node_table(snapshot)
    by_pool = fleet_frames.health_by(nodes, findings, "node_pool")
    assert by_pool["nodes"].sum() == 256
    assert (by_pool[["critical", "warning", "ok"]].sum(axis=1) == by_pool["nodes"]).all()
    chat = fleet_frames.filter_nodes(nodes, pools=["chat"])
    assert set(chat["node_pool"]) == {"chat"}
    assert set(fleet_frames.findings_for(findings, chat)["node"]) <= set(chat["instance"])


def test_heatmap_is_a_rack_by_position_grid(snapshot):
    nodes = fleet_frames.node_table(snapshot)
    grid = fleet_frames.heatmap(nodes, fleet_frames.node_signals(snapshot), "busy (median core)")
    assert grid["z"].shape == (16, 16)
    assert grid["y"][0].startswith("batch / ")
    assert grid["text"][0][0].endswith(":9105")


def test_per_core_view_shows_the_pinned_hogs_of_an_imbalanced_node(fleet):
    name = fleet.instances[fleet.faults["core-imbalance"][0]]
    busy = node_frames.per_core_busy(fleet.node_series(name, minutes=20))
    assert busy.shape == (128, 20)
    summary = node_frames.core_summary(busy)
    assert summary["hogs"] == list(range(16))
    assert summary["spread"] > 0.5
    calm = fleet.instances[0]
    calm_busy = node_frames.per_core_busy(fleet.node_series(calm, 20))
    assert node_frames.core_summary(calm_busy)["hogs"] == []


def test_numa_view_shows_off_node_pages_of_a_remote_numa_node(fleet):
    remote = fleet.instances[fleet.faults["numa-remote-access"][0]]
    view = node_frames.numa_view(fleet.node_series(remote, 10, per_core=False))
    assert list(view["numa_node"]) == ["0-3"]  # four alike NUMA nodes: one row that says so
    calm = node_frames.numa_view(fleet.node_series(fleet.instances[0], 10, per_core=False))
    assert view["pages off-node /s"].sum() > 10 * calm["pages off-node /s"].sum()
    assert node_frames.pool_memory(fleet.node_series(remote, 10, False))["remote"].max() > 0


def test_inference_is_a_third_of_online_session_time(snapshot):
    breakdown = latency_frames.stage_breakdown(snapshot)
    shares = latency_frames.inference_share(breakdown).set_index("pool")["inference share"]
    assert 0.3 <= shares["chat-online"].min() <= shares["chat-online"].max() <= 0.45
    assert 0.3 <= shares["codegen-online"] <= 0.45
    assert breakdown.groupby(["node_pool", "pool"])["share"].sum().round(9).eq(1).all()


def test_rules_table_yaml_and_runbooks():
    table = rulebook.rule_table()
    assert len(table) == len(CATALOG) and set(table["rule"]) >= set(RULE_IDS)
    rules = yaml.safe_load(rulebook.rules_yaml())["groups"][0]["rules"]
    assert {r["labels"]["fleetscope_rule"] for r in rules} >= set(RULE_IDS)
    assert rulebook.runbook("roce-congestion").startswith("# roce-congestion")
    assert "not found" in rulebook.runbook("no-such-rule")


@pytest.mark.parametrize("spec, kind", [("demo", "demo"), ("demo:64", "demo"),
                                        ("bundle:/x", "bundle"),
                                        ("prometheus:http://h:9090", "prometheus")])
def test_parse_source(spec, kind):
    assert data.parse_source(spec)[0] == kind


@pytest.mark.parametrize("spec", ["nope", "demo:3", "bundle:", "prometheus:ftp://x"])
def test_parse_source_rejects(spec):
    with pytest.raises(data.SourceError):
        data.parse_source(spec)


def test_a_bundle_source_is_one_node_with_the_diagnose_findings_and_every_core():
    snap = data.load(f"bundle:{BUNDLES / 'kunpeng-128'}")
    nodes = fleet_frames.node_table(snap)
    assert nodes["instance"].tolist() == ["kunpeng-920-128"]
    assert nodes["cpu_model"].iloc[0] == "HiSilicon Kunpeng 920"
    assert nodes["node_pool"].iloc[0] == fleet_frames.UNLABELLED
    rules = {f["rule"] for f in snap.findings}
    assert {"isa-mismatch", "fd-exhaustion", "numa-remote-access"} <= rules
    assert snap.findings[0]["severity"] == "critical"
    busy = node_frames.per_core_busy(snap.node_loader("kunpeng-920-128", 3600))
    assert busy.shape[0] == 128
    assert {n["rule"] for n in snap.not_evaluated} >= {"queue-backlog"}


def test_a_nodes_history_asks_for_every_series_an_evidence_view_draws():
    """A query engine's node history is range-queried by name (NODE_METRICS): a view whose
    series are not asked for draws nothing on a Prometheus source, though the demo has them."""
    missing = {rule.id: sorted(panel.expr.metrics() - set(data.NODE_METRICS))
               for rule in CATALOG for panel in evidence_views.views_for(rule.id)
               if panel.expr.metrics() - set(data.NODE_METRICS)}
    assert not missing, missing
