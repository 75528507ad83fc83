"""Rule catalog and the expressions shared by the Python engine and the exported PromQL."""
