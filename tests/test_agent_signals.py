"""Agent signals: the OTel instrumentation module, the example worker, and collector `agent`
(runtime endpoint, Redis queue depths, bundle replay), against a real redis-server.

Every server here listens on 127.0.0.1 on a port the OS picked; every loop is bounded in
count and time; fixtures stop what they start.
"""

from __future__ import annotations

import json
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

from fleetscope.agent_signals import (
    OUTCOMES,
    SESSION_OUTCOMES,
    STAGES,
    AgentSignals,
    BadToolArguments,
    classify_exception,
    parse_request_start,
    session_outcome,
)
from fleetscope.collectors.agent import agent_prom, map_genai_stages, parse_agent_exposition
from fleetscope.collectors.parsers import ParseError
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import FIXTURES, require_tool, samples

AGENT_PROM = FIXTURES / "agent" / "agent.prom"
WORKER = Path(__file__).resolve().parents[1] / "examples" / "agent_worker.py"
POOL = "chat-online"
POOLS = [{"name": POOL, "class": "online", "match": {"cmdline": "agent_worker"}}]

# docs/metrics-and-rules.md, Agent signals: family -> its label names (besides le).
DOCUMENTED_LABELS = {
    "agent_queue_depth": {"pool", "queue"},
    "agent_session_duration_seconds": {"pool", "class"},
    "agent_stage_duration_seconds": {"pool", "stage"},
    "agent_tool_calls_total": {"pool", "tool", "model", "outcome"},
    "agent_task_heartbeat_age_seconds": {"pool"},
    "agent_session_migrations_total": {"pool"},
}
# Beside them (issue 35): the harm a user feels that no latency histogram holds.
HARM_LABELS = {
    "agent_sessions_total": {"pool", "class", "outcome"},
    "agent_sessions_in_flight": {"pool", "class"},
    "agent_session_oldest_in_flight_seconds": {"pool", "class"},
}
DOCUMENTED_TYPES = {
    "agent_queue_depth": "gauge", "agent_session_duration_seconds": "histogram",
    "agent_stage_duration_seconds": "histogram", "agent_tool_calls": "counter",
    "agent_task_heartbeat_age_seconds": "gauge", "agent_session_migrations": "counter",
    "agent_sessions": "counter", "agent_sessions_in_flight": "gauge",
    "agent_session_oldest_in_flight_seconds": "gauge",
}
ONLINE = 'class="online",pool="chat-online"'


def outcomes_of(text: str) -> dict[str, float]:
    """agent_sessions_total of the online class, by outcome."""
    return {s.labels["outcome"]: s.value for s in families_of(text)["agent_sessions"].samples
            if s.labels["class"] == "online"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def families_of(text: str) -> dict:
    return {family.name: family for family in parse_text(text)}


def label_names(text: str, family: str) -> set[frozenset]:
    """The distinct label-name sets of a family's samples (le left out)."""
    found = families_of(text)[family.removesuffix("_total")]
    return {frozenset(set(s.labels) - {"le"}) for s in found.samples}


def assert_contract_shape(text: str, required=DOCUMENTED_LABELS) -> None:
    found = families_of(text)
    for name in required:
        base = name.removesuffix("_total")
        assert base in found, f"{name} missing"
        assert found[base].type == DOCUMENTED_TYPES[base], (name, found[base].type)
        assert label_names(text, name) == {frozenset(required[name])}, name


def available(got: dict, source: str) -> float:
    return got[f'fleetscope_scrape_source_available{{collector="agent",source="{source}"}}']


def http_get(url: str, timeout: float = 10.0) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        return response.read()


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The child's first stdout line, waiting at most `timeout` seconds."""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return proc.stdout.readline()


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout:
        proc.stdout.close()


class LocalServer:
    """A threaded HTTP server on 127.0.0.1 in this process; `handler(request)` answers GETs
    as (status, body). Sleeping handlers wait on `release`, set when the server stops."""

    def __init__(self, handler):
        self.release = threading.Event()
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.requests += 1
                status, body = handler(self, outer.release)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (timeout tests)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def local_server():
    started: list[LocalServer] = []

    def start(handler):
        server = LocalServer(handler)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


# -- a real redis-server (tests/conftest.py's redis_url, one for the session) -------------

@pytest.fixture
def redis_client(redis_url):
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=5, decode_responses=True)
    client.flushall()
    yield client
    client.close()


def agent_config(**extra) -> dict:
    return {"collectors": ["agent"], "pools": POOLS, **extra}


# -- the instrumentation module --------------------------------------------------------------

def _exercise(signals: AgentSignals) -> None:
    signals.set_queue_depth("tasks:chat", 7)
    signals.set_module_queue_depth("npu0", 5)
    signals.session_migrated()
    with signals.stage("model_load"):
        pass
    with signals.session("conversation-1"):
        signals.record_stage("queue_wait", 0.25)
        with signals.stage("context_assembly"):
            pass
        with signals.inference("qwen2.5-7b-q4_k_m") as chat:
            chat.usage(input_tokens=100, output_tokens=20)
        with signals.tool_call("search"):
            pass
        for error in (TimeoutError("read timed out"), BadToolArguments("bad json"),
                      ConnectionResetError("reset")):
            with pytest.raises(type(error)), signals.tool_call("search"):
                raise error
        with signals.stage("state_io"):
            pass
        with signals.stage("other"):
            pass


