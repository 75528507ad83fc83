"""Instrumentation for agent runtimes: the contract's `agent_*` signals through OpenTelemetry.

An agent worker creates one `AgentSignals` for its pool, wraps each session, stage and tool
call in the helpers below, and serves `exposition()` at `/metrics` (the endpoint fleetscope's
`agent` collector scrapes as `agent_metrics_url`). Once exported to Prometheus the names and
labels are exactly those of docs/metrics-and-rules.md, Agent signals:

    agent_queue_depth{pool,queue}                          gauge
    agent_module_queue_depth{pool,module}                  gauge (waiting on the module)
    agent_session_duration_seconds{pool,class}             histogram
    agent_stage_duration_seconds{pool,stage}               histogram (stage: STAGES)
    agent_tool_calls_total{pool,tool,model,outcome}        counter   (outcome: OUTCOMES)
    agent_task_heartbeat_age_seconds{pool}                 gauge (oldest in-flight task)
    agent_session_migrations_total{pool}                   counter
    agent_sessions_total{pool,class,outcome}               counter   (outcome: SESSION_OUTCOMES)
    agent_sessions_in_flight{pool,class}                   gauge (arrived, not finished)
    agent_session_oldest_in_flight_seconds{pool,class}     gauge (age since arrival; 0: none)

and, following the OpenTelemetry GenAI semantic conventions, `gen_ai.client.operation.duration`
(`gen_ai_client_operation_duration_seconds`) and `gen_ai.client.token.usage`
(`gen_ai_client_token_usage`) for inference calls, plus spans `invoke_agent {agent}`,
`chat {model}` and `execute_tool {tool}` with `gen_ai.*` attributes (they go to whatever
TracerProvider the application installs; without one they cost nothing).

Example:

    from fleetscope.agent_signals import AgentSignals, BadToolArguments, parse_request_start

    signals = AgentSignals(pool="chat-online", workload_class="online", agent="support")
    arrived = parse_request_start(headers.get("X-Request-Start", ""))  # ValueError: bad
    with signals.session("conversation-42", arrived_at=arrived) as session:
        with signals.stage("context_assembly"):
            prompt = build_prompt(history)
        with signals.inference("qwen2.5-7b-instruct-q4_k_m") as chat:
            reply = model.generate(prompt)
            chat.usage(input_tokens=812, output_tokens=64)
        with signals.tool_call("web_search"):  # model: the one that just answered
            arguments = parse(reply)           # raise BadToolArguments -> bad_arguments
            search(arguments, timeout=5)       # TimeoutError -> timeout, other -> error
        try:
            save_state(redis)
        except RedisError as err:              # the user gets an error: the session failed
            session.fail(err)                  # (raising out of the session does the same)
    signals.set_queue_depth("tasks:chat", redis.llen("tasks:chat"))
    signals.set_module_queue_depth("npu0", engine_stats["num_requests_waiting"])
    body = signals.exposition()                # bytes for GET /metrics

API: `AgentSignals(pool, workload_class, agent, provider)` with `session()`, `stage()`,
`inference()`, `tool_call()` (context managers), `record_stage()`, `record_tool_call()`,
`set_queue_depth()`, `set_module_queue_depth()`, `session_migrated()`, `heartbeat_age()`,
`sessions_in_flight()`, `oldest_in_flight_age()`, `current_session()`, `exposition()` (with
EXPOSITION_CONTENT_TYPE), `shutdown()`; `Session.fail()`, `Session.beat()`;
`BadToolArguments`, `classify_exception()`, `session_outcome()`, `parse_request_start()`; the
label values allowed: STAGES, OUTCOMES, SESSION_OUTCOMES, CLASSES. Names, units, label values
and buckets come from schema.py, which the exporter and the simulators share.
A session is an in-flight task for the heartbeat gauge: entering or leaving any stage inside
it, or `Session.beat()`, refreshes its heartbeat, so a worker parked in a tool call shows an
age that keeps growing (rule `worker-blocked-external-call`).

Harm as users feel it: a session counts from its arrival, not from when the worker got to it.
`session(arrived_at=<unix seconds>)` (the front proxy's X-Request-Start, the time the request
was accepted, a task's enqueue time) makes the duration histogram and the in-flight gauges
count from then and records the wait before the session started as stage `queue_wait`; a
worker busy with someone else's request would otherwise never see the wait its users feel.
Every session ends with an outcome in agent_sessions_total: `ok`, or `error` / `timeout` when
it raised (TimeoutError-like: timeout) or `Session.fail()` marked it; a failed session still
observes its duration. A session that never ends shows in agent_sessions_in_flight and
agent_session_oldest_in_flight_seconds, which keeps growing with wall time.

Names and the OTel -> Prometheus mapping (OTel spec, compatibility/prometheus_and_openmetrics):
the exporter appends the unit (`s` -> `_seconds`) unless the name already holds it and
`_total` to monotonic counters unless present; unit annotations in braces (`{call}`) are
dropped. The instruments are therefore named with their final Prometheus names
(`agent_stage_duration_seconds`, unit `s`; `agent_tool_calls_total`, unit `{call}`), which
come out unchanged whether the suffixes are added (the Prometheus exporter here, an OTel
Collector) or not (Prometheus 3 OTLP ingestion without translation). The exporter's
`otel_scope_*` labels are turned off so the label sets are exactly the contract's.

Needs `pip install 'fleetscope[agent]'` (opentelemetry-sdk, opentelemetry-exporter-prometheus).
"""

