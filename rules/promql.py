"""Rule expressions that are both PromQL and Python: one source of truth for every rule.

A rule's condition is built from these nodes; `promql()` renders it for the exported
Prometheus rules and `evaluate()` computes the same instant vector in-process over recorded
series (a bundle replayed through the collectors, the live node, a Prometheus range query).

    expr = Rate(Selector("fleetscope_pool_run_delay_seconds_total", {"class": "online"}), 120)
    (Sum(expr, by=("pool",)) > 0.05).promql()
    # 'sum by (pool) (rate(fleetscope_pool_run_delay_seconds_total{class="online"}[2m])) > 0.05'

The subset is what the catalog needs, with Prometheus 2.x semantics kept exactly where a
number depends on them: instant selectors look back 5 minutes for the latest sample;
`rate`/`increase` use Prometheus's extrapolation (promql/functions.go extrapolatedRate) and
counter-reset handling over the closed range [t - window, t]; binary operators match on
all labels but the metric name; comparisons filter; `and`/`unless` are set operations.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, is_dataclass

LOOKBACK_MS = 5 * 60 * 1000  # Prometheus's default --query.lookback-delta
# Range windows up to this are rates of what is happening now; longer ones look back over
# events (model loads in the last 5 minutes, crashes in the last 15).
RATE_SECONDS = 60
# How far back an event from the kernel log (a SIGILL crash, an OOM kill...) is the incident,
# in every mode alike: the exported alert, a diagnosis from Prometheus, of a bundle or of the
# live node, whatever its window. Older events are information at most. Event rules use it
# through Recent.
EVENT_LOOKBACK_SECONDS = 15 * 60
# An event this recent still acts: a loop of crashes or kills repeats at least this often
# (Kubernetes' CrashLoopBackOff caps its restart delay at 5 minutes), so one older than this
# with none since has ended. Inside the look-back, an ended event is said as such and
# explains no harm of now.
EVENT_ONGOING_SECONDS = 5 * 60

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs; may hold __name__
Vector = dict[Labels, float]
NAME = "__name__"


def strip_name(labels: Labels) -> Labels:
    """Labels without the metric name: what operators match on and what alerts carry."""
    return tuple(pair for pair in labels if pair[0] != NAME)


class Series:
    """Recorded samples: metric name -> label set -> [(timestamp ms, value)] ascending."""

    def __init__(self) -> None:
        self.by_name: dict[str, dict[Labels, list[tuple[int, float]]]] = {}
        # In-process evidence shorter than a rule's window (a 20 s live sample, a short
        # bundle): rates look back at most max_window_ms, event look-backs at most
        # max_lookback_ms (the whole span). None: the rule's own windows, as Prometheus.
        self.max_window_ms: int | None = None
        self.max_lookback_ms: int | None = None
        self.memo: Memo | None = None  # set inside memoized()

    @contextmanager
    def memoized(self) -> Iterator[Series]:
        """Evaluations inside share their results (see Expr.evaluate): for one pass of many
        rules over series that do not change meanwhile. Nested uses share the outer memo."""
        if self.memo is not None:
            yield self
            return
        self.memo = Memo()
        try:
            yield self
        finally:
            self.memo = None

    def limit_windows(self, rate_ms: int | None, lookback_ms: int | None) -> None:
        """Set max_window_ms and max_lookback_ms; what a pass evaluated under others goes."""
        if (rate_ms, lookback_ms) != (self.max_window_ms, self.max_lookback_ms):
            self.max_window_ms, self.max_lookback_ms = rate_ms, lookback_ms
            if self.memo is not None:
                self.memo.vectors.clear()

    def window_ms(self, window_seconds: int) -> int:
        window_ms = window_seconds * 1000
        cap = self.max_window_ms if window_seconds <= RATE_SECONDS else self.max_lookback_ms
        return min(window_ms, cap) if cap else window_ms

    def add(self, name: str, labels: dict[str, str], timestamp_ms: int, value: float) -> None:
        self.add_key(name, tuple(sorted(labels.items())), timestamp_ms, value)

    def add_key(self, name: str, key: Labels, timestamp_ms: int, value: float) -> None:
        """add() for labels already as sorted (name, value) pairs (a LabelSet's key())."""
        points = self.by_name.setdefault(name, {}).setdefault(key, [])
        if points and points[-1][0] >= timestamp_ms:
            if points[-1][0] == timestamp_ms:
                points[-1] = (timestamp_ms, value)
                return
            points.sort()
        points.append((timestamp_ms, value))

    def names(self) -> set[str]:
        return set(self.by_name)

    def last_sample_ms(self, names: Iterable[str]) -> int | None:
        """The latest sample time of these metrics (where their tiles and recordings are
        evaluated), None without a sample."""
        ends = [points[-1][0] for name in names
                for points in self.by_name.get(name, {}).values() if points]
        return max(ends) if ends else None

    def timestamps(self) -> list[int]:
        seen: set[int] = set()
        first = operator.itemgetter(0)
        for family in self.by_name.values():
            for points in family.values():
                seen.update(map(first, points))  # in C: a fleet has ~100k series a shard
        return sorted(seen)


class Memo:
    """What one pass over a Series has evaluated: each node's vector by time, each
    selector's matching series. By node identity, the node kept with its entry so that no
    other node (a selector built for one call) can take over its id in the pass."""

    def __init__(self) -> None:
        self.vectors: dict[tuple[int, int], tuple[Expr, Vector]] = {}
        self.matches: dict[int, tuple[Expr, list[tuple[Labels, list[tuple[int, float]]]]]] = {}


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class Expr:
    """A node of a rule expression."""

    def promql(self) -> str:
        raise NotImplementedError

    def evaluate(self, series: Series, at_ms: int) -> Vector:
        """The instant vector at `at_ms`. Inside `series.memoized()` a node already evaluated
        there is answered from the memo: the catalog's rules share their harm and cause
        signals, and a rule's tiers and evidence their terms. Not to be changed."""
        memo = series.memo
        if memo is None:
            return self._evaluate(series, at_ms)
        known = memo.vectors.get((id(self), at_ms))
        if known is None or known[0] is not self:
            known = memo.vectors[id(self), at_ms] = (self, self._evaluate(series, at_ms))
        return known[1]

    def _evaluate(self, series: Series, at_ms: int) -> Vector:
        raise NotImplementedError

    def metrics(self) -> set[str]:
        """Metric names this expression reads (to report rules whose inputs are absent)."""
        raise NotImplementedError

    def walk(self) -> Iterator[Expr]:
        """This node and every node under it."""
        yield self
        for item in fields(self) if is_dataclass(self) else ():
            child = getattr(self, item.name)
            for node in child if isinstance(child, (tuple, list)) else (child,):
                if isinstance(node, Expr):
                    yield from node.walk()

    # Operators build nodes, so rules read like the PromQL they become.
    def __gt__(self, other): return Compare(">", self, _wrap(other))  # noqa: E704
    def __ge__(self, other): return Compare(">=", self, _wrap(other))  # noqa: E704
    def __lt__(self, other): return Compare("<", self, _wrap(other))  # noqa: E704
    def __le__(self, other): return Compare("<=", self, _wrap(other))  # noqa: E704
    def __add__(self, other): return Arith("+", self, _wrap(other))  # noqa: E704
    def __sub__(self, other): return Arith("-", self, _wrap(other))  # noqa: E704
    def __mul__(self, other): return Arith("*", self, _wrap(other))  # noqa: E704
    def __truediv__(self, other): return Arith("/", self, _wrap(other))  # noqa: E704
    def __rmul__(self, other): return Arith("*", _wrap(other), self)  # noqa: E704
    def __radd__(self, other): return Arith("+", _wrap(other), self)  # noqa: E704
    def __rsub__(self, other): return Arith("-", _wrap(other), self)  # noqa: E704
    def __rtruediv__(self, other): return Arith("/", _wrap(other), self)  # noqa: E704
    def __and__(self, other): return SetOp("and", self, other)  # noqa: E704
    def __or__(self, other): return SetOp("or", self, other)  # noqa: E704

    def unless(self, other: Expr, on: tuple[str, ...] | None = None) -> Expr:
        return SetOp("unless", self, other, on)

    def and_on(self, other: Expr, on: tuple[str, ...]) -> Expr:
        """`self and on (labels) other`: keep self where other has the same `on` labels."""
        return SetOp("and", self, other, tuple(on))

    __hash__ = object.__hash__


def _wrap(value) -> Expr:
    return value if isinstance(value, Expr) else Scalar(float(value))


@dataclass(eq=False)
class Scalar(Expr):
    value: float

    def promql(self) -> str:
        return repr(self.value).removesuffix(".0") if self.value == int(self.value) \
            else repr(self.value)

    def evaluate(self, series, at_ms):
        raise TypeError("a scalar is evaluated by its parent")

    def scalar(self, at_ms: int) -> float:
        return self.value

    def metrics(self):
        return set()


class Time(Scalar):
    """PromQL time(): the evaluation time in seconds (the last sample of a bundle)."""

    def __init__(self) -> None:
        super().__init__(0.0)

    def promql(self) -> str:
        return "time()"

    def scalar(self, at_ms: int) -> float:
        return at_ms / 1000


@dataclass(eq=False)
class Selector(Expr):
    """`name{label="value", other=~"regex"}`; a matcher value starting with '~' is a regex."""

    name: str
    matchers: dict[str, str] | None = None
    offset_seconds: int = 0  # `offset 15m`: the value that long ago

    def _matcher_text(self) -> str:
        if not self.matchers:
            return ""
        parts = []
        for key, value in self.matchers.items():
            if value.startswith("~"):
                parts.append(f"{key}=~{_quote(value[1:])}")
            else:
                parts.append(f"{key}={_quote(value)}")
        return "{" + ",".join(parts) + "}"

    def promql(self) -> str:
        offset = f" offset {_duration(self.offset_seconds)}" if self.offset_seconds else ""
        return self.name + self._matcher_text() + offset

    def _tests(self) -> tuple[tuple[str, str, re.Pattern | None], ...]:
        """(label, value, compiled regex or None) per matcher, compiled once per selector."""
        tests = self.__dict__.get("_compiled")
        if tests is None:
            tests = tuple(
                (key, value, re.compile(value[1:]) if value.startswith("~") else None)
                for key, value in (self.matchers or {}).items())
            self.__dict__["_compiled"] = tests  # a cache, not a field: frozen stays frozen
        return tests

    def matching(self, series: Series) -> Iterable[tuple[Labels, list[tuple[int, float]]]]:
        memo = series.memo
        if memo is None:
            return self._matching(series)
        known = memo.matches.get(id(self))
        if known is None or known[0] is not self:
            known = memo.matches[id(self)] = (self, list(self._matching(series)))
        return known[1]

    def _matching(self, series: Series) -> Iterator[tuple[Labels, list[tuple[int, float]]]]:
        family = series.by_name.get(self.name)
        if not family:
            return
        tests = self._tests()
        if not tests:
            yield from family.items()
            return
        for labels, points in family.items():
            for key, value, pattern in tests:
                if pattern is None:
                    if (key, value) in labels:
                        continue
                    if value or any(name == key for name, _ in labels):
                        break  # "" matches only where the label is absent
                    continue
                got = ""  # an absent label matches as ""
                for name, label_value in labels:
                    if name == key:
                        got = label_value
                        break
                if pattern.fullmatch(got) is None:  # PromQL regexes are anchored
                    break
            else:
                yield labels, points

    def _evaluate(self, series, at_ms):
        out: Vector = {}
        at_ms -= self.offset_seconds * 1000
        for labels, points in self.matching(series):
            latest = None
            for t, v in reversed(points):
                if t <= at_ms:
                    if t > at_ms - LOOKBACK_MS:
                        latest = v
                    break
            if latest is not None:
                out[tuple(sorted(((NAME, self.name), *labels)))] = latest
        return out

    def metrics(self):
        return {self.name}


def extrapolated_delta(points: list[tuple[int, float]], start_ms: int, end_ms: int,
                       is_rate: bool) -> float | None:
    """Prometheus's extrapolatedRate for counters over the samples in [start, end]."""
    if points and start_ms <= points[0][0] and points[-1][0] <= end_ms:
        window = points  # all inside (a fleet's last two scrapes): no copy
    else:
        window = [(t, v) for t, v in points if start_ms <= t <= end_ms]
    if len(window) < 2:
        return None
    result = window[-1][1] - window[0][1]
    last = 0.0
    for _, v in window:  # a counter that went down was reset: add what it had reached
        if v < last:
            result += last
        last = v
    to_start = (window[0][0] - start_ms) / 1000
    to_end = (end_ms - window[-1][0]) / 1000
    sampled = (window[-1][0] - window[0][0]) / 1000
    average = sampled / (len(window) - 1)
    if result > 0 and window[0][1] >= 0:
        to_zero = sampled * (window[0][1] / result)
        to_start = min(to_start, to_zero)
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    factor = interval / sampled
    if is_rate:
        factor /= (end_ms - start_ms) / 1000
    return result * factor


def extrapolated_gauge_delta(points: list[tuple[int, float]], start_ms: int, end_ms: int
                             ) -> float | None:
    """Prometheus's delta() for gauges: extrapolated, no counter-reset handling."""
    window = [(t, v) for t, v in points if start_ms <= t <= end_ms]
    if len(window) < 2:
        return None
    result = window[-1][1] - window[0][1]
    to_start = (window[0][0] - start_ms) / 1000
    to_end = (end_ms - window[-1][0]) / 1000
    sampled = (window[-1][0] - window[0][0]) / 1000
    average = sampled / (len(window) - 1)
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    return result * (interval / sampled)


@dataclass(eq=False)
class Delta(Expr):
    """delta(selector[window]) for gauges: how much a queue grew over the window."""

    selector: Selector
    window_seconds: int

    def promql(self) -> str:
        return f"delta({self.selector.promql()}[{_duration(self.window_seconds)}])"

    def _evaluate(self, series, at_ms):
        window_ms = series.window_ms(self.window_seconds)
        out: Vector = {}
        for labels, points in self.selector.matching(series):
            value = extrapolated_gauge_delta(points, at_ms - window_ms, at_ms)
            if value is not None:
                out[labels] = value
        return out

    def metrics(self):
        return self.selector.metrics()


@dataclass(eq=False)
class Rate(Expr):
    """rate(selector[window]) per second, or increase() with `increase=True`."""

    selector: Selector
    window_seconds: int
    increase: bool = False

    def promql(self) -> str:
        function = "increase" if self.increase else "rate"
        return f"{function}({self.selector.promql()}[{_duration(self.window_seconds)}])"

    def _evaluate(self, series, at_ms):
        out: Vector = {}
        # Evidence shorter than the window (a 20 s live sample, a short bundle) is rated
        # over what it has: Prometheus would under-count a partly filled window.
        start = at_ms - series.window_ms(self.window_seconds)
        for labels, points in self.selector.matching(series):
            value = extrapolated_delta(points, start, at_ms, not self.increase)
            if value is not None:
                out[labels] = value
        return out

    def metrics(self):
        return self.selector.metrics()


@dataclass(eq=False)
class AvgOverTime(Expr):
    """avg_over_time(selector[window]): a gauge's mean over the window, so one sample of a
    bursty gauge (a core's busy share in a 1-second interval) cannot decide alone."""

    selector: Selector
    window_seconds: int
    function = "avg_over_time"  # the PromQL function; _OVER_TIME computes it

    def promql(self) -> str:
        return f"{self.function}({self.selector.promql()}[{_duration(self.window_seconds)}])"

    def _evaluate(self, series, at_ms):
        start = at_ms - series.window_ms(self.window_seconds)
        reduce = _OVER_TIME[self.function]
        out: Vector = {}
        for labels, points in self.selector.matching(series):
            values = [v for t, v in points if start <= t <= at_ms]
            if values:
                out[labels] = reduce(values)
        return out

    def metrics(self):
        return self.selector.metrics()


class MaxOverTime(AvgOverTime):
    """max_over_time(selector[window]): a gauge's highest value in the window (a swing's
    top; with MinOverTime its bottom: how far it moved)."""

    function = "max_over_time"


class MinOverTime(AvgOverTime):
    """min_over_time(selector[window]): a gauge's lowest value in the window (a queue that
    never emptied held at least this many)."""

    function = "min_over_time"


def _sum(values: list[float]) -> float:
    total = 0.0
    for value in values:  # in series order, as Prometheus adds: the last bits must agree
        total += value
    return total


def _avg(values: list[float]) -> float:
    mean, count = values[0], 1
    for value in values[1:]:  # Prometheus 2.x's incremental mean (promql/engine.go)
        count += 1
        mean += value / count - mean / count
    return mean


def _max(values: list[float]) -> float:
    """Prometheus's max: a NaN gives way to any number (promql/engine.go aggregation)."""
    numbers = [v for v in values if v == v]
    return max(numbers) if numbers else math.nan


def _min(values: list[float]) -> float:
    numbers = [v for v in values if v == v]
    return min(numbers) if numbers else math.nan


# max_over_time/min_over_time skip NaN as max/min do (promql/functions.go, 2.x)
_OVER_TIME: dict[str, Callable[[list[float]], float]] = {
    "avg_over_time": _avg, "max_over_time": _max, "min_over_time": _min}

_AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": _sum,
    "max": _max,
    "min": _min,
    "avg": _avg,
    "count": lambda values: float(len(values)),
}


