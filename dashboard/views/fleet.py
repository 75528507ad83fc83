"""Fleet: what is red and where. Counts; what hurts (the pools over their targets on how many
nodes, explained by which rules, how many unexplained, as `diagnose --fleet` leads with it,
each pool a row that opens its node); the incidents (each rule firing at warning or
worse, worst then widest: how many nodes and where they concentrate, a link to its findings);
then the findings worst first (a search drops the rows it does not match; a click on a row
opens its node with that finding), where each rule concentrates (CPU stepping, rack, pool,
kernel) with its group's sick nodes beside the group's healthy peers, sick nodes by pool, the
worst racks and a heatmap of every node (a click on a cell or a rack row opens it)."""

import streamlit as st

from fleetscope.core import units
from fleetscope.dashboard import charts, evidence_frames, fleet_frames, harm_frames, state
from fleetscope.rules.catalog import CATALOG

MAX_INCIDENTS = 12
SEVERITY_TEXT = {"critical": ":red[**critical**]", "warning": ":orange[**warning**]"}

snap = state.snapshot()
nodes = state.filtered_nodes(snap)
findings = fleet_frames.findings_for(state.findings(snap), nodes)
health = fleet_frames.node_health(nodes, findings)

st.title("Fleet")
cols = st.columns(6)
cols[0].metric("nodes", f"{len(nodes):,}")
cols[1].metric("critical nodes", int((health["health"] == "critical").sum()))
cols[2].metric("warning nodes", int((health["health"] == "warning").sum()))
cols[3].metric("findings", f"{len(findings):,}")
serious = findings[findings["severity"].isin(("critical", "warning"))] \
    if not findings.empty else findings
cols[4].metric("rules firing", f"{serious['rule'].nunique()}",
               help="at warning or worse (an info finding is context, not a fault)")
cols[5].metric("rules not evaluated", f"{len(snap.not_evaluated)} of {len(CATALOG)}")
st.caption(f"{snap.description} · evaluated "
           f"{units.time_window(snap.window[0], snap.window[1])}")
shown_nodes = set(nodes["instance"])
hurt = harm_frames.fleet_count(snap.findings, snap.harm, shown_nodes)
if snap.harm is None:
    st.caption("Harm not judged on this source (its findings are the query engine's firing "
               "alerts).")
elif hurt is None:
    st.success("**Harm:** no pool over its targets on these nodes.")
else:
    (st.error if hurt.unexplained else st.warning)(f"**Harm:** {state.plain(hurt.text())}")
    harm_rows = harm_frames.harm_table(snap.findings, snap.harm, shown_nodes)
    with st.expander(f"Pools over their targets ({len(harm_rows)}): click a row to open its "
                     "node"):
        event = st.dataframe(harm_rows.head(500), hide_index=True, key="harm_table",
                             on_select="rerun", selection_mode="single-row",
                             column_config={"harm": st.column_config.TextColumn(
                                 "harm", width="large")})
        row = state.selected_row(event)
        if row is not None:
            state.open_node(harm_rows.iloc[row]["node"])
if len(nodes) == 1:
    # One node (a bundle, a one-node Prometheus): its verdict, not an empty fleet's charts.
    node = nodes["instance"].iloc[0]
    worst = health["health"].iloc[0] if not health.empty else "ok"
    firing = sorted(set(serious["rule"])) if not serious.empty else []
    skipped = {item["rule"] for item in snap.not_evaluated}
    passed = sorted(r.id for r in CATALOG if r.id not in skipped and r.id not in firing)
    waiting = sorted({item["rule"] for item in snap.pending if item["node"] == node})
    verdict = {"critical": st.error, "warning": st.warning}.get(
        worst, st.warning if waiting else st.success)
    verdict(f"**{node}: {worst}**" + (f": {', '.join(firing)} firing" if firing else
                                      ": no rule fires at warning or worse")
            + (f" ({', '.join(waiting)} pending: the condition holds, not yet for its "
               "rule's for:)" if waiting else "")
            + f". {units.count(len(passed), 'rule')} evaluated and passed, "
              f"{units.count(len(skipped), 'rule')} not evaluated.")
    st.page_link(state.page("node"), label=f"Open {node}", icon=":material/memory:",
                 query_params={"node": node})
    with st.expander(f"Evaluated and passed ({len(passed)})"):
        st.markdown(", ".join(passed) or "none")
if snap.not_evaluated:
    with st.expander(f"Not evaluated on this source ({len(snap.not_evaluated)}): their "
                     "signals are missing", expanded=len(nodes) == 1):
        st.dataframe(fleet_frames.not_evaluated_table(snap.not_evaluated), hide_index=True,
                     key="not_evaluated", column_config={
                         "rule": st.column_config.TextColumn("rule", width="small"),
                         "missing": st.column_config.TextColumn("missing", width="large"),
                         "signals": st.column_config.TextColumn("absent signals",
                                                                width="medium")})

st.subheader("Incidents")
incidents = fleet_frames.incidents(nodes, findings)
shown = set(nodes["instance"])
pending = [item for item in snap.pending if item["node"] in shown]
if pending:  # faults younger than their rule's for: (a query engine's pending alerts)
    st.warning(f"{units.count(len(pending), 'alert')} pending on "
               f"{units.count(len({p['node'] for p in pending}), 'node')}: the condition "
               "holds, not yet for its rule's for:. "
               + evidence_frames.pending_text(pending[:MAX_INCIDENTS])
               + (f"; {len(pending) - MAX_INCIDENTS} more." if len(pending) > MAX_INCIDENTS
                  else "."))
