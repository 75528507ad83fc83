"""Every console page under Streamlit's AppTest, on each source: the simulated fleet, a
fixture bundle, a bundle recorded live on this machine, and a Prometheus HTTP API."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from fleetscope.dashboard import data  # noqa: E402
from fleetscope.dashboard.fleet_sim import Fleet  # noqa: E402
from fleetscope.rules.catalog import CATALOG, RULE_IDS  # noqa: E402
from tests.conftest import BUNDLES, until_alerts_held  # noqa: E402

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "app.py")
DEMO = "demo:256"


def as_read(markdown: str) -> str:
    """Markdown as a reader sees it: names from a node are escaped there (state.plain)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown)


def run_app(monkeypatch, source: str, page: str | None = None,
            query: dict | None = None) -> AppTest:
    monkeypatch.setenv(data.SOURCE_ENV, source)
    app = AppTest.from_file(APP, default_timeout=180)
    app.run()
    if query:
        app.query_params.update(query)
    if page:
        app.switch_page(f"views/{page}.py")
        app.run()
    assert not app.exception, [e.message for e in app.exception]
    return app


def metrics(app: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in app.metric}


TABLES = {"rule_counts": {"rule", "findings", "nodes"}, "findings_table": {"confidence", "summary"},
          "numa_table": {"NUMA node", "busy"}, "evidence_table": {"signal", "threshold"},
          "stage_table": {"stage", "share"}, "rule_table": {"rule", "symptom"},
          "not_evaluated": {"rule", "missing"},
          "peer_comparison": {"signal", "sick median", "healthy peers median"}}


def table(app: AppTest, name: str):
    """The first dataframe or static table with the columns that table has (AppTest drops
    dataframe keys), as it reads: a static table's Markdown escapes taken out."""
    tables = [(frame, False) for frame in app.dataframe] + [(frame, True) for frame in app.table]
    for frame, static in tables:
        value = frame.value
        if TABLES[name] <= set(getattr(value, "columns", [])):
            return value.replace(r"\\(.)", r"\1", regex=True) if static else value
    raise AssertionError(f"no {name} table on the page")


def plotted(values) -> np.ndarray:
    """A trace's values from a figure's JSON (plotly ships a float array as base64)."""
    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
    return np.asarray(values, dtype=float)


def text_of(app: AppTest) -> str:
    return "\n".join(str(m.value) for m in app.markdown)


# -- demo ----------------------------------------------------------------------------------
def test_fleet_page_lists_every_injected_rule_with_counts(monkeypatch):
    app = run_app(monkeypatch, DEMO)
    assert app.title[0].value == "Fleet"
    counts = table(app, "rule_counts")
    assert set(counts["rule"]) >= set(RULE_IDS)
    assert set(counts["rule"]) <= {rule.id for rule in CATALOG}
    assert (counts["nodes"] > 0).all() and (counts["findings"] > 0).all()
    assert counts["severity"].iloc[0] == "critical"
    shown = metrics(app)
    serious = counts[counts["severity"].isin(("critical", "warning"))]
    assert shown["nodes"] == "256" and shown["rules firing"] == str(serious["rule"].nunique())
    assert shown["rules not evaluated"] == f"0 of {len(CATALOG)}"
    assert int(shown["critical nodes"]) > 0
    assert app.get("plotly_chart"), "no charts drawn"
    listed = table(app, "findings_table")
    assert listed["severity"].iloc[0] == "critical"


def test_the_fleet_page_leads_with_incidents_a_rack_wide_fault_first(monkeypatch):
    """Incidents before rows: each rule firing at warning or worse with its node count and
    where it concentrates, worst then widest. The demo's isa-mismatch takes one whole rack
    (its FleetFault): it leads, naming the rack, ahead of single-node critical rows."""
    fleet = Fleet(nodes=256)
    rack_nodes = fleet.faults["isa-mismatch"]
    app = run_app(monkeypatch, DEMO)
    subheaders = [h.value for h in app.subheader]
    assert subheaders.index("Incidents") < subheaders.index("Findings, worst first")
    lines = [m.value for m in app.markdown if "** · " in str(m.value)]
    assert lines, [m.value for m in app.markdown]
    first = lines[0]
    assert first.startswith("**isa-mismatch** · :red[**critical**]"), lines[:3]
    assert f"{len(rack_nodes)} nodes · rack " in first, first
    assert f"{len(rack_nodes)} of its {len(rack_nodes)} nodes" in first, first
    assert not any(" 1 nodes" in line for line in lines)
    assert all("info" not in line.split(" · ")[1] for line in lines)  # context only


