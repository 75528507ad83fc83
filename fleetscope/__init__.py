"""fleetscope: observability and diagnosis for CPU clusters running AI-agent workloads."""

__version__ = "0.1.0"
