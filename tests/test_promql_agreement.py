"""The Python evaluator and Prometheus compute the same vectors for the same expressions.

Series are fed to `promtool test rules` as input series and to the in-process evaluator as
recorded samples; every expression's result must match sample for sample.
"""

from __future__ import annotations

import math
import random
import re
import subprocess

import pytest
import yaml

from fleetscope.rules.promql import (
    Arith,
    Avg,
    AvgOverTime,
    Compare,
    Count,
    Delta,
    HistogramQuantile,
    Max,
    MaxOverTime,
    MinOverTime,
    Rate,
    Selector,
    Series,
    Sum,
    Time,
)
from tests.conftest import require_tool

INTERVAL_S = 15
STEPS = 12


def _input_series(seed: int) -> dict[tuple[str, tuple], list[float | None]]:
    rng = random.Random(seed)
    data: dict[tuple[str, tuple], list[float | None]] = {}
    for pool, cls in (("chat", "online"), ("code", "online"), ("batch", "offline")):
        for cpu in range(3):
            value = rng.uniform(0, 1000)
            values: list[float | None] = []
            for step in range(STEPS):
                value += rng.uniform(0, 20)
                if step == 7 and pool == "code" and cpu == 1:
                    value = rng.uniform(0, 5)  # a counter reset (process restart)
                values.append(None if (step == 4 and cpu == 2) else round(value, 3))
            labels = (("class", cls), ("cpu", str(cpu)), ("pool", pool))
            data[("work_seconds_total", labels)] = values
        data[("queue_depth", (("class", cls), ("pool", pool)))] = [
            float(rng.randint(0, 50)) for _ in range(STEPS)]
    # A gauge that stops being reported: the lookback keeps its last value for 5 minutes.
    data[("stale_gauge", (("pool", "chat"),))] = [3.0, 4.0] + [None] * (STEPS - 2)
    # A latency histogram per pool, cumulative buckets; "code" restarts at step 6.
    hist = random.Random(seed + 1000)
    for pool in ("chat", "code"):
        counts = [0.0, 0.0, 0.0, 0.0]
        rows: list[list[float | None]] = [[], [], [], []]
        for step in range(STEPS):
            if step == 6 and pool == "code":
                counts = [0.0, 0.0, 0.0, 0.0]
            added = 0.0
            for index in range(4):
                added += hist.randint(1, 30)  # every bucket grows: observations > 0
                counts[index] += added
                rows[index].append(counts[index])
        for le, values in zip(("0.1", "0.5", "2.5", "+Inf"), rows, strict=True):
            data[("lat_seconds_bucket", (("le", le), ("pool", pool)))] = values
    return data


EXPRESSIONS = [
    Rate(Selector("work_seconds_total"), 60),
    Rate(Selector("work_seconds_total", {"pool": "code"}), 120, increase=True),
    Sum(Rate(Selector("work_seconds_total", {"class": "online"}), 60), by=("pool",)),
    Sum(Rate(Selector("work_seconds_total"), 90), by=("pool", "class")) > 1.5,
    Max(Selector("queue_depth"), by=("class",)),
    Avg(Selector("queue_depth")) + 1,
    Count(Selector("work_seconds_total", {"pool": "~chat|batch"}), by=("pool",)),
    Selector("queue_depth") / Sum(Rate(Selector("work_seconds_total"), 60), by=("class", "pool")),
    (Selector("queue_depth") > 10) & (Sum(Rate(Selector("work_seconds_total"), 60),
                                          by=("class", "pool")) > 1),
    (Selector("queue_depth") >= 0).unless(Selector("queue_depth", {"class": "offline"})),
    Selector("stale_gauge"),
    Selector("queue_depth", offset_seconds=60),
    (Selector("queue_depth") > 0).unless(Selector("queue_depth", offset_seconds=120)),
    Delta(Selector("queue_depth"), 60),
    Delta(Selector("queue_depth", {"pool": "chat"}), 120) > 0,
    AvgOverTime(Selector("queue_depth"), 60),
    Max(AvgOverTime(Selector("queue_depth", {"class": "online"}), 90), by=("class",)) > 20,
    AvgOverTime(Selector("stale_gauge"), 60),
    MaxOverTime(Selector("queue_depth"), 60),
    MinOverTime(Selector("queue_depth", {"class": "online"}), 90),
    MaxOverTime(Selector("stale_gauge"), 60),
    # a swing: how far a gauge moved inside the window, per series, then the node's worst
    Max(MaxOverTime(Selector("queue_depth"), 60) - MinOverTime(Selector("queue_depth"), 60),
        by=("class",)) > 10,
    Time() - Selector("queue_depth") * 10,
    (Selector("queue_depth") > 5).and_on(Sum(Selector("queue_depth"), by=("pool",)) > 20,
                                         ("pool",)),
    (Selector("queue_depth") > 0).unless(Max(Selector("queue_depth"), by=("class",)) > 45,
                                         ("class",)),
    2 * Selector("queue_depth") - Selector("queue_depth"),
    HistogramQuantile(0.9, Rate(Selector("lat_seconds_bucket"), 60)),
    HistogramQuantile(0.5, Sum(Rate(Selector("lat_seconds_bucket"), 120), by=("le",))),
    HistogramQuantile(0.99, Sum(Rate(Selector("lat_seconds_bucket", {"pool": "code"}), 60),
                                by=("pool", "le"))) > 0.2,
    # many-to-one: each cpu's work over its pool's total, then over its class's queue
    Arith("/", Rate(Selector("work_seconds_total"), 60),
          Sum(Rate(Selector("work_seconds_total"), 60), by=("pool",)), on=("pool",),
          group_left=True),
    Compare(">", Sum(Rate(Selector("work_seconds_total"), 60), by=("class", "pool")),
            Max(Selector("queue_depth"), by=("class",)), on=("class",), group_left=True),
]