def test_the_sick_nodes_of_a_group_are_shown_beside_its_healthy_peers(monkeypatch):
    """Where a rule fires, its group's sick nodes beside the group's healthy nodes (no fault
    injected), with counts and each signal on both sides. The demo's isa-mismatch rack: its
    CPU stepping holds healthy nodes to compare with, its rack none. A node whose fault
    shows as an info finding alone (a driver/firmware pair off the matrix, without harm) is
    a healthy peer."""
    fleet = Fleet(nodes=256)
    table_of = {row["instance"]: row for row in fleet.node_table()}
    sick = {fleet.instances[i] for i in fleet.faults["isa-mismatch"]}
    serious = {f["node"] for f in data.load(DEMO).findings if f["severity"] != "info"}
    faulty = set().union(*fleet.expected_findings().values()) & serious
    one = table_of[min(sick)]

    def healthy(column: str) -> int:
        return sum(1 for name, row in table_of.items()
                   if row[column] == one[column] and name not in faulty)

    app = run_app(monkeypatch, DEMO)
    assert app.selectbox(key="fleet_group_rule").value == "isa-mismatch"
    for dimension, column in (("CPU model / stepping", "stepping"), ("node pool", "node_pool")):
        app.radio(key="fleet_group_by").set_value(dimension).run()
        assert not app.exception, [e.message for e in app.exception]
        line = next(str(m.value) for m in app.markdown if "healthy peer" in str(m.value))
        assert line.startswith(f"**isa-mismatch in {dimension} "), line
        assert f": {len(sick)} sick nodes beside {healthy(column)} healthy peers**" in line
        assert 0 < healthy(column) < 256 - len(faulty)
        compared = table(app, "peer_comparison")
        assert {"busiest core", "PFC pauses /s"} <= set(compared["signal"])
    app.radio(key="fleet_group_by").set_value("rack").run()
    line = next(str(m.value) for m in app.markdown if "healthy peer" in str(m.value))
    assert f"rack {one['rack']}: {len(sick)} sick nodes beside 0 healthy peers" in line
    assert any("No healthy peer in rack" in str(c.value) for c in app.caption)


def test_the_findings_search_drops_the_rows_that_do_not_match_and_lives_in_the_url(
        monkeypatch):
    """?search= filters the findings rows by node, rule, rack or pool (every word must
    match one of them), where the table's own search only highlights."""
    fleet = Fleet(nodes=256)
    pool_of = {row["instance"]: row["node_pool"] for row in fleet.node_table()}
    congested = fleet.expected_findings()["roce-congestion"]
    rack = min(congested).split("n")[0]
    app = run_app(monkeypatch, DEMO, "fleet", {"search": rack})
    assert app.text_input(key="findings_search").value == rack
    rows = table(app, "findings_table")
    assert set(rows["node"]) >= congested and all(n.startswith(rack + "n") for n in rows["node"])
    app.text_input(key="findings_search").set_value("ROCE").run()
    rows = table(app, "findings_table")
    assert set(rows["rule"]) == {"roce-congestion"} and set(rows["node"]) == congested
    assert app.query_params["search"] == "ROCE"
    pool = pool_of[min(congested)]
    app.text_input(key="findings_search").set_value(f"{pool} {rack}").run()
    rows = table(app, "findings_table")
    assert set(rows["node"]) >= congested
    assert all(pool_of[n] == pool and n.startswith(rack + "n") for n in rows["node"])
    app.text_input(key="findings_search").set_value("no-such-thing").run()
    assert any("No finding matches" in i.value for i in app.info)
    app.text_input(key="findings_search").set_value("").run()
    assert "search" not in app.query_params
    assert len(table(app, "findings_table")) == min(500, len(app.session_state[
        "_fleetscope_snapshot"][1].findings))


def test_the_sidebar_says_how_old_the_data_is_and_refresh_reloads(monkeypatch):
    app = run_app(monkeypatch, DEMO)
    age = [c.value for c in app.sidebar.caption if str(c.value).startswith("data up to")]
    assert age and re.search(r", [\d.]+ (s|ms|µs|min) ago$", age[0]), age
    before = app.session_state["_fleetscope_snapshot"][1].window[1] \
        if "_fleetscope_snapshot" in app.session_state else None
    app.sidebar.button(key="refresh").click().run()
    assert not app.exception, [e.message for e in app.exception]
    assert [c.value for c in app.sidebar.caption if str(c.value).startswith("data up to")]
    if before is not None:
        assert app.session_state["_fleetscope_snapshot"][1].window[1] >= before


