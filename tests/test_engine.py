"""The engine's judgement over a window: persistence (a condition must hold across most of
the window), severity tiers (one finding per rule and node, the most severe tier that holds),
merging of label sets per node, and ranking (causes before symptoms).

Series are built by hand here because the point is the engine's arithmetic over steps; the
conditions themselves are checked against Prometheus in test_rules_promtool.py.
"""

from __future__ import annotations

from fleetscope.diagnose import engine
from fleetscope.rules.catalog import CATALOG, Evidence, Rule, Tier
from fleetscope.rules.promql import Delta, Max, Rate, Selector, Series

STEP_MS = 1000


def _series(values_by_labels: dict[tuple, list[float | None]], name="demo_gauge") -> Series:
    series = Series()
    for labels, values in values_by_labels.items():
        for step, value in enumerate(values):
            if value is not None:
                series.add(name, dict(labels), step * STEP_MS, value)
    return series


def _rule(**overrides) -> Rule:
    expr = Max(Selector("demo_gauge"), by=("instance", "pool"))
    fields = dict(id="demo-rule", severity="warning", symptom="s", cause="c", action="a",
                  summary="pool {pool} at {value:g}", condition=expr > 10,
                  evidence=(Evidence("demo", expr, 10, "things"),))
    fields.update(overrides)
    return Rule(**fields)


def test_a_rule_needs_rates_when_a_condition_takes_one_anywhere_in_it():
    gauge = Max(Selector("demo_gauge", {"note": "rate(not a function)"}), by=("instance",))
    assert not _rule(condition=gauge > 1).needs_rates  # a label value is not a rate()
    nested = Max(Rate(Selector("demo_total"), 60) * 2, by=("instance",)) > gauge
    assert _rule(condition=nested).needs_rates
    assert _rule(condition=Delta(Selector("demo_depth"), 300) > 5).needs_rates
    tiered = _rule(tiers=(Tier("info", Rate(Selector("demo_total"), 60) > 1, "s"),))
    assert tiered.needs_rates  # a lesser tier's condition counts too


def test_one_bursty_interval_is_not_a_finding():
    # 21 samples: above the threshold at 3 of the 16 judged steps only.
    values = [1.0] * 21
    for step in (7, 12, 19):
        values[step] = 50.0
    findings, _ = engine.evaluate(_series({(("pool", "p"),): values}), "n", rules=(_rule(),))
    assert findings == []


def test_a_condition_holding_across_most_of_the_window_is_a_finding():
    values = [50.0] * 21
    values[10] = values[15] = 1.0  # two dips do not hide a real fault
    findings, _ = engine.evaluate(_series({(("pool", "p"),): values}), "n", rules=(_rule(),))
    assert [f.to_json()["summary"] for f in findings] == ["pool p at 50"]
    assert findings[0].held_ratio < 1.0


def test_a_fault_only_in_the_first_half_is_not_held():
    values = [50.0] * 10 + [1.0] * 11
    findings, _ = engine.evaluate(_series({(("pool", "p"),): values}), "n", rules=(_rule(),))
    assert findings == []


def test_an_event_rule_fires_on_one_step():
    values = [1.0] * 20 + [50.0]
    findings, _ = engine.evaluate(_series({(("pool", "p"),): values}), "n",
                                  rules=(_rule(for_seconds=0),))
    assert len(findings) == 1


def test_tiers_give_one_finding_per_node_at_the_most_severe_tier():
    expr = Max(Selector("demo_gauge"), by=("instance", "pool"))
    rule = _rule(severity="critical", condition=expr > 100,
                 tiers=(Tier("warning", expr > 10, "pool {pool} warming up"),))
    series = _series({
        (("instance", "a"), ("pool", "p")): [500.0] * 21,  # critical, and above 10 too
        (("instance", "b"), ("pool", "p")): [50.0] * 21,  # warning only
        (("instance", "c"), ("pool", "p")): [1.0] * 21,  # nothing
    })
    findings, _ = engine.evaluate(series, "?", rules=(rule,))
    by_node = {f.node: f.to_json() for f in findings}
    assert set(by_node) == {"a", "b"}
    assert by_node["a"]["severity"] == "critical"
    assert by_node["b"]["severity"] == "warning"
    assert by_node["b"]["summary"] == "pool p warming up"
    document = engine.diagnosis("bundle", ["a", "b"], (0, 20), findings, [], 1)
    assert document["status"] == "critical"
    # The exported alerts: the lesser tier excludes nodes where the more severe one holds.
    (_, top, _), (_, lesser, _) = rule.severities()
    assert lesser.promql().endswith("unless on (instance) " + top.promql())


def test_several_label_sets_on_one_node_merge_into_one_finding():
    series = _series({
        (("pool", "chat"),): [80.0] * 21,
        (("pool", "code"),): [30.0] * 21,
        (("pool", "idle"),): [1.0] * 21,
    })
    findings, _ = engine.evaluate(series, "n", rules=(_rule(),))
    assert len(findings) == 1
    summary = findings[0].to_json()["summary"]
    assert summary.startswith("pool chat at 80") and "also pool code" in summary


