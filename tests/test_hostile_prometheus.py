"""`diagnose --prometheus` against a misbehaving Prometheus this test starts on 127.0.0.1.

Each misbehaviour is a path prefix of the fake server (the client keeps a URL's path, as
Prometheus behind a reverse proxy needs): http://127.0.0.1:PORT/<mode>/api/v1/query_range.
Expected: exit 3 and exactly one stderr line saying what was wrong, or a sane diagnosis; never
a traceback; one deadline (--timeout) for all the queries together.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from fleetscope.diagnose.prometheus import MAX_ANSWER_BYTES
from tests.hostile_corpus import run

STOP = threading.Event()
_BIG: list[bytes] = []  # the ~30 MB answer of the "big-valid" mode, built once


def _big_matrix() -> bytes:
    """A valid range answer of ~30 MB: 2,000 series of 800 points."""
    if not _BIG:
        points = ",".join(f'[{1764660000 + 15 * i},"0.5"]' for i in range(800))
        series = ",".join(f'{{"metric":{{"__name__":"m","instance":"n1","cpu":"{c}"}},'
                          f'"values":[{points}]}}' for c in range(2000))
        _BIG.append(('{"status":"success","data":{"resultType":"matrix","result":['
                     + series + "]}}").encode())
    return _BIG[0]


# The in-process path (every series fetched): its answers are parsed point by point.
LOCAL = ("--evaluate", "local")


def _matrix(name: str, values, metric=None) -> dict:
    metric = {"__name__": name, "instance": "n1"} if metric is None else metric
    return {"status": "success", "data": {"resultType": "matrix",
                                          "result": [{"metric": metric, "values": values}]}}


class FakePrometheus(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type="application/json", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in extra:
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _drip(self, data: bytes, every: float) -> None:
        """One byte per `every` seconds until the client leaves or STOP (bounded)."""
        for byte in data:
            if STOP.is_set():
                return
            try:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
            except OSError:
                return
            time.sleep(every)

    def do_GET(self) -> None:  # noqa: N802
        parts = urlsplit(self.path)
        mode = parts.path.split("/")[1]
        query = parse_qs(parts.query).get("query", [""])[0]
        name = query.split('"')[1] if '"' in query else "up"
        now = time.time()
        good = [[now - 30, "0.5"], [now - 15, "0.6"]]
        answers = {
            "error-status": (422, {"status": "error", "errorType": "bad_data",
                                   "error": "parse error\nat line 2 \x1b[31m<b>"}),
            "bad-status": (200, {"status": "maybe", "data": {"result": []}}),
            "data-list": (200, {"status": "success", "data": [1, 2, 3]}),
            "result-dict": (200, {"status": "success",
                                  "data": {"resultType": "matrix", "result": {"a": 1}}}),
            "non-numeric": (200, _matrix(name, [[now - 30, "abc"], [now - 20, {"x": 1}],
                                                ["soon", "1"], [now - 15, None], [1]])),
            "nan-values": (200, _matrix(name, [[now - 30, "NaN"], [now - 20, "+Inf"],
                                               [now - 15, "0.5"]])),
            "no-metric": (200, {"status": "success", "data": {"resultType": "matrix", "result": [
                {"values": good}, {"metric": ["x"], "values": good}, "row",
                {"metric": {"instance": {"nested": 1}}, "values": good}]}}),
            "answer-list": (200, [1, 2]),
            "empty": (200, {"status": "success", "data": {"resultType": "matrix", "result": []}}),
        }
        if mode == "big-valid":  # every query a valid ~30 MB answer; every metric present
            if "/label/" in parts.path:
                from fleetscope.rules.catalog import CATALOG

                names = sorted(set().union(*(rule.requires() for rule in CATALOG)))
                values = names if "__name__" in parts.path else ["n1"]
                self._send(200, json.dumps({"status": "success", "data": values}).encode())
            else:
                self._send(200, _big_matrix())
        elif mode in answers:
            status, document = answers[mode]
            self._send(status, json.dumps(document).encode())
        elif mode == "incomplete":
            body = json.dumps(_matrix(name, good)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
        elif mode == "huge-header":
            self._send(200, b"{}", extra=[("X-Pad", "a" * 200_000)])
        elif mode == "deep":
            self._send(200, b"[" * 200_000 + b"]" * 200_000)
        elif mode == "html":
            self._send(200, b"<html><body>Grafana login</body></html>", "text/html")
        elif mode == "http500":
            self._send(500, b"<html>oops</html>", "text/html")
        elif mode == "huge-body":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()  # no length: read until the server closes
            chunk = b" " * (1024 * 1024)
            try:
                for _ in range(MAX_ANSWER_BYTES // len(chunk) + 8):
                    self.wfile.write(chunk)
            except OSError:
                pass
            self.close_connection = True
        elif mode == "trickle-body":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.flush()
            self._drip(b'{"status": "success", ' + b" " * 200, 0.5)
            self.close_connection = True
        elif mode == "trickle-header":
            self._drip(b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 400, 0.5)
            self.close_connection = True
        elif mode == "slow":
            STOP.wait(1.0)
            self._send(200, json.dumps(_matrix(name, good)).encode())
        else:
            self._send(404, b"{}")


@pytest.fixture(scope="module")
def prometheus():
    STOP.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    STOP.set()
    server.shutdown()
    server.server_close()


REFUSED = {
    "error-status": "parse error at line 2",
    "bad-status": "status 'maybe'",
    "data-list": "without a data object",
    "result-dict": "not a list",
    "answer-list": "not an API object",
    "incomplete": "Prometheus at",
    "huge-header": "broken HTTP answer",
    "deep": "nested too deeply",
    "html": "did not answer JSON",
    "http500": "HTTP 500",
    "huge-body": "over 64 MiB",
}


@pytest.mark.parametrize("mode", sorted(REFUSED))
def test_bad_answers_are_one_line(prometheus, mode):
    # huge-body: the cap on one answer, under a limit on all of them raised past it
    held = ["--max-answers-mib", "256"] if mode == "huge-body" else []
    result = run(["diagnose", "--prometheus", f"{prometheus}/{mode}", *LOCAL, "--node", "n1",
                  *held], timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 3, result.stderr[-2000:]
    assert len(lines) == 1, lines
    assert "Traceback" not in result.stderr
    assert REFUSED[mode] in lines[0]
    assert "\x1b" not in lines[0]
    assert result.max_rss_mib < 400


@pytest.mark.parametrize("mode", ["no-metric", "empty"])
def test_no_series_of_the_node_is_one_line_naming_it(prometheus, mode):
    """Answers that hold no series labelled instance="n1": --node names no node there."""
    result = run(["diagnose", "--prometheus", f"{prometheus}/{mode}", *LOCAL, "--node", "n1"],
                 timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 3 and len(lines) == 1, result.stderr[-2000:]
    assert 'no series with instance="n1"' in lines[0]


@pytest.mark.parametrize("mode", ["non-numeric", "nan-values"])
def test_bad_points_are_skipped_and_the_rest_diagnosed(prometheus, mode):
    result = run(["diagnose", "--prometheus", f"{prometheus}/{mode}", *LOCAL, "--node", "n1",
                  "--json"], timeout=120)
    # A diagnosis (exit 3 when nothing could be evaluated: status "unknown"), not an error.
    assert result.returncode in (0, 1, 2, 3), result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert document["source"] == "prometheus"
    assert document["status"] in ("ok", "warning", "critical", "unknown")
    if document["status"] == "unknown":  # exit 3: the contract's one line says why, no more
        assert result.returncode == 3
        line, = result.stderr.strip().splitlines()
        assert line.startswith("fleetscope diagnose: error: no rule could be evaluated: node n1")
    else:  # the bad points were skipped without a word
        assert result.stderr == ""


@pytest.mark.parametrize("mode", ["trickle-body", "trickle-header", "slow"])
def test_one_deadline_for_all_queries(prometheus, mode):
    """A server answering a byte every 0.5 s, or every query in 1 s (22 queries), ends at
    the --timeout with one line instead of holding the command."""
    result = run(["diagnose", "--prometheus", f"{prometheus}/{mode}", *LOCAL, "--node", "n1",
                  "--timeout", "3"], timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 3, result.stderr[-2000:]
    assert lines == [lines[0]] and "did not answer within 3 s (--timeout)" in lines[0]


def test_timeout_must_be_positive():
    result = run(["diagnose", "--prometheus", "http://127.0.0.1:9", "--timeout", "nan"])
    assert result.returncode == 2


@pytest.mark.parametrize("evaluate", ["engine", "local"])
def test_answers_held_for_one_command_are_bounded(prometheus, evaluate):
    """Every answer valid and under the per-answer cap (~30 MB), dozens of them (8 at once):
    the answers one command holds are capped together, with one line naming the limit and
    the option that raises it, and the command's peak RSS stays under 1 GiB."""
    result = run(["diagnose", "--prometheus", f"{prometheus}/big-valid", "--evaluate", evaluate,
                  "--node", "n1", "--timeout", "600"], timeout=600)
    lines = result.stderr.strip().splitlines()
    assert result.max_rss_mib < 1024, result.max_rss_mib
    assert result.returncode == 3, (result.returncode, result.stderr[-2000:])
    assert len(lines) == 1, lines
    assert "--max-answers-mib" in lines[0] and "32 MiB" in lines[0], lines[0]
