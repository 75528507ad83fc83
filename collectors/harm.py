"""Collector `harm`: the node's harm targets (config `harm_targets`), as gauges.

    fleetscope_harm_target{signal="online_session_p99_seconds"} 1.0
    fleetscope_harm_target{pool="codegen-online",signal="online_session_p99_seconds"} 8.0

The harm rules compare a pool's signal with the pool's target, else the node's, in PromQL
(rules/harm.py), so the exported alerts, a bundle's replay and the live
engine use the node's own targets. Reads nothing: the values come from the config (defaults in
fleetscope/core/harm_targets.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from fleetscope.core.exposition import Family, gauge, labels

from .base import Collector, Evidence, Scrape, Signal

TARGET = "fleetscope_harm_target"


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal(TARGET, "harm target of a workload signal", ""),
)


class HarmCollector(Collector):
    name = "harm"
    evidence = Evidence(signals=SIGNALS)

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        family = gauge(TARGET, "Where a workload signal starts to hurt (config harm_targets), "
                               "in the signal's own unit.")
        targets = self.config.harm_targets
        for key, value in targets.node.items():
            family.add(value, labels(signal=key))
        for pool, values in targets.pools.items():
            for key, value in values.items():
                family.add(value, labels(signal=key, pool=pool))
        yield family