from __future__ import annotations

import contextvars
import inspect
import itertools
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode

from fleetscope import __version__
from fleetscope.agent_runtime import schema
from fleetscope.agent_runtime.schema import (  # noqa: F401 (part of this module's interface)
    CLASSES,
    GENAI_DURATION_BUCKETS,
    GENAI_TOKEN_BUCKETS,
    OUTCOMES,
    SESSION_BUCKETS,
    SESSION_OUTCOMES,
    STAGE_BUCKETS,
    STAGES,
)

# The text format 0.0.4 that exposition() returns (prometheus-client's generate_latest).
EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

SCOPE = "fleetscope.agent_signals"


class BadToolArguments(ValueError):
    """Raise inside `tool_call()` when the model produced arguments the tool cannot take
    (malformed JSON, missing fields): the call is counted with outcome `bad_arguments`."""


def classify_exception(exc: BaseException) -> str:
    """The tool-call outcome an exception stands for: timeout, bad_arguments or error.

    Timeouts are recognised by type (TimeoutError, which socket.timeout is since Python 3.10,
    urllib's URLError wrapping one) or by an exception class named like one (requests'
    `Timeout`, httpx's `TimeoutException`), so no HTTP library needs importing here.
    """
    if isinstance(exc, BadToolArguments):
        return "bad_arguments"
    for candidate in (exc, getattr(exc, "reason", None), exc.__cause__):
        if isinstance(candidate, TimeoutError):
            return "timeout"
        if candidate is not None and any("Timeout" in cls.__name__
                                         for cls in type(candidate).__mro__):
            return "timeout"
    return "error"


def session_outcome(exc: BaseException) -> str:
    """The session outcome an exception stands for: `timeout` for what classify_exception
    calls a timeout, else `error` (a tool's bad arguments that end a session fail it)."""
    return "timeout" if classify_exception(exc) == "timeout" else "error"


# Timestamps before 2000 are no arrival: how New Relic's agents tell seconds, milliseconds and
# microseconds apart in X-Request-Start (newrelic/api/web_transaction.py, _parse_time_stamp).
_JAN_1_2000 = 946684800.0
_REQUEST_START_UNITS = ((1e6, "microseconds"), (1e3, "milliseconds"), (1.0, "seconds"))