def test_a_bundle_of_one_node_gets_its_verdict_not_an_empty_fleet(monkeypatch):
    """A one-node source: the node's verdict (what fires, how many rules passed, how many
    were not evaluated, as a table of what is missing), no racks, pools or heatmap."""
    app = run_app(monkeypatch, f"bundle:{BUNDLES / 'kunpeng-128'}")
    verdict = [e.value for e in app.error] + [w.value for w in app.warning] + \
        [s.value for s in app.success]
    listed = table(app, "findings_table")
    firing = sorted(set(listed.loc[listed["severity"].isin(("critical", "warning")), "rule"]))
    assert firing and listed["severity"].iloc[0] == "critical"
    assert [v for v in verdict if v.startswith("**kunpeng-920-128: critical**: "
                                               f"{', '.join(firing)} firing")
            and "evaluated and passed" in v], (verdict, firing)
    skipped = table(app, "not_evaluated")
    assert list(skipped.columns) == ["rule", "missing", "signals"]
    assert (skipped["missing"].str.len() > 0).all()
    # the absent signals by their collectors' titles, each with its name and unit
    assert (skipped["signals"].str.len() > 0).all()
    assert skipped["signals"].str.match(r"[A-Za-z].* \((agent|fleetscope)_\w+").all()
    assert not [c for c in app.get("plotly_chart")], "fleet charts drawn for one node"
    subheaders = [h.value for h in app.subheader]
    assert "Incidents" in subheaders


def test_filters_come_from_the_address_bar_and_unknown_values_are_dropped(monkeypatch):
    fleet = Fleet(nodes=256)
    racks = sorted({instance.split("n")[0] for instance in fleet.instances})
    app = run_app(monkeypatch, DEMO, "fleet", {"rack": [racks[0], "no-such-rack"]})
    assert app.sidebar.multiselect(key="filter_racks").value == [racks[0]]
    in_rack = sum(1 for i in fleet.instances if i.startswith(racks[0] + "n"))
    assert metrics(app)["nodes"] == str(in_rack) and in_rack < 256
    app.sidebar.multiselect(key="filter_racks").set_value(racks[:2]).run()
    assert app.query_params["rack"] == racks[:2]
    app.sidebar.multiselect(key="filter_racks").set_value([]).run()
    assert "rack" not in app.query_params and metrics(app)["nodes"] == "256"


def test_fleet_page_heatmap_signal_and_filters(monkeypatch):
    app = run_app(monkeypatch, DEMO)
    options = app.sidebar.multiselect(key="filter_pools").options
    app.selectbox(key="fleet_signal").select("PFC pauses /s").run()
    assert not app.exception
    assert any("fleetscope_nic_pfc_pause_frames_total" in c.value for c in app.caption)
    app.selectbox(key="fleet_signal").select("health").run()
    assert not app.exception
    heat = json.loads(app.get("plotly_chart")[-1].proto.spec)
    cells = heat["data"][0]["z"]
    assert {v for row in cells for v in row if v is not None} >= {0, 2}  # ok and critical
    assert heat["layout"]["yaxis"]["dtick"] == 1  # every rack row labelled
    assert options == ["batch", "chat", "codegen", "mixed"]
    app = AppTest.from_file(APP, default_timeout=180)
    app.session_state["filter_pools"] = ["batch"]
    app.run()
    assert not app.exception
    counts = table(app, "rule_counts")
    assert "roce-congestion" not in set(counts["rule"])  # the congested rack serves chat
    assert "thread-oversubscription" in set(counts["rule"])
    assert metrics(app)["nodes"] == "64"


def _history_minutes(app: AppTest) -> float:
    """How many minutes the Node page's busy-across-cores chart spans."""
    for chart in app.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        if "Busy across cores" in str(spec["layout"].get("title", {}).get("text", "")):
            stamps = sorted(np.datetime64(x) for trace in spec["data"] for x in trace["x"])
            return (stamps[-1] - stamps[0]) / np.timedelta64(1, "m")
    raise AssertionError("no busy-across-cores chart on the Node page")


