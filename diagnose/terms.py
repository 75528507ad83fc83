"""Conditions by their terms: each distinct term of the catalog evaluated once by the query
engine, the set operations that join terms into conditions done in Python.

A rule's condition is set operations (`and`, `or`, `unless`) over terms: comparisons,
aggregations, arithmetic. Terms repeat across the catalog: the harm signals (rules/harm.py)
sit in most conditions and all of them in unexplained-harm's, a rule's lesser tier repeats
its own condition. Sent whole, every condition makes the engine evaluate its terms again,
so the cost grew with the rules. Here

    terms(condition)          the terms of a condition, left to right
    fetch_range(...)          each distinct term (by its PromQL) once over the window, many
                              to a query: label_replace(t1, "fleetscope_term", "0", "", "")
                              or label_replace(t2, "fleetscope_term", "1", "", "") or ...
    condition_vectors(...)    a condition's vector at each step, its set operations done by
                              the in-process engine's own SetOp on the terms' vectors

A term's answer is what it keeps (a comparison filters), so the answers follow the sick
nodes, not the fleet; a set operation joins label sets exactly as Prometheus does
(rules/promql.py, checked against promtool), so a node fires here when the whole condition
fires on the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from fleetscope.rules.promql import Expr, Memo, Series, Vector
from fleetscope.rules.terms import driving, terms  # noqa: F401 (this module's callers read them here)

TERM_LABEL = "fleetscope_term"  # which term a series of a batched answer belongs to
# Terms in one query: enough that a catalog's terms take a few queries, few enough that the
# engine's queries still run side by side on its cores.
TERMS_PER_QUERY = 24


def _tagged(promql: str, index: int) -> str:
    return f'label_replace({promql}, "{TERM_LABEL}", "{index}", "", "")'


def batches(texts: Sequence[str], max_chars: int,
            per_query: int = TERMS_PER_QUERY) -> list[list[int]]:
    """The texts' indices grouped into queries of at most `per_query` terms and `max_chars`
    characters once tagged (a term longer than that alone, as it would be sent anyway)."""
    out: list[list[int]] = []
    size = 0
    for index, text in enumerate(texts):
        cost = len(_tagged(text, index)) + 4  # " or "
        if not out or len(out[-1]) >= per_query or size + cost > max_chars:
            out.append([])
            size = 0
        out[-1].append(index)
        size += cost
    return out


def batched_query(texts: Sequence[str], indices: list[int]) -> str:
    return " or ".join(_tagged(texts[index], index) for index in indices)


def split_answer(result: list[dict], indices: list[int]) -> dict[int, list[dict]]:
    """A batched answer's series by the term they came from, the tag taken off."""
    out: dict[int, list[dict]] = {index: [] for index in indices}
    for series in result:
        metric = series.get("metric")
        if not isinstance(metric, dict):
            continue  # the caller's labels_of says what is wrong with it
        try:
            index = int(metric.get(TERM_LABEL, ""))
        except ValueError:
            continue  # not one of ours
        if index in out:
            out[index].append({**series, "metric": {k: v for k, v in metric.items()
                                                     if k != TERM_LABEL}})
    return out


def fetch_batched(texts: Sequence[str], ask: Callable[[str, list[int]], list[dict]],
                  pool: ThreadPoolExecutor, max_chars: int,
                  per_query: int = TERMS_PER_QUERY) -> list[list[dict]]:
    """Each text's answer from batched queries `ask(promql, the texts' indices in it)` (a
    range or an instant query), the batches side by side in `pool`."""
    groups = batches(texts, max_chars, per_query)
    answers: list[list[dict]] = [[] for _ in texts]
    for indices, result in zip(groups, pool.map(
            lambda indices: ask(batched_query(texts, indices), indices), groups), strict=True):
        for index, series in split_answer(result, indices).items():
            answers[index] = series
    return answers


def condition_vectors(condition: Expr, term_vectors: dict[str, dict[int, Vector]],
                      steps: list[int]) -> list[tuple[int, Vector]]:
    """The condition's vector at each step from its terms' vectors ({term PromQL: {step:
    vector}}, every term of the condition there)."""
    series = Series()
    series.memo = Memo()
    for term in terms(condition):
        by_step = term_vectors[term.promql()]
        for at_ms in steps:
            series.memo.vectors[id(term), at_ms] = (term, by_step.get(at_ms, {}))
    return [(at_ms, condition.evaluate(series, at_ms)) for at_ms in steps]
