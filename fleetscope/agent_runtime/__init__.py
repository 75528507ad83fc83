"""What an agent runtime imports to emit the agent signals (docs/metrics-and-rules.md,
Agent signals).

`signals.py` holds the OpenTelemetry SDK helpers (extra `agent`); importing this package
itself loads no OpenTelemetry."""
