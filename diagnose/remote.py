"""Rules evaluated where the data is: `fleetscope diagnose --prometheus URL` on the query engine.

Prometheus (or anything speaking its query API: VictoriaMetrics, Thanos, Mimir) evaluates
the terms of the rules' conditions, and only the label sets each term keeps come back:

    GET /api/v1/label/__name__/values?match[]=...     which signals the source has
    GET /api/v1/query_range  query=<terms, batched>    each distinct term of every condition
                             start, end, step=15s      once over the evaluation steps, many
                                                       terms a query (diagnose/terms.py)
    GET /api/v1/query        query=<evidence PromQL with instance=~"n1|n2|...">, time=...
                                                       evidence, for the firing nodes alone,
                                                       batched the same way

(GET throughout: node filters are split and batches sized so no query passes
MAX_QUERY_CHARS.)

The set operations joining terms into each condition, and persistence (held at
HOLD_FRACTION of the steps, events at one), are judged in Python with the in-process
engine's own code (SetOp, engine.held_label_sets), so a node is a finding here exactly when
it would be one in-process. The queries follow the catalog's distinct terms, not its rules
(the harm terms sit in most conditions); answers, memory and time follow the findings, not
the nodes.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone

from fleetscope.rules.catalog import CATALOG, NODE_LABELS, Rule
from fleetscope.rules.harm import HARM_SIGNALS, POOL_HARMS, pick_target
from fleetscope.rules.harm import targets as harm_targets
from fleetscope.rules.promql import Count, Expr, Labels, Scalar, Selector, Series, Vector
from fleetscope.rules.terms import TERM_RECORD_PREFIX, TERMS_GROUP, TERMS_RECORDED, record_name

from . import accelerator_fleet, engine, fleet_findings, prometheus, terms

NODE_LABEL = NODE_LABELS[0]
STEP_SECONDS = 15.0  # the scrape interval the rules' windows assume
DEADLINE_SECONDS = 60.0  # the whole diagnosis, every query included
MAX_ANSWER_BYTES = 64 * 2**20  # one answer, decompressed: firing label sets are small
# The window ends this long before now: the newest samples are still arriving (remote
# write batches), and VictoriaMetrics hides them (-search.latencyOffset, 30 s by default),
# so both engines judge the same, complete steps.
SETTLE_SECONDS = 30.0
PARALLEL_QUERIES = 8  # at once against the engine: enough to hide latency, not a stampede
NODES_PER_QUERY = 200  # instance=~"a|b|..." alternatives in one evidence query
# VictoriaMetrics refuses longer queries (-search.maxQueryLen, 16 KiB by default).
MAX_QUERY_CHARS = 16_000
# What fleet findings group nodes by (diagnose/fleet_findings.py): CPU model and stepping
# with the target labels, node_exporter's kernel release, the RDMA devices.
ATTRIBUTE_METRICS = ("fleetscope_cpu_info", "node_uname_info", "fleetscope_rdma_device_info")
# Labels of the scrape, not of the condition; the in-process path drops them the same way.
DROPPED_LABELS = ("__name__", "job")


class RemoteError(Exception):
    """The query engine unreachable, too slow or answering garbage: one line for the user."""


@dataclass
class QueryStats:
    """What a diagnosis cost the query engine: queries made, bytes received (on the wire)."""

    queries: int = 0
    bytes_received: int = 0
    # The conditions' distinct terms read from the engine's recorded series (rules export
    # loaded over the window) and those it computed.
    terms_recorded: int = 0
    terms_computed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, received: int) -> None:
        with self.lock:
            self.queries += 1
            self.bytes_received += received

    def to_json(self) -> dict:
        return {"queries": self.queries, "bytes_received": self.bytes_received,
                "terms_recorded": self.terms_recorded, "terms_computed": self.terms_computed}


class QueryClient:
    """The query API of one engine, under one deadline, a cap on each answer's size and
    one on all the answers it holds (prometheus.AnswerBudget)."""

    def __init__(self, base: str, deadline_seconds: float = DEADLINE_SECONDS,
                 max_answer_bytes: int = MAX_ANSWER_BYTES,
                 max_held_bytes: int = prometheus.MAX_HELD_BYTES):
        self.base = base.rstrip("/")
        self._deadline = prometheus.Deadline(deadline_seconds)
        self._budget = prometheus.AnswerBudget(max_held_bytes)
        self.deadline_seconds = deadline_seconds
        self.max_answer_bytes = max_answer_bytes
        self.stats = QueryStats()
        # What answered with `warnings` (partial data), by the tag of the query's purpose.
        self.warnings: dict[str, list[str]] = {}

    def _warned(self, tag: str, warnings: list[str]) -> None:
        if warnings:
            with self.stats.lock:
                self.warnings.setdefault(tag, []).extend(warnings)

    def request(self, path: str, params: list[tuple[str, str]] | dict,
                tag: str = "") -> dict | list:
        """The `data` of a successful answer; RemoteError otherwise. The transport is the
        hardened one of diagnose/prometheus.py: one deadline for the whole command (a
        watchdog closes a socket that trickles), answers capped, every shape checked."""
        try:
            body = prometheus.fetch(self.base, path, params, self._deadline, self._budget)
        except TimeoutError:
            raise RemoteError(f"query engine at {self.base} did not answer within "
                              f"{self.deadline_seconds:g} s (--timeout), the deadline for all "
                              "its queries") from None
        except prometheus.PrometheusError as err:
            raise RemoteError(str(err)) from None
        self.stats.add(len(body))
        if len(body) > self.max_answer_bytes:
            raise self._too_large(path)
        if path.startswith("/api/v1/label/"):  # its data is a list of values
            try:
                document = json.loads(body)
            except (ValueError, RecursionError):
                raise RemoteError(f"query engine at {self.base} did not answer JSON") from None
            data = document.get("data") if isinstance(document, dict) else None
            if not isinstance(data, list) or document.get("status") != "success":
                raise RemoteError(f"query engine at {self.base} gave no label values")
            self._warned(tag or path, prometheus.answer_warnings(document))
            return data
        try:
            data, warnings = prometheus.parse_document(self.base, body)
        except prometheus.PrometheusError as err:
            raise RemoteError(str(err)) from None
        self._warned(tag or path, warnings)
        return data

    def _too_large(self, path: str) -> RemoteError:
        return RemoteError(f"query engine at {self.base} answered {path} with more than "
                           f"{self.max_answer_bytes // 2**20} MiB")

    def query_range(self, promql: str, start: float, end: float, step: float,
                    tag: str = "") -> list[dict]:
        data = self.request("/api/v1/query_range", {
            "query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
            "step": f"{step:g}s"}, tag=tag)
        return _result(data, "matrix")

    def query(self, promql: str, at: float, tag: str = "") -> list[dict]:
        return _result(self.request("/api/v1/query", {"query": promql, "time": f"{at:.3f}"},
                                    tag=tag), "vector")

    def partial_reasons(self) -> list[str]:
        """One line per purpose whose answers came with warnings: the data was partial."""
        return [f"{tag}: {'; '.join(dict.fromkeys(warnings))[:300]}"
                for tag, warnings in sorted(self.warnings.items())]

    def label_values(self, label: str, matches: Iterable[str], start: float,
                     end: float) -> list[str]:
        params = [("match[]", m) for m in matches]
        params += [("start", f"{start:.3f}"), ("end", f"{end:.3f}")]
        data = self.request(f"/api/v1/label/{label}/values", params)
        if not isinstance(data, list):
            raise RemoteError(f"query engine at {self.base}: label values are not a list")
        return [str(v) for v in data]


def _result(data, kind: str) -> list[dict]:
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise RemoteError("query engine answered a result that is not a list")
    if data.get("resultType") not in (kind, None):
        raise RemoteError(f"query engine answered a {data.get('resultType')}, not a {kind}")
    return data["result"]


def labels_of(result: dict) -> Labels:
    metric = result.get("metric")
    if not isinstance(metric, dict):
        raise RemoteError("query engine answered a series without labels")
    return tuple(sorted((str(k), str(v)) for k, v in metric.items()
                        if k not in DROPPED_LABELS))


def _number(value) -> float:
    try:
        return float(value)  # "NaN", "+Inf" included, as the API writes them
    except (TypeError, ValueError):
        raise RemoteError(f"query engine answered a sample that is not a number: "
                          f"{str(value)[:40]!r}") from None


def with_matchers(expr: Expr, matchers: dict[str, str]) -> Expr:
    """The same expression with `matchers` added to every selector in it (an instance
    filter), so the engine reads only those nodes' series."""
    if isinstance(expr, Selector):
        return replace(expr, matchers={**(expr.matchers or {}), **matchers})
    if isinstance(expr, Scalar):
        return expr
    changes = {f.name: with_matchers(getattr(expr, f.name), matchers) for f in fields(expr)
               if isinstance(getattr(expr, f.name), Expr)}
    return replace(expr, **changes)


