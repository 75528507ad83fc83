"""Node: `/node?node=NAME[&rule=ID]`. What hurts first: each pool over its targets, since
when, and the findings that explain it (or that no rule does), as `diagnose` leads with it;
then the node's findings, those still acting before the events that ended, each with the
charts that prove it (the one named by `rule` open), then its inference modules (or the line
saying it reports none), per-core busy, NUMA, steal and run delay, memory bandwidth against
the peak and the NIC counters."""

import streamlit as st

from fleetscope.core import units
from fleetscope.dashboard import charts, evidence_frames, frames, harm_frames, node_frames, state
from fleetscope.rules.builtin import memory_bandwidth_saturation as bandwidth_rule
from fleetscope.rules.builtin import numa_remote_access as numa_rule
from fleetscope.rules.builtin import offline_preemption as steal_rule
from fleetscope.rules.catalog import RULE_IDS

snap = state.snapshot()
all_nodes = state.nodes(snap)
nodes = state.filtered_nodes(snap)
all_findings = state.findings(snap)
st.title("Node")
# A deep link opens the node it names (its host name alone will do), even one the sidebar
# filters hide, or says there is none: never another node in its place.
choices = nodes["instance"].tolist()
asked = st.query_params.get("node")
wanted = state.resolve_node(asked, all_nodes["instance"])
if asked and wanted is None:
    state.no_such_node(asked)
if wanted and wanted not in choices:
    choices = [wanted, *choices]
if wanted:
    st.query_params["node"] = wanted
if not choices:
    st.warning("No node matches the filters.")
    st.stop()
state.from_url("node", "node_choice", set(choices))
if st.session_state.get("node_choice") not in choices:
    flagged = [n for n in all_findings["node"] if n in set(choices)]
    st.session_state["node_choice"] = flagged[0] if flagged else choices[0]
instance = st.selectbox("Node", choices, key="node_choice",
                        on_change=state.to_url("node", "node_choice", drop=("rule",)))
row = all_nodes[all_nodes["instance"] == instance].iloc[0]
history = state.node_history(snap, instance)
window = evidence_frames.history_window(history)
stamps = history.timestamps()
# A range longer than the node's data: say where its data starts (the chart's axis alone
# reads as if the range were drawn).
starts = (f", its data from {units.local_time(stamps[0] / 1000)}" if len(stamps) > 1
          and stamps[-1] - stamps[0] < 0.95 * state.history_seconds(snap) * 1000 else "")
st.caption(f"**{state.plain(instance)}** · pool **{state.plain(str(row.node_pool))}** · rack "
           f"**{state.plain(str(row.rack))}** · {state.plain(str(row.cpu_model))} "
           f"(stepping {row.stepping}, {row.arch}) · kernel "
           f"{row.kernel if row.kernel not in ('', '?') else 'not recorded'} · data up to "
           f"{units.local_time(snap.window[1])}"
           + (f" · history: the last {state.history_range()} (sidebar){starts}"
              if snap.history_ranged else ""))

mine = harm_frames.ongoing_first([f for f in snap.findings if f["node"] == instance])
asked_rule = st.query_params.get("rule")
open_rule = asked_rule if asked_rule in {f["rule"] for f in mine} else None
if asked_rule and open_rule is None:
    known = asked_rule in RULE_IDS
    st.info((f"{asked_rule} does not fire on {instance}" if known
             else f"No rule has the id {asked_rule!r} (a link from another version?)")
            + (f"; what does: {', '.join(f['rule'] for f in mine)}." if mine
               else "."))
# The URL keeps the rule asked even where it does not fire: a reload or a shared link says so
# again rather than opening the node's first finding as if it had been asked for.
state.keep_in_url(node=instance, rule=asked_rule)
hurting = harm_frames.node_harm(snap.findings, snap.harm, instance)
if snap.harm is None:
    st.caption("Harm not judged on this source (its findings are the query engine's firing "
               "alerts): which pool hurts is not known here.")
elif hurting:
    st.subheader(f"Harm now: {units.count(len(hurting), 'pool')} over "
                 f"{'its' if len(hurting) == 1 else 'their'} targets")
    for harm in hurting:
        explained = bool(harm.causes)
        box = st.warning if explained else st.error
        lines = [f"**{state.plain(harm.head)}**"]
        lines += [f"← **{state.plain(cause['rule'])}** ({cause['severity']}): "
                  f"{state.plain(cause['summary'])}" for cause in harm.causes]
        if not explained:
            lines.append(f"← {state.plain(harm.cause)}")
        box("  \n".join(lines))