if incidents.empty and not pending:
    st.success("No rule fires at warning or worse on these nodes.")
for _, incident in incidents.head(MAX_INCIDENTS).iterrows():
    line, link = st.columns([6, 1])
    line.markdown(f"**{incident['rule']}** · {SEVERITY_TEXT[incident['severity']]} · "
                  f"{units.count(incident['nodes'], 'node')} · {incident['where']}")
    link.page_link(state.page("findings"), label="Findings", icon=":material/report:",
                   query_params={"rule": incident["rule"]})
if len(incidents) > MAX_INCIDENTS:
    st.caption(f"{len(incidents) - MAX_INCIDENTS} more rules fire: see the rows below")

st.subheader("Findings, worst first")
# The table's own search only highlights: this one drops the rows that do not match.
state.from_url("search", "findings_search")
search = st.text_input("Search findings", key="findings_search",
                       placeholder="node, rule, rack or pool (every word must match)",
                       on_change=state.to_url("search", "findings_search"))
state.keep_in_url(search=search.strip() or None)
matched = fleet_frames.search_findings(findings, nodes, search)
if findings.empty:
    st.success("No rule fires on these nodes.")
elif matched.empty:
    st.info(f"No finding matches {search!r}.")
else:
    if search.strip():
        st.caption(f"{units.count(len(matched), 'finding')} of {len(findings):,} match "
                   f"{search.strip()!r}")
    shown = matched[["severity", "rule", "node", "confidence", "summary"]].head(500)
    st.caption("Click a row to open its node with the finding.")
    event = st.dataframe(
        shown, hide_index=True, key="findings_table", on_select="rerun",
        selection_mode="single-row", height=min(38 + 35 * len(shown), 316),
        column_config={"confidence": st.column_config.ProgressColumn(
            "confidence", format="percent", min_value=0.0, max_value=1.0),
            "summary": st.column_config.TextColumn("summary", width="large")})
    row = state.selected_row(event)
    if row is not None:
        state.open_node(shown.iloc[row]["node"], shown.iloc[row]["rule"])
    if len(matched) > 500:
        st.caption(f"the first 500 of {len(matched):,}; narrow with the search or the "
                   "filters")

if len(nodes) == 1:
    st.stop()  # groupings, racks and a heatmap of one node say nothing the verdict does not

signals = fleet_frames.with_health(state.signals(snap), health)
counts = fleet_frames.rule_counts(findings)
if not counts.empty:
    left, right = st.columns([2, 3])
    with left:
        st.markdown("**Where each rule fires**")
        rule = st.selectbox("Rule", counts["rule"].tolist(), key="fleet_group_rule")
        dimension = st.radio("Group by", list(fleet_frames.GROUPINGS), horizontal=True,
                             key="fleet_group_by")
        summary = fleet_frames.grouping_summary(nodes, findings, rule)
        if summary:
            st.info(summary)
    grouping = fleet_frames.rule_grouping(nodes, findings, rule, dimension)
    right.plotly_chart(charts.grouping_bars(grouping.head(20), rule, dimension),
                       key="grouping_bars", config=charts.STATIC)
    if not grouping.empty:
        # The sick nodes beside healthy nodes of their own group: what sets them apart.
        group = grouping["group"].iloc[0]
        sick, peers, compared = fleet_frames.peer_comparison(
            health, signals, findings, rule, dimension, group)
        st.markdown(f"**{rule} in {dimension} {group}: {units.count(sick, 'sick node')} "
                    f"beside {units.count(peers, 'healthy peer')}** (no finding at warning "
                    "or worse), the signals that differ most first")
        if peers:
            st.dataframe(compared, hide_index=True, key="peer_comparison")
        else:
            st.caption(f"No healthy peer in {dimension} {group} to compare with.")
    with st.expander("Nodes per firing rule", expanded=False):
        st.plotly_chart(charts.rule_bars(counts), key="rule_bars", config=charts.STATIC)
        st.dataframe(counts, hide_index=True, key="rule_counts")

left, right = st.columns(2)
by_pool = fleet_frames.health_by(nodes, findings, "node_pool")
left.plotly_chart(charts.health_bars(by_pool, "node_pool"), key="health_pool",
                  config=charts.STATIC)
by_rack = fleet_frames.health_by(nodes, findings, "rack").head(12)
with right:
    st.markdown("**Worst racks** (click a row to open its worst node)")
    event = st.dataframe(by_rack, hide_index=True, key="health_rack", on_select="rerun",
                         selection_mode="single-row")
    row = state.selected_row(event)
    if row is not None:
        rack = by_rack.iloc[row]["rack"]
        worst = fleet_frames.worst_node(health, rack)
        if worst:
            state.open_node(worst)

signal = st.selectbox("Heatmap signal", list(fleet_frames.SIGNALS), key="fleet_signal")
signal_unit, signal_meaning = fleet_frames.SIGNALS[signal]
st.caption(signal_meaning + (f" ({units.unit_words(signal_unit)})" if signal_unit else "")
           + "; blank = no data")
grid = fleet_frames.heatmap(nodes, signals, signal)
event = st.plotly_chart(charts.fleet_heatmap(grid, signal), key="fleet_heatmap",
                        on_select="rerun", selection_mode="points")
point = state.selected_point(event)
if point and point.get("customdata"):
    node = point["customdata"]
    state.open_node(node[0] if isinstance(node, list) else node)