def test_module_exports_exactly_the_contract_names_and_labels():
    signals = AgentSignals(POOL, "online", agent="support")
    _exercise(signals)
    text = signals.exposition().decode()
    assert_contract_shape(text)
    got = samples(text)
    assert got['agent_queue_depth{pool="chat-online",queue="tasks:chat"}'] == 7
    assert got['agent_module_queue_depth{module="npu0",pool="chat-online"}'] == 5
    assert label_names(text, "agent_module_queue_depth") == {frozenset({"pool", "module"})}
    assert families_of(text)["agent_module_queue_depth"].type == "gauge"
    assert got['agent_session_migrations_total{pool="chat-online"}'] == 1
    assert got['agent_session_duration_seconds_count{class="online",pool="chat-online"}'] == 1
    stages = {s.labels["stage"] for s in families_of(text)["agent_stage_duration_seconds"].samples}
    assert stages == set(STAGES)
    outcomes = {s.labels["outcome"]: s.value for s in families_of(text)["agent_tool_calls"].samples}
    assert outcomes == dict.fromkeys(OUTCOMES, 1.0)
    model = {s.labels["model"] for s in families_of(text)["agent_tool_calls"].samples}
    assert model == {"qwen2.5-7b-q4_k_m"}  # the model that answered before the tool call
    # GenAI metrics under their OTel -> Prometheus names, seconds buckets.
    assert got[('gen_ai_client_operation_duration_seconds_count{gen_ai_operation_name="chat",'
                'gen_ai_provider_name="local",gen_ai_request_model="qwen2.5-7b-q4_k_m"}')] == 1
    assert 'gen_ai_token_type="output"' in text
    assert 'le="0.01"' in text and 'le="5000.0"' not in text
    assert "otel_scope" not in text  # the contract's label sets, nothing more
    signals.shutdown()


def test_module_rejects_names_outside_the_contract():
    signals = AgentSignals(POOL)
    with pytest.raises(ValueError), signals.stage("thinking"):
        pass
    with pytest.raises(ValueError):
        signals.record_tool_call("search", "m", "maybe")
    with pytest.raises(ValueError):
        AgentSignals(POOL, "batch")
    signals.record_tool_call("search", "m", "timeout", seconds=1.5)
    assert 'outcome="timeout"' in signals.exposition().decode()


def test_exceptions_classify_into_outcomes():
    import urllib.error

    assert classify_exception(TimeoutError()) == "timeout"
    assert classify_exception(ConnectionRefusedError()) == "error"
    assert classify_exception(urllib.error.URLError(TimeoutError("timed out"))) == "timeout"
    ReadTimeout = type("ReadTimeout", (OSError,), {})  # noqa: N806 (requests' class name)
    assert classify_exception(ReadTimeout()) == "timeout"
    assert classify_exception(BadToolArguments()) == "bad_arguments"
    assert classify_exception(ValueError()) == "error"


def test_spans_follow_the_genai_conventions():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, StatusCode

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    signals = AgentSignals(POOL, agent="support", provider="llama_cpp", tracer_provider=provider)
    _exercise(signals)
    spans = {}
    for span in exporter.get_finished_spans():
        spans.setdefault(span.name, []).append(span)
    agent = spans["invoke_agent support"][0]
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.agent.name"] == "support"
    assert agent.attributes["gen_ai.conversation.id"] == "conversation-1"
    chat = spans["chat qwen2.5-7b-q4_k_m"][0]
    assert chat.kind == SpanKind.CLIENT
    assert chat.attributes["gen_ai.provider.name"] == "llama_cpp"
    assert chat.attributes["gen_ai.request.model"] == "qwen2.5-7b-q4_k_m"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 100
    assert chat.parent.span_id == agent.context.span_id
    tools = spans["execute_tool search"]
    assert len(tools) == 4
    assert all(t.attributes["gen_ai.tool.name"] == "search" for t in tools)
    assert all(t.attributes["gen_ai.operation.name"] == "execute_tool" for t in tools)
    failed = [t for t in tools if t.status.status_code == StatusCode.ERROR]
    assert sorted(t.attributes["error.type"] for t in failed) == [
        "BadToolArguments", "ConnectionResetError", "TimeoutError"]
    provider.shutdown()


def test_heartbeat_age_grows_while_a_task_is_blocked():
    signals = AgentSignals(POOL)
    entered, release = threading.Event(), threading.Event()

    def blocked_session():
        with signals.session("stuck"), signals.tool_call("slow_api"):
            entered.set()
            release.wait(5)

    thread = threading.Thread(target=blocked_session)
    thread.start()
    try:
        assert entered.wait(5)
        time.sleep(0.3)
        assert signals.heartbeat_age() >= 0.25
        age = samples(signals.exposition().decode())[
            'agent_task_heartbeat_age_seconds{pool="chat-online"}']
        assert age >= 0.25
    finally:
        release.set()
        thread.join(5)
    assert signals.heartbeat_age() == 0.0