@dataclass(eq=False)
class Aggregate(Expr):
    function: str
    inner: Expr
    by: tuple[str, ...] = ()

    def promql(self) -> str:
        grouping = f" by ({', '.join(self.by)})" if self.by else ""
        return f"{self.function}{grouping} ({self.inner.promql()})"

    def _evaluate(self, series, at_ms):
        groups: dict[Labels, list[float]] = {}
        by = self.by
        for labels, value in sorted(self.inner.evaluate(series, at_ms).items()):
            key = tuple([pair for pair in labels if pair[0] in by])
            groups.setdefault(key, []).append(value)
        return {key: _AGGREGATIONS[self.function](values) for key, values in groups.items()}

    def metrics(self):
        return self.inner.metrics()


def Sum(inner: Expr, by: tuple[str, ...] = ()) -> Aggregate:  # noqa: N802 (reads as PromQL)
    return Aggregate("sum", inner, tuple(by))


def Max(inner: Expr, by: tuple[str, ...] = ()) -> Aggregate:  # noqa: N802
    return Aggregate("max", inner, tuple(by))


def Min(inner: Expr, by: tuple[str, ...] = ()) -> Aggregate:  # noqa: N802
    return Aggregate("min", inner, tuple(by))


def Avg(inner: Expr, by: tuple[str, ...] = ()) -> Aggregate:  # noqa: N802
    return Aggregate("avg", inner, tuple(by))