def test_the_history_range_comes_from_the_address_bar_and_reaches_the_loader(monkeypatch):
    """?range=1+h: the node's history is made for the last hour (the demo's loader, as a
    Prometheus one range-queries it); the sidebar's choice goes back into the URL."""
    app = run_app(monkeypatch, DEMO, "node", {"range": "1 h"})
    assert app.sidebar.selectbox(key="history_range").value == "1 h"
    assert _history_minutes(app) == 60
    app.sidebar.selectbox(key="history_range").select("6 h").run()
    assert not app.exception, [e.message for e in app.exception]
    assert app.query_params["range"] == "6 h" and _history_minutes(app) == 360
    app.sidebar.selectbox(key="history_range").select("3 h").run()  # the default: left out
    assert "range" not in app.query_params and _history_minutes(app) == 180


def test_node_page_per_core_numa_steal_bandwidth_and_nic(monkeypatch):
    fleet = Fleet(nodes=256)
    hog = fleet.instances[fleet.faults["core-imbalance"][0]]
    app = run_app(monkeypatch, DEMO, "node")
    app.selectbox(key="node_choice").select(hog).run()
    assert not app.exception
    assert app.query_params["node"] == hog  # the address bar follows the choice
    shown = metrics(app)
    assert shown["cores > 90 % now"] == "16"
    assert any("pinned hogs" in w.value for w in app.warning)
    numa = table(app, "numa_table")
    assert not numa.empty and numa["busy"].str.endswith("%").all()
    assert len(numa) == numa["NUMA node"].nunique()  # alike NUMA nodes are one row
    assert any("core-imbalance" in e.label for e in app.expander)
    assert len(app.get("plotly_chart")) >= 8


def test_rdma_counters_are_drawn_each_on_its_own_scale(monkeypatch):
    """A congested node's RDMA counters, hundreds of times apart (ECN marks vs sequence
    errors): one panel per counter with its own y axis, a line per device in each."""
    fleet = Fleet(nodes=256)
    node = fleet.instances[fleet.faults["roce-congestion"][0]]
    app = run_app(monkeypatch, DEMO, "node", {"node": node})
    specs = [json.loads(c.proto.spec) for c in app.get("plotly_chart")]
    rdma = next(s for s in specs if str(s["layout"]["title"]["text"]).startswith("RDMA"))
    panels = [a["text"] for a in rdma["layout"]["annotations"]]
    assert {"np_ecn_marked_roce_packets", "packet_seq_err"} <= set(panels), panels
    axes = {trace.get("yaxis", "y") for trace in rdma["data"]}
    assert len(axes) == len(panels)
    for axis in axes:
        on_axis = [t for t in rdma["data"] if t.get("yaxis", "y") == axis]
        assert len(on_axis) == 2  # the node's two RDMA devices
    tops = sorted(max(plotted(t["y"]).max() for t in rdma["data"]
                      if t.get("yaxis", "y") == axis) for axis in axes)
    assert tops[-1] > 50 * tops[0]  # why one axis would not do


def test_a_node_deep_link_opens_that_node_with_the_finding_and_its_charts(monkeypatch):
    fleet = Fleet(nodes=256)
    node = fleet.instances[fleet.faults["offline-preemption"][0]]
    app = run_app(monkeypatch, DEMO, "node", {"node": node, "rule": "offline-preemption"})
    assert app.selectbox(key="node_choice").value == node
    opened = [e for e in app.expander if "offline-preemption" in e.label]
    assert opened and opened[0].proto.expanded
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in app.get(
        "plotly_chart")]
    assert any(t.startswith("Victim:") for t in titles)
    assert any(t.startswith("Antagonist:") for t in titles)  # not only the victim


def test_a_node_page_leads_with_its_pools_harm_and_what_explains_it(monkeypatch):
    """The crash-loop node's chat-online restarts its workers: the harm (signal, value against
    the target, since when) and the rule explaining it, above the findings; the node where
    no rule explains its harm says so."""
    fleet = Fleet(nodes=256)
    node = fleet.instances[fleet.faults["crash-loop"][0]]
    app = run_app(monkeypatch, DEMO, "node", {"node": node})
    subheaders = [h.value for h in app.subheader]
    assert subheaders[0] == "Harm now: 1 pool over its targets", subheaders
    assert subheaders[1].startswith("Findings on this node")
    (said,) = [w.value for w in app.warning if "since" in w.value]
    plain = said.replace("\\", "")
    assert plain.startswith("**pool chat-online: online pool processes started per minute ")
    assert "(target 2/min) since " in plain
    assert "← **crash-loop** (critical): fatal traps" in plain
    unexplained = fleet.instances[fleet.faults["unexplained-harm"][0]]
    app = run_app(monkeypatch, DEMO, "node", {"node": unexplained})
    assert any("← no rule explains it" in e.value.replace("\\", "") for e in app.error)