def test_sessions_end_with_the_outcome_users_got():
    """Raised out of the session, or marked failed by the runtime that caught it: counted by
    outcome, and the failed ones still observe their duration."""
    import urllib.error

    signals = AgentSignals(POOL)
    # every outcome is a series from the start: a first failure is a rate, not a new series
    assert outcomes_of(signals.exposition().decode()) == dict.fromkeys(SESSION_OUTCOMES, 0.0)
    with signals.session("fine"):
        pass
    failures = [RuntimeError("state write refused"), TimeoutError("model server"),
                urllib.error.URLError(TimeoutError("timed out")), BadToolArguments("bad json"),
                ConnectionResetError("reset")]
    for error in failures:
        with pytest.raises(type(error)), signals.session():
            raise error
    with signals.session() as caught:  # the runtime answered an error itself
        caught.fail(ConnectionRefusedError("redis down"))
    with signals.session() as gave_up:
        gave_up.fail("timeout")
    with pytest.raises(ValueError), signals.session() as wrong:
        wrong.fail("ok")  # a failure's outcome is error or timeout; that session failed too
    text = signals.exposition().decode()
    assert outcomes_of(text) == {"ok": 1.0, "error": 5.0, "timeout": 3.0}
    assert samples(text)[f"agent_session_duration_seconds_count{{{ONLINE}}}"] == 9
    assert_contract_shape(text, HARM_LABELS)
    assert [session_outcome(e) for e in failures] == [
        "error", "timeout", "timeout", "error", "error"]
    signals.shutdown()


def test_in_flight_gauges_follow_sessions_from_arrival():
    signals = AgentSignals(POOL)
    started = [threading.Event() for _ in range(3)]
    release = [threading.Event() for _ in range(3)]
    arrived = time.time() - 2.0  # a request that waited 2 s before the worker got to it

    def hold(n: int, workload_class: str, arrived_at: float | None) -> None:
        with signals.session(f"s{n}", workload_class, arrived_at=arrived_at):
            started[n].set()
            release[n].wait(10)

    threads = [threading.Thread(target=hold, args=args) for args in (
        (0, "online", arrived), (1, "online", None), (2, "offline", None))]
    try:
        for thread in threads:
            thread.start()
        assert all(event.wait(5) for event in started)
        got = samples(signals.exposition().decode())
        offline = 'class="offline",pool="chat-online"'
        assert got[f"agent_sessions_in_flight{{{ONLINE}}}"] == 2
        assert got[f"agent_sessions_in_flight{{{offline}}}"] == 1
        assert got[f"agent_session_oldest_in_flight_seconds{{{ONLINE}}}"] >= 2.0
        assert signals.oldest_in_flight_age("offline") < 2.0 <= signals.oldest_in_flight_age()
        release[0].set()
        threads[0].join(5)
        got = samples(signals.exposition().decode())
        assert got[f"agent_sessions_in_flight{{{ONLINE}}}"] == 1
        assert got[f"agent_session_oldest_in_flight_seconds{{{ONLINE}}}"] < 2.0
    finally:
        for event in release:
            event.set()
        for thread in threads:
            thread.join(5)
    got = samples(signals.exposition().decode())
    for cls in ("online", "offline"):  # nothing in flight: 0, not a vanished series
        where = f'class="{cls}",pool="chat-online"'
        assert got[f"agent_sessions_in_flight{{{where}}}"] == 0
        assert got[f"agent_session_oldest_in_flight_seconds{{{where}}}"] == 0
    assert signals.sessions_in_flight() == 0
    signals.shutdown()


def test_a_session_counts_from_its_arrival():
    signals = AgentSignals(POOL)
    waited = 1.5
    with signals.session(arrived_at=time.time() - waited) as session:
        assert signals.oldest_in_flight_age() >= waited
        assert session.arrived_at <= time.time() - waited
    with signals.session():  # no arrival given: arrives now, no queue_wait recorded
        pass
    with signals.session(arrived_at=time.time() + 60):  # another host's clock: counts as now
        pass
    with pytest.raises(ValueError):
        with signals.session(arrived_at=float("nan")):
            pass
    got = samples(signals.exposition().decode())
    bucket = 'agent_session_duration_seconds_bucket{{class="online",le="{}",pool="chat-online"}}'
    assert got[bucket.format("1")] == 2  # the two that arrived when they started
    assert got[bucket.format("2.5")] == 3  # the one that waited 1.5 s first
    wait = 'agent_stage_duration_seconds_{}{{pool="chat-online",stage="queue_wait"}}'
    assert got[wait.format("count")] == 2  # the sessions given an arrival
    assert waited <= got[wait.format("sum")] < waited + 1.0
    signals.shutdown()


NOW = 1764662500.0
REQUEST_START = [
    ("t=1764662400.123", 1764662400.123),     # nginx: t=${msec}, seconds with milliseconds
    ("t=1764662400123456", 1764662400.123456),  # Apache mod_headers %t: microseconds
    ("1764662400123", 1764662400.123),        # Heroku router: milliseconds, no t=
    ("t=1764662400", 1764662400.0),           # whole seconds
    (" t=1764662400.5 ", 1764662400.5),
]


