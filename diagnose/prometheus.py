"""Evidence from a Prometheus server: range queries for every metric the rules read.

    GET /api/v1/query_range?query={__name__="fleetscope_cpu_core_busy_ratio",instance="n1"}
        &start=...&end=...&step=15s
    {"status": "success", "data": {"resultType": "matrix",
     "result": [{"metric": {"instance": "n1", "cpu": "3"}, "values": [[1764660000, "0.93"]]}]}}

Results land in the same `Series` a bundle replay fills, keeping their `instance` label, so
the same rules evaluate per node (`--node`) or across the fleet (`--fleet`).

Answers come over the network, so nothing in them is trusted: one deadline covers every
query of a command (a server trickling a byte every few seconds cannot hold it), each answer
is capped at MAX_ANSWER_BYTES, all the answers of one command together at MAX_HELD_BYTES
(AnswerBudget: their parsed form is kept to the end, 9 to 14 times their size), and an answer of
the wrong shape is one clear error. Single
bad points (a non-numeric value, a row without `metric`) are skipped; "NaN" values, which
Prometheus itself writes, are skipped too (the rules read numbers).
"""

from __future__ import annotations

import difflib
import http.client
import json
import math
import socket
import ssl
import threading
import time
import urllib.parse

from fleetscope.core.diagnose_options import MAX_ANSWERS_MIB
from fleetscope.rules.promql import Series

MAX_ANSWER_BYTES = 64 * 1024 * 1024
# All the answers of one command: what is parsed from them stays to the verdict, and the
# queries run 8 at a time. Raised with `diagnose --max-answers-mib`.
MAX_HELD_BYTES = int(MAX_ANSWERS_MIB * 1024 * 1024)
HELD_OPTION = "--max-answers-mib"
MAX_ERROR_CHARS = 200


class PrometheusError(Exception):
    """Prometheus unreachable or answering garbage: one line for the user."""


def _one_line(text: object) -> str:
    cleaned = " ".join(str(text).split())
    cleaned = "".join(c if c.isprintable() else "?" for c in cleaned)
    return cleaned[:MAX_ERROR_CHARS]