def node_filtered(expr: Expr, nodes: list[str]) -> list[Expr]:
    """`expr` filtered to `nodes`, NODES_PER_QUERY at a time, fewer where the filter in every
    selector of a long condition would pass MAX_QUERY_CHARS."""
    return [filtered for _chunk, filtered in node_chunks(expr, nodes)]


def node_chunks(expr: Expr, nodes: list[str]) -> list[tuple[list[str], Expr]]:
    """(nodes, `expr` filtered to them) for `nodes` NODES_PER_QUERY at a time, fewer where
    the filter in every selector of a long expression would pass MAX_QUERY_CHARS."""
    out, first, size = [], 0, NODES_PER_QUERY
    while first < len(nodes):
        chunk = nodes[first:first + size]
        filtered = with_matchers(expr, {NODE_LABEL: node_regex(chunk)})
        if size > 1 and len(filtered.promql()) > MAX_QUERY_CHARS:
            size = max(1, size // 2)
            continue
        out.append((chunk, filtered))
        first += len(chunk)
    return out


def node_regex(nodes: Iterable[str]) -> str:
    """A matcher value for `instance=~`: the nodes' names, RE2-escaped (the leading `~`
    marks a regex matcher in rules/promql.py)."""
    return "~" + "|".join(re.escape(node) for node in sorted(nodes))


def evaluation_steps(timestamps: list[int]) -> list[int]:
    """The steps the in-process engine judges on samples at `timestamps`: those with a
    full rate window behind them (engine.evaluation_steps)."""
    return engine.evaluation_steps(timestamps, engine.rate_window_ms(timestamps))


# Where the source has data in the window: the in-process engine judges the instants its
# samples exist at, so a node scraped for a minute is judged on that minute, not found
# "not persistent" over five.
PRESENCE = Count(Selector("fleetscope_exporter_build_info"))


@dataclass
class _Candidate:
    """A firing label set waiting for its evidence."""

    finding: engine.Finding
    at_ms: int
    vectors: list[Vector] = field(default_factory=list)


def _vector(result: list[dict]) -> Vector:
    """An instant query's answer as {labels without __name__/job: value}."""
    return {labels_of(item): _value(item) for item in result}


def _value(item: dict) -> float:
    return _number((item.get("value") or [0, "NaN"])[1])


def instant_vectors(client: QueryClient, queries: dict[str, str], at: float,
                    parallel: int = PARALLEL_QUERIES) -> dict[str, Vector]:
    """Each PromQL expression's instant vector at `at`, `parallel` queries at a time."""
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return dict(zip(queries, pool.map(lambda promql: _vector(client.query(promql, at)),
                                          queries.values()), strict=True))


def recorded_vectors(client: QueryClient, recordings, at: float,
                     parallel: int = PARALLEL_QUERIES) -> dict[str, Vector]:
    """Each recording rule's vector at `at`: the recorded series where the engine has them
    (one query for all: `rules export` loaded), else its expression as an instant query."""
    names = "|".join(re.escape(r.record) for r in recordings)
    found: dict[str, Vector] = {}
    for item in client.query(f'{{__name__=~"{names}"}}', at):
        name = str((item.get("metric") or {}).get("__name__", ""))
        found.setdefault(name, {})[labels_of(item)] = _value(item)
    missing = {r.record: r.expr.promql() for r in recordings if r.record not in found}
    return {**found, **instant_vectors(client, missing, at, parallel)} if missing else found


@dataclass
class RemoteDiagnosis:
    findings: list[engine.Finding]
    not_evaluated: list[dict]
    nodes: list[str]
    window: tuple[float, float]
    stats: QueryStats
    fleet_findings: list[dict] = field(default_factory=list)
    # The fleet's inference modules by model and driver/firmware (accelerator_fleet.py).
    accelerator_groups: list[dict] = field(default_factory=list)
    from_alerts: bool = False  # the engine's firing alerts (alerts_diagnosis), not evaluated
    pending: list[dict] = field(default_factory=list)  # its pending alerts (pending_alerts)
    harm: list[engine.PoolHarm] = field(default_factory=list)  # the pools that hurt
    partial: list[str] = field(default_factory=list)  # why the data was partial, if it was


def diagnose_remote(base: str, seconds: float, node: str | None = None, *,
                    step: float = STEP_SECONDS, deadline_seconds: float = DEADLINE_SECONDS,
                    max_answer_bytes: int = MAX_ANSWER_BYTES,
                    max_held_bytes: int = prometheus.MAX_HELD_BYTES,
                    parallel: int = PARALLEL_QUERIES, now: float | None = None,
                    settle_seconds: float = SETTLE_SECONDS,
                    rules: tuple[Rule, ...] = CATALOG,
                    recorded: bool = True) -> RemoteDiagnosis:
    """Every rule evaluated by the engine at `base` over the `seconds` before `now` less
    `settle_seconds`, for one node (`node`, its instance label) or the whole fleet; the
    terms the engine records (rules export loaded) read from their series unless `recorded`
    is False."""
    client = QueryClient(base, deadline_seconds, max_answer_bytes, max_held_bytes)
    scope = {NODE_LABEL: node} if node else {}
    now = time.time() if now is None else now
    # Instants step apart ending now: the settled window ends `settle_seconds` earlier.
    now = round(now, 3)
    count = max(2, int(seconds // step) + 1)
    settle_steps = math.ceil(settle_seconds / step)
    instants = [int(round((now - k * step) * 1000)) for k in range(count + settle_steps)][::-1]
    presence = client.query_range(with_matchers(PRESENCE, scope).promql(),
                                  instants[0] / 1000, now, step)
    seen = sorted({int(round(_number(p[0]) * 1000)) for s in presence
                   for p in s.get("values") or []})
    # A source younger than the window is judged on all it has, up to now; an older one
    # on the settled window.
    grid = instants[:count] if seen and seen[0] <= instants[0] else instants[-count:]
    end = grid[-1] / 1000
    window = (grid[0] / 1000, end)
    stamps = [t for t in seen if grid[0] <= t <= grid[-1]] or grid
    steps = evaluation_steps(stamps)
    # The fleet's metric names straight from the index; a node's from its own series.
    scope_match = [f'{{{NODE_LABEL}="{_escape(node)}"}}'] if node else []
    names = _present_names(client, scope_match, window)
    if node and not names.by_name:
        known = client.label_values(NODE_LABEL, prometheus.EXPORTER_PRESENCE, *window)
        raise RemoteError(prometheus.unknown_node(base, node, known))

    not_evaluated: list[dict] = []
    queries: list[tuple[Rule, int, str, Expr, str]] = []
    unavailable: set[tuple[str, str]] | None = None if node else set()  # a node's own only
    for rule in rules:
        missing = engine.missing_signals(rule, names)
        if missing:
            if unavailable is None:
                unavailable = _unavailable_sources(client, scope, end)
            not_evaluated.append(engine.not_evaluated_item(rule.id, missing, names.names(),
                                                           unavailable))
            continue
        if rule.needs_rates and stamps[-1] == stamps[0]:
            not_evaluated.append({"rule": rule.id,
                                  "reason": "one sample only: rates need at least two"})
            continue
        for tier, level in enumerate(rule.levels()):
            expr = with_matchers(level.condition, scope) if scope else level.condition
            queries.append((rule, tier, level.severity, expr, level.summary))

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        harm_conditions = [with_matchers(c, scope) if scope else c for c in POOL_HARMS]
        term_vectors, partial_terms = _term_vectors(
            client, pool, [query[3] for query in queries] + harm_conditions, steps, step, scope,
            recorded)
        candidates = _candidates(queries, [terms.condition_vectors(query[3], term_vectors, steps)
                                           for query in queries], steps)
        _fetch_evidence(client, pool, candidates, scope)
        harm = remote_harm(client, pool, steps, scope, [terms.condition_vectors(
            condition, term_vectors, steps) for condition in harm_conditions])

    # A rule with a term that came back with warnings (a store down) is not judged on the
    # part that answered: no finding from it, and no clean bill either.
    warned = {query[0].id: reason for query in queries
              for term in terms.terms(query[3])
              if (reason := partial_terms.get(term.promql()))}
    candidates = [c for c in candidates if c.finding.rule.id not in warned]
    not_evaluated += [{"rule": rule_id, "reason": f"partial answer from the query engine: "
                       f"{reason}"} for rule_id, reason in sorted(warned.items())]
    findings = engine.drop_explained(_with_evidence(candidates, rules))
    engine.explain(harm, findings)
    findings.sort(key=engine.rank_key(rules))
    if node:
        answer = RemoteDiagnosis(findings, not_evaluated, [node], window, client.stats)
    else:
        answer = _fleet_answer(client, findings, not_evaluated, window)
    answer.harm = harm
    answer.partial = client.partial_reasons()
    return answer


HARM_TAG = "harm"
TERMS_TAG = "terms "


def _term_vectors(client: QueryClient, pool: ThreadPoolExecutor, conditions: list[Expr],
                  steps: list[int], step: float, scope: dict[str, str],
                  use_recorded: bool = True
                  ) -> tuple[dict[str, dict[int, Vector]], dict[str, str]]:
    """Every distinct term of `conditions` over the steps, from range queries batching many
    terms each (diagnose/terms.py): first the terms that drive a condition (terms.driving),
    for the whole fleet; then the others for the nodes where a condition using them can
    hold, none where no condition can; each read from its recorded series where the engine
    keeps them over the window (and `use_recorded`). Returns ({term PromQL: {step: vector}},
    {term PromQL: the warnings its answer came with}, for the terms whose data was
    partial)."""
    start_s, end_s = steps[0] / 1000, steps[-1] / 1000
    step_set = set(steps)
    vectors: dict[str, dict[int, Vector]] = {}
    tags: dict[str, list[str]] = {}  # the tag of each batch -> the terms in it

    def fetch(jobs: list[tuple[str, str]], round_name: str) -> None:
        """(term PromQL, the PromQL sent for it: the term, or it for some nodes)."""
        texts = [sent for _, sent in jobs]

        def ask(promql: str, indices: list[int]) -> list[dict]:
            tag = f"{TERMS_TAG}{round_name} {indices[0]}"  # a batch's own: asked in threads
            tags[tag] = [jobs[index][0] for index in indices]
            return client.query_range(promql, start_s, end_s, step, tag)

        for (term, _sent), answer in zip(jobs, terms.fetch_batched(
                texts, ask, pool, MAX_QUERY_CHARS), strict=True):
            for at_ms, vector in _per_step(answer, step_set).items():
                vectors.setdefault(term, {}).setdefault(at_ms, {}).update(vector)

    every = {term.promql(): term for condition in conditions
             for term in terms.terms(condition)}
    # Terms the engine keeps recorded over the whole window are read, not computed.
    recorded = _recorded_terms(client, steps, step, start_s, end_s) if use_recorded else {}
    sent = {text: Selector(recorded[text]) if text in recorded else term
            for text, term in every.items()}
    drivers = {term.promql(): term for condition in conditions
               for term in (terms.terms(condition) if scope
                            else terms.driving(condition, NODE_LABEL))}
    client.stats.terms_recorded = sum(text in recorded for text in every)
    client.stats.terms_computed = len(every) - client.stats.terms_recorded
    fetch([(text, with_matchers(sent[text], scope).promql() if scope else sent[text].promql())
           for text in drivers], "drivers")
    nodes: dict[str, set[str] | None] = {}  # a filter term -> its nodes (None: every node)
    for condition in conditions:
        driven = [t for t in terms.terms(condition) if t.promql() not in drivers]
        if not driven:
            continue
        found = [dict(labels).get(NODE_LABEL) for term in terms.driving(condition, NODE_LABEL)
                 for vector in vectors.get(term.promql(), {}).values() for labels in vector]
        for term in driven:
            known = nodes.setdefault(term.promql(), set())
            if known is not None:
                nodes[term.promql()] = None if None in found else known | set(found)
    jobs = []
    for text, wanted in nodes.items():
        if wanted is None or len(wanted) > NODES_PER_QUERY:
            # Beyond one filter's worth of nodes, the term for every node: one query, not
            # one per filter (the engine matches a long regex against the fleet anyway).
            jobs.append((text, sent[text].promql()))
        elif wanted:
            jobs += [(text, expr.promql()) for _chunk, expr in
                     node_chunks(sent[text], sorted(wanted))]
    fetch(jobs, "filters")
    for text in every:
        vectors.setdefault(text, {})
    partial: dict[str, str] = {}
    for tag, warnings in client.warnings.items():
        for text in tags.get(tag, []):
            partial[text] = "; ".join(dict.fromkeys(warnings))[:200]
    return vectors, partial


def _recorded_terms(client: QueryClient, steps: list[int], step: float, start_s: float,
                    end_s: float) -> dict[str, str]:
    """{term PromQL: its recorded series} for the terms the engine records (`rules export`'s
    group fleetscope-terms loaded, the rule healthy) over every step of the window (its
    TERMS_RECORDED sample at each); empty where it records none or not for that long."""
    try:
        data = client.request("/api/v1/rules", {"type": "record"})
    except RemoteError:
        return {}  # no rules API here (VictoriaMetrics without vmalert behind it)
    found: dict[str, str] = {}
    groups = data.get("groups") if isinstance(data, dict) else None
    for group in groups if isinstance(groups, list) else []:
        if not isinstance(group, dict) or group.get("name") != TERMS_GROUP:
            continue
        for loaded in group.get("rules") or []:
            if not isinstance(loaded, dict) or loaded.get("health") != "ok":
                continue
            name, query = str(loaded.get("name", "")), loaded.get("query")
            if isinstance(query, str) and name.startswith(TERM_RECORD_PREFIX):
                found[query] = name
    if not found:
        return {}
    covered = _per_step(client.query_range(TERMS_RECORDED, start_s, end_s, step, TERMS_TAG),
                        set(steps))
    if len(covered) < len(steps):
        return {}  # loaded since less than the window: those before are not recorded
    # A record is read for its term only under the name this version gives the term.
    return {query: name for query, name in found.items()
            if name == record_name(query)}


def remote_harm(client: QueryClient, pool: ThreadPoolExecutor, steps: list[int],
                scope: dict[str, str], pool_harms: list[list[tuple[int, Vector]]]
                ) -> list[engine.PoolHarm]:
    """Each pool's harm over the window, as the in-process engine judges it (held_harm),
    from each harm signal's pools over target at every step (`pool_harms`, from the terms
    the conditions share) and the targets of the nodes that hurt (batched instant queries)."""
    end_s = steps[-1] / 1000
    hurting = [(signal, vectors) for signal, vectors in zip(HARM_SIGNALS, pool_harms,
                                                            strict=True)
               if any(vector for _, vector in vectors)]
    jobs: list[tuple[int, str]] = []  # (signal's place in `hurting`, its targets' query)
    for place, (signal, vectors) in enumerate(hurting):
        nodes = sorted({dict(labels).get(NODE_LABEL, "") for _, vector in vectors
                        for labels in vector} - {""})
        chunks = node_chunks(harm_targets(signal), nodes) if not scope else \
            [(nodes, with_matchers(harm_targets(signal), scope))]
        jobs += [(place, expr.promql()) for _chunk, expr in chunks]
    answers = terms.fetch_batched([text for _, text in jobs], lambda promql, _indices:
                                  client.query(promql, end_s, HARM_TAG), pool, MAX_QUERY_CHARS)
    target_vectors: list[Vector] = [{} for _ in hurting]
    for (place, _text), answer in zip(jobs, answers, strict=True):
        target_vectors[place].update(_vector(answer))
    harm = []
    for (signal, vectors), target_vector in zip(hurting, target_vectors, strict=True):
        harm += engine.held_harm(
            signal, vectors, len(steps), "?", engine.HOLD_FRACTION,
            lambda _at, labels, s=signal, v=target_vector: pick_target(v, s, labels))
    return harm


def _per_step(result: list[dict], step_set: set[int]) -> dict[int, Vector]:
    """A range answer as {step: vector}, the steps outside `step_set` left out."""
    per_step: dict[int, Vector] = {}
    for series in result:
        labels = labels_of(series)
        for point in series.get("values") or []:
            at_ms = int(round(_number(point[0]) * 1000))
            if at_ms in step_set:
                per_step.setdefault(at_ms, {})[labels] = _number(point[1])
    return per_step


EVIDENCE_TAG = "evidence"


def _unavailable_sources(client: QueryClient, scope: dict[str, str], at: float
                        ) -> set[tuple[str, str]]:
    """The sources the node's collectors could not read at `at` (none if the query fails:
    the reason then falls back to the usual one)."""
    try:
        answer = client.query(with_matchers(engine.UNAVAILABLE, scope).promql(), at)
    except RemoteError:
        return set()
    return {(s["metric"].get("collector", ""), s["metric"].get("source", ""))
            for s in answer if "collector" in s.get("metric", {})}


def _present_names(client: QueryClient, matches: list[str],
                   window: tuple[float, float]) -> Series:
    """The metric names the source has in the window (matching `matches`), straight from
    the index, as an empty Series the engine's missing-signal check reads."""
    names = Series()
    names.by_name = {name: {} for name in client.label_values("__name__", matches, *window)}
    return names


def _fleet_answer(client: QueryClient, findings: list[engine.Finding],
                  not_evaluated: list[dict], window: tuple[float, float]) -> RemoteDiagnosis:
    """The fleet's nodes and what its sick nodes share (fleet findings), around findings."""
    end = window[1]
    nodes = client.label_values(NODE_LABEL, ("fleetscope_exporter_build_info",
                                             "fleetscope_cpu_info"), window[0], window[1])
    nodes = sorted(set(nodes) | {f.node for f in findings})
    with ThreadPoolExecutor(max_workers=4) as pool:
        modules = pool.submit(accelerator_fleet.accelerator_groups, client, end)
        info = list(pool.map(lambda name: [dict(labels_of(s)) for s in client.query(name, end)],
                             ATTRIBUTE_METRICS))
        groups = modules.result()
    attributes = fleet_findings.node_attributes(*info, node_label=NODE_LABEL)
    shared = fleet_findings.fleet_findings([f.to_json() for f in findings], attributes)
    return RemoteDiagnosis(findings, not_evaluated, nodes, window, client.stats, shared,
                           groups)


# The console on a Prometheus that evaluates `fleetscope rules export`: its alerts are the
# rules' conditions held for their `for:`, already evaluated; reading them costs the engine
# one call instead of every condition over the window.
ALERT_META_LABELS = ("alertname", "alertstate", "severity", "fleetscope_rule",
                     "fleetscope_phase")


def loaded_alerts(rules_data: dict, rules: tuple[Rule, ...] = CATALOG,
                  state: str = "firing") -> list[dict] | None:
    """The alerts in `state` (firing, or pending: the condition holds, not yet for its
    `for:`) of /api/v1/rules's `data` when it holds every alert of `rules` exactly as
    `rules export` writes them (same expression and `for:`, evaluated without error); None
    otherwise (not loaded, another version or `--for`: evaluate instead)."""
    wanted = {(rule.alert_name, level.severity, level.phase): (level.condition.promql(),
                                                                rule.for_seconds)
              for rule in rules for level in rule.levels()}
    found: dict[tuple[str, str], tuple[str, float]] = {}
    firing: list[dict] = []
    groups = rules_data.get("groups") if isinstance(rules_data, dict) else None
    for group in groups if isinstance(groups, list) else []:
        for loaded in (group.get("rules") or []) if isinstance(group, dict) else []:
            labels = loaded.get("labels") if isinstance(loaded, dict) else None
            if not isinstance(labels, dict) or "fleetscope_rule" not in labels:
                continue
            if loaded.get("type") != "alerting" or loaded.get("health") != "ok":
                return None  # one of ours not evaluated cleanly: do not trust the rest
            if not isinstance(loaded.get("alerts"), list):
                return None  # no alerts listed with the rule (vmalert 1.79 behind a proxy)
            key = (str(loaded.get("name")), str(labels.get("severity")),
                   str(labels.get("fleetscope_phase")))
            try:
                found[key] = (str(loaded.get("query")), _number(loaded.get("duration", 0)))
            except RemoteError:
                return None
            firing += [alert for alert in loaded["alerts"]
                       if isinstance(alert, dict) and alert.get("state") == state]
    if found != wanted:
        return None
    return firing


def alerts_diagnosis(base: str, seconds: float, *, deadline_seconds: float = DEADLINE_SECONDS,
                     parallel: int = PARALLEL_QUERIES, now: float | None = None,
                     rules: tuple[Rule, ...] = CATALOG) -> RemoteDiagnosis | None:
    """The fleet's findings from the alerts the engine fires for the exported rules
    (GET /api/v1/rules), with their evidence fetched for the firing nodes; None when the
    engine does not evaluate exactly these rules (diagnose_remote then evaluates them)."""
    client = QueryClient(base, deadline_seconds)
    try:
        data = client.request("/api/v1/rules", {"type": "alert"})
    except RemoteError:
        return None  # no rules API here (VictoriaMetrics without vmalert behind it)
    firing = loaded_alerts(data, rules)
    if firing is None:
        return None
    now = time.time() if now is None else now
    window = (now - seconds, now)
    names = _present_names(client, [], window)
    not_evaluated = [engine.not_evaluated_item(rule.id, missing, names.names())
                     for rule in rules if (missing := engine.missing_signals(rule, names))]
    candidates = alert_candidates(firing, now, rules)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        _fetch_evidence(client, pool, candidates, {})
    answer = _fleet_answer(client, _with_evidence(candidates, rules), not_evaluated, window)
    answer.from_alerts = True
    answer.pending = pending_alerts(loaded_alerts(data, rules, "pending") or [], rules)
    return answer


def pending_alerts(alerts: list[dict], rules: tuple[Rule, ...] = CATALOG) -> list[dict]:
    """Pending alerts as {rule, severity, node, since (epoch seconds or None), for_seconds}:
    a fault that began inside its rule's `for:` is not a finding yet, but the node is not
    fine either. One per rule and node, the most severe tier; malformed ones are skipped."""
    by_id = {rule.id: rule for rule in rules}
    chosen: dict[tuple[str, str], dict] = {}
    for alert in alerts:
        labels = alert.get("labels") if isinstance(alert.get("labels"), dict) else {}
        rule = by_id.get(str(labels.get("fleetscope_rule", "")))
        node = labels.get(NODE_LABEL)
        severity = str(labels.get("severity", ""))
        if rule is None or node is None or severity not in engine.SEVERITY_RANK:
            continue
        item = {"rule": rule.id, "severity": severity, "node": str(node),
                "since": _rfc3339(alert.get("activeAt")), "for_seconds": rule.for_seconds}
        key = (rule.id, item["node"])
        if key not in chosen or (engine.SEVERITY_RANK[severity]
                                 < engine.SEVERITY_RANK[chosen[key]["severity"]]):
            chosen[key] = item
    return sorted(chosen.values(), key=lambda item: (engine.SEVERITY_RANK[item["severity"]],
                                                    item["rule"], item["node"]))


def _rfc3339(text) -> float | None:
    """Prometheus's activeAt ('2026-12-05T17:05:10.123456789Z') as epoch seconds."""
    if not isinstance(text, str) or not text:
        return None
    head, _, fraction = text.rstrip("Z").partition(".")
    try:
        moment = datetime.fromisoformat(head).replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    digits = "".join(ch for ch in fraction if ch.isdigit())[:6]
    return moment.timestamp() + (int(digits) / 10 ** len(digits) if digits else 0.0)


def alert_candidates(firing: list[dict], now: float,
                     rules: tuple[Rule, ...] = CATALOG) -> list[_Candidate]:
    """A finding per firing alert (its labels less the alert's own, its value), the most
    severe tier per label set; an alert naming no rule tier or node, or without a number,
    is skipped."""
    by_id = {rule.id: rule for rule in rules}
    tiers = {(rule.id, level.severity, level.phase): (tier, level.summary, level.phase)
             for rule in rules for tier, level in enumerate(rule.levels())}
    chosen: dict[tuple[str, str], tuple[int, _Candidate]] = {}
    for alert in sorted(firing, key=lambda a: json.dumps(a.get("labels"), sort_keys=True)):
        labels = {str(k): str(v) for k, v in (alert.get("labels") or {}).items()}
        rule = by_id.get(labels.get("fleetscope_rule", ""))
        tier = tiers.get((rule.id, labels.get("severity", ""),
                          labels.get("fleetscope_phase", ""))) if rule else None
        node = labels.get(NODE_LABEL)
        try:
            value = _number(alert.get("value"))
        except RemoteError:
            continue  # one malformed alert costs that alert
        if tier is None or node is None:
            continue
        finding_labels = {k: v for k, v in labels.items() if k not in ALERT_META_LABELS}
        finding = _finding(rule, node, finding_labels, value, labels["severity"], tier[1], 1.0,
                           tier[2])
        key = (rule.id, json.dumps(sorted(finding_labels.items())))
        if key not in chosen or tier[0] < chosen[key][0]:
            chosen[key] = (tier[0], _Candidate(finding, int(round(now * 1000))))
    return [candidate for _, candidate in chosen.values()]


def _finding(rule: Rule, node: str, labels: dict[str, str], value: float, severity: str,
             summary: str, held_ratio: float, phase: str) -> engine.Finding:
    finding = engine.Finding(rule, node, labels, value, rule.confidence, severity=severity,
                             summary_template=summary, held_ratio=held_ratio, phase=phase)
    for kind, label in rule.subject_labels.items():
        if label in labels:
            finding.subjects[kind].append(engine._subject_value(kind, labels[label]))
    return finding


def _with_evidence(candidates: list[_Candidate], rules: tuple[Rule, ...]) -> list:
    """The findings of the candidates, their evidence fetched: one per rule and node, worst
    first as the in-process engine ranks them."""
    by_rule_node: dict[tuple[str, str], list[engine.Finding]] = {}
    for candidate in candidates:
        finding = candidate.finding
        finding.evidence = engine.evidence_from(finding.rule, finding.labels,
                                                candidate.vectors)
        finding.confidence = engine._confidence(finding.rule, finding.evidence)
        engine.name_subjects(finding, candidate.vectors)
        by_rule_node.setdefault((finding.rule.id, finding.node), []).append(finding)
    findings = [engine._merge(same) for same in by_rule_node.values()]
    findings.sort(key=engine.rank_key(rules))
    return findings


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _candidates(queries, answers: list[list[tuple[int, Vector]]],
                steps: list[int]) -> list[_Candidate]:
    """Firing label sets of every rule, from each condition's vector at every step, the
    most severe tier per node, as the in-process engine picks them."""
    out: list[_Candidate] = []
    tier_of: dict[tuple[str, str], int] = {}  # (rule, node) -> the tier that holds there
    for (rule, tier, severity, _expr, summary), vectors in zip(queries, answers, strict=True):
        hold = engine.HOLD_FRACTION if rule.for_seconds else 0.0
        held = engine.held_label_sets(vectors, len(steps), hold)
        for labels, record in sorted(held.items()):
            finding_labels = dict(labels)
            node = finding_labels.get(NODE_LABEL, "?")
            if tier_of.setdefault((rule.id, node), tier) != tier:
                continue  # a more severe tier already holds on this node
            finding = _finding(rule, node, finding_labels, record.value, severity, summary,
                               record.steps / len(steps), rule.levels()[tier].phase)
            out.append(_Candidate(finding, record.last_ms))
    return out


def _fetch_evidence(client: QueryClient, pool: ThreadPoolExecutor,
                    candidates: list[_Candidate], scope: dict[str, str]) -> None:
    """Each evidence expression once per (rule, time) for up to NODES_PER_QUERY firing
    nodes at a time (fewer where a long expression would pass MAX_QUERY_CHARS), then split
    back to the findings by their labels."""
    groups: dict[tuple[str, int], list[_Candidate]] = {}
    for candidate in candidates:
        groups.setdefault((candidate.finding.rule.id, candidate.at_ms), []).append(candidate)
    jobs = []
    for (_rule_id, at_ms), members in groups.items():
        rule = members[0].finding.rule
        nodes = sorted({m.finding.node for m in members})
        for index, item in enumerate(rule.evidence):
            chunks = [(nodes, with_matchers(item.expr, scope))] if scope else \
                node_chunks(item.expr, nodes)
            for chunk, filtered in chunks:
                jobs.append((members, set(chunk), index, filtered.promql(), at_ms / 1000))
    answers: list[list[dict]] = [[] for _ in jobs]
    for at in sorted({job[4] for job in jobs}):  # one batch of queries per instant
        places = [place for place, job in enumerate(jobs) if job[4] == at]
        batch = terms.fetch_batched([jobs[place][3] for place in places],
                                    lambda promql, _indices, at=at: client.query(
                                        promql, at, EVIDENCE_TAG), pool, MAX_QUERY_CHARS)
        for place, answer in zip(places, batch, strict=True):
            answers[place] = answer
    vectors: dict[tuple[int, int], Vector] = {}  # (candidate id, evidence index) -> samples
    for (members, chunk, index, _query, _at), result in zip(jobs, answers, strict=True):
        vector = _vector(result)
        for member in members:
            if member.finding.node in chunk:
                vectors[(id(member), index)] = vector
    for candidate in candidates:
        candidate.vectors = [vectors.get((id(candidate), index), {})
                             for index in range(len(candidate.finding.rule.evidence))]