@pytest.mark.parametrize("value, arrived", REQUEST_START)
def test_request_start_forms_the_proxies_write(value, arrived):
    assert parse_request_start(value, now=NOW) == pytest.approx(arrived, abs=1e-6)


@pytest.mark.parametrize("value, reason", [
    ("", "not t=<unix time>"), ("t=", "not t=<unix time>"), ("soon", "not t=<unix time>"),
    ("t=-1764662400", "not t=<unix time>"), ("t=1.7e9", "not t=<unix time>"),
    ("t=inf", "not t=<unix time>"), ("t=nan", "not t=<unix time>"),
    ("t=1.2.3", "not t=<unix time>"), ("t=123", "before 2000"),
    (f"t={NOW + 30:.3f}", "in the future"), (f"{int((NOW + 30) * 1000)}", "in the future"),
])
def test_request_start_refuses_what_is_no_arrival(value, reason):
    with pytest.raises(ValueError, match=reason):
        parse_request_start(value, now=NOW)


# -- Redis queue depths ----------------------------------------------------------------------

def test_queue_depths_grow_when_the_producer_outpaces_the_consumer(
        exporter_factory, redis_url, redis_client):
    redis_client.xgroup_create("events:chat", "workers", id="0", mkstream=True)
    config = agent_config(redis_url=redis_url, redis_queues=[
        {"key": "tasks:chat", "pool": POOL}, {"key": "events:chat", "pool": POOL},
        {"key": "tasks:absent", "pool": POOL}])
    exporter = exporter_factory("/", config)
    depths = []
    for round_ in range(1, 4):
        # Producer: 5 tasks a round on each queue. Consumer: takes 2, acknowledges 1.
        redis_client.rpush("tasks:chat", *[json.dumps({"n": i}) for i in range(5)])
        for i in range(5):
            redis_client.xadd("events:chat", {"n": i})
        redis_client.lpop("tasks:chat", 2)
        taken = redis_client.xreadgroup("workers", "c1", {"events:chat": ">"}, count=2)
        redis_client.xack("events:chat", "workers", taken[0][1][0][0])
        got = samples(exporter.text())
        where = 'pool="chat-online",queue="events:chat"'
        assert got['agent_queue_depth{pool="chat-online",queue="tasks:chat"}'] == 3 * round_
        assert got[f'fleetscope_redis_stream_group_lag{{group="workers",{where}}}'] == 3 * round_
        assert got[f'fleetscope_redis_stream_group_pending{{group="workers",{where}}}'] == round_
        assert got[f'fleetscope_redis_stream_group_consumers{{group="workers",{where}}}'] == 1
        assert got[f"fleetscope_redis_stream_length{{{where}}}"] == 5 * round_
        assert got[f"agent_queue_depth{{{where}}}"] == 4 * round_  # lag + pending
        assert got['agent_queue_depth{pool="chat-online",queue="tasks:absent"}'] == 0
        assert available(got, "redis") == 1
        depths.append(got['agent_queue_depth{pool="chat-online",queue="tasks:chat"}'])
    assert depths == sorted(depths) and depths[0] < depths[-1]


def test_a_key_of_another_type_costs_only_its_queue(exporter_factory, redis_url, redis_client):
    redis_client.hset("tasks:hash", "a", "1")
    redis_client.rpush("tasks:chat", "x")
    exporter = exporter_factory("/", agent_config(redis_url=redis_url, redis_queues=[
        {"key": "tasks:hash", "pool": POOL}, {"key": "tasks:chat", "pool": POOL}]))
    got = samples(exporter.text())
    assert available(got, "redis:tasks:hash") == 0
    assert got['agent_queue_depth{pool="chat-online",queue="tasks:chat"}'] == 1
    assert 'agent_queue_depth{pool="chat-online",queue="tasks:hash"}' not in got


def test_redis_unreachable_is_an_unavailable_source_logged_once(exporter_factory):
    port = free_port()  # nothing listens there
    exporter = exporter_factory("/", agent_config(
        redis_url=f"redis://127.0.0.1:{port}/0", redis_queues=[{"key": "q", "pool": POOL}],
        agent_timeout_seconds=1))
    for _ in range(3):
        start = time.monotonic()
        status, _, body = exporter.scrape()
        assert status == 200 and time.monotonic() - start < 5
        got = samples(body.decode())
        assert available(got, "redis") == 0
        assert got['fleetscope_scrape_collector_success{collector="agent"}'] == 1
    lines = [line for line in exporter.stderr().splitlines() if "source redis not" in line]
    assert len(lines) == 1, exporter.stderr()


# -- the example worker, end to end ----------------------------------------------------------

@pytest.fixture
def worker_factory(tmp_path):
    started: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        log = open(tmp_path / f"worker-{len(started)}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--listen", "127.0.0.1:0", "--pool", POOL, *args],
            stdout=subprocess.PIPE, stderr=log, text=True, cwd=WORKER.parent.parent)
        log.close()
        started.append(proc)
        line = read_line(proc, 30)
        assert "listening on" in line, (line, (tmp_path / "worker-0.log").read_text())
        return line.split("listening on ", 1)[1].strip()

    yield start
    for proc in started:
        stop_process(proc)