def test_the_fleet_page_counts_the_harm_as_diagnose_fleet_does(monkeypatch):
    from fleetscope.dashboard import harm_frames

    snap = data.load(DEMO)
    count = harm_frames.fleet_count(snap.findings, snap.harm)
    app = run_app(monkeypatch, DEMO)
    said = [e.value.replace("\\", "") for e in (*app.error, *app.warning)
            if "Harm:" in e.value]
    assert said == [f"**Harm:** {count.text()}"]
    assert "crash-loop 1" in said[0] and "1 unexplained" in said[0]


def test_a_node_link_with_the_host_name_alone_opens_that_node(monkeypatch):
    """Tickets and pages carry the host name without the exporter's port."""
    fleet = Fleet(nodes=256)
    node = fleet.instances[fleet.faults["fd-exhaustion"][0]]
    app = run_app(monkeypatch, DEMO, "node", {"node": node.rpartition(":")[0]})
    assert app.selectbox(key="node_choice").value == node
    assert app.query_params["node"] == node


def test_a_link_to_what_is_not_there_says_so_and_opens_nothing_else(monkeypatch):
    fleet = Fleet(nodes=256)
    sick = fleet.instances[fleet.faults["fd-exhaustion"][0]]
    healthy = next(i for i in fleet.instances if i not in {
        fleet.instances[n] for nodes in fleet.faults.values() for n in nodes})
    # an unknown node: said, and no other node's page in its place
    app = run_app(monkeypatch, DEMO, "node", {"node": "no-such-node:9105"})
    assert any("no-such-node:9105" in e.value for e in app.error), [e.value for e in app.error]
    assert not app.main.selectbox and not app.main.expander  # the sidebar keeps its own
    # a rule that does not fire on the node: the node, and a line saying so
    app = run_app(monkeypatch, DEMO, "node", {"node": healthy, "rule": "fd-exhaustion"})
    assert app.selectbox(key="node_choice").value == healthy
    assert any("fd-exhaustion does not fire on" in i.value for i in app.info)
    assert app.query_params == {"node": healthy, "rule": "fd-exhaustion"}  # a reload says so
    # a rule id that does not exist: said as such, not as a rule that does not fire there
    app = run_app(monkeypatch, DEMO, "node", {"node": healthy, "rule": "no-such-rule"})
    assert any("No rule has the id 'no-such-rule'" in i.value for i in app.info)
    assert not any("does not fire" in i.value for i in app.info)
    # the findings page: an unknown rule, and a rule asked on a node it does not fire on
    app = run_app(monkeypatch, DEMO, "findings", {"rule": "no-such-rule"})
    assert any("no-such-rule" in e.value for e in app.error) and not app.subheader
    app = run_app(monkeypatch, DEMO, "findings", {"rule": "fd-exhaustion", "node": healthy})
    assert any(f"fd-exhaustion does not fire on {healthy}" in e.value for e in app.error)
    assert not app.subheader
    # ...and the host name alone finds the node's finding
    app = run_app(monkeypatch, DEMO, "findings", {"rule": "fd-exhaustion",
                                                  "node": sick.rpartition(":")[0]})
    assert as_read(app.subheader[0].value).endswith(f"fd-exhaustion on {sick}")
    # a node with no rule: its own worst finding, an unknown or a healthy node said
    worst = next(f for f in data.load(DEMO).findings if f["node"] == sick)
    app = run_app(monkeypatch, DEMO, "findings", {"node": sick})
    assert as_read(app.subheader[0].value).endswith(f"{worst['rule']} on {sick}")
    assert app.query_params == {"node": sick, "rule": worst["rule"]}
    app = run_app(monkeypatch, DEMO, "findings", {"node": "no-such-node:9105"})
    assert any("No node 'no-such-node:9105'" in e.value for e in app.error)
    assert not app.subheader and app.query_params == {"node": "no-such-node:9105"}
    app = run_app(monkeypatch, DEMO, "findings", {"node": healthy})
    assert any(f"No rule fires on {healthy}" in s.value for s in app.success)
    assert not app.subheader


