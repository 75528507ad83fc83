"""Latency breakdown: where session time goes, by stage, per node pool (the sidebar's pools)
and the workload pools running on it. On CPU agent clusters inference is only 30-40 % of a
session; the rest is queueing, context, tools and state."""

import streamlit as st

from fleetscope.core import units
from fleetscope.dashboard import charts, latency_frames, state

snap = state.snapshot()
nodes = state.filtered_nodes(snap)
breakdown = latency_frames.stage_breakdown(snap, nodes)
st.title("Latency breakdown")
if breakdown.empty:
    st.info("No agent stage timings (agent_stage_duration_seconds) from this source: the "
            "agent runtime's metrics are not scraped.")
    st.stop()
shares = latency_frames.inference_share(breakdown)
st.caption("Share of session time that is model inference, per node pool · workload pool")
cols = st.columns(max(1, min(4, len(shares))))
for number, row in enumerate(shares.itertuples(index=False)):
    cols[number % len(cols)].metric(f"inference · {row.node_pool} · {row.pool}",
                                    f"{row[2]:.0%}")
st.plotly_chart(charts.stage_bars(breakdown), key="stage_bars", config=charts.STATIC)
spent = breakdown["seconds_per_second"].map(lambda v: units.format_value(v, "s/s"))
per_session = breakdown["seconds_per_session"].map(lambda v: units.format_value(v, "s"))
table = breakdown.assign(**{"time spent per second, all nodes": spent,
                            "per session (mean)": per_session,
                            "share": breakdown["share"] * 100})
# Every stage row in view (a fixed-height grid hid the last behind a scroll), the shares with
# one decimal each.
st.dataframe(table[["node_pool", "pool", "stage", "share", "per session (mean)",
                    "time spent per second, all nodes"]],
             hide_index=True, key="stage_table", height=35 * (len(table) + 1) + 3,
             column_config={"node_pool": "node pool", "pool": "workload pool",
                            "share": st.column_config.NumberColumn("share", format="%.1f %%")})
