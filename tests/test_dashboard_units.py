"""The console's formatting layer (fleetscope/core/units.py), the per-rule evidence views
(dashboard/evidence_views.py), the fleet grouping per rule, runbook links and the demo's clock."""

from __future__ import annotations

import re
import time

import pandas as pd
import pytest

from fleetscope.core import units
from fleetscope.dashboard import (
    data,
    evidence_frames,
    evidence_views,
    fleet_eval,
    fleet_frames,
    rulebook,
)
from fleetscope.dashboard.evidence_frames import MET
from fleetscope.dashboard.fleet_sim import Fleet
from fleetscope.rules.catalog import CATALOG, Evidence, Rule
from fleetscope.rules.promql import Max, Selector


@pytest.mark.parametrize("value, unit, text", [
    (3.754e11, "bytes/s", "375 GB/s"),
    (409.6e9, "bytes/s", "410 GB/s"),
    (56540488564.1924, "bytes", "52.7 GiB"),
    (2.5e9 * 24, "bytes", "55.9 GiB"),
    (0.482, "ratio", "48.2 %"),
    (0.3, "ratio", "30 %"),
    (0.12, "s/s", "120 ms/s"),
    (0.0004, "s", "400 µs"),
    (125.0, "s", "125 s"),
    (5400.0, "s", "1.5 h"),
    (8833 * 3600.0, "s", "368 days"),
    (1500.0, "1/s", "1.5k/s"),
    (36.0, "1/min", "36/min"),
    (950.0, "frames/s", "950 frames/s"),
    (6e4, "pages/s", "60k pages/s"),
    (1024.0, "fds", "1,024 fds"),
    (30.5, "CPUs", "30.5 CPUs"),
    (1.234, "ipc", "1.23 IPC"),
    (float("nan"), "ratio", "–"),
])
def test_values_read_in_their_units(value, unit, text):
    assert units.format_value(value, unit) == text


def test_thresholds_read_as_conditions_and_never_in_exponent_notation():
    assert units.format_threshold(0.3, "ratio") == "> 30 %"
    assert units.format_threshold(1.0, "ipc", pick="min") == "< 1 IPC"
    assert units.format_threshold(3.754e11, "bytes/s") == "> 375 GB/s"
    for rule in CATALOG:
        for item in rule.evidence:
            text = units.format_threshold(item.threshold, item.unit, item.pick)
            assert "e+" not in text and "e-" not in text, (rule.id, text)
    assert units.reading(0.6, 0.3, "ratio").result == "met, 2x the threshold"
    assert units.reading(0.15, 0.3, "ratio").result == "not met, 50 % of it"
    assert str(units.reading(12, 0)) == ""  # a 0 threshold is context: no reading


def test_a_moment_reads_as_a_local_time_and_its_distance_from_the_threshold(monkeypatch):
    monkeypatch.setenv(units.TIME_ZONE_ENV, "Asia/Shanghai")
    crash, look_back_start = 1_764_662_463.0, 1_764_661_570.0
    assert units.format_value(crash, units.TIME_UNIT) == "2025-12-02 16:01:03 CST"
    assert units.format_threshold(look_back_start, units.TIME_UNIT) == \
        "after 2025-12-02 15:46:10 CST"
    # the look-back's start on the crash's day reads as a time of day beside it
    assert str(units.reading(crash, look_back_start, units.TIME_UNIT)) == \
        "needs after 15:46:10 CST: met, 14.9 min after it"
    assert str(units.reading(look_back_start - 60, look_back_start, units.TIME_UNIT)) == \
        "needs after 15:46:10 CST: not met, 60 s before it"
    day_before = units.reading(look_back_start - 86400, look_back_start, units.TIME_UNIT)
    assert day_before.needs == "needs after 2025-12-02 15:46:10 CST"
    frame = evidence_frames.evidence_frame({"rule": "isa-mismatch", "evidence": [
        {"signal": "latest SIGILL", "value": crash, "threshold": look_back_start,
         "unit": units.TIME_UNIT}]})
    assert frame["ratio"].isna().all()  # no "1.0000006x" bar for a moment


def test_axes_format_bandwidth_in_bytes_per_second_not_billions():
    bandwidth = units.axis("bytes/s")
    assert bandwidth["tickformat"] == "~s" and bandwidth["ticksuffix"] == "B/s"
    assert units.axis("ratio")["tickformat"] == ".0%"
    assert units.axis("s/s")["ticksuffix"] == "s/s"  # d3 SI: 120ms/s
    assert units.axis("s")["tickformat"] == ",~g"  # 1,200 s, not 1.2ks
    assert units.axis("frames/s", 0.3)["tickformat"] == ",.2~f"  # 0.3/s, not 300m/s
    assert units.axis("frames/s", 1500)["tickformat"] == "~s"  # 1.5k/s
    assert "%{y:.1%}" in units.hover_format("ratio")