def _tool(request, release):
    query = parse_qs(urlsplit(request.path).query).get("q", [""])[0]
    if query == "slow":
        release.wait(3)  # past the worker's tool timeout
    return {"bad": 422, "boom": 500}.get(query, 200), b"tool result"


def test_example_worker_signals_reach_the_exporter(
        exporter_factory, worker_factory, local_server, redis_url, redis_client, tmp_path):
    tool = local_server(_tool)
    worker = worker_factory("--redis", redis_url, "--queue", "tasks:chat",
                            "--tool-url", f"{tool.url}/search", "--tool-timeout", "0.3",
                            "--inference-ms", "5")
    queries = ["ok", "ok", "bad", "slow", "boom", "ok"]
    for query in queries:
        answer = json.loads(http_get(f"{worker}/run?q={query}"))
        assert answer["tool_outcome"] == {"bad": "bad_arguments", "slow": "timeout",
                                          "boom": "error"}.get(query, "ok")
    http_get(f"{worker}/run?q=ok&session=s1&migrated=1")
    for i in range(3):
        redis_client.rpush("tasks:chat", json.dumps({"id": f"t{i}", "q": "ok",
                                                     "enqueued_at": time.time()}))
    sessions = len(queries) + 1 + 3
    deadline = time.monotonic() + 20
    key = 'agent_session_duration_seconds_count{class="online",pool="chat-online"}'
    while time.monotonic() < deadline:
        if samples(http_get(f"{worker}/metrics").decode()).get(key) == sessions:
            break
        time.sleep(0.1)

    exporter = exporter_factory("/", agent_config(
        agent_metrics_url=f"{worker}/metrics", redis_url=redis_url,
        redis_queues=[{"key": "tasks:chat", "pool": POOL}]))
    text = exporter.text()
    assert_contract_shape(text)
    got = samples(text)
    assert got[key] == sessions
    # every session has an arrival (its accept, or its task's enqueue time): queue_wait too
    for stage in ("queue_wait", "context_assembly", "inference", "tool_call", "state_io"):
        assert got[f'agent_stage_duration_seconds_count{{pool="chat-online",stage="{stage}"}}'] \
            == sessions, stage
    assert got['agent_stage_duration_seconds_count{pool="chat-online",stage="model_load"}'] == 1
    calls = {s.labels["outcome"]: s.value for s in families_of(text)["agent_tool_calls"].samples}
    assert calls == {"ok": sessions - 3, "bad_arguments": 1, "timeout": 1, "error": 1}
    assert got['agent_session_migrations_total{pool="chat-online"}'] == 1
    # the harm families pass through as the runtime wrote them
    assert_contract_shape(text, HARM_LABELS)
    assert outcomes_of(text) == {"ok": sessions, "error": 0, "timeout": 0}
    assert got[f"agent_sessions_in_flight{{{ONLINE}}}"] == 0
    assert got[f"agent_session_oldest_in_flight_seconds{{{ONLINE}}}"] == 0
    assert got['agent_queue_depth{pool="chat-online",queue="tasks:chat"}'] == 0  # from Redis
    assert len([k for k in got if k.startswith("agent_queue_depth")]) == 1
    assert any(k.startswith("gen_ai_client_operation_duration_seconds_bucket") for k in got)
    assert "target_info" not in got and not any(k.startswith("python_gc") for k in got)
    for source in ("agent_metrics_url", "redis", "redis:tasks:chat"):
        assert available(got, source) == 1
    assert got['fleetscope_scrape_collector_success{collector="agent"}'] == 1
    assert got["fleetscope_agent_scrape_samples"] > 50

    # Valid as OpenMetrics too (what Prometheus asks for), and by Prometheus's own linter.
    status, headers, body = exporter.scrape({"Accept": "application/openmetrics-text"})
    om = {family.name: family for family in parse_om(body.decode())}
    assert om["agent_tool_calls"].type == "counter"
    assert om["agent_stage_duration_seconds"].type == "histogram"
    promtool = require_tool("promtool")
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    # What a bundle recorder writes as agent.prom replays to the same signals, offline.
    recorded = agent_prom(parse_config(agent_config(
        agent_metrics_url=f"{worker}/metrics", redis_url=redis_url,
        redis_queues=[{"key": "tasks:chat", "pool": POOL}]), ("agent",)))
    assert "fleetscope_" not in recorded and "target_info" not in recorded
    sample = _bundle(tmp_path, with_agent_prom=False)
    (sample / "agent.prom").write_text(recorded)
    replayed_text = render(Exporter(str(sample), parse_config(
        agent_config(), ("agent",))).collect())
    replayed = samples(replayed_text)
    assert replayed[key] == sessions
    assert outcomes_of(replayed_text) == outcomes_of(text)
    assert_contract_shape(replayed_text, HARM_LABELS)
    assert replayed['agent_queue_depth{pool="chat-online",queue="tasks:chat"}'] == 0