def Count(inner: Expr, by: tuple[str, ...] = ()) -> Aggregate:  # noqa: N802
    return Aggregate("count", inner, tuple(by))


def _divide(a: float, b: float) -> float:
    if b == 0:  # IEEE 754, as Go computes it
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a)
    return a / b


_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": _divide}
_COMPARE = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
            "==": operator.eq, "!=": operator.ne}
_PRECEDENCE = {"or": 1, "and": 2, "unless": 2, "==": 3, "!=": 3, ">": 3, ">=": 3, "<": 3,
               "<=": 3, "+": 4, "-": 4, "*": 5, "/": 5}


def _operand(expr: Expr, parent: str, right: bool) -> str:
    text = expr.promql()
    op = getattr(expr, "op", None)
    if op is not None and (_PRECEDENCE[op] < _PRECEDENCE[parent]
                           or (right and _PRECEDENCE[op] == _PRECEDENCE[parent])):
        return f"({text})"
    return text


class _Binary(Expr):
    op: str
    left: Expr
    right: Expr
    on: tuple[str, ...] | None = None  # match on these labels only (PromQL `on (...)`)
    # `group_left`: many left series to one right series (a pool's stages over its sessions);
    # in-process matching already keys the right side on `on` and keeps the left's labels.
    group_left: bool = False

    def promql(self) -> str:
        left = _operand(self.left, self.op, False)
        matching = f" on ({', '.join(self.on)})" if self.on is not None else ""
        matching += " group_left ()" if self.group_left else ""  # as Prometheus prints it
        return f"{left} {self.op}{matching} {_operand(self.right, self.op, True)}"

    def _key(self, labels: Labels) -> Labels:
        if self.on is None:
            return strip_name(labels)
        return tuple(pair for pair in labels if pair[0] in self.on)

    def metrics(self):
        return self.left.metrics() | self.right.metrics()

    def _apply(self, series, at_ms, combine: Callable[[float, float], float | None],
               keep_name: bool) -> Vector:
        """Vector-scalar or one-to-one vector matching on all labels but the name."""
        def result_labels(labels: Labels) -> Labels:
            return labels if keep_name else strip_name(labels)

        left_scalar = isinstance(self.left, Scalar)
        right_scalar = isinstance(self.right, Scalar)
        if left_scalar and right_scalar:
            raise TypeError("scalar-scalar expressions are not rule conditions")
        out: Vector = {}
        if right_scalar or left_scalar:
            vector = self.left if right_scalar else self.right
            for labels, value in vector.evaluate(series, at_ms).items():
                result = (combine(value, self.right.scalar(at_ms)) if right_scalar
                          else combine(self.left.scalar(at_ms), value))
                if result is not None:
                    out[result_labels(labels)] = result
            return out
        right = {self._key(k): v for k, v in self.right.evaluate(series, at_ms).items()}
        for labels, value in self.left.evaluate(series, at_ms).items():
            other = right.get(self._key(labels))
            if other is not None:
                result = combine(value, other)
                if result is not None:
                    out[result_labels(labels)] = result
        return out


