"""Findings: each finding with its evidence charts, its action and its runbook."""

import streamlit as st

from fleetscope.dashboard import charts, data, state

snap = state.snapshot()
nodes = state.filtered_nodes(snap)
keep = set(nodes["instance"])
findings = [f for f in snap.findings if f["node"] in keep]
st.title("Findings")
if not findings:
    st.success("No rule fires on these nodes.")
    st.stop()
rules = sorted({f["rule"] for f in findings},
               key=lambda r: [f["rule"] for f in findings].index(r))
rule = st.selectbox("Rule", rules, key="findings_rule",
                    format_func=lambda r: f"{r} ({sum(f['rule'] == r for f in findings)})")
of_rule = [f for f in findings if f["rule"] == rule]
labels = [f"{f['node']} · {f['summary']}" for f in of_rule]
choice = st.selectbox(f"Finding ({len(of_rule)} for this rule, worst first)",
                      range(len(of_rule)), format_func=lambda i: labels[i],
                      key="findings_choice")
finding = of_rule[min(choice or 0, len(of_rule) - 1)]

st.subheader(f"{finding['severity'].upper()}: {finding['rule']} on {finding['node']}")
st.markdown(f"**{finding['summary']}** (confidence {finding['confidence']:.0%})")
st.markdown(f"**Likely cause:** {finding['cause']}")
st.markdown(f"**Action:** {finding['action']}")
subjects = {k: v for k, v in finding.get("subjects", {}).items() if v}
if subjects:
    st.markdown("**Subjects:** " + "; ".join(f"{k}: {', '.join(map(str, v))}"
                                           for k, v in subjects.items()))
evidence = data.evidence_frame(finding)
left, right = st.columns(2)
left.dataframe(evidence, hide_index=True, key="evidence_table")
if evidence["over threshold"].notna().any():
    right.plotly_chart(charts.evidence_bars(evidence), key="evidence_bars")

history = state.node_history(snap, finding["node"])
labels_of = {k: v for k, v in finding.get("labels", {}).items()} if "labels" in finding \
    else {}
for number, (metric, frame) in enumerate(data.finding_timelines(rule, history, labels_of)):
    st.plotly_chart(charts.lines(frame, f"{metric}"
                                 + (" (per second)" if data.is_counter(metric) else "")),
                    key=f"timeline_{number}")

st.subheader("Runbook")
st.markdown(data.runbook(rule))
