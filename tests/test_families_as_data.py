"""Families carry data: what the diagnosis reads from them is what the exposition says.

The evidence a bundle replay feeds the rules (diagnose.evidence.add_families, reading the
samples as they are) must equal what a scraper reads from the rendered text, sample name
for sample name, label for label, value for value: per-core template families, nanosecond
counters, label values that need escaping and the agent runtime's histograms included.
"""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from fleetscope.collectors.agent import map_genai_stages, parse_agent_exposition
from fleetscope.collectors.source import recorded_sample
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import Family, counter, gauge, labels, render, seconds_from_ns
from fleetscope.diagnose.evidence import add_families
from fleetscope.exporter import Exporter
from fleetscope.rules.promql import Series
from tests.conftest import BUNDLES, FIXTURES


def _parsed_back(text: str, timestamp_ms: int) -> Series:
    series = Series()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series.add(sample.name, dict(sample.labels), timestamp_ms, sample.value)
    return series


def _comparable(series: Series) -> dict:
    # repr: NaN equals NaN, and 1.0 and 1 stay apart from 1.00000001
    return {name: {key: [(t, repr(float(v))) for t, v in points]
                   for key, points in family.items()}
            for name, family in series.by_name.items()}


def _families(bundle: str) -> list[Family]:
    recorded = json.loads((BUNDLES / bundle / "meta.json").read_text())["config"]
    config = parse_config({**recorded, "per_core": "full", "busy_interval_min_seconds": 0,
                           "numa_maps_min_interval_seconds": 0})
    sample = BUNDLES / bundle / "samples" / "s0000"
    exporter = Exporter(str(sample), config)
    exporter.collect(now=1000.0, source=recorded_sample(str(sample)))
    later = BUNDLES / bundle / "samples" / "s0001"
    families = exporter.collect(now=1001.0, source=recorded_sample(str(later)))
    agent = parse_agent_exposition((FIXTURES / "agent" / "agent.prom").read_text())
    families += [family.to_family() for family in map_genai_stages(agent, "chat-online")]
    odd = gauge("fleetscope_test_odd", "Label values the text format escapes.")
    odd.add(1.5, labels(binary='we"ird\\path\nx', pct="50%"))
    odd.add(float("nan"), labels(binary="", pct="%s"))
    exact = counter("fleetscope_test_seconds_total", "Nanoseconds as seconds.")
    exact.add(seconds_from_ns(123_456_789_012_345_678))
    return [*families, odd, exact]


def test_the_samples_are_what_the_text_says():
    for bundle in ("x86-256", "kunpeng-128"):
        families = _families(bundle)
        names = {name for family in families for name, _, _ in family}
        assert {"fleetscope_cpu_seconds_total", "fleetscope_schedstat_running_seconds_total",
                "agent_stage_duration_seconds_bucket", "fleetscope_test_odd"} <= names
        data = Series()
        add_families(data, families, 1_001_000)
        text = _parsed_back(render(families), 1_001_000)
        assert _comparable(data) == _comparable(text), bundle


def test_a_label_set_is_rendered_once_and_shared():
    first, again = labels(cpu=3, mode="user"), labels(cpu="3", mode="user")
    assert first is again
    assert first.text == 'cpu="3",mode="user"'
    assert first.key() == (("cpu", "3"), ("mode", "user"))
    assert labels(pool="p", **{"class": "online"}).plus(kind="x").text == \
        'pool="p",class="online",kind="x"'
    assert not labels() and labels(a=1)


def test_a_value_format_family_renders_like_sample_by_sample():
    ticks = Family("fleetscope_test_ticks_total", "counter", "Ticks as seconds.", "%.2f")
    plain = counter("fleetscope_test_ticks_total", "Ticks as seconds.")
    for cpu, value in enumerate((8.37, 1.0, 0.07, 12345.6)):
        ticks.add(value, labels(cpu=cpu, mode="a%d"))
        plain.add(value, labels(cpu=cpu, mode="a%d"))
    text = render([ticks])
    assert 'fleetscope_test_ticks_total{cpu="1",mode="a%d"} 1.00' in text
    assert text.replace("1.00\n", "1.0\n").replace("12345.60", "12345.6") == render([plain])
    ticks.samples[0] = (ticks.samples[0][0], 9.5)  # new values, same label sets: no stale text
    assert 'cpu="0",mode="a%d"} 9.50' in render([ticks])