@dataclass(eq=False)
class Arith(_Binary):
    op: str
    left: Expr
    right: Expr
    on: tuple[str, ...] | None = None
    # many-to-one: each left series (a pool's) with the one right series (its node's) of
    # the same `on` labels, keeping the left labels, as _apply matches them
    group_left: bool = False

    def _evaluate(self, series, at_ms):
        return self._apply(series, at_ms, _ARITH[self.op], keep_name=False)


@dataclass(eq=False)
class Compare(_Binary):
    """A filter, as PromQL comparisons without `bool`: keeps the left value where true."""

    op: str
    left: Expr
    right: Expr
    on: tuple[str, ...] | None = None
    group_left: bool = False

    def _evaluate(self, series, at_ms):
        test = _COMPARE[self.op]
        if isinstance(self.left, Scalar):
            return self._apply(series, at_ms, lambda a, b: b if test(a, b) else None, True)
        return self._apply(series, at_ms, lambda a, b: a if test(a, b) else None, True)


@dataclass(eq=False)
class SetOp(_Binary):
    op: str
    left: Expr
    right: Expr
    on: tuple[str, ...] | None = None

    def _evaluate(self, series, at_ms):
        left = self.left.evaluate(series, at_ms)
        if not left and self.op != "or":
            return {}  # `and`/`unless` of nothing: the right side cannot change that
        right = self.right.evaluate(series, at_ms)
        right_keys = {self._key(k) for k in right}
        if self.op == "and":
            return {k: v for k, v in left.items() if self._key(k) in right_keys}
        if self.op == "unless":
            return {k: v for k, v in left.items() if self._key(k) not in right_keys}
        left_keys = {self._key(k) for k in left}  # or: left wins, right fills in
        return {**left, **{k: v for k, v in right.items() if self._key(k) not in left_keys}}


