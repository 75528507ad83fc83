"""The ops console (`fleetscope console`, `fleetscope demo`) and the simulated fleet."""
