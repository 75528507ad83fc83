"""Rendering in both formats, checked with prometheus-client's own parsers."""

from __future__ import annotations

import math

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from fleetscope.core.exposition import (
    counter,
    format_value,
    gauge,
    labels,
    render,
    wants_openmetrics,
)


def _families():
    seconds = counter("fleetscope_test_seconds_total", 'Seconds "quoted" and a \\ backslash.')
    seconds.add(1.5, labels(cpu=0, mode="user")).add(2, labels(cpu=1, mode='we"ird\\\nvalue'))
    ratio = gauge("fleetscope_test_ratio", "A ratio.").add(math.inf)
    ratio.add(float("nan"), labels(x="1"))
    return [seconds, ratio]


def test_text_format_round_trips_through_prometheus_parser():
    families = {f.name: f for f in parse_text(render(_families()))}
    seconds = families["fleetscope_test_seconds"]  # the parser strips _total from the family
    assert seconds.type == "counter"
    values = {s.labels["cpu"]: (s.labels["mode"], s.value) for s in seconds.samples}
    assert values["0"] == ("user", 1.5)
    assert values["1"] == ('we"ird\\\nvalue', 2.0)
    ratio = families["fleetscope_test_ratio"].samples
    assert ratio[0].value == math.inf and math.isnan(ratio[1].value)


def test_openmetrics_names_counter_families_without_total():
    text = render(_families(), openmetrics=True) + "# EOF\n"
    assert "# TYPE fleetscope_test_seconds counter" in text
    assert 'fleetscope_test_seconds_total{cpu="0",mode="user"} 1.5' in text
    families = {f.name: f for f in parse_om(text)}  # the strict OpenMetrics parser
    assert families["fleetscope_test_seconds"].samples[0].name == "fleetscope_test_seconds_total"


@pytest.mark.parametrize(
    "value, text", [(3, "3"), (1.5, "1.5"), (math.inf, "+Inf"), (-math.inf, "-Inf"),
                    (float("nan"), "NaN"), (1e21, "1e+21")],
)
def test_format_value(value, text):
    assert format_value(value) == text


@pytest.mark.parametrize(
    "accept, expected",
    [
        (None, False),
        ("text/plain", False),
        # What Prometheus 2.x/3.x sends by default.
        ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
         "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1", True),
        ("text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.5",
         False),
        ("application/openmetrics-text;version=2.0.0", False),
        ("application/json", False),
    ],
)
def test_content_negotiation(accept, expected):
    assert wants_openmetrics(accept) is expected


def test_empty_render():
    assert render([]) == ""