def test_times_are_local_with_their_zone(monkeypatch):
    monkeypatch.setenv(units.TIME_ZONE_ENV, "Asia/Shanghai")
    assert units.local_time(1_764_660_000) == "2025-12-02 15:20:00 CST"
    assert units.zone_name() == "CST (UTC+08:00)"
    assert units.time_window(1_764_660_000 - 1200, 1_764_660_000) == \
        "2025-12-02 15:00:00 .. 15:20:00 CST (20 min)"
    monkeypatch.setenv(units.TIME_ZONE_ENV, "UTC")
    assert units.local_time(1_764_660_000).endswith("07:20:00 UTC")


def test_chart_titles_are_words_with_the_unit():
    assert units.metric_title("fleetscope_nic_pfc_pause_frames_total") == \
        "PFC pause frames (frames/s)"
    assert units.metric_title("fleetscope_memory_bandwidth_bytes_per_second") == \
        "DRAM bandwidth (B/s)"
    assert units.metric_title("fleetscope_something_new_total") == "Something new (per second)"


def test_the_evidence_table_has_units_and_says_whether_and_how_far_the_value_meets_it():
    finding = {"rule": "fd-exhaustion", "evidence": [
        {"signal": "open fds over RLIMIT_NOFILE (worst process)", "value": 0.97,
         "threshold": 0.9, "unit": "ratio"},
        {"signal": "open fds of that process", "value": 993.0, "threshold": 0, "unit": "fds"},
        {"signal": "its soft limit", "value": 1024.0, "threshold": 65535, "unit": "fds"}]}
    frame = evidence_frames.evidence_frame(finding).set_index("signal")
    assert frame.loc["open fds over RLIMIT_NOFILE (worst process)", "value"] == "97 %"
    assert frame.loc["open fds over RLIMIT_NOFILE (worst process)", "threshold"] == \
        "needs over 90 %"
    assert frame.loc["open fds over RLIMIT_NOFILE (worst process)", MET] == "met, 7.8 % over it"
    assert frame.loc["open fds of that process", "threshold"] == "–"
    # pick="min" in the rule: it fires under the limit ('64x below' said neither)
    assert frame.loc["its soft limit", "threshold"] == "needs under 65,535 fds"
    assert frame.loc["its soft limit", MET] == "met, 1.6 % of it"
    # a floor's ratio says how far past it (more than 1 when firing), as a ceiling's does
    assert frame.loc["its soft limit", "ratio"] == pytest.approx(65535 / 1024)
    assert frame.loc["open fds over RLIMIT_NOFILE (worst process)", "ratio"] == \
        pytest.approx(0.97 / 0.9)
    assert frame[MET].notna().all()


def test_a_value_just_under_a_floor_reads_as_meeting_it_not_as_1x():
    assert units.reading(14.4, 15.0, "", "min").result == "met, 4 % under it"
    assert units.reading(15.5, 15.0, "", "min").result == "not met, 3.3 % over it"
    assert units.reading(0, 15.0, "", "min").result == "met"
    assert units.reading(15.0, 15.0, "", "min").result == "at it"


# -- evidence views ------------------------------------------------------------------------
def test_every_catalog_rule_has_an_evidence_view_with_a_threshold():
    for rule in CATALOG:
        panels = evidence_views.views_for(rule.id)
        assert panels, rule.id
        assert any(p.threshold is not None for p in panels), rule.id


def test_every_rule_of_the_catalog_is_declared():
    assert evidence_views.undeclared() == [], "give these rules views in rules/builtin/"


def test_a_rule_without_a_declaration_gets_its_evidence_expressions(monkeypatch):
    new = Rule(id="cpu-saturation-test", severity="warning", symptom="s", cause="c",
               action="a", summary="busy {value}",
               condition=Max(Selector("fleetscope_cpu_core_busy_ratio", {"stat": "p50"}),
                             by=("instance",)) > 0.9,
               evidence=(Evidence("median core busy", Max(Selector(
                   "fleetscope_cpu_core_busy_ratio", {"stat": "p50"}), by=("instance",)),
                   0.9, "ratio"),))
    from fleetscope.rules import catalog

    monkeypatch.setattr(catalog, "CATALOG", (*catalog.CATALOG, new))
    panels = evidence_views.views_for(new.id)
    assert [(p.title, p.threshold, p.unit) for p in panels] == [("Median core busy", 0.9,
                                                                 "ratio")]
    fleet = Fleet(nodes=64)
    history = fleet.node_series(fleet.instances[0], 10, per_core=False)
    (panel, frame), = evidence_frames.evidence_panels(new.id, history)
    assert len(frame) == 11 and frame["value"].between(0, 1).all()
    assert evidence_frames.evidence_panels("no-such-rule", history) == []


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return Fleet(nodes=256)


