"""Per-rule evidence views: which series prove each rule, drawn with their thresholds.

    views_for(a rule with views)     -> the rule's own `views` (rules/builtin/<rule>.py),
                                        e.g. offline preemption's victim (online pools'
                                        run-queue delay per process), antagonist (offline
                                        pools' CPU use), steal, pressure
    views_for(a rule without views)  -> one panel per `evidence` expression of the rule, so a
                                        new rule still draws

Each panel is a rules.promql expression evaluated over the finding's node history at every
sample (the same expressions the engine and the exported alerts use), with the threshold the
rule fires on. No streamlit or pandas here: evidence_frames.py evaluates, charts.py draws.
"""

from __future__ import annotations

from fleetscope.rules import catalog
from fleetscope.rules.model import Panel

__all__ = ["Panel", "generic_views", "views_for", "declared", "undeclared"]


def _rule(rule_id: str):
    for rule in catalog.CATALOG:
        if rule.id == rule_id:
            return rule
    return None


def generic_views(rule_id: str) -> tuple[Panel, ...]:
    """A rule with no declaration: its `evidence` expressions, one panel each."""
    rule = _rule(rule_id)
    if rule is None:
        return ()
    return tuple(Panel(e.signal[:1].upper() + e.signal[1:], e.expr, e.unit,
                       e.threshold if e.threshold else None, e.pick) for e in rule.evidence)


def views_for(rule_id: str) -> tuple[Panel, ...]:
    rule = _rule(rule_id)
    return (rule.views if rule is not None and rule.views else ()) or generic_views(rule_id)


def declared() -> set[str]:
    return {rule.id for rule in catalog.CATALOG if rule.views}


def undeclared() -> list[str]:
    """Catalog rules drawn by the generic view (declared views would draw them better)."""
    return [rule.id for rule in catalog.CATALOG if not rule.views]