def test_agent_endpoint_unreachable_or_garbage_leaves_the_scrape_whole(
        exporter_factory, local_server):
    garbage = local_server(lambda request, release: (200, b"<html><body>hi</body></html>\n"))
    for url in (f"http://127.0.0.1:{free_port()}/metrics", f"{garbage.url}/metrics"):
        exporter = exporter_factory("/", agent_config(agent_metrics_url=url))
        status, _, body = exporter.scrape()
        got = samples(body.decode())
        assert status == 200
        assert available(got, "agent_metrics_url") == 0
        assert not any(k.startswith("agent_") for k in got)
        assert "fleetscope_exporter_build_info" in "".join(got)
    assert garbage.requests >= 1


def test_a_slow_agent_endpoint_never_holds_the_scrape_past_the_timeout(
        exporter_factory, local_server):
    slow = local_server(lambda request, release: (release.wait(10), (200, b"agent_x 1\n"))[1])
    exporter = exporter_factory("/", agent_config(agent_metrics_url=f"{slow.url}/metrics",
                                                  agent_timeout_seconds=0.5))
    results = []

    def scrape():
        start = time.monotonic()
        status, _, body = exporter.scrape()
        results.append((status, time.monotonic() - start, samples(body.decode())))

    for _ in range(2):  # two Prometheus replicas at once, twice
        scrapers = [threading.Thread(target=scrape) for _ in range(2)]
        for thread in scrapers:
            thread.start()
        for thread in scrapers:
            thread.join(30)
    assert len(results) == 4
    for status, seconds, got in results:
        assert status == 200 and seconds < 2.5
        assert available(got, "agent_metrics_url") == 0
    # Replicas scraping together share one request (which gives up after the timeout too):
    # at most one per round, plus the exporter's first collection at start-up.
    assert 1 <= slow.requests <= 3
    lines = [line for line in exporter.stderr().splitlines() if "agent_metrics_url" in line]
    assert len(lines) == 1 and "no answer within 0.5 s" in lines[0], exporter.stderr()


# -- bundle replay ---------------------------------------------------------------------------

def _bundle(tmp_path: Path, with_agent_prom: bool = True) -> Path:
    bundle = tmp_path / "bundle"
    sample = bundle / "samples" / "s0000"
    sample.mkdir(parents=True)
    (bundle / "static").mkdir()
    (bundle / "meta.json").write_text(json.dumps({
        "format": "fleetscope-bundle/1", "hostname": "agent-node-1", "interval_s": 15.0,
        "samples": [{"dir": "samples/s0000", "time": 1764660000.0}], "config": {}}))
    if with_agent_prom:
        shutil.copy(AGENT_PROM, sample / "agent.prom")
    return sample


@pytest.fixture
def traps():
    """Two listening sockets standing in for the recorded node's endpoints: any connection
    attempt would be queued on them (the kernel completes the handshake without accept)."""
    sockets = []
    for _ in range(2):
        trap = socket.socket()
        trap.bind(("127.0.0.1", 0))
        trap.listen(8)
        trap.settimeout(0.3)
        sockets.append(trap)
    yield sockets
    for trap in sockets:
        trap.close()


def _assert_untouched(traps) -> None:
    for trap in traps:
        with pytest.raises(socket.timeout):
            conn, _ = trap.accept()
            conn.close()


def _replay_config(traps) -> dict:
    return agent_config(
        agent_metrics_url=f"http://127.0.0.1:{traps[0].getsockname()[1]}/metrics",
        redis_url=f"redis://127.0.0.1:{traps[1].getsockname()[1]}/0",
        redis_queues=[{"key": "tasks:chat", "pool": POOL}])


def test_bundle_replay_reads_agent_prom_and_never_the_network(exporter_factory, tmp_path, traps):
    exporter = exporter_factory(_bundle(tmp_path), _replay_config(traps))
    text = exporter.text()
    assert_contract_shape(text)
    got = samples(text)
    assert got['agent_queue_depth{pool="chat-online",queue="tasks:chat"}'] == 4  # as recorded
    assert got['agent_task_heartbeat_age_seconds{pool="chat-online"}'] == 0.071
    assert_contract_shape(text, HARM_LABELS)  # one task in flight since its enqueue
    assert got[f"agent_sessions_in_flight{{{ONLINE}}}"] == 1
    assert got[f"agent_session_oldest_in_flight_seconds{{{ONLINE}}}"] == 1.546
    assert outcomes_of(text) == {"ok": 14, "error": 0, "timeout": 0}
    assert got[('agent_tool_calls_total{model="qwen2.5-1.5b-instruct-q4_k_m",'
                'outcome="timeout",pool="chat-online",tool="search"}')] == 2
    assert available(got, "agent.prom") == 1
    assert not any(k.startswith(("fleetscope_redis_", "fleetscope_agent_scrape")) for k in got)
    _assert_untouched(traps)


def test_bundle_without_agent_prom_is_unavailable_offline(exporter_factory, tmp_path, traps):
    exporter = exporter_factory(_bundle(tmp_path, with_agent_prom=False), _replay_config(traps))
    got = samples(exporter.text())
    assert available(got, "agent.prom") == 0
    assert not any(k.startswith("agent_") for k in got)
    _assert_untouched(traps)


