"""Node collectors: one file each, registered here by name (also their `collector` label).

Importing this package does no I/O; collectors read only inside `collect()`.
"""

from .base import Collector, NotAvailable, Scrape, bundle_roots
from .cpu import CpuCollector
from .numa import NumaCollector
from .pressure import PressureCollector

COLLECTORS: dict[str, type[Collector]] = {
    cls.name: cls for cls in (CpuCollector, PressureCollector, NumaCollector)
}

__all__ = ["COLLECTORS", "Collector", "NotAvailable", "Scrape", "bundle_roots"]
