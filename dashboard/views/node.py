"""Node: per-core busy over time, NUMA, steal and run delay, memory bandwidth against the
peak, NIC counters, and the node's findings with their evidence."""

import streamlit as st

from fleetscope.dashboard import charts, data, state

snap = state.snapshot()
nodes = state.filtered_nodes(snap)
all_findings = state.findings(snap)
st.title("Node")
if nodes.empty:
    st.warning("No node matches the filters.")
    st.stop()
choices = nodes["instance"].tolist()
flagged = [n for n in all_findings["node"] if n in set(choices)]
default = st.session_state.get("node_choice")
if default not in choices:
    st.session_state["node_choice"] = flagged[0] if flagged else choices[0]
instance = st.selectbox("Node", choices, key="node_choice")
row = nodes[nodes["instance"] == instance].iloc[0]
st.caption(f"pool **{row.node_pool}** · rack **{row.rack}** · {row.cpu_model} "
           f"(stepping {row.stepping}, {row.arch})")

history = state.node_history(snap, instance)
mine = all_findings[all_findings["node"] == instance]
st.subheader(f"Findings on this node ({len(mine)})")
if mine.empty:
    st.success("No rule fires on this node.")
for finding in [f for f in snap.findings if f["node"] == instance]:
    with st.expander(f"{finding['severity'].upper()} · {finding['rule']} · "
                     f"{finding['summary']}"):
        st.markdown(f"**Action:** {finding['action']}")
        st.dataframe(data.evidence_frame(finding), hide_index=True)

st.subheader("Cores")
busy = state.per_core(f"{state.source()}@{snap.window[1]}", instance, snap)
if busy.empty:
    st.info("This source has no per-core series (the exporter's `per_core: summary`); the "
            "busy distribution across cores is below.")
else:
    summary = data.core_summary(busy)
    cols = st.columns(4)
    cols[0].metric("median core busy", f"{summary['median']:.0%}")
    cols[1].metric("busiest core", f"{summary['max']:.0%}")
    cols[2].metric("busiest minus median", f"{summary['spread']:.0%}")
    cols[3].metric("cores > 90 % now", summary["saturated_now"])
    if summary["hogs"]:
        st.warning(f"pinned hogs (busy > 90 % over the last 10 samples): cpus {summary['hogs']}")
    st.plotly_chart(charts.core_heatmap(busy), key="core_heatmap")
spread = data.timeline(history, "fleetscope_cpu_core_busy_ratio")
if not spread.empty:
    st.plotly_chart(charts.lines(spread, "Busy across cores (min / p50 / p90 / max)",
                                 colour="stat", unit="ratio"), key="busy_spread")

st.subheader("NUMA")
numa = data.numa_view(history)
if numa.empty:
    st.info("No per-NUMA-node series from this source.")
else:
    st.dataframe(numa, hide_index=True, key="numa_table")
memory = data.pool_memory(history)
if not memory.empty:
    st.dataframe(memory, hide_index=True, key="pool_memory")
remote = data.timeline(history, "fleetscope_pool_numa_remote_memory_ratio")
if not remote.empty:
    st.plotly_chart(charts.lines(remote, "Pool memory on remote NUMA nodes", colour="pool",
                                 threshold=0.3, unit="ratio"), key="numa_remote")

st.subheader("Steal and run delay")
left, right = st.columns(2)
steal = data.timeline(history, "fleetscope_cpu_core_steal_ratio")
if not steal.empty:
    left.plotly_chart(charts.lines(steal, "Steal across cores", colour="stat",
                                   threshold=0.1, unit="ratio"), key="steal")
delay = data.timeline(history, "fleetscope_pool_run_delay_seconds_total")
if not delay.empty:
    right.plotly_chart(charts.lines(delay, "Run-queue delay per pool", colour="pool",
                                    unit="s/s"), key="run_delay")

st.subheader("Memory bandwidth")
bandwidth = data.timeline(history, "fleetscope_memory_bandwidth_bytes_per_second")
peak = data.latest(history, "fleetscope_memory_bandwidth_peak_bytes_per_second")
if bandwidth.empty:
    st.info("No memory-bandwidth series (perf uncore counters) from this source.")
else:
    total = bandwidth.groupby("time", as_index=False)["value"].sum()
    total["series"] = "read + write"
    st.plotly_chart(charts.lines(total, "DRAM bandwidth against the platform peak",
                                 colour="series",
                                 threshold=float(peak["value"].max()) if not peak.empty
                                 else None, unit="bytes/s"), key="bandwidth")

st.subheader("NIC")
left, right = st.columns(2)
pfc = data.timeline(history, "fleetscope_nic_pfc_pause_frames_total")
if not pfc.empty:
    left.plotly_chart(charts.lines(pfc, "PFC pause frames /s", unit="1/s"), key="pfc")
rdma = data.timeline(history, "fleetscope_rdma_hw_stats_total")
if not rdma.empty:
    right.plotly_chart(charts.lines(rdma, "RDMA congestion counters /s", unit="1/s"),
                       key="rdma")
port = data.timeline(history, "fleetscope_nic_port_bytes_total")
if not port.empty:
    st.plotly_chart(charts.lines(port, "Port bytes /s", unit="bytes/s"), key="port_bytes")
if pfc.empty and rdma.empty and port.empty:
    st.info("No NIC or RDMA counters from this source.")