def parse_request_start(value: str, now: float | None = None) -> float:
    """The arrival time (unix seconds) an `X-Request-Start` header value says, or ValueError.

    The front proxy stamps when it received the request: `t=<seconds with a fraction>`
    (nginx `proxy_set_header X-Request-Start "t=${msec}"`: `t=1764662400.123`), `t=<microseconds>`
    (Apache mod_headers `%t`: `t=1764662400123456`) or bare milliseconds (Heroku's router:
    `1764662400123`). As the New Relic agents read it: the `t=` is optional, the unit is the
    largest of microseconds, milliseconds, seconds that puts the time after 2000. A time after
    `now` (a proxy clock ahead of this host's) is refused, not read as no wait.

    >>> parse_request_start("t=1764662400.123", now=1764662401.0)
    1764662400.123
    >>> parse_request_start("1764662400123", now=1764662401.0)
    1764662400.123
    """
    now = time.time() if now is None else now
    text = value.strip()
    number = text[2:] if text.startswith("t=") else text
    # digits and one dot only: no sign, exponent, inf or nan (float() takes them all)
    if not number or number.count(".") > 1 or not number.replace(".", "").isdigit():
        raise ValueError(f"X-Request-Start {value[:40]!r} is not t=<unix time>")
    stamp = float(number)
    for divisor, unit in _REQUEST_START_UNITS:
        arrived = stamp / divisor
        if arrived > now:
            raise ValueError(f"X-Request-Start {value[:40]!r} is {arrived - now:.3f} s in the "
                             f"future (read as {unit}): the proxy's clock is ahead of this host's")
        if arrived > _JAN_1_2000:
            return arrived
    raise ValueError(f"X-Request-Start {value[:40]!r} is before 2000 in seconds, milliseconds "
                     "and microseconds")


class Session:
    """One agent session in flight; yielded by `AgentSignals.session()`.

    arrived_at  unix seconds the session arrived (the `arrived_at` given, else its start)
    outcome     None while it runs; `fail()` sets it, else it ends ok or with the outcome of
                the exception that ended it
    """

    def __init__(self, signals: AgentSignals, session_id: str | None, workload_class: str,
                 arrived_at: float):
        self.signals = signals
        self.session_id = session_id
        self.workload_class = workload_class
        self.arrived_at = arrived_at
        self.model: str | None = None  # the last model that answered, for tool calls
        self.span: Any = None
        self.outcome: str | None = None

    def beat(self) -> None:
        """Refresh this task's heartbeat (call it from long loops that have no stages)."""
        self.signals._beat(self)

    def fail(self, reason: BaseException | str = "error") -> None:
        """Mark the session failed although no exception leaves it (the runtime caught it and
        answered with an error): `reason` an exception (classified by session_outcome) or an
        outcome, `error` or `timeout`."""
        outcome = reason if isinstance(reason, str) else session_outcome(reason)
        if outcome not in SESSION_OUTCOMES or outcome == "ok":
            raise ValueError(f"a failed session's outcome is error or timeout, got {outcome!r}")
        self.outcome = outcome
        if self.span is not None:
            if isinstance(reason, BaseException):
                self.span.set_attribute("error.type", type(reason).__qualname__)
            self.span.set_status(Status(StatusCode.ERROR, outcome))


class Inference:
    """One model call; yielded by `AgentSignals.inference()`."""

    def __init__(self, span: Any):
        self.span = span
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.response_model: str | None = None

    def usage(self, input_tokens: int | None = None, output_tokens: int | None = None,
              response_model: str | None = None, finish_reasons: tuple[str, ...] = ()) -> None:
        """Token counts and response details, recorded on the span and the token histogram."""
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.response_model = response_model
        if input_tokens is not None:
            self.span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        if output_tokens is not None:
            self.span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
        if response_model:
            self.span.set_attribute("gen_ai.response.model", response_model)
        if finish_reasons:
            self.span.set_attribute("gen_ai.response.finish_reasons", list(finish_reasons))


class ToolCall:
    """One tool call; yielded by `AgentSignals.tool_call()`. Set `outcome` to override the
    one inferred from how the block ends (ok, or the exception's class)."""

    def __init__(self, tool: str, model: str, span: Any):
        self.tool = tool
        self.model = model
        self.span = span
        self.outcome: str | None = None