def history_of(fleet: Fleet, rule: str, pick=0):
    return fleet.node_series(fleet.instances[fleet.faults[rule][pick]], 60, per_core=False)


def test_preemption_shows_the_victim_and_the_antagonist(fleet):
    # the mixed rack: an offline batch pool beside the online chat pool
    mixed = next(nodes for rule, _, nodes in fleet.placements if rule == "offline-preemption")
    history = fleet.node_series(fleet.instances[mixed[0]], 120, per_core=False)
    panels = {p.role + ":" + p.title: f for p, f in
              evidence_frames.evidence_panels("offline-preemption", history,
                                              {"pool": "chat-online"})}
    victim = panels["victim:Online pool run-queue delay per process"]
    antagonist = panels["antagonist:Offline pools' CPU use"]
    assert set(victim["series"]) == {"chat-online"}
    assert set(antagonist["series"]) == {"batch-offline"}
    # both rise at the fault's onset: over their thresholds at the end, under an hour ago
    assert victim["value"].iloc[-1] > 0.05 > victim["value"].iloc[0]
    assert antagonist["value"].iloc[-1] > 0.5 > antagonist["value"].iloc[0]


def test_isa_mismatch_draws_the_crash_timeline_per_binary(fleet):
    panels = dict((p.title, f) for p, f in evidence_frames.evidence_panels(
        "isa-mismatch", history_of(fleet, "isa-mismatch")))
    crashes = panels["SIGILL crashes in the kernel log so far, per binary"]
    assert set(crashes["series"]) == {"llama-server"}
    assert crashes["value"].is_monotonic_increasing and crashes["value"].iloc[-1] >= 20
    per_minute = panels["New SIGILL crashes per minute, per binary"]
    assert per_minute["value"].max() == pytest.approx(1.0)  # a restart a minute, each dies


def test_roce_draws_pfc_and_ecn_per_port_with_thresholds(fleet):
    panels = {p.title: (p, f) for p, f in evidence_frames.evidence_panels(
        "roce-congestion", history_of(fleet, "roce-congestion"))}
    panel, pfc = panels["PFC pause frames per interface"]
    assert panel.threshold == 100 and pfc["series"].nunique() == 2
    assert pfc.groupby("series")["value"].last().max() > 100
    _, ecn = panels["ECN marks, CNPs and sequence errors per RDMA device"]
    assert set(ecn["series"]) == {"mlx5_0", "mlx5_1"}


def test_numa_draws_the_remote_share_per_pool(fleet):
    panels = {p.title: (p, f) for p, f in evidence_frames.evidence_panels(
        "numa-remote-access", history_of(fleet, "numa-remote-access"))}
    panel, share = panels["Share of each pool's memory on remote NUMA nodes"]
    assert panel.unit == "ratio" and share["value"].iloc[-1] > panel.threshold


# -- fleet grouping ------------------------------------------------------------------------
def test_grouping_puts_every_crashing_node_on_its_stepping(fleet):
    snap = data.load("demo:256")
    nodes = fleet_frames.node_table(snap)
    findings = fleet_frames.findings_frame(snap.findings)
    table = fleet_frames.rule_grouping(nodes, findings, "isa-mismatch", "CPU model / stepping")
    crashing = set(findings.loc[findings["rule"] == "isa-mismatch", "node"])
    assert table["firing"].sum() == len(crashing)
    steppings = set(nodes.loc[nodes["instance"].isin(crashing), "stepping"])
    assert steppings <= {"0xd01 r1p0", "0xd01 r1p1"}  # only the steppings without SVE crash
    assert all(group.endswith(tuple(steppings)) for group in table["group"])
    assert table["share of firing"].sum() == pytest.approx(1.0)
    racks = fleet_frames.rule_grouping(nodes, findings, "roce-congestion", "rack")
    assert len(racks) == 1 and racks["share of group"].iloc[0] == 1.0  # one whole rack
    summary = fleet_frames.grouping_summary(nodes, findings, "roce-congestion")
    assert re.search(r"\(100%\) are in (rack|kernel|CPU model / stepping|node pool) ", summary)
    kernels = fleet_frames.rule_grouping(nodes, findings, "roce-congestion", "kernel")
    assert kernels["group"].str.startswith("5.10.0-").all()


