"""A query engine answering with `warnings` (partial data) never reads as healthy.

The answer envelope of the Prometheus HTTP API (docs: "Format overview"):

    {"status": "success" | "error", "data": <data>,
     "errorType": "<string>", "error": "<string>",   # only when status is error
     "warnings": ["<string>"],                       # only if there were warnings
     "infos": ["<string>"]}                          # only if there were info-level annotations

Thanos, VictoriaMetrics cluster and Mimir answer success with `warnings` when a store or
shard is down. The engine this test starts on 127.0.0.1 imitates such a fleet: every
signal present, a node reporting, nothing firing; under the /partial/ prefix each answer
also carries a warning. The same diagnosis must then say partial, leave the rules "not
evaluated" with the reason, and exit 3 (unknown), not 0.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from fleetscope.diagnose.remote import PRESENCE
from fleetscope.rules.catalog import CATALOG
from tests.hostile_corpus import run

WARNING = "partial response: store 10.0.0.7:10901 unavailable"  # Thanos's wording
NAMES = sorted(set().union(*(rule.requires() for rule in CATALOG)) |
               {"fleetscope_exporter_build_info"})


RESTART_AFTER = 12  # queries answered before the engine goes away mid-diagnosis
ANSWERED = {"restart": 0}
LOCK = threading.Lock()


class Engine(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        parts = urlsplit(self.path)
        prefix, _, api = parts.path.lstrip("/").partition("/")
        if prefix == "restart":
            with LOCK:
                ANSWERED["restart"] += 1
                down = ANSWERED["restart"] > RESTART_AFTER
            if down:  # the engine restarting: its proxy answers 503 until it is back
                self.send_error(503, "Service Unavailable")
                return
        params = parse_qs(parts.query)
        if api.startswith("api/v1/label/__name__/values"):
            data: object = NAMES
        elif api.startswith("api/v1/label/"):
            data = ["n1"]
        elif api == "api/v1/query_range":
            start, end = float(params["start"][0]), float(params["end"][0])
            step = float(params["step"][0].rstrip("s"))
            result = []
            values = [[start + k * step, "0"] for k in range(int((end - start) // step) + 1)]
            query = params["query"][0]
            if query == PRESENCE.promql():  # the engine path: a node reports
                result = [{"metric": {}, "values": values}]
            elif query.startswith('{__name__="'):  # the local path: a flat, idle series
                name = query.split('"')[1]
                result = [{"metric": {"__name__": name, "instance": "n1"}, "values": values}]
            data = {"resultType": "matrix", "result": result}
        elif api == "api/v1/query":
            data = {"resultType": "vector", "result": []}
        else:
            self.send_error(404)
            return
        document = {"status": "success", "data": data}
        if prefix == "partial":
            document["warnings"] = [WARNING]
        body = json.dumps(document).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def engine_url():
    with ThreadingHTTPServer(("127.0.0.1", 0), Engine) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()


def _diagnose(url: str, evaluate: str = "engine") -> tuple[int, dict]:
    result = run(["diagnose", "--prometheus", url, "--evaluate", evaluate, "--fleet", "--json",
                  "--timeout", "60"], timeout=180)
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    return result.returncode, json.loads(result.stdout)


def test_complete_answers_read_healthy(engine_url):
    code, document = _diagnose(f"{engine_url}/complete")
    assert (code, document["status"]) == (0, "ok"), document["not_evaluated"]
    assert "partial" not in document


def test_answers_with_warnings_are_partial_not_healthy(engine_url):
    code, document = _diagnose(f"{engine_url}/partial")
    assert (code, document["status"]) == (3, "unknown")
    assert document["partial"] is True
    assert any(WARNING in reason for reason in document["partial_reasons"])
    reasons = {item["rule"]: item["reason"] for item in document["not_evaluated"]}
    assert set(reasons) == {rule.id for rule in CATALOG}
    assert all(WARNING in reason for reason in reasons.values()), reasons


def test_local_evaluation_of_partial_answers(engine_url):
    """--evaluate local: every rule the complete answers let it judge is, with warnings,
    not evaluated with the warning as the reason, and nothing reads healthy."""
    code, complete = _diagnose(f"{engine_url}/complete", "local")
    judged = {rule.id for rule in CATALOG} - {i["rule"] for i in complete["not_evaluated"]}
    assert "partial" not in complete and judged, complete["not_evaluated"]
    code, partial = _diagnose(f"{engine_url}/partial", "local")
    assert partial["partial"] is True and partial["status"] != "ok" and code != 0
    reasons = {item["rule"]: item["reason"] for item in partial["not_evaluated"]}
    assert judged <= set(reasons)
    assert all(WARNING in reasons[rule_id] for rule_id in judged), reasons
    assert not partial["findings"]


@pytest.mark.parametrize("evaluate", ["engine", "local"])
def test_an_engine_restarting_mid_diagnosis_is_an_error_not_healthy(engine_url, evaluate):
    ANSWERED["restart"] = 0
    result = run(["diagnose", "--prometheus", f"{engine_url}/restart", "--evaluate", evaluate,
                  "--fleet", "--timeout", "60"], timeout=180)
    lines = result.stderr.strip().splitlines()
    assert ANSWERED["restart"] > RESTART_AFTER  # it did go away mid-way
    assert result.returncode == 3 and len(lines) == 1 and "503" in lines[0], result.stderr