def _prometheus_reader(registry: Any) -> Any:
    """A PrometheusMetricReader on `registry` without the `otel_scope_*` labels.

    The option is `scope_info_enabled=False` in the exporter versions checked
    (0.66b2); the spec names it `without_scope_info`, which later versions may adopt.
    """
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    params = inspect.signature(PrometheusMetricReader).parameters
    kwargs: dict[str, Any] = {"registry": registry}
    if "without_scope_info" in params:
        kwargs["without_scope_info"] = True
    elif "scope_info_enabled" in params:
        kwargs["scope_info_enabled"] = False
    return PrometheusMetricReader(**kwargs)


class AgentSignals:
    """The agent signals of one pool, recorded through OpenTelemetry.

    pool            the workload pool this runtime serves (label `pool`)
    workload_class  `online` or `offline` (label `class` of session durations)
    agent           agent name for `invoke_agent {agent}` spans (gen_ai.agent.name)
    provider        gen_ai.provider.name of the model server (e.g. "llama_cpp", "openai")
    meter_provider  an application's own MeterProvider; default: a private one exporting to
                    `self.registry` (a prometheus-client CollectorRegistry), served by
                    `exposition()`
    tracer_provider default: the global one (a no-op until the application installs an SDK)
    """

    def __init__(self, pool: str, workload_class: str = "online", agent: str | None = None,
                 provider: str = "local", *, meter_provider: MeterProvider | None = None,
                 tracer_provider: Any = None, registry: Any = None):
        if not pool:
            raise ValueError("pool must be a non-empty string")
        if workload_class not in CLASSES:
            raise ValueError(f"workload_class must be online or offline, got {workload_class!r}")
        self.pool = pool
        self.workload_class = workload_class
        self.agent = agent
        self.provider = provider
        self.registry = None
        self._own_provider = None
        if meter_provider is None:
            from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
            from prometheus_client import CollectorRegistry

            self.registry = registry if registry is not None else CollectorRegistry()
            meter_provider = SdkMeterProvider(
                metric_readers=[_prometheus_reader(self.registry)], shutdown_on_exit=False)
            self._own_provider = meter_provider
        meter = meter_provider.get_meter(SCOPE, __version__)
        self._tracer = trace.get_tracer(SCOPE, __version__, tracer_provider=tracer_provider)
        self._pool_attrs = {"pool": pool}

        self._queue_depth = meter.create_gauge(
            schema.QUEUE_DEPTH.name, unit=schema.QUEUE_DEPTH.unit,
            description=schema.QUEUE_DEPTH.help)
        self._module_queue_depth = meter.create_gauge(
            schema.MODULE_QUEUE_DEPTH.name, unit=schema.MODULE_QUEUE_DEPTH.unit,
            description=schema.MODULE_QUEUE_DEPTH.help)
        self._session_duration = self._histogram(meter, schema.SESSION_DURATION)
        self._stage_duration = self._histogram(meter, schema.STAGE_DURATION)
        self._tool_calls = meter.create_counter(
            schema.TOOL_CALLS.name, unit=schema.TOOL_CALLS.unit,
            description=schema.TOOL_CALLS.help)
        self._migrations = meter.create_counter(
            schema.SESSION_MIGRATIONS.name, unit=schema.SESSION_MIGRATIONS.unit,
            description=schema.SESSION_MIGRATIONS.help)
        meter.create_observable_gauge(
            schema.HEARTBEAT_AGE.name, callbacks=[self._observe_heartbeat],
            unit=schema.HEARTBEAT_AGE.unit, description=schema.HEARTBEAT_AGE.help)
        self._sessions = meter.create_counter(
            schema.SESSIONS.name, unit=schema.SESSIONS.unit, description=schema.SESSIONS.help)
        meter.create_observable_gauge(
            schema.SESSIONS_IN_FLIGHT.name, callbacks=[self._observe_in_flight],
            unit=schema.SESSIONS_IN_FLIGHT.unit, description=schema.SESSIONS_IN_FLIGHT.help)
        meter.create_observable_gauge(
            schema.OLDEST_IN_FLIGHT.name, callbacks=[self._observe_oldest_in_flight],
            unit=schema.OLDEST_IN_FLIGHT.unit, description=schema.OLDEST_IN_FLIGHT.help)
        self._genai_duration = meter.create_histogram(
            schema.GENAI_OPERATION, unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=GENAI_DURATION_BUCKETS)
        self._genai_tokens = meter.create_histogram(
            schema.GENAI_TOKENS, unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=GENAI_TOKEN_BUCKETS)

        self._lock = threading.Lock()
        self._beats: dict[int, float] = {}  # in-flight session -> monotonic time of last beat
        # in-flight session -> (class, monotonic time of its arrival)
        self._arrivals: dict[int, tuple[str, float]] = {}
        # classes whose gauges are reported, 0 when none in flight (a series that vanished
        # would read as no data, not as nothing stuck)
        self._classes: list[str] = [workload_class]
        # Every outcome of the pool's class from 0, so a first failure is a rate, not a new
        # series that rate() cannot see yet.
        for outcome in SESSION_OUTCOMES:
            self._sessions.add(0, self._session_attrs(workload_class, outcome))
        self._ids = itertools.count()
        self._current: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
            f"fleetscope_agent_session_{id(self)}", default=None)

    # -- exposition ---------------------------------------------------------------------

    @staticmethod
    def _histogram(meter: Any, metric: schema.Metric) -> Any:
        return meter.create_histogram(metric.name, unit=metric.unit, description=metric.help,
                                      explicit_bucket_boundaries_advisory=metric.buckets)

    def exposition(self) -> bytes:
        """The Prometheus text (format 0.0.4) of this pool's signals, for GET /metrics."""
        if self.registry is None:
            raise RuntimeError("exposition() needs the private MeterProvider; with your own, "
                               "serve its exporter instead")
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def shutdown(self) -> None:
        """Stop the private MeterProvider (no-op with an application's own)."""
        if self._own_provider is not None:
            self._own_provider.shutdown()

    # -- heartbeats ---------------------------------------------------------------------

    def _beat(self, session: Session) -> None:
        with self._lock:
            key = id(session)
            if key in self._beats:
                self._beats[key] = time.monotonic()

    def heartbeat_age(self) -> float:
        """Seconds since the oldest heartbeat among in-flight sessions; 0 when none."""
        with self._lock:
            oldest = min(self._beats.values(), default=None)
        return 0.0 if oldest is None else max(0.0, time.monotonic() - oldest)

    def _observe_heartbeat(self, options: CallbackOptions) -> Iterator[Observation]:
        yield Observation(round(self.heartbeat_age(), 3), self._pool_attrs)

    # -- sessions in flight -------------------------------------------------------------

    def _in_flight(self, workload_class: str | None) -> list[float]:
        with self._lock:
            return [arrival for cls, arrival in self._arrivals.values()
                    if workload_class is None or cls == workload_class]

    def sessions_in_flight(self, workload_class: str | None = None) -> int:
        """Sessions arrived and not finished (of one class, or all)."""
        return len(self._in_flight(workload_class))

    def oldest_in_flight_age(self, workload_class: str | None = None) -> float:
        """Seconds since the arrival of the oldest session still in flight; 0 when none."""
        oldest = min(self._in_flight(workload_class), default=None)
        return 0.0 if oldest is None else max(0.0, time.monotonic() - oldest)

    def _observe_in_flight(self, options: CallbackOptions) -> Iterator[Observation]:
        for workload_class in list(self._classes):
            yield Observation(self.sessions_in_flight(workload_class),
                              {"pool": self.pool, "class": workload_class})

    def _observe_oldest_in_flight(self, options: CallbackOptions) -> Iterator[Observation]:
        for workload_class in list(self._classes):
            yield Observation(round(self.oldest_in_flight_age(workload_class), 3),
                              {"pool": self.pool, "class": workload_class})

    def _session_attrs(self, workload_class: str, outcome: str) -> dict[str, str]:
        return {"pool": self.pool, "class": workload_class, "outcome": outcome}

    # -- sessions and stages ------------------------------------------------------------

    @contextmanager
    def session(self, session_id: str | None = None, workload_class: str | None = None, *,
                arrived_at: float | None = None) -> Iterator[Session]:
        """One agent session: its duration, its outcome, an `invoke_agent` span, a heartbeat
        and a place in the in-flight gauges while it runs. Stages, inferences and tool calls
        inside it belong to it.

        arrived_at  unix seconds the request or task arrived (parse_request_start() of the
                    proxy's X-Request-Start, the accept time, a task's enqueue time): the
                    duration and the in-flight age count from it, and the wait until now is
                    recorded as stage queue_wait. None: the session arrives now. A time after
                    now (another host's clock) counts as now.
        """
        workload_class = workload_class or self.workload_class
        if workload_class not in CLASSES:
            raise ValueError(f"workload_class must be online or offline, got {workload_class!r}")
        if arrived_at is not None and not math.isfinite(arrived_at):
            raise ValueError(f"arrived_at must be unix seconds, got {arrived_at!r}")
        now = time.time()
        start = time.monotonic()
        waited = 0.0 if arrived_at is None else max(0.0, now - arrived_at)
        arrival = start - waited  # on the monotonic clock: immune to clock steps from here on
        session = Session(self, session_id, workload_class, now - waited)
        attributes = {"gen_ai.operation.name": "invoke_agent",
                      "gen_ai.provider.name": self.provider}
        if self.agent:
            attributes["gen_ai.agent.name"] = self.agent
        if session_id:
            attributes["gen_ai.conversation.id"] = session_id
        name = f"invoke_agent {self.agent}" if self.agent else "invoke_agent"
        token = self._current.set(session)
        with self._lock:
            self._beats[id(session)] = start
            self._arrivals[id(session)] = (workload_class, arrival)
            if workload_class not in self._classes:
                self._classes.append(workload_class)
        if arrived_at is not None:
            self.record_stage("queue_wait", waited)
        outcome = "ok"
        try:
            # the span covers what the histogram does: from the arrival
            with self._tracer.start_as_current_span(
                    name, kind=SpanKind.INTERNAL, attributes=attributes,
                    start_time=int(session.arrived_at * 1e9)) as span:
                session.span = span
                try:
                    yield session
                except BaseException as exc:
                    outcome = session_outcome(exc)
                    raise
        finally:
            outcome = session.outcome or outcome
            self._session_duration.record(
                time.monotonic() - arrival, {"pool": self.pool, "class": workload_class})
            self._sessions.add(1, self._session_attrs(workload_class, outcome))
            with self._lock:
                self._beats.pop(id(session), None)
                self._arrivals.pop(id(session), None)
            self._current.reset(token)

    def current_session(self) -> Session | None:
        """The session the calling code runs in, if any."""
        return self._current.get()

    def record_stage(self, stage: str, seconds: float) -> None:
        """A stage duration measured elsewhere (e.g. queue_wait from the enqueue time)."""
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
        self._stage_duration.record(max(0.0, seconds), {"pool": self.pool, "stage": stage})

    @contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        """Time a block as one stage (STAGES); beats the current session on entry and exit."""
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
        session = self._current.get()
        if session is not None:
            self._beat(session)
        start = time.monotonic()
        try:
            yield
        finally:
            self.record_stage(stage, time.monotonic() - start)
            if session is not None:
                self._beat(session)

    @contextmanager
    def inference(self, model: str, provider: str | None = None,
                  operation: str = "chat") -> Iterator[Inference]:
        """A model call: stage `inference`, a `{operation} {model}` CLIENT span and the GenAI
        client metrics (operation duration, token usage)."""
        provider = provider or self.provider
        attributes = {"gen_ai.operation.name": operation, "gen_ai.provider.name": provider,
                      "gen_ai.request.model": model}
        session = self._current.get()
        error_type = None
        with self._tracer.start_as_current_span(f"{operation} {model}", kind=SpanKind.CLIENT,
                                                attributes=attributes) as span:
            call = Inference(span)
            start = time.monotonic()
            try:
                with self.stage("inference"):
                    yield call
            except BaseException as exc:
                error_type = type(exc).__qualname__
                span.set_attribute("error.type", error_type)
                raise
            finally:
                metric_attrs = dict(attributes)
                if error_type:
                    metric_attrs["error.type"] = error_type
                if call.response_model:
                    metric_attrs["gen_ai.response.model"] = call.response_model
                self._genai_duration.record(time.monotonic() - start, metric_attrs)
                tokens = (("input", call.input_tokens), ("output", call.output_tokens))
                for kind, count in tokens:
                    if count is not None:
                        self._genai_tokens.record(count,
                                                  {**metric_attrs, "gen_ai.token.type": kind})
                if session is not None:
                    session.model = model

    @contextmanager
    def tool_call(self, tool: str, model: str | None = None, call_id: str | None = None,
                  tool_type: str = "function") -> Iterator[ToolCall]:
        """A tool call: stage `tool_call`, an `execute_tool {tool}` span and one count in
        agent_tool_calls_total with its outcome. `model` (whose arguments the tool got)
        defaults to the session's last inference model, else "unknown". Exceptions pass
        through after being counted (see classify_exception)."""
        session = self._current.get()
        model = model or (session.model if session is not None else None) or "unknown"
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                      "gen_ai.tool.type": tool_type}
        if call_id:
            attributes["gen_ai.tool.call.id"] = call_id
        with self._tracer.start_as_current_span(f"execute_tool {tool}", kind=SpanKind.INTERNAL,
                                                attributes=attributes) as span:
            call = ToolCall(tool, model, span)
            outcome = "ok"
            try:
                with self.stage("tool_call"):
                    yield call
            except BaseException as exc:
                outcome = classify_exception(exc)
                span.set_attribute("error.type", type(exc).__qualname__)
                raise
            finally:
                if call.outcome is not None:
                    outcome = call.outcome
                if outcome not in OUTCOMES:
                    outcome = "error"
                if outcome != "ok":
                    span.set_attribute("fleetscope.tool.outcome", outcome)
                    span.set_status(Status(StatusCode.ERROR, outcome))
                self._count_tool_call(tool, model, outcome)

    def record_tool_call(self, tool: str, model: str, outcome: str,
                         seconds: float | None = None) -> None:
        """A tool call measured elsewhere: its outcome and, if known, its duration."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        self._count_tool_call(tool, model or "unknown", outcome)
        if seconds is not None:
            self.record_stage("tool_call", seconds)

    def _count_tool_call(self, tool: str, model: str, outcome: str) -> None:
        self._tool_calls.add(1, {"pool": self.pool, "tool": tool, "model": model,
                                 "outcome": outcome})

    # -- queues and migrations ----------------------------------------------------------

    def set_queue_depth(self, queue: str, depth: float) -> None:
        """Tasks waiting in `queue` (a Redis key, a topic) as this runtime last saw it."""
        self._queue_depth.set(depth, {"pool": self.pool, "queue": queue})

    def set_module_queue_depth(self, module: str, depth: float) -> None:
        """Requests waiting on the inference module `module` (a device, a serving engine's
        name) as its engine last reported them: the module side of the wait, beside the
        pool's own queue (rule module-bound-cpu-idle reads it)."""
        self._module_queue_depth.set(depth, {"pool": self.pool, "module": module})

    def session_migrated(self, count: int = 1) -> None:
        """A session arrived from another worker or node (its context had to be re-synced)."""
        self._migrations.add(count, self._pool_attrs)
