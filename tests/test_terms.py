"""diagnose/terms.py: a condition taken apart into terms and joined again in Python gives
what the whole condition gives, and batched answers go back to the term that asked."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from fleetscope.diagnose import terms
from fleetscope.rules.catalog import CATALOG
from fleetscope.rules.harm import POOL_HARMS
from fleetscope.rules.promql import Series, SetOp

from .conftest import SCENARIOS


def _all_conditions():
    return [level.condition for rule in CATALOG for level in rule.levels()] + list(POOL_HARMS)


def test_terms_hold_no_set_operation_and_rebuild_the_condition_text():
    for condition in _all_conditions():
        parts = terms.terms(condition)
        assert parts and not any(isinstance(part, SetOp) for part in parts)
        text = condition.promql()
        for part in parts:
            assert part.promql() in text


def test_the_catalog_shares_terms():
    """What the engine evaluates: each distinct term once, not each condition's terms."""
    occurrences = [term.promql() for condition in _all_conditions()
                   for term in terms.terms(condition)]
    assert len(set(occurrences)) < len(occurrences) * 0.7
    harm = {term.promql() for condition in POOL_HARMS for term in terms.terms(condition)}
    in_rules = {term.promql() for rule in CATALOG for level in rule.levels()
                for term in terms.terms(level.condition)}
    assert harm <= in_rules  # the harm a diagnosis reports costs no query of its own


def test_batches_keep_to_the_size_and_the_count():
    texts = [f"metric_{i}" + "x" * (i * 37 % 400) for i in range(100)]
    groups = terms.batches(texts, 2000, per_query=7)
    assert sorted(i for group in groups for i in group) == list(range(100))
    for group in groups:
        assert len(group) <= 7
        assert len(terms.batched_query(texts, group)) <= 2000
    alone = terms.batches(["y" * 5000, "z"], 2000)
    assert alone == [[0], [1]]  # too long for any batch: sent alone, as it would be anyway


def test_a_batched_answer_goes_back_to_its_terms():
    answer = [{"metric": {"instance": "a", terms.TERM_LABEL: "3"}, "values": [[1, "1"]]},
              {"metric": {"instance": "b", terms.TERM_LABEL: "5"}, "values": [[1, "2"]]},
              {"metric": {"instance": "c", terms.TERM_LABEL: "x"}, "values": []},
              {"metric": {"instance": "d"}, "values": []}]
    split = terms.split_answer(answer, [3, 5, 9])
    assert split[3] == [{"metric": {"instance": "a"}, "values": [[1, "1"]]}]
    assert [s["metric"] for s in split[5]] == [{"instance": "b"}]
    assert split[9] == []

    asked = []

    def ask(promql, indices):
        asked.append(indices)
        return [{"metric": {"i": str(index), terms.TERM_LABEL: str(index)}, "value": [0, "1"]}
                for index in indices]

    with ThreadPoolExecutor(2) as pool:
        answers = terms.fetch_batched([f"t{i}" for i in range(10)], ask, pool, 10_000,
                                      per_query=4)
    assert len(asked) == 3
    assert [a[0]["metric"] for a in answers] == [{"i": str(i)} for i in range(10)]


@pytest.mark.parametrize("rule", CATALOG, ids=lambda rule: rule.id)
def test_joined_terms_give_the_whole_condition(rule, scenario_series):
    """On each rule's own scenario (and a healthy node), the terms' vectors joined by
    condition_vectors equal the whole condition evaluated in-process, at every step."""
    fired = 0
    for series in (scenario_series(rule.id), scenario_series("healthy-busy")):
        steps = series.timestamps()[-8:]
        for level in rule.levels():
            term_vectors = {term.promql(): {at: term.evaluate(series, at) for at in steps}
                            for term in terms.terms(level.condition)}
            joined = terms.condition_vectors(level.condition, term_vectors, steps)
            whole = [(at, level.condition.evaluate(series, at)) for at in steps]
            assert joined == whole, (rule.id, level.severity)
            fired += sum(bool(vector) for _, vector in whole)
    assert fired  # the rule's own fault fires: a join of empty vectors proves nothing


@pytest.fixture
def scenario_series():
    from fleetscope.bundle.read import open_bundle
    from fleetscope.diagnose.evidence import bundle_series

    def load(name: str) -> Series:
        bundle = open_bundle(str(SCENARIOS / name))
        try:
            return bundle_series(bundle, bundle.config(None))
        finally:
            bundle.close()

    return load
