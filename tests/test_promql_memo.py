"""Series.memoized(): one pass of many rules shares each node's vector, and only that node's."""

from __future__ import annotations

import gc

from fleetscope.rules.promql import Rate, Selector, Series, Sum


def _series() -> Series:
    series = Series()
    for second in range(0, 61, 15):
        for pool, per_second in (("online", 2.0), ("batch", 5.0)):
            series.add("delay_seconds_total", {"pool": pool}, second * 1000,
                       per_second * second)
        series.add("queue_depth", {"queue": "a"}, second * 1000, float(second))
    return series


def test_a_node_evaluated_twice_in_a_pass_is_computed_once():
    series = _series()
    rate = Rate(Selector("delay_seconds_total", {"pool": "online"}), 60)
    calls = []
    real = rate._evaluate

    def counted(s, at_ms):
        calls.append(at_ms)
        return real(s, at_ms)

    rate._evaluate = counted
    condition = Sum(rate) > 1  # two rules over one signal
    other = Sum(rate) * 2
    with series.memoized():
        first = condition.evaluate(series, 60_000)
        second = other.evaluate(series, 60_000)
        rate.evaluate(series, 45_000)  # another time is another vector
    assert calls == [60_000, 45_000]
    assert first == {(): 2.0} and second == {(): 4.0}
    assert series.memo is None  # the pass is over: nothing kept
    rate.evaluate(series, 60_000)
    assert calls == [60_000, 45_000, 60_000]


# Slow: a full gc.collect() each round (so freed nodes' ids are reused), which walks the
# whole heap of the process running the tests.
def test_a_selector_built_for_one_call_never_answers_for_another():
    """Nodes made and dropped inside a pass (a selector built per call) may reuse a freed
    node's id: each must still get its own series."""
    series = _series()
    with series.memoized():
        for round_ in range(50):
            pool = ("online", "batch")[round_ % 2]
            got = Selector("delay_seconds_total", {"pool": pool}).evaluate(series, 60_000)
            assert [dict(labels)["pool"] for labels in got] == [pool]
            queue = Selector("queue_depth").evaluate(series, 60_000)
            assert list(queue.values()) == [60.0]
            gc.collect()


def test_a_pass_gives_what_evaluating_alone_gives():
    series = _series()
    exprs = [Sum(Rate(Selector("delay_seconds_total"), 60), by=("pool",)),
             Selector("delay_seconds_total", {"pool": "~on.*"}),
             Selector("delay_seconds_total", {"queue": ""}),  # an absent label matches ""
             Selector("queue_depth", {"pool": ""}) > 30]
    alone = [e.evaluate(series, t) for e in exprs for t in (30_000, 60_000)]
    with series.memoized():
        together = [e.evaluate(series, t) for e in exprs for t in (30_000, 60_000)]
        again = [e.evaluate(series, t) for e in exprs for t in (30_000, 60_000)]
    assert together == alone == again
    assert alone[3] and alone[5] and alone[7], "matchers on an absent label match nothing"