def _labels(labels) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def _promtool_case(data, eval_step: int) -> tuple[dict, Series]:
    series = Series()
    input_series = []
    for (name, labels), values in data.items():
        label_text = ",".join(f'{k}="{v}"' for k, v in labels)
        input_series.append({
            "series": f"{name}{{{label_text}}}",
            "values": " ".join("_" if v is None else repr(v) for v in values),
        })
        for step, value in enumerate(values):
            if value is not None:
                series.add(name, dict(labels), step * INTERVAL_S * 1000, value)
    at_ms = eval_step * INTERVAL_S * 1000
    tests = []
    for expr in EXPRESSIONS:
        vector = expr.evaluate(series, at_ms)
        tests.append({
            "expr": expr.promql(),
            "eval_time": f"{eval_step * INTERVAL_S}s",
            "exp_samples": [
                {"labels": _labels(labels), "value": value}
                for labels, value in sorted(vector.items())
            ],
        })
    return {"interval": f"{INTERVAL_S}s", "input_series": input_series,
            "promql_expr_test": tests}, series


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_evaluator_matches_promtool(tmp_path, seed):
    promtool = require_tool("promtool")
    data = _input_series(seed)
    cases = []
    for eval_step in (3, 8, STEPS - 1, STEPS + 15):
        case, _ = _promtool_case(data, eval_step)
        cases.append(case)
    # Expressions must produce something somewhere, or the comparison proves nothing.
    assert any(case_test["exp_samples"] for case in cases for case_test in
               case["promql_expr_test"])
    (tmp_path / "rules.yml").write_text("groups: []\n")
    test_file = tmp_path / "test.yml"
    # promtool appends input samples as it steps through evaluation_interval: it must match
    # the sample interval or a query sees only samples up to the last whole step.
    test_file.write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "tests": cases,
                                         "evaluation_interval": f"{INTERVAL_S}s"}))
    result = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True,
                            text=True, timeout=120)
    if result.returncode != 0:
        _assert_only_rounding_differs(result.stdout + result.stderr)


_SAMPLE = re.compile(r"(\{[^}]*\}) ([-+]?[0-9.]+(?:E[-+]?[0-9]+)?|NaN|[-+]Inf)")


def _assert_only_rounding_differs(report: str) -> None:
    """promtool 2.x compares floats exactly, and its sums add series in an order that
    varies from run to run, so sums may differ in the last bit: anything beyond a relative
    1e-12 (or any difference in label sets) is a real disagreement."""
    lines = report.splitlines()
    expected = [line for line in lines if line.strip().startswith("exp:")]
    got = [line for line in lines if line.strip().startswith("got:")]
    assert expected and len(expected) == len(got), report[-6000:]
    for exp_line, got_line in zip(expected, got, strict=True):
        exp = dict(_SAMPLE.findall(exp_line))
        actual = dict(_SAMPLE.findall(got_line))
        assert exp.keys() == actual.keys(), (exp_line, got_line)
        for labels, value in exp.items():
            assert math.isclose(float(value), float(actual[labels]), rel_tol=1e-12), \
                (labels, value, actual[labels])


def test_promql_rendering():
    expr = Sum(Rate(Selector("fleetscope_pool_run_delay_seconds_total", {"class": "online"}),
                    120), by=("pool",)) > 0.05
    assert expr.promql() == ('sum by (pool) (rate(fleetscope_pool_run_delay_seconds_total'
                             '{class="online"}[2m])) > 0.05')
    assert ((Selector("a") - Selector("b")) / Selector("c")).promql() == "(a - b) / c"
    assert Selector("a", {"x": "~y|z"}).promql() == 'a{x=~"y|z"}'