else:
    st.success("Harm now: no pool over its targets on this node.")
gone = [f for f in mine if harm_frames.ended(f) and f["severity"] != "info"]
if gone:
    st.caption("Ended (no longer acting, explains no harm of now): " + "; ".join(
        f"{f['rule']}: {state.plain(f['summary'])}" for f in gone))
st.subheader(f"Findings on this node ({len(mine)})")
# A fault younger than its rule's `for:` is pending in the engine: not a finding yet, and not
# "nothing fires" either.
pending = [item for item in snap.pending if item["node"] == instance]
if pending:
    st.warning(("No rule fires on this node yet, but " if not mine else "")
               + f"{units.count(len(pending), 'alert')} pending (the condition holds, not yet "
               f"for its rule's for:): {evidence_frames.pending_text(pending)}.")
elif not mine:
    st.success("No rule fires on this node.")
for number, finding in enumerate(mine):
    is_open = finding["rule"] == open_rule or (open_rule is None and number == 0)
    phase = " · ended" if harm_frames.ended(finding) else ""
    with st.expander(f"{finding['severity'].upper()} · {finding['rule']}{phase} · "
                     f"{state.plain(finding['summary'])}", expanded=is_open):
        st.markdown(f"**Likely cause:** {state.plain(finding['cause'])}  \n"
                    f"**Action:** {state.plain(finding['action'])}")
        subjects = {k: v for k, v in finding.get("subjects", {}).items() if v}
        if subjects:
            st.markdown(evidence_frames.subjects_line(subjects))
        state.static_table(evidence_frames.evidence_frame(finding)[evidence_frames.TABLE])
        if is_open:  # the charts of the finding asked for (the others on a click)
            panels = evidence_frames.evidence_panels(finding["rule"], history,
                                                     finding.get("labels"))
            for chart_number, (panel, frame) in enumerate(panels):
                st.plotly_chart(charts.evidence_chart(panel, frame, window),
                                key=f"node_panel_{number}_{chart_number}")
        links = st.columns(3)
        links[0].page_link(state.page("runbook"), label=f"Runbook: {finding['rule']}",
                           icon=":material/menu_book:", query_params={"rule": finding["rule"]})
        links[1].page_link(state.page("findings"), label="Open in Findings",
                           icon=":material/report:",
                           query_params={"rule": finding["rule"], "node": instance})
        if not is_open:
            links[2].page_link(state.page("node"), label="Show its charts",
                               icon=":material/show_chart:",
                               query_params={"node": instance, "rule": finding["rule"]})

st.subheader("Inference modules")
modules = node_frames.modules(history)
if modules.empty:
    st.info("No inference module reported by this node (no fleetscope_accelerator_* series: "
            "it has none, or no accelerator source is configured).")
else:
    st.caption(f"{units.count(len(modules), 'module')} at the last sample: utilisation, "
               "device memory, the vendor's errors and whether the operator's compatibility "
               "matrix lists the driver/firmware pair")
    state.static_table(node_frames.modules_display(modules))  # a few rows, read whole

st.subheader("Cores")
busy = state.per_core(snap, instance)
if busy.empty:
    st.info("This source has no per-core series (the exporter's `per_core: summary`); the "
            "busy distribution across cores is below.")
else:
    summary = node_frames.core_summary(busy)
    cols = st.columns(4)
    cols[0].metric("median core busy", f"{summary['median']:.0%}")
    cols[1].metric("busiest core", f"{summary['max']:.0%}")
    cols[2].metric("busiest minus median", f"{summary['spread']:.0%}")
    cols[3].metric("cores > 90 % now", summary["saturated_now"])
    if summary["hogs"]:
        st.warning(f"pinned hogs (busy > 90 % over the last 10 samples): cpus {summary['hogs']}")
    st.plotly_chart(charts.core_heatmap(busy), key="core_heatmap")
spread = frames.timeline(history, "fleetscope_cpu_core_busy_ratio")
if not spread.empty:
    st.plotly_chart(charts.lines(spread, "Busy across cores (min / p50 / p90 / max)",
                                 colour="stat", unit="ratio"), key="busy_spread")