def test_worst_node_of_a_rack_is_a_critical_one(fleet):
    snap = data.load("demo:256")
    nodes = fleet_frames.node_table(snap)
    findings = fleet_frames.findings_frame(snap.findings)
    health = fleet_frames.node_health(nodes, findings)
    rack = health.loc[health["health"] == "critical", "rack"].iloc[0]
    worst = fleet_frames.worst_node(health, rack)
    assert health.set_index("instance").loc[worst, "health"] == "critical"
    assert fleet_frames.worst_node(health, "no-such-rack") is None


def test_health_signal_on_the_heatmap(fleet):
    snap = data.load("demo:256")
    nodes = fleet_frames.node_table(snap)
    health = fleet_frames.node_health(nodes, fleet_frames.findings_frame(snap.findings))
    signals = fleet_frames.with_health(fleet_frames.node_signals(snap), health)
    grid = fleet_frames.heatmap(nodes, signals, "health")
    flat = pd.Series(grid["z"].ravel()).dropna()
    assert set(flat) == {0.0, 1.0, 2.0}
    assert (flat == 2).sum() == (health["health"] == "critical").sum()


# -- runbooks and the clock ----------------------------------------------------------------
def test_runbook_links_point_inside_the_console():
    text = rulebook.runbook_markdown("isa-mismatch")
    assert "](/runbook?rule=cold-start)" in text and ".md)" not in text
    assert rulebook.related_runbooks("isa-mismatch")[:2] == ["cold-start", "queue-backlog"]
    for rule in CATALOG:
        for other in rulebook.related_runbooks(rule.id):
            assert other in rulebook.runbook_ids(), (rule.id, other)


def test_the_demo_clock_ends_now():
    before = time.time()
    end = data.demo_end()
    assert before - 60 <= end <= time.time() and end % 60 == 0
    fleet = Fleet(nodes=64, end_s=end)
    assert fleet.times(1)[-1] == end


@pytest.mark.parametrize("hour", [3, 15])
def test_every_fault_is_found_at_any_time_of_day(hour):
    """The demo's clock is now: night or day, the engine finds exactly the injected nodes."""
    end = 1_764_633_600 + hour * 3600 - 8 * 3600  # that hour in the fleet's UTC+8
    small = Fleet(nodes=64, end_s=end)
    found, _ = fleet_eval.evaluate_sharded(small.shards(set(data.FLEET_METRICS)))
    by_rule: dict[str, set[str]] = {}
    for finding in found:
        by_rule.setdefault(finding.rule.id, set()).add(finding.node)
    for rule, nodes in small.expected_findings().items():
        assert by_rule.get(rule) == nodes, rule


def test_bundle_show_reads_its_window_in_local_time_with_the_zone():
    import os
    import subprocess
    import sys

    from tests.conftest import BUNDLES

    result = subprocess.run([sys.executable, "-m", "fleetscope", "bundle", "show",
                             str(BUNDLES / "kunpeng-128")], capture_output=True, text=True,
                            timeout=60, env=dict(os.environ, **{units.TIME_ZONE_ENV:
                                                                "Asia/Shanghai"}))
    assert result.returncode == 0, result.stderr
    rows = dict(line.split(None, 1) if not line.startswith("window,") else
                ("unix", line.split("seconds", 1)[1]) for line in result.stdout.splitlines())
    assert rows["window"].strip() == "2025-12-02 15:20:00 .. 15:20:15 CST (15 s)"
    assert "1764660000.000" in rows["unix"]


def test_commands_are_filled_from_the_findings_subjects_prose_is_left_alone():
    values = rulebook.placeholder_values({"pids": [6387, 6390],
                                          "binaries": ["/opt/bin/llama-server"],
                                          "pods": ["batch/etl-7f9c/etl"], "cgroups": ["/x"]})
    assert values == {"PID": "6387", "ONLINE_PID": "6387", "BINARY": "/opt/bin/llama-server",
                      "POD": "etl"}
    runbook = ("The PID is the worker's.\n\n```bash\nfleetscope stacks PID\n"
               "gdb BINARY CORE\nkubectl logs POD\n```\nthen `cat /proc/PID/status`; "
               "PIDS and APID stay\n")
    filled = rulebook.fill_commands(runbook, values)
    assert "The PID is the worker's." in filled  # prose keeps its words
    assert "fleetscope stacks 6387\ngdb /opt/bin/llama-server CORE\nkubectl logs etl" in filled
    assert "`cat /proc/6387/status`" in filled and "PIDS and APID stay" in filled
    action = "fleetscope stacks PID shows the blocking call"
    assert rulebook.fill_commands(action, values, code_only=False) == \
        "fleetscope stacks 6387 shows the blocking call"
    assert rulebook.fill_commands(runbook, {}) == runbook