class Deadline:
    """One deadline for a whole command: every query gets only the time left."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


class AnswerBudget:
    """The bytes of answers one command may hold, every query's together (counted as they
    arrive, across the threads that query at once)."""

    def __init__(self, limit: int = MAX_HELD_BYTES):
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, size: int, base: str) -> None:
        with self._lock:
            self.used += size
            over = self.used > self.limit
        if over:
            raise PrometheusError(
                f"Prometheus at {_one_line(base)} sent more than {self.limit // 1024**2} MiB "
                f"of answers for this command, the limit it may hold ({HELD_OPTION} raises "
                "it; --node or a shorter --seconds asks for less)")


def _connection(base: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PrometheusError(f"Prometheus URL {_one_line(base)} must be http:// or https://"
                              "HOST[:PORT][/prefix]")
    try:
        port = parts.port
    except ValueError:
        raise PrometheusError(f"Prometheus URL {_one_line(base)} has a bad port") from None
    if parts.scheme == "https":
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, port, timeout=timeout, context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(parts.hostname, port, timeout=timeout)
    return connection, parts.path.rstrip("/")


def fetch(base: str, path: str, params, deadline: Deadline,
          budget: AnswerBudget | None = None) -> bytes:
    """The body of one GET, within the deadline, MAX_ANSWER_BYTES and the command's
    `budget` of answers held."""
    left = deadline.left()
    if left <= 0:
        raise TimeoutError
    connection, prefix = _connection(base, left)
    response = None
    try:
        connection.connect()
    except (http.client.HTTPException, OSError, ValueError) as err:
        _raise_for(base, err, deadline)
    # A watchdog shuts the socket at the deadline: socket timeouts bound each read, not a
    # server that answers one byte at a time (headers included). It holds the socket
    # itself: on an answer that closes its connection (HTTP/1.0, `Connection: close`)
    # http.client hands the socket to the response and forgets it on the connection.
    watchdog = threading.Timer(max(0.0, deadline.left()), _abort, (connection.sock,))
    watchdog.daemon = True
    watchdog.start()
    try:
        connection.request("GET", f"{prefix}{path}?{urllib.parse.urlencode(params)}",
                           headers={"Accept": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            detail = ""
            body = response.read(4096)
            try:
                detail = json.loads(body).get("error") or ""
            except (ValueError, AttributeError, RecursionError):
                pass
            hint = NOT_AN_API_HINT if response.status == 404 else ""
            raise PrometheusError(f"Prometheus at {_one_line(base)} answered HTTP "
                                  f"{response.status}" + (f": {_one_line(detail)}"
                                                          if detail else "") + hint)
        declared = response.getheader("Content-Length")
        if declared and declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
            raise PrometheusError(_too_large(base))
        chunks, size = [], 0
        while True:
            chunk = response.read1(1024 * 1024) if hasattr(response, "read1") else \
                response.read(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise PrometheusError(_too_large(base))
            if budget is not None:
                budget.take(len(chunk), base)
            chunks.append(chunk)
        if deadline.left() <= 0:
            raise TimeoutError
        return b"".join(chunks)
    except (http.client.HTTPException, OSError, ValueError) as err:
        _raise_for(base, err, deadline)
    finally:
        watchdog.cancel()
        if response is not None:
            response.close()
        connection.close()


def _raise_for(base: str, err: Exception, deadline: Deadline):
    """The error a failed connect or read becomes: TimeoutError past the deadline, else
    one line saying what broke."""
    if deadline.left() <= 0:
        raise TimeoutError from None
    if isinstance(err, (socket.timeout, TimeoutError)):
        raise err
    if isinstance(err, (http.client.HTTPException, ValueError)):
        raise PrometheusError(f"Prometheus at {_one_line(base)} sent a broken HTTP "
                              f"answer ({_one_line(type(err).__name__)}: "
                              f"{_one_line(err)[:80]})") from None
    reason = getattr(err, "strerror", None) or err
    raise PrometheusError(f"Prometheus at {_one_line(base)} is unreachable: "
                          f"{_one_line(reason)}") from None


def _abort(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            # The plain socket's shutdown, also under TLS: the reader wakes to end-of-file
            # and sees the deadline passed.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass


# A 404 on /api/v1/... is a server that is not a Prometheus query API at that path.
NOT_AN_API_HINT = (": is this a Prometheus base URL? Give the server's root, e.g. "
                   "http://prometheus:9090, without /api/v1 or /graph")
MAX_NAMED_INSTANCES = 10
# Series that every fleetscope exporter serves: which instances exist.
EXPORTER_PRESENCE = ("fleetscope_exporter_build_info", "fleetscope_cpu_info")


def unknown_node(base: str, node: str, instances: list[str]) -> str:
    """The line for a --node Prometheus holds no series of: the instances that exist, the
    nearest to the name asked first (a host name alone, or a typo, finds its instance)."""
    if not instances:
        return (f"Prometheus at {_one_line(base)} has no series with instance=\"{_one_line(node)}"
                f"\", and no fleetscope exporter's series at all in the window: is it scraping "
                "`fleetscope exporter` (port 9105)?")
    on_host = sorted(i for i in instances if i.rpartition(":")[0].strip("[]") == node)
    meant = (f" (did you mean --node {_one_line(on_host[0])}?)" if len(on_host) == 1 else "")
    # cutoff 0: every instance is a candidate, so the list is always full
    nearest = on_host + [i for i in difflib.get_close_matches(
        node, instances, n=MAX_NAMED_INSTANCES, cutoff=0.0) if i not in on_host]
    named = ", ".join(_one_line(i) for i in nearest[:MAX_NAMED_INSTANCES])
    more = len(instances) - min(len(nearest), MAX_NAMED_INSTANCES)
    return (f"Prometheus at {_one_line(base)} has no series with instance=\"{_one_line(node)}"
            f"\"{meant}; --node takes the instance label, and the exporters there nearest "
            f"to it are: {named}" + (f" (+{more} more)" if more > 0 else ""))


def instances(base: str, start: float, end: float, deadline: Deadline) -> list[str]:
    """The instance labels of the fleetscope exporters Prometheus holds in [start, end]."""
    params = [("match[]", name) for name in EXPORTER_PRESENCE]
    params += [("start", f"{start:.3f}"), ("end", f"{end:.3f}")]
    try:
        body = fetch(base, "/api/v1/label/instance/values", params, deadline)
        document = json.loads(body)
    except (TimeoutError, ValueError, RecursionError, PrometheusError):
        return []
    values = document.get("data") if isinstance(document, dict) else None
    return [str(v) for v in values] if isinstance(values, list) else []


def _too_large(base: str) -> str:
    return (f"Prometheus at {_one_line(base)} sent an answer over "
            f"{MAX_ANSWER_BYTES // 1024**2} MiB: refused (narrow --seconds or use --node)")


def _get(base: str, path: str, params: dict, timeout: float | Deadline,
         warnings: list[str] | None = None, budget: AnswerBudget | None = None) -> dict:
    """The `data` object of a successful API answer; `timeout` is seconds or a Deadline
    shared with the command's other queries; the answer's warnings added to `warnings`."""
    deadline = timeout if isinstance(timeout, Deadline) else Deadline(timeout)
    try:
        body = fetch(base, path, params, deadline, budget)
    except TimeoutError:
        raise PrometheusError(f"Prometheus at {_one_line(base)} did not answer within "
                              f"{deadline.seconds:g} s (--timeout)") from None
    data, warned = parse_document(base, body)
    if warnings is not None:
        warnings.extend(warned)
    return data


def parse_answer(base: str, body: bytes) -> dict:
    """The `data` object of an API answer's body, or PrometheusError saying what is wrong."""
    return parse_document(base, body)[0]


