"""Rules: the catalog and the Prometheus rule file it exports."""

import streamlit as st

from fleetscope.dashboard import rulebook

st.title("Rules")
table = rulebook.rule_table()
st.metric("rules in the catalog", len(table))
# Every rule in view and its symptom and cause readable: rows tall enough for the grid to wrap
# them (a one-line row cut them off), the table as tall as its rows (no scroll inside).
# At 1600 px the rule, severity and three 290 px text columns fit; the alert, `for` and
# PromQL columns follow on a scroll.
ROW_HEIGHT = 112
st.dataframe(table, hide_index=True, key="rule_table", row_height=ROW_HEIGHT,
             height=ROW_HEIGHT * len(table) + 40,
             column_config={"rule": st.column_config.TextColumn("rule", width=210),
                            **{name: st.column_config.TextColumn(name, width=290)
                               for name in ("symptom", "cause", "action")}})
text = rulebook.rules_yaml()
st.download_button("Download the Prometheus rule file", text, file_name="fleetscope-rules.yml",
                   mime="application/yaml", key="rules_download")
with st.expander("fleetscope-rules.yml"):
    st.code(text, language="yaml")
