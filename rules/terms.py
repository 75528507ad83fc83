"""The terms of the catalog's conditions, and the recording rules that keep them evaluated.

A condition is set operations (`and`, `or`, `unless`) over terms: comparisons, aggregations,
arithmetic. Terms repeat across the catalog (the harm signals of rules/harm.py sit in most
conditions, a rule's lesser tier repeats its own condition), so a query engine asked for
each distinct term once does the catalog's work once (diagnose/terms.py).

    terms(condition)            its terms, left to right
    driving(condition)          the terms that say where it can hold (both sides of `or`, the
                                left of `and`/`unless`): the others are needed only there
    term_record(term)           fleetscope_term:<hash of its PromQL>, the series a recording
                                rule keeps for it
    terms_group(rules)          the rule group `fleetscope-terms` of `rules export`: every
                                computed term recorded, and TERMS_RECORDED, whose samples say
                                since when (a diagnosis reads the recorded terms only over a
                                window they cover)
"""

from __future__ import annotations

import hashlib

from .model import NODE
from .promql import Expr, Selector, SetOp

TERMS_GROUP = "fleetscope-terms"
TERMS_RECORDED = "fleetscope_terms_recorded"  # vector(1), evaluated with the terms
TERM_RECORD_PREFIX = "fleetscope_term:"


def terms(condition: Expr) -> list[Expr]:
    """The terms of a condition: what is left once its set operations are taken apart."""
    if isinstance(condition, SetOp):
        return terms(condition.left) + terms(condition.right)
    return [condition]


def driving(condition: Expr, node_label: str = NODE[0]) -> list[Expr]:
    """The terms that say where a condition can hold: both sides of `or`, the left of `and`
    and `unless` (their right side only keeps or takes away what the left found, on labels
    that name the node: it is needed for those nodes alone). A right side matched on labels
    that do not name the node drives too."""
    if isinstance(condition, SetOp):
        per_node = condition.on is None or node_label in condition.on
        if condition.op == "or" or not per_node:
            return driving(condition.left, node_label) + driving(condition.right, node_label)
        return driving(condition.left, node_label)
    return [condition]


def term_record(term: Expr) -> str:
    """The recorded series' name for a term, from its PromQL: a changed term is another
    series, so an engine running an older export is not read for a newer term."""
    return record_name(term.promql())


def record_name(promql: str) -> str:
    return TERM_RECORD_PREFIX + hashlib.sha256(promql.encode()).hexdigest()[:16]


def computed(term: Expr) -> bool:
    """Whether recording the term saves the engine work: a bare selector is read as it is,
    and so are Prometheus's ALERTS (another group's output: recorded, they would lag it)."""
    return not isinstance(term, Selector) and "ALERTS" not in term.metrics()


def catalog_terms(conditions: list[Expr]) -> list[Expr]:
    """The distinct terms of `conditions` that a recording rule keeps (computed ones)."""
    found: dict[str, Expr] = {}
    for condition in conditions:
        for term in terms(condition):
            if computed(term):
                found.setdefault(term.promql(), term)
    return list(found.values())


def terms_group(conditions: list[Expr]) -> dict:
    """The Prometheus rule group recording every computed term of `conditions`."""
    return {"name": TERMS_GROUP,
            "rules": [{"record": TERMS_RECORDED, "expr": "vector(1)"}]
            + [{"record": term_record(term), "expr": term.promql()}
               for term in catalog_terms(conditions)]}
