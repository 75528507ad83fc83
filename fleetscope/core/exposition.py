"""Metric families and their rendering in the Prometheus text formats.

Renders the classic text format 0.0.4 and OpenMetrics 1.0.0, e.g.

    # HELP fleetscope_cpu_seconds_total Seconds the CPUs spent in each mode.
    # TYPE fleetscope_cpu_seconds_total counter
    fleetscope_cpu_seconds_total{cpu="0",mode="user"} 8.37

Node state is rendered by hand rather than through prometheus-client's object model: on a
256-core node a scrape carries thousands of samples, and building a client object per sample
costs several times more CPU than formatting the line (see bench/).

Families hold data, not text: a sample is a `LabelSet` (label names and values as tuples)
and a number, so the diagnosis, the console and bundle replay read the values the
collectors made instead of parsing the text back. A label set renders once (`.text`) and is
interned, so the collectors' recurring label sets cost one dictionary look-up per scrape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


# Interned label sets: (names, values) -> LabelSet. Bounded label values keep this small;
# past the bound (an agent runtime sending a label per request) it starts over.
_INTERNED: dict[tuple[tuple[str, ...], tuple[str, ...]], LabelSet] = {}
MAX_INTERNED = 200_000


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class LabelSet:
    """One label set as data: `names` and `values` (tuples of str, in exposition order) and
    `.text`, the rendered form (`cpu="3",mode="user"`), made once.

    Label sets are interned (`label_set`, `labels`): the same names and values give the same
    object, so they are compared and hashed by identity; compare `.names`/`.values`, or
    `key()`, for equality by value.
    """

    __slots__ = ("names", "values", "text", "_key")

    def __init__(self, names: tuple[str, ...], values: tuple[str, ...]):
        self.names = names
        self.values = values
        self.text = ",".join(f'{name}="{_escape_label_value(value)}"'
                             for name, value in zip(names, values, strict=True))
        self._key: tuple[tuple[str, str], ...] | None = None

    def key(self) -> tuple[tuple[str, str], ...]:
        """The (name, value) pairs sorted by name: `rules.promql.Labels`."""
        key = self._key
        if key is None:
            key = self._key = tuple(sorted(zip(self.names, self.values, strict=True)))
        return key

    def as_dict(self) -> dict[str, str]:
        return dict(zip(self.names, self.values, strict=True))

    def plus(self, **pairs: object) -> LabelSet:
        """These labels followed by more: labels(pool="p").plus(kind="x")."""
        return label_set(self.names + tuple(pairs),
                         self.values + tuple([str(value) for value in pairs.values()]))

    def __bool__(self) -> bool:
        return bool(self.names)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"LabelSet({self.text!r})"


def label_set(names: tuple[str, ...], values: tuple[str, ...]) -> LabelSet:
    """The interned label set of these names and values (str, in exposition order)."""
    key = (names, values)
    found = _INTERNED.get(key)
    if found is None:
        if len(_INTERNED) >= MAX_INTERNED:
            _INTERNED.clear()
        found = _INTERNED[key] = LabelSet(names, values)
    return found


def labels(**pairs: object) -> LabelSet:
    """A label set: labels(cpu=3, mode="user").text == 'cpu="3",mode="user"'."""
    return label_set(tuple(pairs), tuple([str(value) for value in pairs.values()]))


NO_LABELS = label_set((), ())


class Exact(float):
    """A float that renders as the exact decimal text it was made from (`seconds_from_ns`):
    nanosecond counters keep all nine digits in the exposition whatever their size."""

    __slots__ = ("text",)

    text: str


def seconds_from_ns(nanoseconds: int) -> Exact:
    """Nanoseconds as exact seconds, formatted from integers (cheaper than from floats)."""
    seconds, rest = divmod(nanoseconds, 1_000_000_000)
    text = f"{seconds}.{rest:09d}"
    value = Exact(text)
    value.text = text
    return value


class Family:
    """One metric family: a name, a type, a help text and its samples, as data.

    `samples` are `(LabelSet, value)` under the family's name (counter names end in `_total`
    as in the text format). `named_samples` are `(sample name, LabelSet, value)` for samples
    with a name of their own (a histogram's `_bucket`, `_sum`, `_count`); they render first.
    `value_format`, when set, is the %-format every value of `samples` renders with (e.g.
    "%.2f" for USER_HZ ticks turned into seconds).
    """

    __slots__ = ("name", "type", "help", "samples", "named_samples", "value_format")

    def __init__(self, name: str, type: str, help: str, value_format: str | None = None):
        self.name = name
        self.type = type
        self.help = help
        self.samples: list[tuple[LabelSet, float]] = []
        self.named_samples: list[tuple[str, LabelSet, float]] = []
        self.value_format = value_format

    def add(self, value: float, label_set: LabelSet = NO_LABELS) -> Family:
        self.samples.append((label_set, value))
        return self

    def __iter__(self) -> Iterator[tuple[str, LabelSet, float]]:
        """Every sample as (sample name, labels, value), in exposition order."""
        yield from self.named_samples
        name = self.name
        for label_set_, value in self.samples:
            yield name, label_set_, value

    def __repr__(self) -> str:
        count = len(self.samples) + len(self.named_samples)
        return f"Family({self.name!r}, {self.type!r}, {count} samples)"


def counter(name: str, help: str) -> Family:
    return Family(name, "counter", help)


def gauge(name: str, help: str) -> Family:
    return Family(name, "gauge", help)


def format_value(value: float) -> str:
    """A sample value as both formats spell it (Go-style +Inf/-Inf/NaN)."""
    if type(value) is int:
        return str(value)
    if type(value) is Exact:
        return value.text
    if math.isfinite(value):
        return repr(float(value))
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def _escape_help(text: str, openmetrics: bool) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if openmetrics else text


# Family name -> (the label sets of its samples, the template rendering them): a family
# with a value_format renders in one % operation while its label sets stay the same.
_TEMPLATES: dict[str, tuple[tuple[LabelSet, ...], str]] = {}


def _template(name: str, label_sets: tuple[LabelSet, ...], value_format: str) -> str:
    cached = _TEMPLATES.get(name)
    if cached is not None and cached[0] == label_sets:  # interned: compared by identity
        return cached[1]
    template = "\n".join(
        f"{name}{{{ls.text.replace('%', '%%')}}} {value_format}" if ls.text
        else f"{name} {value_format}" for ls in label_sets)
    _TEMPLATES[name] = (label_sets, template)
    return template


def render(families: Iterable[Family], openmetrics: bool = False) -> str:
    """Render families in the text format, or OpenMetrics without its trailing `# EOF`."""
    out: list[str] = []
    append = out.append
    fmt = format_value
    for family in families:
        name = family.name
        type_name = name
        if openmetrics and family.type == "counter" and name.endswith("_total"):
            type_name = name[:-6]  # OpenMetrics names the family without the suffix
        append(f"# HELP {type_name} {_escape_help(family.help, openmetrics)}")
        append(f"# TYPE {type_name} {family.type}")
        for sample_name, label_set_, value in family.named_samples:
            text = label_set_.text
            if text:
                append(f"{sample_name}{{{text}}} {fmt(value)}")
            else:
                append(f"{sample_name} {fmt(value)}")
        samples = family.samples
        if family.value_format is not None and samples:
            template = _template(name, tuple([ls for ls, _ in samples]), family.value_format)
            append(template % tuple([value for _, value in samples]))
            continue
        for label_set_, value in samples:
            text = label_set_.text
            if text:
                append(f"{name}{{{text}}} {fmt(value)}")
            else:
                append(f"{name} {fmt(value)}")
    if not out:
        return ""
    out.append("")
    return "\n".join(out)


def wants_openmetrics(accept_header: str | None) -> bool:
    """True when the scraper accepts OpenMetrics 1.0 (as Prometheus does by default).

    Prometheus sends e.g. 'application/openmetrics-text;version=1.0.0,...;q=0.75,
    text/plain;version=0.0.4;q=0.5,*/*;q=0.1'; we honour the highest-q offer we can serve.
    """
    if not accept_header:
        return False
    best_q, best_is_om = -1.0, False
    for offer in accept_header.split(","):
        media, *params = (p.strip() for p in offer.split(";"))
        q = 1.0
        version = None
        for param in params:
            key, _, val = param.partition("=")
            if key.strip() == "q":
                try:
                    q = float(val)
                except ValueError:
                    q = 0.0
            elif key.strip() == "version":
                version = val.strip()
        if media == "application/openmetrics-text" and version in (None, "1.0.0"):
            is_om = True
        elif media in ("text/plain", "*/*", "text/*"):
            is_om = False
        else:
            continue
        if q > best_q:
            best_q, best_is_om = q, is_om
    return best_is_om
