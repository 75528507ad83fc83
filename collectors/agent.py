"""Collector `agent`: the agent runtime's signals and its Redis queue depths.

Inputs:
    agent_metrics_url   the runtime's Prometheus endpoint (fleetscope.agent_signals serves it):
        # TYPE agent_stage_duration_seconds histogram
        agent_stage_duration_seconds_bucket{pool="chat-online",stage="inference",le="0.5"} 41
    redis_url, redis_queues   TYPE, then LLEN (lists) or XLEN + XINFO GROUPS (streams)
    agent.prom          in a bundle sample: the same text, recorded (docs/bundle-format.md)

Live (`scrape.evidence.live`: `--root /`, `/host` in a container): fetches
`agent_metrics_url` and asks Redis, both at once and never longer than
`agent_timeout_seconds` in all; a slow endpoint leaves its request finishing in the
background and this scrape reports the source unavailable. Replay (a recorded sample: a
bundle sample, or a fixture root with agent.prom): reads `agent.prom` from the root and
touches no network.

Re-exported as they are: the families named `agent_*` (docs/metrics-and-rules.md) and `gen_ai_*`
(OpenTelemetry GenAI conventions); everything else on the endpoint (target_info, process_*)
is dropped. Untyped families come out as gauges, counters always as `<name>_total`.

GenAI mapping: for a stage the runtime reports in no `agent_stage_duration_seconds` series,
these OTel GenAI histograms stand in, summed over their other labels:
    gen_ai_client_operation_duration_seconds, gen_ai_operation_name chat, generate_content,
        text_completion, embeddings (or none)            -> stage="inference"
    gen_ai_client_operation_duration_seconds, gen_ai_operation_name="execute_tool",
        and gen_ai_execute_tool_duration_seconds (draft)  -> stage="tool_call"
The pool is the series' `pool` label, else the config's only pool, else "unknown". Series with
different bucket bounds are merged on the union of bounds, each counting at a bound what it
counted at its nearest lower bound (never more than the true count).

Queue depth, `agent_queue_depth{pool,queue=<key>}`: a list's LLEN; a stream's backlog, the
largest `lag + pending` over its consumer groups (entries not yet delivered plus delivered but
not acknowledged; XLEN stands in for a group whose lag Redis cannot tell), or XLEN when it has
no group; a missing key is 0. A stream's XLEN alone is not a backlog (it counts acknowledged
entries until trimmed), so it has its own gauge, beside the per-group lag, pending and
consumers. Redis values replace the runtime's own agent_queue_depth for the same pool and
queue. In replay the depth comes from agent.prom only (the bundle recorder writes the
collector's agent_* output there: `agent_prom()` below).

Redis unreachable: source `redis` unavailable and one log line; the rest of the scrape is
unaffected. The `redis` package is imported only when redis_url is set.
"""

from __future__ import annotations

import http.client
import math
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from fleetscope import __version__
from fleetscope.agent_runtime import schema
from fleetscope.core.bundle_format import MAX_SERIES
from fleetscope.core.exposition import (
    Family,
    LabelSet,
    format_value,
    gauge,
    label_set,
    labels,
    render,
)

from .base import Collector, Evidence, NotAvailable, Scrape, Signal, configured_but_unread
from .parsers import ParseError
from .source import LiveHost

AGENT_PROM = "agent.prom"
MAX_BODY_BYTES = 16 * 1024 * 1024
KEPT_PREFIXES = ("agent_", "gen_ai_")
# A source reported unavailable when a bundle's agent series alone took its replay past the
# series limit of a bundle and were left out (diagnose/evidence.py).
OVER_BUNDLE_LIMIT = "agent.prom over the series limit of a bundle"
_NAME = re.compile(r"(agent|gen_ai)_[a-zA-Z0-9_]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
# Sample-name suffixes each family type may carry (`_created` is optional; dropped).
_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum"),
             "summary": ("", "_count", "_sum")}
STAGE_FAMILY = schema.STAGE_DURATION.name
QUEUE_FAMILY = schema.QUEUE_DEPTH.name
MODULE_QUEUE_FAMILY = schema.MODULE_QUEUE_DEPTH.name  # re-exported as the runtime wrote it
GENAI_OPERATION = schema.GENAI_OPERATION_DURATION
GENAI_TOOL = schema.GENAI_TOOL_DURATION
INFERENCE_OPERATIONS = {None, "chat", "generate_content", "text_completion", "embeddings"}