def test_fixture_root_with_agent_prom_replays_in_process(tmp_path, traps):
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(AGENT_PROM, root / "agent.prom")
    config = parse_config(_replay_config(traps), ("agent",))
    text = render(Exporter(str(root), config).collect())
    assert samples(text)['agent_session_migrations_total{pool="chat-online"}'] == 1
    _assert_untouched(traps)


def test_collector_reexports_the_module_queue_as_the_runtime_wrote_it(tmp_path, traps):
    root = tmp_path / "root"
    root.mkdir()
    signals = AgentSignals(POOL, "online")
    signals.set_module_queue_depth("gpu3", 11)
    (root / "agent.prom").write_bytes(signals.exposition())
    signals.shutdown()
    config = parse_config(_replay_config(traps), ("agent",))
    text = render(Exporter(str(root), config).collect())
    assert samples(text)['agent_module_queue_depth{module="gpu3",pool="chat-online"}'] == 11
    assert label_names(text, "agent_module_queue_depth") == {frozenset({"pool", "module"})}
    _assert_untouched(traps)


def test_collector_reexports_failed_and_stuck_sessions_as_the_runtime_wrote_them(
        tmp_path, traps):
    """A bundle's agent.prom with failed sessions and one in flight for 30 s replays to the
    same agent_sessions_total and in-flight gauges, label sets unchanged."""
    root = tmp_path / "root"
    root.mkdir()
    signals = AgentSignals(POOL, "online")
    for error in (RuntimeError("refused"), TimeoutError("late"), RuntimeError("refused")):
        with pytest.raises(type(error)), signals.session():
            raise error
    with signals.session(arrived_at=time.time() - 30):
        (root / "agent.prom").write_bytes(signals.exposition())
    signals.shutdown()
    written = samples((root / "agent.prom").read_text())
    assert written[f"agent_session_oldest_in_flight_seconds{{{ONLINE}}}"] >= 30
    text = render(Exporter(str(root), parse_config(_replay_config(traps), ("agent",))).collect())
    got = samples(text)
    for name in HARM_LABELS:
        kept = {k: v for k, v in written.items() if k.startswith(name.removesuffix("_total"))}
        assert kept and all(got[k] == v for k, v in kept.items()), name
    assert outcomes_of(text) == {"ok": 0, "error": 2, "timeout": 1}
    assert got[f"agent_sessions_in_flight{{{ONLINE}}}"] == 1
    assert_contract_shape(text, HARM_LABELS)
    _assert_untouched(traps)


