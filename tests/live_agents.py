"""The example agent worker (examples/agent_worker.py) in live tests: a tool it calls, the
workers themselves, and users asking them, all real processes on 127.0.0.1, each ending by
itself (an alarm) and killed by pid through the scenario's Lab (tests/test_live_accuracy.py).

    tool = start_tool(lab, delay=1.2)                    # a search API, right after 1.2 s
    bases = start_workers(lab, 1, "--tool-url", tool)    # the online pool chat-online
    start_users(lab, bases[0], 4)                        # four users, X-Request-Start set

The workers' command lines hold WORKER_NAME, which the pool matches on; the node's config
gets the first worker's metrics endpoint (agent_metrics_url).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.test_live_accuracy import LIFETIME_S, Lab, _wait_line

WORKER = Path(__file__).resolve().parent.parent / "examples" / "agent_worker.py"
POOL = "chat-online"
WORKER_NAME = "fs_agent_worker"

TOOL_SERVER = """
import signal, socket, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
signal.alarm(int(float(sys.argv[1])))
delay = float(sys.argv[2])
if delay < 0:                     # a tool API that accepts and never answers
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    print(server.getsockname()[1], flush=True)
    held = []
    while True:
        held.append(server.accept()[0])
class Tool(BaseHTTPRequestHandler):
    def do_GET(self):             # a search API: always right, after `delay` seconds
        time.sleep(delay)
        body = b'{"results": ["a correct answer"]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Tool)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
"""
# The example worker with a lifetime: argv[1] seconds, argv[2] the cgroup.procs files to join
# first (comma-separated, or "-"), argv[3] the worker, the rest its arguments.
WORKER_WRAPPER = """
import os, runpy, signal, sys
signal.alarm(int(float(sys.argv[1])))
for procs in filter(None, sys.argv[2].split(",") if sys.argv[2] != "-" else []):
    with open(procs, "w") as handle:
        handle.write(str(os.getpid()))
sys.argv = sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
# Users: argv lifetime, URL, how many, think seconds. Each stamps X-Request-Start (as a front
# proxy does, nginx's t=${msec}) so the worker counts from the request's arrival.
USERS = """
import sys, threading, time, urllib.request
end = time.time() + float(sys.argv[1])
url, count, think = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def user():
    while time.time() < end:
        request = urllib.request.Request(url, headers={
            "X-Request-Start": "t=%.3f" % time.time()})
        try:
            opener.open(request, timeout=30).read()
        except OSError:
            time.sleep(0.5)
        time.sleep(think)
threads = [threading.Thread(target=user, daemon=True) for _ in range(count)]
for thread in threads:
    thread.start()
print("ready", flush=True)
time.sleep(max(0.0, end - time.time()))
"""


def start_tool(lab: Lab, delay: float) -> str:
    """A tool on 127.0.0.1 answering after `delay` seconds (negative: never); its URL."""
    tool = lab.script("fs_agent_tool.py", TOOL_SERVER, LIFETIME_S, delay,
                      stdout=subprocess.PIPE)
    return f"http://127.0.0.1:{int(_wait_line(tool))}/search"


def start_workers(lab: Lab, count: int, *args, join: tuple[str, ...] = (),
                  pool: str = POOL, name: str = WORKER_NAME) -> list[str]:
    """`count` example workers of pool `pool` (online), each in the cgroups whose
    cgroup.procs files are `join`; their base URLs. The config gets the pool and the first
    worker's metrics endpoint."""
    bases = []
    for _ in range(count):
        worker = lab.script(f"{name}.py", WORKER_WRAPPER, LIFETIME_S, ",".join(join) or "-",
                            WORKER, "--listen", "127.0.0.1:0", "--pool", pool,
                            "--inference-ms", "10", *args, stdout=subprocess.PIPE)
        line = _wait_line(worker, 60)
        assert "listening on" in line, line
        bases.append(line.split("listening on ", 1)[1].strip())
    lab.pool(pool, "online", name)
    lab.config.setdefault("agent_metrics_url", f"{bases[0]}/metrics")
    return bases


def start_users(lab: Lab, base: str, count: int, think: float = 0.2,
                name: str = "fs_agent_users") -> None:
    users = lab.script(f"{name}.py", USERS, LIFETIME_S, f"{base}/run?q=weather", count, think,
                       stdout=subprocess.PIPE)
    assert _wait_line(users, 60) == "ready"


def settle(seconds: float = 3.0) -> None:
    """Sessions finish before the diagnosis window opens (its rates need some behind them)."""
    time.sleep(seconds)