def test_changing_the_rule_never_leaves_the_previous_rules_finding_selected(monkeypatch):
    app = run_app(monkeypatch, DEMO, "findings")
    rules = app.selectbox(key="findings_rule").options
    first, second = rules[0], rules[1]
    boxes = [b for b in app.selectbox if b.key and b.key.startswith("findings_choice")]
    boxes[0].select_index(len(boxes[0].options) - 1).run()
    app.selectbox(key="findings_rule").select_index(1).run()
    assert not app.exception
    boxes = [b for b in app.selectbox if b.key and b.key.startswith("findings_choice")]
    assert len(boxes) == 1
    shown = boxes[0].value
    heading = as_read(app.subheader[0].value)
    assert f": {second} on " in heading and first not in heading
    assert heading.endswith(shown.split(" ")[0])  # the box names the finding on the page
    assert app.query_params == {"rule": second, "node": shown.split(" ")[0]}


def test_a_bandwidth_value_renders_in_gigabytes_per_second(monkeypatch):
    fleet = Fleet(nodes=256)
    node = fleet.instances[fleet.faults["memory-bandwidth-saturation"][0]]
    app = run_app(monkeypatch, DEMO, "findings",
                  {"rule": "memory-bandwidth-saturation", "node": node})
    assert as_read(app.subheader[0].value).endswith(node)
    evidence = table(app, "evidence_table").set_index("signal")
    assert evidence.loc["DRAM bandwidth over platform peak", "value"].endswith(" %")
    assert evidence.loc["DRAM bandwidth over platform peak", "threshold"] == "needs over 80 %"
    charts = [json.loads(c.proto.spec) for c in app.get("plotly_chart")]
    axes = [c["layout"].get("yaxis", {}) for c in charts]
    assert any(a.get("ticksuffix") == "B/s" and a.get("tickformat") == "~s" for a in axes)
    node_page = run_app(monkeypatch, DEMO, "node", {"node": node})
    assert any(re.search(r"now \d+(\.\d+)? GB/s of the platform peak \d+(\.\d+)? GB/s",
                         c.value) for c in node_page.caption)


def test_a_firing_bandwidth_node_is_drawn_above_the_line_where_its_rule_fires(monkeypatch):
    """The node page's bandwidth chart draws its red line where memory-bandwidth-saturation
    fires (80 % of the platform peak), the peak itself apart: the firing node's bandwidth
    sits above the red line (it sat under a line drawn at the peak)."""
    fleet = Fleet(nodes=256)
    node = fleet.instances[fleet.faults["memory-bandwidth-saturation"][0]]
    page = run_app(monkeypatch, DEMO, "node", {"node": node})
    chart = next(json.loads(c.proto.spec) for c in page.get("plotly_chart")
                 if "read + write" in json.loads(c.proto.spec)["layout"]["title"]["text"])
    lines = {a["text"].split(" ", 1)[0]: shape["y0"] for a, shape in
             zip(chart["layout"]["annotations"], chart["layout"]["shapes"], strict=True)}
    peak, fires = lines["platform"], lines["memory-bandwidth-saturation"]
    assert fires == pytest.approx(0.8 * peak)
    values = plotted(chart["data"][0]["y"])
    assert fires < values[-1] < peak * 1.2, (values[-1], fires, peak)


def test_runbook_links_stay_inside_the_console(monkeypatch):
    app = run_app(monkeypatch, DEMO, "runbook", {"rule": "isa-mismatch"})
    assert app.selectbox(key="runbook_rule").value == "isa-mismatch"
    body = text_of(app)
    assert "](/runbook?rule=cold-start)" in body and "(cold-start.md)" not in body
    related = [link.proto for link in app.get("page_link")]
    assert any(p.page == "runbook" and "rule=cold-start" in p.query_string for p in related)


def test_findings_page_renders_evidence_action_and_runbook(monkeypatch):
    app = run_app(monkeypatch, DEMO, "findings")
    first = app.selectbox(key="findings_rule").value  # the primary diagnosis: a critical one
    assert first in {"isa-mismatch", "worker-blocked-external-call", "fd-exhaustion"}
    body = text_of(app)
    assert "**Action:**" in body and "## Confirm by hand" in body
    assert f"# {first}" in body
    rules = app.selectbox(key="findings_rule").options
    app.selectbox(key="findings_rule").select_index(rules.index("roce-congestion")).run()
    body = text_of(app)
    assert "# roce-congestion" in body and "RoCEv2 packet loss" in body
    assert not table(app, "evidence_table").empty
    assert len(app.get("plotly_chart")) >= 2