def test_node_side_imports_stay_light():
    code = ("import sys, fleetscope.exporter, fleetscope.collectors.agent; "
            "bad = [m for m in ('redis', 'opentelemetry', 'pandas') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- the exposition parser and the GenAI mapping ---------------------------------------------

def test_parser_keeps_agent_and_genai_families_only():
    text = ("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\n"
            "# TYPE agent_custom counter\nagent_custom 2\n"  # counter without _total
            "agent_untyped{pool=\"p\"} 1\n"
            "# TYPE agent_queue_depth gauge\nagent_queue_depth{pool=\"p\",queue=\"q\"} 1\n"
            "agent_queue_depth{pool=\"p\",queue=\"q\"} 9\n"  # duplicate series: first wins
            "gen_ai_client_token_usage_sum 3\n"
            "# TYPE agent_h histogram\nagent_h_bucket{le=\"+Inf\"} 1\n"
            "agent_h_count 1\nagent_h_sum 1\n"
            "# TYPE agent_h_bucket gauge\nagent_h_bucket 5\n")  # the histogram's sample name
    families = {f.name: f for f in parse_agent_exposition(text)}
    assert set(families) == {"agent_custom_total", "agent_untyped", "agent_queue_depth",
                             "gen_ai_client_token_usage_sum", "agent_h"}
    assert families["agent_custom_total"].type == "counter"
    assert families["agent_untyped"].type == "gauge"
    assert [s[2] for s in families["agent_queue_depth"].samples] == [1.0]
    out = render([f.to_family() for f in families.values()], openmetrics=True) + "# EOF\n"
    assert {f.name for f in parse_om(out)} >= {"agent_custom", "agent_queue_depth"}


@pytest.mark.parametrize("text", [
    "<html><body>login</body></html>\n",
    "agent_x{pool=\"p\" 1\n",
    "# TYPE agent_h histogram\nagent_h_bucket{le=\"soon\"} 1\n",
    "agent_x one\n",
])
def test_parser_rejects_what_is_not_an_exposition(text):
    with pytest.raises(ParseError):
        parse_agent_exposition(text)


GENAI_ONLY = """\
# TYPE gen_ai_client_operation_duration_seconds histogram
gen_ai_client_operation_duration_seconds_bucket{gen_ai_operation_name="chat",le="0.1"} 2
gen_ai_client_operation_duration_seconds_bucket{gen_ai_operation_name="chat",le="1"} 5
gen_ai_client_operation_duration_seconds_bucket{gen_ai_operation_name="chat",le="+Inf"} 6
gen_ai_client_operation_duration_seconds_count{gen_ai_operation_name="chat"} 6
gen_ai_client_operation_duration_seconds_sum{gen_ai_operation_name="chat"} 4.5
gen_ai_client_operation_duration_seconds_bucket{gen_ai_operation_name="text_completion",le="0.5"} 1
gen_ai_client_operation_duration_seconds_bucket{gen_ai_operation_name="text_completion",le="+Inf"} 1
gen_ai_client_operation_duration_seconds_count{gen_ai_operation_name="text_completion"} 1
gen_ai_client_operation_duration_seconds_sum{gen_ai_operation_name="text_completion"} 0.3
gen_ai_client_operation_duration_seconds_bucket{gen_ai_operation_name="execute_tool",le="+Inf"} 3
gen_ai_client_operation_duration_seconds_count{gen_ai_operation_name="execute_tool"} 3
gen_ai_client_operation_duration_seconds_sum{gen_ai_operation_name="execute_tool"} 1.2
gen_ai_client_operation_duration_seconds_bucket{gen_ai_operation_name="invoke_agent",le="+Inf"} 9
gen_ai_client_operation_duration_seconds_count{gen_ai_operation_name="invoke_agent"} 9
gen_ai_client_operation_duration_seconds_sum{gen_ai_operation_name="invoke_agent"} 30
"""


def test_genai_durations_stand_in_for_missing_stages():
    families = map_genai_stages(parse_agent_exposition(GENAI_ONLY), default_pool=POOL)
    got = samples(render([f.to_family() for f in families]))
    stage = 'agent_stage_duration_seconds_{}{{le="{}",pool="chat-online",stage="inference"}}'
    # chat (bounds 0.1, 1) and text_completion (bound 0.5) merged on 0.1, 0.5, 1.
    assert got[stage.format("bucket", "0.1")] == 2
    assert got[stage.format("bucket", "0.5")] == 3  # chat counts 2 at 0.5 (its bound 0.1)
    assert got[stage.format("bucket", "1.0")] == 6
    assert got[stage.format("bucket", "+Inf")] == 7
    assert got['agent_stage_duration_seconds_count{pool="chat-online",stage="inference"}'] == 7
    assert got['agent_stage_duration_seconds_sum{pool="chat-online",stage="inference"}'] == 4.8
    assert got['agent_stage_duration_seconds_count{pool="chat-online",stage="tool_call"}'] == 3
    assert not any('stage="invoke_agent"' in k for k in got)

    # A runtime that reports the inference stage itself keeps its own numbers.
    own = ("# TYPE agent_stage_duration_seconds histogram\n"
           'agent_stage_duration_seconds_bucket{pool="p",stage="inference",le="+Inf"} 1\n'
           'agent_stage_duration_seconds_count{pool="p",stage="inference"} 1\n'
           'agent_stage_duration_seconds_sum{pool="p",stage="inference"} 0.1\n')
    families = map_genai_stages(parse_agent_exposition(own + GENAI_ONLY), default_pool=POOL)
    got = samples(render([f.to_family() for f in families]))
    assert [k for k in got if "inference" in k and k.startswith("agent_stage")] == [
        'agent_stage_duration_seconds_bucket{le="+Inf",pool="p",stage="inference"}',
        'agent_stage_duration_seconds_count{pool="p",stage="inference"}',
        'agent_stage_duration_seconds_sum{pool="p",stage="inference"}']
    assert got['agent_stage_duration_seconds_count{pool="chat-online",stage="tool_call"}'] == 3


# -- fuzzing: only ParseError escapes, and what parses renders as valid text -----------------

FIXTURE_TEXT = AGENT_PROM.read_text()
exposition_tokens = st.sampled_from([
    "# TYPE ", "# HELP ", "agent_x", "agent_h", "gen_ai_client_operation_duration_seconds",
    "_bucket", "_sum", "_count", "_total", "_created", " counter", " gauge", " histogram",
    " summary", " untyped", "{", "}", '="', '"', ",", "le", "pool", "stage", "quantile", " ",
    "\n", "1", "0.5", "+Inf", "NaN", "-", "e9", "\\", "\\n", "\x00", "\u00e9", "__name__",
    "gen_ai_operation_name", "execute_tool", "chat",
])


def _roundtrip(text: str) -> None:
    try:
        families = map_genai_stages(parse_agent_exposition(text), default_pool=POOL)
    except ParseError:
        return
    out = render([f.to_family() for f in families])
    parsed = list(parse_text(out))
    names = [f.name for f in parsed]
    assert all(name.startswith(("agent_", "gen_ai_")) for name in names)
    assert len(names) == len(set(names)), names
    sample_names = [{s.name for s in f.samples} for f in parsed]
    assert sum(map(len, sample_names)) == len(set().union(*sample_names))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(max_size=300),
                      st.lists(exposition_tokens, max_size=80).map("".join)))
def test_fuzz_parser_only_raises_parse_error(text):
    _roundtrip(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(0, len(FIXTURE_TEXT)), junk=st.text(max_size=20),
       at=st.integers(0, len(FIXTURE_TEXT)))
def test_fuzz_parser_on_cut_and_corrupted_fixture(cut, junk, at):
    _roundtrip(FIXTURE_TEXT[:cut])
    _roundtrip(FIXTURE_TEXT[:at] + junk + FIXTURE_TEXT[at:])
