"""Node tools beside the exporter: `fleetscope isa check` (isa.py, isa_x86.py, isa_fault.py)
and `fleetscope stacks` (stacks.py, py-spy)."""
