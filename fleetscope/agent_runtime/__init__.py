"""What an agent runtime imports to emit the agent signals (CONTRACT section 4).

`signals.py` holds the OpenTelemetry SDK helpers (extra `agent`); importing this package
itself loads no OpenTelemetry."""
