"""Fleet: health by pool and rack, a heatmap of every node by a chosen signal, and the active
findings worst first with counts per rule."""

import streamlit as st

from fleetscope.dashboard import charts, data, state

snap = state.snapshot()
nodes = state.filtered_nodes(snap)
findings = data.findings_for(state.findings(snap), nodes)
health = data.node_health(nodes, findings)

st.title("Fleet")
cols = st.columns(5)
cols[0].metric("nodes", f"{len(nodes):,}")
cols[1].metric("critical nodes", int((health["health"] == "critical").sum()))
cols[2].metric("warning nodes", int((health["health"] == "warning").sum()))
cols[3].metric("findings", len(findings))
cols[4].metric("rules firing", findings["rule"].nunique())

counts = data.rule_counts(findings)
st.subheader("Active findings")
if counts.empty:
    st.success("No rule fires on these nodes.")
else:
    left, right = st.columns([2, 3])
    left.dataframe(counts, hide_index=True, key="rule_counts")
    right.plotly_chart(charts.rule_bars(counts), key="rule_bars")

left, right = st.columns(2)
by_pool = data.health_by(nodes, findings, "node_pool")
left.plotly_chart(charts.health_bars(by_pool, "node_pool"), key="health_pool")
by_rack = data.health_by(nodes, findings, "rack")
right.markdown("**Worst racks**")
right.dataframe(by_rack.head(12), hide_index=True, key="health_rack")

signal = st.selectbox("Heatmap signal", list(data.SIGNALS), key="fleet_signal")
st.caption(f"{data.SIGNALS[signal][1]} ({data.SIGNALS[signal][0]}); blank = no data")
grid = data.heatmap(nodes, state.signals(snap), signal)
st.plotly_chart(charts.fleet_heatmap(grid, signal), key="fleet_heatmap")

st.subheader("Findings, worst first")
st.dataframe(findings[["severity", "rule", "node", "confidence", "summary"]].head(500),
             hide_index=True, key="findings_table")
if len(findings) > 500:
    st.caption(f"the first 500 of {len(findings):,}; narrow with the filters")
if snap.not_evaluated:
    with st.expander(f"{len(snap.not_evaluated)} rules not evaluated on this source"):
        st.dataframe(snap.not_evaluated, hide_index=True)
