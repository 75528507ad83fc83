"""Rules: the catalog and the Prometheus rule file it exports."""

import streamlit as st

from fleetscope.dashboard import rulebook

st.title("Rules")
table = rulebook.rule_table()
st.metric("rules in the catalog", len(table))
st.dataframe(table, hide_index=True, key="rule_table")
text = rulebook.rules_yaml()
st.download_button("Download the Prometheus rule file", text, file_name="fleetscope-rules.yml",
                   mime="application/yaml", key="rules_download")
with st.expander("fleetscope-rules.yml"):
    st.code(text, language="yaml")
