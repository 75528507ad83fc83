"""The core every layer may import: the exposition format (exposition.py), the config
(config.py), display units (units.py), the bundle format (bundle_format.py) and
`fleetscope diagnose`'s command-line options (diagnose_options.py). It imports nothing
of fleetscope above it (tests/test_layers.py)."""