@dataclass(eq=False)
class Recent(Expr):
    """`age < seconds`: an event at most `seconds` old (age from `time() - <timestamp>`).

    Read as written everywhere, in-process too: the look-back does not shrink to a short
    window (a 20 s live sample, a 1-minute bundle), so a crash 40 s before a live diagnosis
    reads as it does in the alert and in a diagnosis from Prometheus."""

    age: Expr
    seconds: int = EVENT_LOOKBACK_SECONDS

    def promql(self) -> str:
        return (self.age < self.seconds).promql()

    def _evaluate(self, series, at_ms):
        return {labels: value for labels, value in self.age.evaluate(series, at_ms).items()
                if value < self.seconds}

    def metrics(self):
        return self.age.metrics()


def bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """Prometheus's bucketQuantile (promql/quantile.go, 2.x) over (upper bound, cumulative
    count) pairs: linear inside the bucket the rank falls in, the highest finite bound when
    it falls in +Inf, NaN without a +Inf bucket or observations."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    merged: dict[float, float] = {}
    for bound, count in buckets:  # the same bound twice (e.g. "1" and "1.0"): one bucket
        merged[bound] = merged.get(bound, 0.0) + count
    ordered = sorted(merged.items())
    if not ordered or not math.isinf(ordered[-1][0]) or len(ordered) < 2:
        return math.nan
    counts, highest = [], -math.inf
    for _, count in ordered:  # ensureMonotonic: a scrape between bucket updates
        highest = max(highest, count)
        counts.append(highest)
    observations = counts[-1]
    if not observations > 0:
        return math.nan
    rank = q * observations
    index = next(i for i, count in enumerate(counts) if count >= rank)
    if index == len(ordered) - 1:
        return ordered[-2][0]
    if index == 0 and ordered[0][0] <= 0:
        return ordered[0][0]
    start, end, count = 0.0, ordered[index][0], counts[index]
    if index > 0:
        start = ordered[index - 1][0]
        count -= counts[index - 1]
        rank -= counts[index - 1]
    return start + (end - start) * (rank / count)


def bucket_bound(le: str) -> float:
    """A bucket's `le` label as its upper bound ("+Inf" too); NaN when it is not a number."""
    try:
        return float(le)  # "+Inf" and "Inf" too
    except ValueError:
        return math.nan


@dataclass(eq=False)
class HistogramQuantile(Expr):
    """histogram_quantile(q, buckets): `inner` gives bucket values (rates) with an `le`
    label; series are grouped by every other label but the name."""

    q: float
    inner: Expr

    def promql(self) -> str:
        return f"histogram_quantile({Scalar(self.q).promql()}, {self.inner.promql()})"

    def _evaluate(self, series, at_ms):
        groups: dict[Labels, list[tuple[float, float]]] = {}
        for labels, value in self.inner.evaluate(series, at_ms).items():
            le = next((v for k, v in labels if k == "le"), None)
            bound = math.nan if le is None else bucket_bound(le)
            if math.isnan(bound):
                continue  # Prometheus drops series without a usable le
            key = tuple(pair for pair in labels if pair[0] not in ("le", NAME))
            groups.setdefault(key, []).append((bound, value))
        return {key: bucket_quantile(self.q, buckets) for key, buckets in groups.items()}

    def metrics(self):
        return self.inner.metrics()
