"""Bundles (`fleetscope-bundle/1`, docs/bundle-format.md), the format itself in
fleetscope/core/bundle_format.py: `bundle record` (record.py, with the command outputs of
commands.py, the file copying of files.py and the redaction of redact.py), `bundle show`
(show.py) and reading a bundle for replay (read.py)."""
