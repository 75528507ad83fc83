"""diagnose/remote.py without an engine: filters land on every selector,
and the client keeps to its deadline and size cap against a server on 127.0.0.1."""

from __future__ import annotations

import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleetscope.diagnose import remote
from fleetscope.rules.catalog import CATALOG
from fleetscope.rules.promql import Selector


def test_every_selector_gets_the_node_filter():
    for rule in CATALOG:
        for _, condition, _ in rule.severities():
            text = remote.with_matchers(condition, {"instance": "n1:9105"}).promql()
            # ALERTS (read by unexplained-harm) is matched `on (instance[, pool])`: no filter
            # needed, and its `fleetscope_rule` and `fleetscope_phase` labels are no selectors
            selectors = (text.count("fleetscope_") + text.count("agent_")
                         + text.count("gen_ai_") - text.count("fleetscope_rule=")
                         - text.count("fleetscope_phase="))
            assert text.count('instance="n1:9105"') == selectors, rule.id
    regex = remote.node_regex(["a.b:1", "c:2"])
    assert Selector("x", {"instance": regex}).promql() == 'x{instance=~"a\\\\.b:1|c:2"}'


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.do_POST()

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = self.server.mode
        if mode == "slow":
            time.sleep(2)
        body = {"ok": json.dumps({"status": "success",
                                  "data": {"resultType": "vector", "result": []}}).encode(),
                "big": b'{"status": "success", "data": {"result": [' + b" " * 4096 + b"]}}",
                "html": b"<html>proxy error</html>",
                "error": json.dumps({"status": "error", "error": "parse error"}).encode(),
                "slow": b"{}"}[mode]
        status = 400 if mode == "error" else 200
        self.send_response(status)
        if mode == "ok" and "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except BrokenPipeError:
            pass  # the client gave up at its deadline

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.mode = "ok"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_client_answers_and_fails_in_one_line(server):
    url = f"http://127.0.0.1:{server.server_address[1]}"
    client = remote.QueryClient(url, deadline_seconds=5, max_answer_bytes=1024)
    assert client.query("up", time.time()) == []
    assert client.stats.queries == 1 and client.stats.bytes_received > 0
    for mode, message in (("big", "more than"), ("html", "did not answer JSON"),
                          ("error", "HTTP 400")):
        server.mode = mode
        with pytest.raises(remote.RemoteError, match=message) as caught:
            client.query("up", time.time())
        assert "\n" not in str(caught.value)
    server.mode = "slow"
    slow = remote.QueryClient(url, deadline_seconds=0.5)
    with pytest.raises(remote.RemoteError, match="deadline"):
        slow.query("up", time.time())
    with pytest.raises(remote.RemoteError, match="deadline"):  # spent: no further query
        slow.query("up", time.time())
    with pytest.raises(remote.RemoteError, match="unreachable"):
        remote.QueryClient("http://127.0.0.1:9").query("up", time.time())