def test_latency_page_shows_inference_as_a_third_of_session_time(monkeypatch):
    app = run_app(monkeypatch, DEMO, "latency")
    shares = {k: v for k, v in metrics(app).items() if k.startswith("inference · ")}
    node_pools = set(app.sidebar.multiselect(key="filter_pools").options)
    assert {k.split(" · ")[1] for k in shares} == node_pools  # the sidebar's pools
    assert {"inference · chat · chat-online", "inference · codegen · codegen-online",
            "inference · batch · batch-offline"} <= set(shares)
    for key in ("chat · chat-online", "codegen · codegen-online"):
        assert 30 <= int(shares[f"inference · {key}"].rstrip("%")) <= 45
    stages = table(app, "stage_table")
    assert set(stages["stage"]) >= {"inference", "tool_call"}
    # shares in percent, each pool's stages adding up to its whole session time
    assert stages.groupby(["node_pool", "pool"])["share"].sum().round(6).eq(100).all()


def test_rules_page_has_every_catalog_rule_and_downloads_the_rule_file(monkeypatch):
    app = run_app(monkeypatch, DEMO, "rules")
    rules = table(app, "rule_table")
    assert len(rules) == len(CATALOG) and set(rules["rule"]) >= set(RULE_IDS)
    assert metrics(app)["rules in the catalog"] == str(len(CATALOG))
    assert app.get("download_button")
    assert "fleetscope_rule: isa-mismatch" in app.code[0].value


# -- bundles -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live_bundle(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("live") / "bundle"
    subprocess.run([sys.executable, "-m", "fleetscope", "bundle", "record", "--seconds", "2",
                    "--interval", "1", "-o", str(path)], check=True, capture_output=True,
                   timeout=120)
    return path


@pytest.mark.parametrize("page", ["fleet", "node", "findings", "latency", "rules"])
def test_fixture_bundle_every_page(monkeypatch, page):
    app = run_app(monkeypatch, f"bundle:{BUNDLES / 'kunpeng-128'}", page)
    if page == "fleet":  # one node: its findings and verdict, no fleet groupings
        listed = table(app, "findings_table")
        assert {"isa-mismatch", "fd-exhaustion", "numa-remote-access"} <= set(listed["rule"])
        assert metrics(app)["nodes"] == "1"
    elif page == "node":
        assert app.selectbox(key="node_choice").value == "kunpeng-920-128"
        assert metrics(app)["median core busy"].endswith("%")
        assert not table(app, "numa_table").empty
        # a CPU node: no module series in its bundle, and the page says so
        assert any("No inference module reported" in i.value for i in app.info)
    elif page == "findings":
        first = app.selectbox(key="findings_rule").value
        assert first in {"isa-mismatch", "fd-exhaustion"}
        assert f"# {first}" in text_of(app) and "## Fix" in text_of(app)
    elif page == "latency":
        assert "agent_stage_duration_seconds" in app.info[0].value
    else:
        assert len(table(app, "rule_table")) == len(CATALOG)


@pytest.mark.live
@pytest.mark.parametrize("page", ["fleet", "node", "findings", "latency", "rules"])
def test_live_recorded_bundle_every_page(monkeypatch, live_bundle, page):
    app = run_app(monkeypatch, f"bundle:{live_bundle}", page)
    hostname = json.loads((live_bundle / "meta.json").read_text())["hostname"]
    if page == "fleet":
        assert metrics(app)["nodes"] == "1"
    elif page == "node":
        assert app.selectbox(key="node_choice").value == hostname
        assert metrics(app)["busiest core"].endswith("%")
    elif page == "rules":
        assert len(table(app, "rule_table")) == len(CATALOG)


def test_a_bad_source_is_one_error_line(monkeypatch, tmp_path):
    monkeypatch.setenv(data.SOURCE_ENV, f"bundle:{tmp_path / 'missing'}")
    app = AppTest.from_file(APP, default_timeout=60)
    app.run()
    assert not app.exception
    assert "no such bundle" in app.error[0].value


# -- Prometheus and VictoriaMetrics --------------------------------------------------------
# The small fleet of tests/conftest.py (engine_fleet): Prometheus evaluates the exported rules
# (the console reads its recorded per-node series), VictoriaMetrics has none (the console asks
# it the same expressions as instant queries).
def _wait_recorded(fleet: dict) -> float:
    """When Prometheus held every recorded series, 31 s back: the rule evaluations reach
    past the settled window's end (30 s ago)."""
    at = fleet["bench"].wait_recorded(fleet["engines"]["prometheus"].url, 120, back=31)
    assert at is not None, "Prometheus recorded none of the console's series in time"
    return at


