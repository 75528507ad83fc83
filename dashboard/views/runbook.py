"""Runbooks: `/runbook?rule=ID` renders runbooks/<ID>.md inside the console, its links to
other runbooks rewritten to stay here (and the "Related" ones as buttons)."""

import streamlit as st

from fleetscope.dashboard import rulebook, state

ids = rulebook.runbook_ids()
st.title("Runbooks")
if not ids:
    st.error("No runbooks beside the console (runbooks/ of the fleetscope checkout).")
    st.stop()
asked = st.query_params.get("rule")
if asked and asked not in ids:
    st.warning(f"No runbook for {asked!r}; these are the runbooks there are.")
state.from_url("rule", "runbook_rule", set(ids))
rule = st.selectbox("Runbook", ids, key="runbook_rule",
                    on_change=state.to_url("rule", "runbook_rule"))
state.keep_in_url(rule=rule)
related = rulebook.related_runbooks(rule)
if related:
    st.markdown("**Related runbooks**")
    cols = st.columns(min(4, len(related)))
    for number, other in enumerate(related):
        cols[number % len(cols)].page_link(state.page("runbook"), label=other,
                                           icon=":material/menu_book:",
                                           query_params={"rule": other})
st.divider()
st.markdown(rulebook.runbook_markdown(rule))
