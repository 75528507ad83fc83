"""Harm as users feel it, from the real example worker (examples/agent_worker.py):

    state writes refused   a real redis-server on 127.0.0.1 that is full (`CONFIG SET
                           maxmemory 1`, policy noeviction: SET answers "OOM command not
                           allowed"): every session fails, counted `error` in
                           agent_sessions_total, HTTP 500; the worker keeps serving
    a serial worker        one request at a time under 12 concurrent users who stamp
                           X-Request-Start as a front proxy does: the worker's own P99 is the
                           users' P99 (ground truth: the users' own timings), where without the
                           header it sees only its own work
    a session that hangs   its tool (a socket on 127.0.0.1 that takes the connection and never
                           answers) holds it: it never reaches the duration histogram, and
                           agent_session_oldest_in_flight_seconds grows with wall time, from
                           the arrival the header gave

Every child ends by itself (an alarm) and is killed by pid at the end of its test; every
client is bounded in count and time.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fleetscope.agent_runtime.schema import SESSION_BUCKETS
from tests.conftest import samples
from tests.test_agent_signals import (
    families_of,
    read_line,
    stop_process,
)
from tests.test_live_fault_harm import WORKER, WORKER_WITH_ALARM

pytestmark = pytest.mark.live

POOL = "chat-online"
ONLINE = f'class="online",pool="{POOL}"'
LIFETIME_S = 120  # every worker ends by itself after this
USERS = 12
ROUNDS = 5  # requests per user
SESSION_MS = 125  # the serial worker's own work per session: 12 users wait ~1.5 s
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Worker:
    """The example worker in a child process with a lifetime, stderr kept in a file."""

    def __init__(self, tmp_path: Path, *args: str):
        wrapper = tmp_path / "fs_harm_worker.py"
        wrapper.write_text(WORKER_WITH_ALARM)
        self.log = tmp_path / f"worker-{time.monotonic_ns()}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(wrapper), str(LIFETIME_S), str(WORKER), "--listen",
                 "127.0.0.1:0", "--pool", POOL, *args],
                stdout=subprocess.PIPE, stderr=log, text=True)
        line = read_line(self.proc, 30)
        if "listening on" not in line:
            self.stop()
            raise AssertionError(f"worker did not start: {line!r} {self.log.read_text()}")
        self.base = line.split("listening on ", 1)[1].strip()

    def get(self, path: str, headers: dict | None = None, timeout: float = 30
            ) -> tuple[int, bytes]:
        request = urllib.request.Request(f"{self.base}{path}", headers=headers or {})
        try:
            with OPENER.open(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def metrics(self) -> str:
        status, body = self.get("/metrics")
        assert status == 200
        return body.decode()

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture
def workers(tmp_path):
    started: list[Worker] = []

    def start(*args: str) -> Worker:
        started.append(Worker(tmp_path, *args))
        return started[-1]

    yield start
    for worker in started:
        worker.stop()


def outcomes(text: str) -> dict[str, float]:
    return {s.labels["outcome"]: s.value for s in families_of(text)["agent_sessions"].samples
            if s.labels["class"] == "online"}


def request_start() -> str:
    """X-Request-Start as nginx writes `t=${msec}`: seconds, milliseconds truncated."""
    return f"t={math.floor(time.time() * 1000) / 1000:.3f}"


# -- a state store refusing every write ------------------------------------------------------

def test_state_writes_refused_fail_every_session_and_the_worker_keeps_serving(
        workers, redis_url):
    import redis

    store = redis.Redis.from_url(redis_url, socket_timeout=5)
    worker = workers("--redis", redis_url, "--inference-ms", "5")
    refused = 5
    store.config_set("maxmemory-policy", "noeviction")
    store.config_set("maxmemory", "1")  # full: every write refused, reads still answered
    try:
        # the fault is real: Redis answers "-OOM command not allowed when used memory >
        # 'maxmemory'." (redis-py: OutOfMemoryError)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            store.set("probe", "x")
        for n in range(refused):
            status, body = worker.get(f"/run?q=weather&session=refused-{n}")
            answer = json.loads(body)
            assert status == 500 and answer["session"] == f"refused-{n}", answer
            assert answer["error"].startswith("OutOfMemoryError: command not allowed"), answer
        text = worker.metrics()  # still serving
        assert worker.proc.poll() is None
    finally:
        store.config_set("maxmemory", "0")
    assert outcomes(text) == {"ok": 0, "error": refused, "timeout": 0}
    got = samples(text)
    # the failed sessions took their time like any other: the histogram holds them too
    assert got[f"agent_session_duration_seconds_count{{{ONLINE}}}"] == refused
    assert got[f"agent_sessions_in_flight{{{ONLINE}}}"] == 0

    status, body = worker.get("/run?q=weather&session=after")  # Redis takes writes again
    assert status == 200 and json.loads(body)["session"] == "after"
    assert store.get("session:after") is not None
    assert outcomes(worker.metrics()) == {"ok": 1, "error": refused, "timeout": 0}
    store.close()
    worker.stop()
    lines = [line for line in worker.log.read_text().splitlines() if "session failed" in line]
    assert len(lines) == 1 and "OutOfMemoryError" in lines[0], worker.log.read_text()


# -- a single-threaded worker under concurrent users -----------------------------------------

def bucket_quantile(q: float, text: str) -> float:
    """Prometheus histogram_quantile() over the online sessions' buckets: linear inside the
    bucket that holds the rank, from 0 below the first bound."""
    buckets = sorted((float(s.labels["le"]), s.value)
                     for s in families_of(text)["agent_session_duration_seconds"].samples
                     if s.name.endswith("_bucket") and s.labels["class"] == "online")
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    raise AssertionError("no bucket holds the rank")


def client_p99(timings: list[float]) -> float:
    ranked = sorted(timings)
    return ranked[math.ceil(0.99 * len(ranked)) - 1]


def serve_users(worker: Worker, stamp: bool) -> list[float]:
    """USERS users at once, each ROUNDS requests back to back; their own timings (s)."""
    timings: list[float] = []
    failures: list[str] = []
    start = threading.Barrier(USERS)

    def user() -> None:
        try:
            start.wait(30)
            for _ in range(ROUNDS):
                began = time.monotonic()
                headers = {"X-Request-Start": request_start()} if stamp else {}
                status, _ = worker.get("/run?q=weather", headers, timeout=60)
                timings.append(time.monotonic() - began)
                if status != 200:
                    failures.append(str(status))
        except (OSError, threading.BrokenBarrierError) as err:
            failures.append(repr(err))

    threads = [threading.Thread(target=user) for _ in range(USERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LIFETIME_S)
    assert not failures and len(timings) == USERS * ROUNDS, failures
    return timings


def test_a_serial_worker_reports_the_wait_its_users_feel(workers):
    args = ("--serial", "--inference-ms", str(SESSION_MS), "--listen-backlog", "64")
    seen = {}
    for stamp in (True, False):
        worker = workers(*args)
        timings = serve_users(worker, stamp)
        text = worker.metrics()
        worker.stop()
        assert outcomes(text)["ok"] == USERS * ROUNDS
        seen[stamp] = (client_p99(timings), bucket_quantile(0.99, text))
    (users, stamped), (users_plain, plain) = seen[True], seen[False]
    print(f"\nserial worker, {USERS} users: users' P99 {users:.2f} s; the worker's own P99 "
          f"{stamped:.2f} s with X-Request-Start, {plain:.2f} s without (users then: "
          f"{users_plain:.2f} s)")
    # A histogram places a value no finer than its bucket: within the widest step between
    # neighbouring bounds of the runtime's session buckets, it is the users' P99.
    factor = max(b / a for a, b in zip(SESSION_BUCKETS[:-1], SESSION_BUCKETS[1:], strict=True))
    assert users / factor <= stamped <= users * factor, seen
    # Without the header the worker sees its own work only: a fraction of the users' wait.
    assert plain * 3 < stamped and plain * 3 < users_plain, seen


# -- a session that never finishes -----------------------------------------------------------

def test_a_session_that_never_finishes_ages_from_its_arrival(workers):
    silent = socket.socket()  # the kernel takes the connection; nobody ever answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    tool = f"http://127.0.0.1:{silent.getsockname()[1]}/search"
    worker = workers("--tool-url", tool, "--tool-timeout", str(LIFETIME_S),
                     "--inference-ms", "5")
    waited = 3.0  # the request waited 3 s in front of the worker already
    arrived = f"t={math.floor((time.time() - waited) * 1000) / 1000:.3f}"

    def user() -> None:
        try:
            worker.get("/run?q=weather", {"X-Request-Start": arrived}, timeout=2)
        except OSError:
            pass  # the user gives up; the session goes on

    client = threading.Thread(target=user)
    client.start()
    oldest = f"agent_session_oldest_in_flight_seconds{{{ONLINE}}}"
    readings = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(readings) < 2:
        got = samples(worker.metrics())
        if got[f"agent_sessions_in_flight{{{ONLINE}}}"] == 1 and (
                not readings or got[oldest] >= readings[0][1] + 2):
            readings.append((time.monotonic(), got[oldest], got))
        time.sleep(0.2)
    still = worker.metrics()
    client.join(10)
    silent.close()  # the tool's connection reset: the session ends now
    assert len(readings) == 2, readings
    (first_at, first_age, _), (then_at, then_age, then) = readings
    assert first_age >= waited  # counted from the arrival, not from the worker's start
    wall = then_at - first_at
    assert 0.5 * wall <= then_age - first_age <= wall + 1.0, (readings, wall)
    # never finished: no duration observed, no outcome counted, only the gauges show it
    assert then.get(f"agent_session_duration_seconds_count{{{ONLINE}}}", 0) == 0
    assert outcomes(still) == {"ok": 0, "error": 0, "timeout": 0}