@pytest.mark.parametrize("cores, step", [(2, 1), (128, 4)])
def test_the_core_heatmap_ticks_whole_cores(cores, step):
    from fleetscope.dashboard import charts

    busy = pd.DataFrame([[0.5, 0.6]] * cores, index=range(cores),
                        columns=pd.to_datetime([0, 15], unit="s"))
    yaxis = charts.core_heatmap(busy).layout.yaxis
    assert (yaxis.tickmode, yaxis.dtick) == ("linear", step)


def test_a_node_with_only_an_info_finding_is_healthy_and_counted():
    """accelerator-driver-mismatch's info tier (a pair off the matrix, no harm) was a health
    of its own: the node fell out of the health counts by pool and off the heatmap."""
    nodes = pd.DataFrame({"instance": ["a", "b", "c"], "node_pool": ["p", "p", "q"],
                          "rack": ["r1", "r1", "r2"], "cpu_model": ["x"] * 3,
                          "stepping": ["s"] * 3, "arch": ["aarch64"] * 3, "kernel": ["k"] * 3})
    findings = pd.DataFrame({"rule": ["r-info", "r-warn", "r-info"],
                             "severity": ["info", "warning", "info"], "node": ["a", "b", "b"]})
    health = fleet_frames.node_health(nodes, findings)
    assert dict(zip(health["instance"], health["health"], strict=True)) == {
        "a": "ok", "b": "warning", "c": "ok"}
    assert fleet_frames.health_by(nodes, findings, "node_pool")["nodes"].sum() == 3


def test_one_of_a_count_reads_singular():
    """'1 crashes', '1 codes' (issue 29): one of a counted thing is singular, more plural."""
    assert units.format_value(1, "crashes") == "1 crash"
    assert units.format_value(1, "codes") == "1 code"
    assert units.format_value(1, "processes") == "1 process"
    assert units.format_value(1, "CPUs") == "1 CPU"
    assert units.format_value(2, "codes") == "2 codes"
    assert units.format_value(6973, "nodes") == "6,973 nodes"
    assert units.format_value(1, "s") == "1 s" and units.format_value(1, "ratio") == "100 %"


def test_a_health_check_reads_failing_not_zero_percent():
    """A vendor health verdict (1 passing) read '0 %' against '< 100 %', 'at 0'."""
    said = units.reading(0, 1, units.CHECK_UNIT, "min")
    row = (units.format_value(0, units.CHECK_UNIT), said.needs, said.result)
    assert row == ("failing", "needs failing", "met")
    assert units.reading(1, 1, units.CHECK_UNIT, "min").result == "not met"
    assert units.format_value(1, units.CHECK_UNIT) == "passing"
    assert units.format_value(79, "xid") == "XID 79"


def test_just_past_a_threshold_says_by_how_much_not_1x():
    """99.4 % against a 95 % threshold read '1x the threshold', as if at it."""
    assert units.reading(0.994, 0.95).result == "met, 4.6 % over it"
    assert units.reading(0.95, 0.95).result == "at it"
    assert units.reading(1.2, 1).result == "met, 1.2x the threshold"


def test_a_context_row_without_threshold_claims_nothing_past_it():
    """A 0 threshold is context (idle CPUs): its row read '–' for the threshold but 'above
    0' past it."""
    frame = evidence_frames.evidence_frame({"rule": "cpu-saturation", "evidence": [
        {"signal": "idle CPUs on the node", "value": 12, "threshold": 0, "unit": "CPUs"},
        {"signal": "run queue per CPU", "value": 3, "threshold": 1.5, "unit": ""}]})
    rows = frame.set_index("signal")
    assert rows.loc["idle CPUs on the node", "threshold"] == "–"
    assert rows.loc["idle CPUs on the node", MET] == "–"
    assert rows.loc["run queue per CPU", MET] == "met, 2x the threshold"


def test_subjects_read_as_names_not_counts():
    """'devices: 0' (module 0) read as no device: each subject is shown as a name."""
    line = evidence_frames.subjects_line({"devices": ["0"], "pids": [41, 42], "binaries": []})
    assert line == "**Subjects:** devices: `0`; pids: `41`, `42`"
