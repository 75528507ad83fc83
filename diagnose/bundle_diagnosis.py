"""A bundle's diagnosis, the one chain `fleetscope diagnose --bundle` and the console share:
every sample replayed through the collectors from the source the bundle hands out for it,
the rules evaluated over the series, each finding enriched from the same sources.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleetscope.bundle.read import Bundle
from fleetscope.core.config import Config
from fleetscope.rules.promql import Series

from . import engine
from .enrich import Enricher
from .evidence import bundle_series


@dataclass
class BundleDiagnosis:
    series: Series  # the replayed samples, as the rules read them
    findings: list[engine.Finding]
    not_evaluated: list[dict]
    harm: list[engine.PoolHarm]


def diagnose_bundle(bundle: Bundle, config: Config,
                    progress: Callable[[int, int], None] | None = None) -> BundleDiagnosis:
    """Replay, evaluate and enrich `bundle` under `config` (the recorded one, or an
    override)."""
    series = bundle_series(bundle, config, progress)
    samples = tuple((bundle.source(sample), sample.time) for sample in bundle.samples)
    enricher = Enricher(config, samples[0][0], samples[-1][0], series, samples)
    verdict = engine.assess(series, bundle.hostname, enrich=enricher)
    return BundleDiagnosis(series, verdict.findings, verdict.not_evaluated, verdict.harm)