@dataclass
class AgentFamily:
    """One parsed family: `name` as exposed (counters end in _total); samples are
    (sample name, labels, value)."""

    name: str
    type: str
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def to_family(self) -> Family:
        """The family as data: every sample keeps its own name (`_bucket`, `_sum`...)."""
        family = Family(self.name, self.type, self.help)
        family.named_samples = [(name, _label_set(sample_labels), value)
                                for name, sample_labels, value in self.samples]
        return family


def _label_set(pairs: dict[str, str]) -> LabelSet:
    ordered = sorted(pairs, key=lambda key: (key in ("le", "quantile"), key))
    return label_set(tuple(ordered), tuple([pairs[key] for key in ordered]))


# Series in one exposition: a runtime's pools x stages x histogram buckets and its tools x
# models x outcomes are some thousands. The text parser costs ~0.1 ms a series, so a bigger
# one is refused by a count before it is parsed.
MAX_EXPOSITION_SERIES = 20_000


def _series_count(text: str) -> int:
    """Sample lines of a text exposition (comments and blank lines are not series)."""
    if text.count("\n") <= MAX_EXPOSITION_SERIES:
        return text.count("\n") + 1
    return sum(1 for line in text.splitlines() if line.strip() and not line.startswith("#"))


def parse_agent_exposition(text: str) -> list[AgentFamily]:
    """The agent_* and gen_ai_* families of a Prometheus text exposition, or ParseError.

    Samples with label names the text format cannot carry are skipped; duplicate families
    are merged and duplicate series keep their first value, so the result renders as valid
    text and OpenMetrics whatever the runtime sent.

    >>> [f.name for f in parse_agent_exposition('agent_queue_depth{pool="p",queue="q"} 3\\n')]
    ['agent_queue_depth']
    """
    from prometheus_client.parser import text_string_to_metric_families

    count = _series_count(text)
    if count > MAX_EXPOSITION_SERIES:
        raise ParseError(f"{count} series, over the {MAX_EXPOSITION_SERIES} series an agent "
                         "exposition may have: refused unparsed")
    try:
        parsed = list(text_string_to_metric_families(text))
    except (ValueError, IndexError, KeyError, TypeError) as err:
        raise ParseError(f"not in the Prometheus text format: {str(err)[:120]}") from None
    families: dict[str, AgentFamily] = {}
    seen: set[tuple[str, tuple]] = set()
    for metric in parsed:
        if not _NAME.match(metric.name):
            continue
        kind = "gauge" if metric.type in ("unknown", "untyped") else metric.type
        if kind not in _SUFFIXES:
            continue
        name = metric.name + "_total" if kind == "counter" else metric.name
        family = families.get(name)
        if family is None:
            family = families[name] = AgentFamily(name, kind, metric.documentation)
        elif family.type != kind:
            continue  # the same name with two types: keep the first
        allowed = {metric.name + suffix for suffix in _SUFFIXES[kind]}
        for sample in metric.samples:
            if sample.name not in allowed:
                continue
            if not all(_LABEL.match(key) and not key.startswith("__") for key in sample.labels):
                continue
            if kind == "histogram" and sample.name.endswith("_bucket"):
                _bound(sample.labels.get("le"), metric.name)
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key in seen:
                continue
            seen.add(key)
            family.samples.append((sample.name, dict(sample.labels), float(sample.value)))
    # A sample name may belong to one family only (a histogram `agent_h` and a gauge
    # `agent_h_bucket` would both write agent_h_bucket lines): the first family keeps it.
    kept, taken = [], set()
    for family in families.values():
        names = {name for name, _, _ in family.samples}
        if names and not names & taken:
            kept.append(family)
            taken |= names
    return kept


def _bound(le: str | None, name: str) -> float:
    try:
        value = float(le) if le is not None else math.nan
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise ParseError(f"{name}: histogram bucket without a numeric le label ({le!r})")
    return value


# -- GenAI -> agent_stage_duration_seconds ---------------------------------------------------

