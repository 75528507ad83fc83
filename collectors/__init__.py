"""Node collectors: one file each, each a class that names itself (also its `collector`
label), declares its evidence and registers itself in COLLECTORS when its module is imported
(collectors/evidence.py). This package imports every module in its folder, so a new collector
is its own file and nothing else.

Importing this package does no I/O on the node; collectors read only inside `collect()`.
"""

import importlib
import pkgutil

from .base import Collector, NotAvailable, Scrape
from .evidence import COLLECTORS, Evidence, Signal
from .source import EvidenceSource, LiveHost, RecordedSample, evidence_source

# In name order, so the exporter's order (the registry's) is the same on every node.
for _module in sorted(pkgutil.iter_modules(__path__), key=lambda found: found.name):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["COLLECTORS", "Collector", "Evidence", "EvidenceSource", "LiveHost", "NotAvailable",
           "RecordedSample", "Scrape", "Signal", "evidence_source"]