def answer_warnings(document: dict) -> list[str]:
    """The answer's `warnings` (the API's envelope: {"status": "success", "data": ...,
    "warnings": ["..."]}): a distributed engine (Thanos, VictoriaMetrics cluster, Mimir)
    answers success with them when a store or shard is down, so its data is partial."""
    warnings = document.get("warnings")
    if not isinstance(warnings, list):
        return [_one_line(warnings)] if warnings else []
    return [_one_line(w) for w in warnings[:5] if w] or (["warnings"] if warnings else [])


def parse_document(base: str, body: bytes) -> tuple[dict, list[str]]:
    """The `data` object of an API answer's body and its warnings, or PrometheusError."""
    try:
        document = json.loads(body)
    except RecursionError:
        raise PrometheusError(f"Prometheus at {_one_line(base)} answered JSON nested too "
                              "deeply: refused") from None
    except ValueError:
        raise PrometheusError(f"Prometheus at {_one_line(base)} did not answer JSON "
                              "(is the URL a Prometheus server?)") from None
    if not isinstance(document, dict):
        raise PrometheusError(f"Prometheus at {_one_line(base)} answered "
                              f"{type(document).__name__}, not an API object")
    status = document.get("status")
    if status != "success":
        error = document.get("error")
        detail = _one_line(error) if isinstance(error, str) and error else \
            f"status {_one_line(status)!r}"
        raise PrometheusError(f"Prometheus query failed: {detail}")
    data = document.get("data")
    if not isinstance(data, dict):
        raise PrometheusError(f"Prometheus at {_one_line(base)} answered success without a "
                              f"data object (got {type(data).__name__})")
    return data, answer_warnings(document)


def _number(value, finite: bool = True) -> float | None:
    """A float from Prometheus's string-encoded number, else None; `finite=False` keeps
    "NaN" and "+Inf" (a sample value: an unlimited RLIMIT_NPROC or CPU quota is +Inf, and the
    query engine divides by it as PromQL does)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) or not finite else None


def add_matrix(series: Series, name: str, data: dict, nodes: set[str]) -> int:
    """Add a range query's matrix to `series`; returns the rows or points skipped as
    malformed."""
    result = data.get("result", [])
    if not isinstance(result, list):
        raise PrometheusError(f"Prometheus answered {name} with a result that is not a list")
    skipped = 0
    for row in result:
        metric = row.get("metric") if isinstance(row, dict) else None
        values = row.get("values") if isinstance(row, dict) else None
        if not isinstance(metric, dict) or not isinstance(values, list):
            skipped += 1
            continue
        labels = {str(k): str(v) for k, v in metric.items()
                  if isinstance(v, (str, int, float)) and not isinstance(v, bool)}
        labels.pop("__name__", None)
        labels.pop("job", None)
        if "instance" in labels:
            nodes.add(labels["instance"])
        for point in values:
            if not isinstance(point, (list, tuple)) or len(point) != 2:
                skipped += 1
                continue
            timestamp, value = _number(point[0]), _number(point[1], finite=False)
            if timestamp is None or value is None or not 0 <= timestamp < 1e11:
                skipped += 1
                continue
            series.add(name, labels, int(round(timestamp * 1000)), value)
    return skipped


def prometheus_series(base: str, metrics: set[str], seconds: float, node: str | None,
                      step: float = 15.0, timeout: float = 30.0,
                      warnings: dict[str, list[str]] | None = None,
                      max_held_bytes: int = MAX_HELD_BYTES,
                      ) -> tuple[Series, list[str]]:
    """Range-query each metric over the last `seconds`, all within `timeout` seconds and
    `max_held_bytes` of answers in all; returns the series and the nodes. `warnings`: filled
    with the metrics whose answers came with warnings (partial data) and what they said."""
    deadline = Deadline(timeout)
    budget = AnswerBudget(max_held_bytes)
    end = time.time()
    start = end - max(seconds, step * 2)
    series = Series()
    nodes: set[str] = set()
    for name in sorted(metrics):
        selector = f'{{__name__="{name}"'
        if node:
            selector += f',instance="{_escape(node)}"'
        selector += "}"
        data = _get(base, "/api/v1/query_range",
                    {"query": selector, "start": f"{start:.3f}", "end": f"{end:.3f}",
                     "step": f"{step:g}s"}, deadline, warned := [], budget)
        if warned and warnings is not None:
            warnings[name] = warned
        add_matrix(series, name, data, nodes)
    if node and not nodes:
        raise PrometheusError(unknown_node(base, node, instances(base, start, end, deadline)))
    return series, sorted(nodes)


def _escape(value: str) -> str:
    """A PromQL string literal's content (a node name with a quote cannot break out)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
