"""Latency breakdown: where session time goes, by stage, per pool. On CPU agent clusters
inference is only 30-40 % of a session; the rest is queueing, context, tools and state."""

import streamlit as st

from fleetscope.dashboard import charts, data, state

snap = state.snapshot()
nodes = state.filtered_nodes(snap)
breakdown = data.stage_breakdown(snap, nodes)
st.title("Latency breakdown")
if breakdown.empty:
    st.info("No agent stage timings (agent_stage_duration_seconds) from this source: the "
            "agent runtime's metrics are not scraped.")
    st.stop()
shares = data.inference_share(breakdown)
cols = st.columns(max(1, len(shares)))
for col, row in zip(cols, shares.itertuples(index=False), strict=False):
    col.metric(f"inference share · {row.pool}", f"{row._1:.0%}")
st.plotly_chart(charts.stage_bars(breakdown), key="stage_bars")
st.dataframe(breakdown, hide_index=True, key="stage_table",
             column_config={"share": st.column_config.NumberColumn(format="percent")})
