"""An example agent worker, instrumented with fleetscope.agent_signals.

    python examples/agent_worker.py --listen 127.0.0.1:8081 --pool chat-online \\
        [--redis redis://127.0.0.1:6379/0 --queue tasks:chat] [--tool-url URL] \\
        [--serial] [--listen-backlog N]

    GET /metrics          the agent runtime endpoint: agent_* and gen_ai_* families, what
                          fleetscope's `agent` collector scrapes as agent_metrics_url
    GET /run?q=TEXT       one simulated agent session, answered as JSON (HTTP 500 with
                          {"error": ...} when the session failed)
        &session=ID       conversation id (default: a new one)
        &migrated=1       the session arrives from another node (counts a migration)

A session counts from the request's arrival: the `X-Request-Start` header the front proxy
sets (`t=<unix time>` in seconds, milliseconds or microseconds, e.g. nginx
`proxy_set_header X-Request-Start "t=${msec}";`), else the time its connection was accepted.
A bad or future header value is ignored (said once on stderr). Without the header a worker
cannot see the time a request waited in its listen socket's accept queue.

--serial serves one request at a time, as a single-threaded (GIL-bound, single event loop)
worker does: the others wait in the accept queue (--listen-backlog long, default 128), and
/metrics waits its turn too.

With --redis and --queue it also pops tasks from that Redis list, each a JSON object
{"id": str, "q": str, "enqueued_at": unix seconds} (the task's arrival: queue wait = now -
enqueued_at), and reports the list's length as agent_queue_depth.

A session is: context assembly (joins a made-up history), inference (burns --inference-ms of
CPU, as a small quantised model on CPU would), a tool call (GET --tool-url?q=TEXT with
--tool-timeout: 200 is ok, 400/422 bad arguments, other errors error, no answer in time a
timeout; without --tool-url a local stub), and state I/O (the session's state to Redis when
--redis is given; appended to --state-file under an exclusive flock held --state-file-ms, as
a file-backed store syncs it, when given; else to memory), then --untracked-ms in no stage
at all (a step nobody instrumented). A state write Redis refuses (e.g. a full Redis: `CONFIG
SET maxmemory 1` with `maxmemory-policy noeviction` answers SET with "OOM command not
allowed") fails the session: outcome `error` (`timeout` for a Redis timeout) and HTTP 500;
the worker keeps serving. The worker loads its "model" once at start (stage model_load).
Needs `pip install 'fleetscope[agent,redis]'`.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn

from fleetscope.agent_signals import (
    EXPOSITION_CONTENT_TYPE,
    AgentSignals,
    BadToolArguments,
    classify_exception,
    parse_request_start,
)


def burn_cpu(milliseconds: float) -> int:
    """Busy-loop for the given time: stands in for a forward pass on CPU."""
    end = time.perf_counter() + milliseconds / 1000
    state = 1
    while time.perf_counter() < end:
        for _ in range(1000):
            state = (state * 1103515245 + 12345) & 0xFFFFFFFF
    return state


class Worker:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.signals = AgentSignals(args.pool, args.workload_class, agent="example-agent",
                                    provider="local")
        self.redis = None
        if args.redis:
            import redis

            self.redis = redis.Redis.from_url(args.redis, socket_timeout=5,
                                              socket_connect_timeout=5, decode_responses=True)
        self.memory_state: dict[str, str] = {}
        self.stop = threading.Event()
        self._said: set[str] = set()
        self._said_lock = threading.Lock()
        with self.signals.stage("model_load"):
            burn_cpu(args.load_ms)

    def say_once(self, kind: str, message: str) -> None:
        """One stderr line per kind of trouble: a bad header on every request, or every
        session failing on a full Redis, is one fact, not a flood."""
        with self._said_lock:
            if kind in self._said:
                return
            self._said.add(kind)
        print(f"agent worker: {message}", file=sys.stderr, flush=True)

    def call_tool(self, query: str) -> str:
        if not self.args.tool_url:
            time.sleep(0.002)
            return f"stub result for {query!r}"
        url = f"{self.args.tool_url}?{urllib.parse.urlencode({'q': query})}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=self.args.tool_timeout) as response:
                return response.read(65536).decode("utf-8", "replace")
        except urllib.error.HTTPError as err:
            if err.code in (400, 422):
                raise BadToolArguments(f"tool rejected the arguments: HTTP {err.code}") from err
            raise

    def append_state(self, state: str) -> None:
        """One line to the shared state file under an exclusive flock: workers sharing the
        file take turns, each holding it while its write is made durable."""
        import fcntl

        with open(self.args.state_file, "a", encoding="utf-8") as out:
            fcntl.flock(out, fcntl.LOCK_EX)
            try:
                out.write(state + "\n")
                out.flush()
                time.sleep(self.args.state_file_ms / 1000)  # the sync a durable store waits
            finally:
                fcntl.flock(out, fcntl.LOCK_UN)

    def run_session(self, query: str, session_id: str, migrated: bool = False,
                    arrived_at: float | None = None) -> dict:
        """One session; an exception (a state write refused) leaves it failed and counted."""
        if migrated:
            self.signals.session_migrated()
        answer: dict = {"session": session_id}
        with self.signals.session(session_id, arrived_at=arrived_at):
            with self.signals.stage("context_assembly"):
                prompt = "\n".join(f"turn {i}: {query}" for i in range(50))
            with self.signals.inference(self.args.model) as chat:
                burn_cpu(self.args.inference_ms)
                chat.usage(input_tokens=len(prompt.split()), output_tokens=32)
            try:
                with self.signals.tool_call("search"):
                    answer["tool"] = self.call_tool(query)[:200]
                answer["tool_outcome"] = "ok"
            except Exception as err:  # counted by tool_call(); the agent answers without it
                answer["tool_outcome"] = classify_exception(err)
                answer["tool_error"] = str(err)[:200]
            with self.signals.stage("state_io"):
                state = json.dumps({"query": query, "updated": time.time()})
                if self.redis is not None:
                    self.redis.set(f"session:{session_id}", state, ex=3600)
                elif self.args.state_file:
                    self.append_state(state)
                else:
                    self.memory_state[session_id] = state
            if self.args.untracked_ms:  # a step of the session no stage measures
                time.sleep(self.args.untracked_ms / 1000)
        return answer

    def consume(self) -> None:
        """Pop tasks from the Redis list until stopped (BLPOP with a 1 s timeout)."""
        key = self.args.queue
        while not self.stop.is_set():
            try:
                popped = self.redis.blpop([key], timeout=1)
                self.signals.set_queue_depth(key, self.redis.llen(key))
            except Exception as err:  # Redis restarting: retry after a pause
                print(f"agent worker: redis: {err}", file=sys.stderr, flush=True)
                self.stop.wait(1)
                continue
            if popped is None:
                continue
            try:
                task = json.loads(popped[1])
                query, task_id = str(task.get("q", "")), str(task.get("id") or new_session_id())
                enqueued_at = task.get("enqueued_at")
                enqueued_at = None if enqueued_at is None else float(enqueued_at)
            except (ValueError, TypeError, AttributeError) as err:
                print(f"agent worker: bad task {popped[1][:80]!r}: {err}", file=sys.stderr,
                      flush=True)
                continue
            if enqueued_at is not None and not math.isfinite(enqueued_at):
                enqueued_at = None
            try:
                self.run_session(query, task_id, arrived_at=enqueued_at)
            except Exception as err:  # counted failed by the session; the next task comes
                self.say_once(f"task {type(err).__name__}", session_failed(err))


def new_session_id() -> str:
    return uuid.uuid4().hex[:12]


def session_failed(err: Exception) -> str:
    return (f"session failed: {type(err).__name__}: {str(err)[:160]} (outcome counted in "
            "agent_sessions_total; later failures of this kind are not logged)")


class Handler(BaseHTTPRequestHandler):
    server: WorkerServer

    def handle(self) -> None:
        # the accept: where a request without X-Request-Start starts counting
        self.accepted_at = time.time()
        super().handle()

    def arrival(self) -> float:
        """When the request arrived: the proxy's X-Request-Start, else the accept time."""
        header = self.headers.get("X-Request-Start")
        if header:
            try:
                return parse_request_start(header)
            except ValueError as err:
                self.server.worker.say_once("X-Request-Start", f"{err}; such requests count "
                                            "from their accept (said once)")
        return self.accepted_at

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        url = urllib.parse.urlsplit(self.path)
        worker = self.server.worker
        if url.path == "/metrics":
            self.reply(200, worker.signals.exposition(), EXPOSITION_CONTENT_TYPE)
        elif url.path == "/run":
            params = dict(urllib.parse.parse_qsl(url.query))
            session_id = params.get("session") or new_session_id()
            try:
                answer = worker.run_session(params.get("q", ""), session_id,
                                            params.get("migrated") == "1", self.arrival())
            except Exception as err:  # the session failed (and was counted so): say so
                worker.say_once(f"http {type(err).__name__}", session_failed(err))
                error = {"session": session_id, "error": f"{type(err).__name__}: {err}"[:300]}
                self.reply(500, json.dumps(error).encode(), "application/json")
                return
            self.reply(200, json.dumps(answer).encode(), "application/json")
        else:
            self.reply(404, b"try /run?q=... or /metrics\n", "text/plain")

    def reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        pass  # quiet: one line per request is noise here