def _histograms(family: AgentFamily) -> dict[tuple, dict]:
    """Series of a histogram family: labels without le -> {buckets: {bound: n}, sum, count}."""
    series: dict[tuple, dict] = {}
    for name, sample_labels, value in family.samples:
        rest = {k: v for k, v in sample_labels.items() if k != "le"}
        entry = series.setdefault(tuple(sorted(rest.items())),
                                  {"buckets": {}, "sum": 0.0, "count": None})
        if name.endswith("_bucket"):
            entry["buckets"][_bound(sample_labels["le"], family.name)] = value
        elif name.endswith("_sum"):
            entry["sum"] = value
        else:
            entry["count"] = value
    return series


def _merge(histograms: list[dict]) -> tuple[list[tuple[float, float]], float, float]:
    """Sum histograms over the union of their bounds -> ([(bound, cumulative)], sum, count)."""
    bounds = sorted({b for h in histograms for b in h["buckets"] if not math.isinf(b)})
    cumulative = dict.fromkeys(bounds, 0.0)
    total_sum = total_count = 0.0
    for h in histograms:
        own = sorted((b, n) for b, n in h["buckets"].items() if not math.isinf(b))
        count = h["count"] if h["count"] is not None else h["buckets"].get(math.inf, 0.0)
        index, last = 0, 0.0
        for bound in bounds:
            while index < len(own) and own[index][0] <= bound:
                last = own[index][1]
                index += 1
            cumulative[bound] += last
        total_sum += h["sum"]
        total_count += count
    return [*cumulative.items(), (math.inf, total_count)], total_sum, total_count


def map_genai_stages(families: list[AgentFamily], default_pool: str) -> list[AgentFamily]:
    """Add agent_stage_duration_seconds{stage="inference"|"tool_call"} series derived from
    the GenAI durations for each of the two stages the runtime does not report itself."""
    by_name = {family.name: family for family in families}
    stages = by_name.get(STAGE_FAMILY)
    if stages is not None and stages.type != "histogram":
        return families
    present = set()  # stages the runtime reports itself, for any pool
    if stages is not None:
        present = {lbl.get("stage") for _, lbl, _ in stages.samples}
    groups: dict[tuple[str, str], list[dict]] = {}
    for source in (GENAI_OPERATION, GENAI_TOOL):
        family = by_name.get(source)
        if family is None or family.type != "histogram":
            continue
        for key, histogram in _histograms(family).items():
            series_labels = dict(key)
            operation = series_labels.get("gen_ai_operation_name")
            if source == GENAI_TOOL or operation == "execute_tool":
                stage = "tool_call"
            elif operation in INFERENCE_OPERATIONS:
                stage = "inference"
            else:
                continue  # invoke_agent, create_agent: whole sessions, not stages
            if stage not in present:
                pool = series_labels.get("pool") or default_pool
                groups.setdefault((pool, stage), []).append(histogram)
    if not groups:
        return families
    mine = {f"{STAGE_FAMILY}{suffix}" for suffix in _SUFFIXES["histogram"]}
    if any(name in mine for family in families if family is not stages
           for name, _, _ in family.samples):
        return families  # other families already write those sample names
    if stages is None:
        stages = AgentFamily(STAGE_FAMILY, "histogram",
                             "Time agent sessions spend in each stage (inference and tool_call "
                             "from OTel GenAI durations).")
        families = [*families, stages]
    for (pool, stage), histograms in sorted(groups.items()):
        buckets, total_sum, total_count = _merge(histograms)
        base = {"pool": pool, "stage": stage}
        for bound, count in buckets:
            stages.samples.append((f"{STAGE_FAMILY}_bucket",
                                   {**base, "le": format_value(float(bound))}, count))
        stages.samples.append((f"{STAGE_FAMILY}_sum", base, total_sum))
        stages.samples.append((f"{STAGE_FAMILY}_count", base, total_count))
    return families


# -- fetching, bounded in time ---------------------------------------------------------------

