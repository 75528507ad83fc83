"""`fleetscope diagnose`: evidence from a bundle, the live node or Prometheus, through the rules."""
