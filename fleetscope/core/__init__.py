"""The core every layer may import: the exposition format (exposition.py), the config
(config.py), display units (units.py) and the bundle format (bundle_format.py). It imports
nothing of fleetscope above it (tests/test_layers.py)."""