def test_the_node_wide_view_of_a_pools_events_is_not_named_beside_it():
    # crash-loop's condition: the node's latest crash or a pool's (the same crash, when the
    # pool runs the binary): one finding about the pool, no "also another series"
    node = Max(Selector("demo_gauge"), by=("instance",))
    pool = Max(Selector("demo_gauge", {"pool": "chat"}), by=("instance", "pool"))
    rule = _rule(summary="crashes", condition=(node > 10) | (pool > 10))
    series = _series({(("instance", "n"), ("pool", "chat")): [50.0] * 21})
    findings, _ = engine.evaluate(series, "n", rules=(rule,))
    assert len(findings) == 1
    assert findings[0].to_json()["summary"] == "crashes"
    assert {"instance": "n", "pool": "chat"} in findings[0].label_sets


def test_causes_rank_before_symptoms_of_the_same_severity():
    expr = Max(Selector("demo_gauge"), by=("instance", "pool"))
    symptom = _rule(id="a-symptom", kind="symptom", confidence=0.95, condition=expr > 10)
    cause = _rule(id="a-cause", confidence=0.3, condition=expr > 10)
    findings, _ = engine.evaluate(_series({(("pool", "p"),): [50.0] * 21}), "n",
                                  rules=(symptom, cause))
    assert [f.rule.id for f in findings] == ["a-cause", "a-symptom"]


def test_rates_in_a_short_live_window_look_back_a_quarter_of_it():
    stamps = list(range(0, 21_000, 1000))
    assert engine.rate_window_ms(stamps) == 5000
    assert engine.evaluation_steps(stamps, 5000)[0] == 5000
    assert engine.rate_window_ms([0]) is None


def test_rdma_ports_without_hw_counters_are_not_called_no_device():
    from fleetscope.rules.catalog import by_id

    series = Series()
    for step in range(3):
        series.add("fleetscope_rdma_port_state", {"device": "mlx5_0", "port": "1"},
                   step * STEP_MS, 4.0)
    _, not_evaluated = engine.evaluate(series, "n", rules=(by_id("roce-congestion"),))
    (reason,) = [n["reason"] for n in not_evaluated]
    assert "RDMA devices present" in reason and "no RDMA device" not in reason
    _, not_evaluated = engine.evaluate(_series({(("pool", "p"),): [1.0] * 3}), "n",
                                       rules=(by_id("roce-congestion"),))
    assert "no RDMA device" in not_evaluated[0]["reason"]


def test_the_reason_for_a_missing_signal_is_its_collectors():
    from fleetscope.collectors import COLLECTORS
    from fleetscope.collectors.base import Collector

    class DeviceCollector(Collector):
        name = "throwaway_device"
        missing_hints = (("demo_device_", "no demo device on this node"),
                         ("demo_device_queue", "the demo driver exports no queues"))

    rule = _rule(condition=Max(Selector("demo_device_queue_depth"), by=("instance",)) > 1)
    COLLECTORS[DeviceCollector.name] = DeviceCollector
    try:
        _, not_evaluated = engine.evaluate(_series({(("pool", "p"),): [1.0] * 3}), "n",
                                           rules=(rule,))
    finally:
        del COLLECTORS[DeviceCollector.name]
    # the most specific prefix of the collector that writes the series
    assert not_evaluated[0]["reason"] == ("signals absent from this source: "
                                          "demo_device_queue_depth (the demo driver exports "
                                          "no queues)")
    _, not_evaluated = engine.evaluate(_series({(("pool", "p"),): [1.0] * 3}), "n",
                                       rules=(rule,))
    assert "(" not in not_evaluated[0]["reason"]  # no collector owns it: no guess


def test_a_summary_reads_seconds_as_the_evidence_table_does():
    rule = _rule(summary="pool {pool}: silent for {value:duration} ({value:.0f} s)")
    assert rule.render_summary({"pool": "chat"}, 1349.2) == \
        "pool chat: silent for 22.5 min (1349 s)"
    assert rule.render_summary({"pool": "chat"}, 0.4) == "pool chat: silent for 400 ms (0 s)"
    assert rule.render_summary({}, 42.0) == "pool ?: silent for 42 s (42 s)"
    # every duration summary of the catalog renders (no raw template left)
    for catalog_rule in CATALOG:
        for _, _, template in catalog_rule.severities():
            text = catalog_rule.render_summary({}, 1349.2, template)
            assert "{" not in text and "1349 s" not in text, (catalog_rule.id, text)


def test_an_event_counts_inside_the_look_back_whatever_the_window():
    """A 20 s window: an event 4 s before it, or 14 minutes before it, is inside the
    15-minute look-back, as Prometheus reads the same condition; 16 minutes before is not."""
    from fleetscope.rules.promql import EVENT_LOOKBACK_SECONDS, Recent, Time

    age = Time() - Max(Selector("last_event_timestamp_seconds"), by=("instance",))
    rule = _rule(condition=Recent(age), for_seconds=0, summary="event {value:.0f} s ago")
    assert EVENT_LOOKBACK_SECONDS == 900 and rule.condition.promql().endswith("< 900")
    start_s = 10_000
    for before_s, found in ((4, 1), (14 * 60, 1), (16 * 60, 0)):
        series = Series()
        for step in range(21):  # a 20 s window starting at start_s
            series.add("last_event_timestamp_seconds", {}, start_s * 1000 + step * STEP_MS,
                       start_s - before_s)
        findings, _ = engine.evaluate(series, "n", rules=(rule,))
        assert len(findings) == found, before_s