def test_recorded_series_and_instant_expressions_give_the_same_aggregates(engine_fleet):
    from fleetscope.diagnose import remote
    from fleetscope.rules.recording import RECORDINGS

    prometheus = engine_fleet["engines"]["prometheus"].url
    victoria = engine_fleet["engines"]["victoriametrics"].url
    at = _wait_recorded(engine_fleet)
    recorded_client = remote.QueryClient(prometheus, 60)
    recorded = remote.recorded_vectors(recorded_client, RECORDINGS, at)
    assert recorded_client.stats.queries == 1  # one query: every recorded series
    asked_client = remote.QueryClient(victoria, 60)
    asked = remote.recorded_vectors(asked_client, RECORDINGS, at)
    assert asked_client.stats.queries == 1 + len(RECORDINGS)  # none recorded: each asked
    for recording in RECORDINGS:
        mine, theirs = recorded[recording.record], asked[recording.record]
        assert set(mine) == set(theirs), recording.record
        assert len({dict(k)["instance"] for k in mine}) > 1, recording.record
        for labels, value in mine.items():
            other = theirs[labels]
            if value != value:  # NaN (no online session in the window) on both
                assert other != other, (recording.record, labels)
            else:
                assert other == pytest.approx(value, rel=0.05, abs=1e-9), (recording.record,
                                                                          labels)


@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
@pytest.mark.parametrize("page", ["fleet", "node", "findings", "latency", "rules"])
def test_query_engine_source_every_page(monkeypatch, engine_fleet, engine, page):
    url = engine_fleet["engines"][engine].url
    if engine == "prometheus":  # the console reads its alerts: once they fire
        _wait_recorded(engine_fleet)
        until_alerts_held(engine_fleet)
    app = run_app(monkeypatch, f"prometheus:{url}", page)
    expected = set().union(*engine_fleet["expected"].values())  # rules of every profile
    how = {"prometheus": "the alerts this engine fires",
           "victoriametrics": "every rule evaluated on this engine"}[engine]
    assert any(how in str(c.value) for c in app.sidebar.caption)
    if page == "fleet":
        counts = table(app, "rule_counts")
        assert set(counts["rule"]) == expected
        assert metrics(app)["nodes"] == str(len(engine_fleet["nodes"]))
    elif page == "node":  # the first flagged node, its history loaded on opening it
        assert "per_core: summary" in " ".join(i.value for i in app.info)
        assert app.get("plotly_chart"), "no chart of the node's history"
        assert not any("No rule fires" in s.value for s in app.success)
    elif page == "findings":
        assert "## Confirm by hand" in text_of(app)
    elif page == "latency":
        assert any(k.startswith("inference · ") for k in metrics(app))


def test_a_query_engine_source_loads_once_a_run_even_when_its_cache_expires(monkeypatch,
                                                                            engine_fleet):
    """The entry point and the page it runs draw from one snapshot: the cached one expiring
    between them (a load crossing the reload time) costs no second load; the next run
    reloads, keeping one snapshot, not a stale one beside it."""
    from fleetscope.dashboard import state

    url = engine_fleet["engines"]["victoriametrics"].url
    loads = []
    real_load, real_nodes = data.load, state.nodes

    def counted_load(spec):
        loads.append(spec)
        return real_load(spec)

    def expire_then_nodes(snap):  # app.py's next step after its load: the TTL runs out
        state._live_snapshot.clear()
        return real_nodes(snap)

    state._live_snapshot.clear()
    monkeypatch.setattr(data, "load", counted_load)
    monkeypatch.setattr(state, "nodes", expire_then_nodes)
    run_app(monkeypatch, f"prometheus:{url}")
    assert len(loads) == 1  # app.py and the Fleet page: one load
    app = run_app(monkeypatch, f"prometheus:{url}", "findings")
    assert len(loads) == 3  # two runs (entry page, then Findings): one load each
    assert "## Confirm by hand" in text_of(app)


def test_the_rules_table_shows_whole_symptoms_and_causes(monkeypatch):
    """The Rules page cut every symptom and cause after one line: its grid's rows are tall
    enough to wrap them (five lines at 290 px) and every rule is in view."""
    import json

    app = run_app(monkeypatch, DEMO, "rules")
    grid = next(d for d in app.dataframe if "symptom" in d.value.columns)
    assert grid.proto.row_height >= 5 * 20
    widths = {name: spec.get("width") for name, spec in json.loads(grid.proto.columns).items()}
    assert all(isinstance(widths.get(name), int) for name in ("symptom", "cause", "action"))
