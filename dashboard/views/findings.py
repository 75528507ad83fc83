"""Findings: `/findings?rule=ID&node=NAME`. Each finding with the charts that prove it (its
rule's evidence view), its action and its runbook."""

import streamlit as st

from fleetscope.dashboard import charts, evidence_frames, rulebook, state
from fleetscope.rules.catalog import CATALOG

snap = state.snapshot()
nodes = state.filtered_nodes(snap)
keep = set(nodes["instance"])
asked = st.query_params.get("node")
asked_node = state.resolve_node(asked, state.nodes(snap)["instance"])
findings = [f for f in snap.findings if f["node"] in keep or f["node"] == asked_node]
st.title("Findings")
# A deep link opens the finding it names or says there is none: never another one instead.
if asked and asked_node is None:
    state.no_such_node(asked)
asked_rule = st.query_params.get("rule")
if asked_rule and not any(f["rule"] == asked_rule for f in findings):
    st.error(f"No {asked_rule!r} finding in this source"
             + (" (no such rule)." if asked_rule not in {r.id for r in CATALOG} else "."))
    st.stop()
if asked_node:
    on_node = [f["rule"] for f in findings if f["node"] == asked_node]
    asked_rule = asked_rule or next(iter(on_node), None)  # a node alone: its worst finding
    if asked_rule not in on_node:
        if asked_rule:
            st.error(f"{asked_rule} does not fire on {asked_node}.")
        else:
            st.success(f"No rule fires on {asked_node}.")
        st.page_link(state.page("node"), label=f"Open {asked_node}",
                     query_params={"node": asked_node})
        st.stop()
if not findings:
    st.success("No rule fires on these nodes.")
    st.stop()
rules = list(dict.fromkeys(f["rule"] for f in findings))  # worst first, as the engine ranks
if asked_rule in rules:  # the URL's rule (or the asked node's worst) wins over the widget's
    st.session_state["findings_rule"] = asked_rule
# No format_func: option values are what the widget shows and what the URL holds.
rule = st.selectbox("Rule (worst first)", rules, key="findings_rule",
                    on_change=state.to_url("rule", "findings_rule", drop=("node",)))
of_rule = [f for f in findings if f["rule"] == rule]


def finding_id(finding: dict) -> str:
    """What names one finding among its rule's: the node and the labels it fired on."""
    labels = {k: v for k, v in finding.get("labels", {}).items() if k != "instance"}
    return finding["node"] + "".join(f" {k}={v}" for k, v in sorted(labels.items()))


ids = [finding_id(f) for f in of_rule]
by_id = dict(zip(ids, of_rule, strict=True))
# One widget per rule: a rule change can never leave the previous rule's finding showing.
choice_key = f"findings_choice::{rule}"
if asked_node:
    on_node = [i for i, f in zip(ids, of_rule, strict=True) if f["node"] == asked_node]
    if on_node and st.session_state.get(choice_key) not in on_node:
        st.session_state[choice_key] = on_node[0]
if st.session_state.get(choice_key) not in by_id:
    st.session_state[choice_key] = ids[0]


def _node_to_url() -> None:
    st.query_params["rule"] = rule
    st.query_params["node"] = by_id[st.session_state[choice_key]]["node"]


choice = st.selectbox(f"Finding ({len(of_rule)} for {rule}, worst first)", ids,
                      key=choice_key, on_change=_node_to_url)
finding = by_id[choice]
state.keep_in_url(rule=rule, node=finding["node"])  # the deep link names this finding

# names from the node are data: shown as written, never read as Markdown
st.subheader(f"{finding['severity'].upper()}: {finding['rule']} on {state.plain(finding['node'])}")
st.markdown(f"**{state.plain(finding['summary'])}** (confidence {finding['confidence']:.0%})")
st.markdown(f"**Likely cause:** {state.plain(finding['cause'])}")
subjects = {k: v for k, v in finding.get("subjects", {}).items() if v}
filled = rulebook.placeholder_values(subjects)  # the commands name this finding's own subjects
st.markdown(f"**Action:** {rulebook.fill_commands(finding['action'], filled, code_only=False)}")
if subjects.get("pods"):  # on Kubernetes the SRE acts on pods: named first, by namespace
    st.markdown("**Pods:** " + ", ".join(rulebook.code_span(str(pod))
                                         for pod in subjects.pop("pods")))
if subjects:
    st.markdown(evidence_frames.subjects_line(subjects))
links = st.columns(3)
links[0].page_link(state.page("node"), label=f"Open node {state.plain(finding['node'])}",
                   icon=":material/memory:",
                   query_params={"node": finding["node"], "rule": finding["rule"]})
links[1].page_link(state.page("runbook"), label=f"Runbook: {finding['rule']}",
                   icon=":material/menu_book:", query_params={"rule": finding["rule"]})
evidence = evidence_frames.evidence_frame(finding)
left, right = st.columns([3, 2])
state.static_table(evidence[evidence_frames.TABLE], left)
if evidence["ratio"].notna().any():
    right.plotly_chart(charts.evidence_bars(evidence), key="evidence_bars",
                       config=charts.STATIC)

history = state.node_history(snap, finding["node"])
window = evidence_frames.history_window(history)
panels = evidence_frames.evidence_panels(rule, history, finding.get("labels"))
if not panels:
    st.info("No history of this rule's signals on the node from this source.")
cols = st.columns(2)
for number, (panel, frame) in enumerate(panels):
    cols[number % 2].plotly_chart(charts.evidence_chart(panel, frame, window),
                                  key=f"panel_{number}")

st.subheader("Runbook")
if filled:
    st.caption("Commands filled from this finding: " + ", ".join(
        f"{word} = {value}" for word, value in filled.items()))
st.markdown(rulebook.fill_commands(rulebook.runbook_markdown(rule), filled))