def _redact(url: str) -> str:
    """scheme://host:port/path of a URL: no credentials or query in logs and labels."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _late(what: str, timeout: float) -> str:
    """One message for a source too slow, whether the scrape's deadline or the socket's
    timeout noticed first (so it is logged once, not flapping between two texts)."""
    return f"{what}: no answer within {timeout:g} s"


def fetch_exposition(url: str, timeout: float, what: str = "agent endpoint") -> str:
    """GET a metrics endpoint (text format, no proxy, no compression); NotAvailable when it
    cannot be reached or answers other than 200."""
    where = _redact(url)
    if urlsplit(url).scheme not in ("http", "https"):
        raise NotAvailable(f"{what} {where} is not an http(s) URL")
    request = urllib.request.Request(url, headers={
        "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
        "User-Agent": f"fleetscope/{__version__}",
    })
    # A node-local endpoint: environment proxies must not apply.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            body = response.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as err:
        raise NotAvailable(f"{where} answered HTTP {err.code}") from None
    except (TimeoutError, urllib.error.URLError) as err:
        if isinstance(err, TimeoutError) or isinstance(err.reason, TimeoutError):
            raise NotAvailable(_late(what, timeout)) from None
        raise NotAvailable(f"{where} unreachable: {err.reason}") from None
    except (OSError, http.client.HTTPException, ValueError) as err:
        raise NotAvailable(f"{where} unreachable: {type(err).__name__}: {err}") from None
    if len(body) > MAX_BODY_BYTES:
        raise ParseError(f"{where} sent more than {MAX_BODY_BYTES} bytes")
    return body.decode("utf-8", "replace")


class _Background:
    """Runs one blocking call at a time in a daemon thread, so that a scrape waits for it no
    longer than its deadline. A scrape that comes while a call is still running waits for
    that call (within its own deadline) instead of starting another: two Prometheus replicas
    share one request, and a hung endpoint never collects a pile of threads."""

    def __init__(self, what: str):
        self.what = what
        self._lock = threading.Lock()
        self._running: tuple[threading.Thread, dict] | None = None

    def start(self, call: Callable[[], Any], timeout: float) -> Callable[[float], Any]:
        with self._lock:
            if self._running is None or not self._running[0].is_alive():
                outcome: dict[str, Any] = {}

                def run() -> None:
                    try:
                        outcome["value"] = call()
                    except BaseException as err:  # handed to the scrape thread below
                        outcome["error"] = err

                thread = threading.Thread(target=run, name=f"fleetscope-{self.what}",
                                          daemon=True)
                self._running = (thread, outcome)
                thread.start()
            thread, outcome = self._running

        def result(deadline: float) -> Any:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise NotAvailable(_late(self.what, timeout))
            if "error" in outcome:
                raise outcome["error"]
            return outcome["value"]

        return result


# -- Redis queues ----------------------------------------------------------------------------

@dataclass
class QueueReading:
    key: str
    pool: str
    kind: str = "none"  # list, stream, none (missing key) or another Redis type
    depth: float = 0.0
    length: float | None = None  # XLEN of a stream
    groups: list[dict] = field(default_factory=list)  # name, consumers, pending, lag
    error: str | None = None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def read_queues(client: Any, queues) -> list[QueueReading]:
    """Two pipelined round trips: TYPE of every key, then LLEN or XLEN + XINFO GROUPS."""
    readings = [QueueReading(q.key, q.pool) for q in queues]
    pipe = client.pipeline(transaction=False)
    for reading in readings:
        pipe.type(reading.key)
    for reading, kind in zip(readings, pipe.execute(), strict=True):
        reading.kind = _text(kind)
    pipe = client.pipeline(transaction=False)
    asked = []
    for reading in readings:
        if reading.kind == "list":
            pipe.llen(reading.key)
            asked.append((reading, "llen"))
        elif reading.kind == "stream":
            pipe.xlen(reading.key)
            pipe.xinfo_groups(reading.key)
            asked += [(reading, "xlen"), (reading, "groups")]
        elif reading.kind != "none":
            reading.error = f"{reading.key} is a Redis {reading.kind}, not a list or stream"
    answers = pipe.execute(raise_on_error=False) if asked else []
    for (reading, what), answer in zip(asked, answers, strict=True):
        if isinstance(answer, Exception):  # the key changed type in between: WRONGTYPE
            reading.error = f"{reading.key}: {_text(answer)}"
        elif what == "llen":
            reading.depth = float(answer)
        elif what == "xlen":
            reading.length = float(answer)
        else:
            for group in answer:
                group = {_text(k): v for k, v in group.items()}
                lag = group.get("lag")
                reading.groups.append({
                    "name": _text(group.get("name", "")),
                    "consumers": float(group.get("consumers") or 0),
                    "pending": float(group.get("pending") or 0),
                    "lag": None if lag is None else float(lag),
                })
    for reading in readings:
        if reading.kind == "stream" and reading.error is None:
            length = reading.length or 0.0
            backlogs = [(length if g["lag"] is None else g["lag"]) + g["pending"]
                        for g in reading.groups]
            reading.depth = max(backlogs) if backlogs else length
    return readings


def _redis_client(url: str, timeout: float) -> Any:
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        raise NotAvailable("the redis package is not installed: "
                           "pip install 'fleetscope[redis]'") from None
    # No retries: redis-py 6+ retries failed connections with backoff by default, which
    # would outlast the scrape's time budget.
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                retry=Retry(NoBackoff(), 0), decode_responses=True)


# -- the collector ---------------------------------------------------------------------------

class AgentCollector(Collector):
    name = "agent"
    # the runtime's schema titles its families: its HELP as a phrase, its unit as UCUM
    # writes it ("{session}": sessions)
    evidence = Evidence(
        described=((AGENT_PROM, "agent runtime metrics"),),
        signals=tuple(Signal(metric.name, metric.help[:1].lower() + metric.help[1:].rstrip("."),
                             metric.unit.strip("{}") + ("s" if metric.unit[:1] == "{" else ""))
                      for metric in schema.METRICS)
        + (Signal(schema.GENAI_OPERATION_DURATION, "GenAI client operation duration",
                  "s"),))
    missing_hints = (("agent_", "no agent runtime metrics: set agent_metrics_url / redis_queues "
                                "(a bundle carries them as agent.prom)"),
                     (MODULE_QUEUE_FAMILY, "the agent runtime reports no module-side queue "
                                           "(agent_module_queue_depth, set_module_queue_depth()): "
                                           "no inference module, or a runtime that does not "
                                           "report it"))

    @classmethod
    def why_missing(cls, prefix: str, present: set[str],
                    unavailable: frozenset[str] = frozenset()) -> str:
        # agent_metrics_url or Redis set but not answering: not "set agent_metrics_url"
        down = [s for s in unavailable if s in ("agent_metrics_url", "redis")
                or s.startswith("redis:")]
        if down:
            return configured_but_unread(down, "is the agent runtime up?")
        if OVER_BUNDLE_LIMIT in unavailable:
            return (f"the bundle's {AGENT_PROM} files were left out: with their series its "
                    f"samples hold over the {MAX_SERIES} series a bundle may (the series "
                    "limit of a bundle; no config key raises it)")
        if AGENT_PROM in unavailable:  # replay: nothing recorded, or a file refused
            return (f"the bundle holds no {AGENT_PROM} that could be read: the agent runtime "
                    "did not answer while it was recorded, or the file was refused (over "
                    f"{MAX_EXPOSITION_SERIES} series or 16 MiB, or not the text format)")
        if not any(name.startswith("agent_") for name in present):
            prefix = "agent_"  # no runtime at all, whatever the family
        return super().why_missing(prefix, present, unavailable)

    def __init__(self, config):
        super().__init__(config)
        self._endpoint = _Background("agent endpoint")
        self._redis = _Background("redis")
        self._client: Any = None
        self._client_lock = threading.Lock()

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        if scrape.evidence.live:
            yield from self._live(scrape)
        else:
            yield from self._replay(scrape)

    def _default_pool(self) -> str:
        pools = self.config.pools
        return pools[0].name if len(pools) == 1 else "unknown"

    def _replay(self, scrape: Scrape) -> Iterator[Family]:
        configured = self.config.agent_metrics_url or self.config.redis_url
        if not configured and not os.path.isfile(scrape.path(AGENT_PROM)):
            return  # no agent on the recorded node, nothing expected
        families: list[AgentFamily] = []
        with scrape.source(self.name, AGENT_PROM, "the bundle was recorded without it"):
            families = parse_agent_exposition(scrape.read_text(AGENT_PROM))
            families = map_genai_stages(families, self._default_pool())
        yield from (family.to_family() for family in families)

    def _live(self, scrape: Scrape) -> Iterator[Family]:
        url, redis_url = self.config.agent_metrics_url, self.config.redis_url
        queues = self.config.redis_queues
        timeout = self.config.agent_timeout_seconds
        start = time.monotonic()
        deadline = start + timeout
        endpoint = redis = None
        if url:
            endpoint = self._endpoint.start(lambda: fetch_exposition(url, timeout), timeout)
        if redis_url and queues:
            redis = self._redis.start(lambda: self._read_redis(redis_url, timeout), timeout)
        duration = gauge("fleetscope_agent_scrape_duration_seconds",
                         "Time this scrape waited for the agent endpoint or Redis.")
        families: list[AgentFamily] = []
        readings: list[QueueReading] | None = None
        if endpoint is not None:
            with scrape.source(self.name, "agent_metrics_url",
                               "is the agent runtime up and serving /metrics?"):
                try:
                    families = parse_agent_exposition(endpoint(deadline))
                    families = map_genai_stages(families, self._default_pool())
                finally:
                    duration.add(round(time.monotonic() - start, 6),
                                 labels(source="agent_metrics_url"))
        if redis is not None:
            with scrape.source(self.name, "redis"):
                try:
                    readings = redis(deadline)
                finally:
                    duration.add(round(time.monotonic() - start, 6), labels(source="redis"))
        samples = sum(len(f.samples) for f in families)
        if readings is not None:
            families = self._merge_queue_depths(families, readings, scrape)
            yield from self._stream_families(readings)
        yield from (family.to_family() for family in families)
        if duration.samples:
            yield duration
            yield gauge("fleetscope_agent_scrape_samples",
                        "Samples re-exported from the agent runtime this scrape.").add(samples)

    def _read_redis(self, url: str, timeout: float) -> list[QueueReading]:
        with self._client_lock:
            if self._client is None:
                self._client = _redis_client(url, timeout)  # NotAvailable without redis-py
            client = self._client
        from redis.exceptions import RedisError
        from redis.exceptions import TimeoutError as RedisTimeout

        try:
            return read_queues(client, self.config.redis_queues)
        except RedisTimeout:
            raise NotAvailable(_late("redis", timeout)) from None
        except RedisError as err:
            where = _redact(url)
            raise NotAvailable(f"redis at {where} unreachable: {type(err).__name__}: "
                               f"{str(err)[:160]}") from None

    def _merge_queue_depths(self, families: list[AgentFamily], readings: list[QueueReading],
                            scrape: Scrape) -> list[AgentFamily]:
        measured = {}
        for reading in readings:
            with scrape.source(self.name, f"redis:{reading.key}"):
                if reading.error:
                    raise NotAvailable(reading.error)
                measured[(reading.pool, reading.key)] = reading.depth
        if not measured:
            return families
        family = next((f for f in families if f.name == QUEUE_FAMILY), None)
        if family is None or family.type != "gauge":
            families = [f for f in families if f.name != QUEUE_FAMILY]
            family = AgentFamily(QUEUE_FAMILY, "gauge", "Tasks waiting in a queue of a pool "
                                 "(Redis LLEN, or a stream's consumer-group backlog).")
            families.append(family)
        family.samples = [s for s in family.samples
                          if (s[1].get("pool"), s[1].get("queue")) not in measured]
        for (pool, key), depth in measured.items():
            family.samples.append((QUEUE_FAMILY, {"pool": pool, "queue": key}, depth))
        return families

    @staticmethod
    def _stream_families(readings: list[QueueReading]) -> Iterator[Family]:
        length = gauge("fleetscope_redis_stream_length",
                       "Entries in a Redis stream queue (XLEN), acknowledged or not.")
        lag = gauge("fleetscope_redis_stream_group_lag",
                    "Stream entries not yet delivered to a consumer group (XINFO GROUPS lag).")
        pending = gauge("fleetscope_redis_stream_group_pending",
                        "Stream entries delivered to a group but not acknowledged (XINFO "
                        "GROUPS pending).")
        consumers = gauge("fleetscope_redis_stream_group_consumers",
                          "Consumers in a stream's consumer group (0: nobody reads it).")
        for reading in readings:
            if reading.kind != "stream" or reading.error:
                continue
            where = {"pool": reading.pool, "queue": reading.key}
            length.add(reading.length or 0.0, labels(**where))
            for group in reading.groups:
                group_labels = labels(**where, group=group["name"])
                if group["lag"] is not None:
                    lag.add(group["lag"], group_labels)
                pending.add(group["pending"], group_labels)
                consumers.add(group["consumers"], group_labels)
        yield from (f for f in (length, lag, pending, consumers) if f.samples)


def agent_prom(config) -> str:
    """What a bundle recorder writes as `agent.prom`: this node's agent_* and gen_ai_*
    families, live (runtime endpoint merged with Redis queue depths), in the text format."""
    collector = AgentCollector(config)
    families = [f for f in collector._live(Scrape(LiveHost()))
                if f.name.startswith(KEPT_PREFIXES)]
    return render(families)