st.subheader("NUMA")
numa = node_frames.numa_view(history)
if numa.empty:
    st.info("No per-NUMA-node series from this source.")
else:
    st.dataframe(node_frames.numa_display(numa), hide_index=True, key="numa_table")
memory = node_frames.pool_memory(history)
if not memory.empty:
    st.dataframe(node_frames.bytes_display(memory), hide_index=True, key="pool_memory")
remote = frames.timeline(history, "fleetscope_pool_numa_remote_memory_ratio")
if not remote.empty:
    st.plotly_chart(charts.lines(remote, "Pool memory on remote NUMA nodes", colour="pool",
                                 threshold=numa_rule.NUMA_REMOTE_RATIO, unit="ratio",
                                 threshold_label=f"{numa_rule.RULE.id} fires"),
                    key="numa_remote")

st.subheader("Steal and run delay")
left, right = st.columns(2)
steal = frames.timeline(history, "fleetscope_cpu_core_steal_ratio")
if not steal.empty:
    left.plotly_chart(charts.lines(steal, "Steal across cores", colour="stat",
                                   threshold=steal_rule.STEAL_P90, unit="ratio",
                                   threshold_label=f"{steal_rule.RULE.id}: p90 steal"),
                      key="steal")
delay = frames.timeline(history, "fleetscope_pool_run_delay_seconds_total")
if not delay.empty:
    right.plotly_chart(charts.lines(delay, "Run-queue delay per pool", colour="pool",
                                    unit="s/s"), key="run_delay")

st.subheader("Memory bandwidth")
bandwidth = frames.timeline(history, "fleetscope_memory_bandwidth_bytes_per_second")
peak = frames.latest(history, "fleetscope_memory_bandwidth_peak_bytes_per_second")
if bandwidth.empty:
    st.info("No memory-bandwidth series (perf uncore counters) from this source.")
else:
    total = bandwidth.groupby("time", as_index=False)["value"].sum()
    total["series"] = "read + write"
    peak_value = float(peak["value"].max()) if not peak.empty else None
    now = float(total.sort_values("time")["value"].iloc[-1])
    # A source that keeps the rule's ratio but not the peak series (a relabelling keeping
    # what the rules read): the peak is the exporter's own, bandwidth over that ratio.
    ratio = frames.latest(history, "fleetscope_memory_bandwidth_utilization_ratio")
    if peak_value is None and not ratio.empty and float(ratio["value"].max()) > 0:
        peak_value = now / float(ratio["value"].max())
    st.caption(f"DRAM bandwidth now {units.format_value(now, 'bytes/s')}"
               + (f" of the platform peak {units.format_value(peak_value, 'bytes/s')} "
                  f"({units.format_value(now / peak_value, 'ratio')}; "
                  f"{bandwidth_rule.RULE.id} fires above "
                  f"{units.format_value(bandwidth_rule.BANDWIDTH_RATIO, 'ratio')} of it)"
                  if peak_value else " (no platform peak known)"))
    # the line is where the rule fires, not the peak: a node firing at 92 % sits above it
    st.plotly_chart(charts.lines(
        total, "DRAM bandwidth (read + write) against the peak", colour="series",
        threshold=peak_value * bandwidth_rule.BANDWIDTH_RATIO if peak_value else None,
        unit="bytes/s", threshold_label=f"{bandwidth_rule.RULE.id} fires",
        reference=(peak_value, "platform peak") if peak_value else None), key="bandwidth")

st.subheader("NIC")
left, right = st.columns(2)
pfc = frames.timeline(history, "fleetscope_nic_pfc_pause_frames_total")
if not pfc.empty:
    left.plotly_chart(charts.lines(pfc, "PFC pause frames", unit="frames/s"), key="pfc")
rdma = frames.timeline(history, "fleetscope_rdma_hw_stats_total")
if not rdma.empty:
    right.plotly_chart(charts.small_multiples(rdma, "RDMA congestion counters", "counter",
                                              unit="1/s", window=window), key="rdma")
port = frames.timeline(history, "fleetscope_nic_port_bytes_total")
if not port.empty:
    st.plotly_chart(charts.lines(port, "NIC port traffic", unit="bytes/s"), key="port_bytes")
if pfc.empty and rdma.empty and port.empty:
    st.info("No NIC or RDMA counters from this source.")
