"""Bundles (`fleetscope-bundle/1`, CONTRACT section 3): `bundle record` (record.py, with the
command outputs of commands.py and the redaction of redact.py) and reading one (read.py)."""
