"""The core every layer may import: the exposition format, the config, display units and
(later) the bundle format. It imports nothing of fleetscope above it (tests/test_layers.py)."""