class WorkerServer(HTTPServer):
    """The worker's HTTP server. As it is, one request at a time in the serving thread
    (--serial): the others wait in the listen socket's accept queue."""

    def __init__(self, address: tuple[str, int], worker: Worker, backlog: int):
        self.worker = worker
        self.request_queue_size = backlog  # listen()'s backlog (socketserver's default: 5)
        super().__init__(address, Handler)


class ThreadedWorkerServer(ThreadingMixIn, WorkerServer):
    """A thread per request."""

    daemon_threads = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:8081", metavar="HOST:PORT",
                        help="address of the HTTP server (port 0: any free port)")
    parser.add_argument("--pool", required=True, help="workload pool (label pool)")
    parser.add_argument("--class", dest="workload_class", default="online",
                        choices=["online", "offline"])
    parser.add_argument("--redis", metavar="URL", help="Redis for tasks and session state")
    parser.add_argument("--queue", metavar="KEY", help="Redis list to pop tasks from")
    parser.add_argument("--tool-url", metavar="URL", help="HTTP tool to call once a session")
    parser.add_argument("--tool-timeout", type=float, default=2.0, metavar="SECONDS")
    parser.add_argument("--model", default="qwen2.5-1.5b-instruct-q4_k_m")
    parser.add_argument("--inference-ms", type=float, default=20.0)
    parser.add_argument("--load-ms", type=float, default=50.0)
    parser.add_argument("--untracked-ms", type=float, default=0.0, metavar="MS",
                        help="time each session spends in a step outside every stage (an "
                             "uninstrumented call: what no stage histogram shows)")
    parser.add_argument("--state-file", metavar="PATH",
                        help="append each session's state to this file under an exclusive "
                             "flock (workers sharing it take turns)")
    parser.add_argument("--state-file-ms", type=float, default=5.0, metavar="MS",
                        help="how long a state write holds the file's lock (its sync)")
    parser.add_argument("--serial", action="store_true",
                        help="serve one request at a time (a single-threaded worker); the "
                             "others wait in the listen socket's accept queue")
    parser.add_argument("--listen-backlog", type=int, default=128, metavar="N",
                        help="accept-queue length of the listen socket (listen() backlog)")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        parser.error(f"--listen must be HOST:PORT, got {args.listen!r}")
    if args.queue and not args.redis:
        parser.error("--queue needs --redis")
    if args.listen_backlog < 1:
        parser.error(f"--listen-backlog must be at least 1, got {args.listen_backlog}")

    worker = Worker(args)
    server_class = WorkerServer if args.serial else ThreadedWorkerServer
    server = server_class((host.strip("[]") or "127.0.0.1", int(port)), worker,
                          args.listen_backlog)
    consumer = None
    if args.queue:
        consumer = threading.Thread(target=worker.consume, name="consumer", daemon=True)
        consumer.start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    bound_host, bound_port = server.server_address[:2]
    print(f"agent worker listening on http://{bound_host}:{bound_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        worker.stop.set()
        server.server_close()
        if consumer is not None:
            consumer.join(timeout=3)
        worker.signals.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
