"""`diagnose --prometheus` ends at its --timeout against servers that trickle the answer.

Each server this test starts on 127.0.0.1 sends its headers promptly, then the body one
byte every TRICKLE_SECONDS, three ways: HTTP/1.0 (the server closes after the answer),
HTTP/1.1 with `Connection: close`, and HTTP/1.1 keep-alive with a Content-Length. On the
first two, http.client hands the socket from the connection to the response, so a
watchdog that shuts the connection's socket finds nothing there. Every drip is bounded:
it stops when the client leaves, at STOP, or after MAX_DRIP_BYTES.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from fleetscope.diagnose import prometheus
from tests.hostile_corpus import run

TRICKLE_SECONDS = 2.0
MAX_DRIP_BYTES = 200  # 400 s of answer at most: far beyond any deadline here
STOP = threading.Event()

HEADERS = {
    "http10": b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n",
    "close": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\n\r\n"),
    "keepalive": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n"),
}


def _serve(listener: socket.socket, headers: bytes) -> None:
    """Accept until STOP; each client gets the headers, then a byte every TRICKLE_SECONDS."""
    listener.settimeout(0.2)
    while not STOP.is_set():
        try:
            client, _ = listener.accept()
        except OSError:
            continue
        threading.Thread(target=_drip, args=(client, headers), daemon=True).start()
    listener.close()


def _drip(client: socket.socket, headers: bytes) -> None:
    with client:
        client.settimeout(5)
        try:
            client.recv(65536)  # the request (small, one segment on loopback)
            client.sendall(headers)
            for byte in (b'{"status": "success", "data": ' + b" " * MAX_DRIP_BYTES)[
                    :MAX_DRIP_BYTES]:
                if STOP.wait(TRICKLE_SECONDS):
                    return
                client.sendall(bytes([byte]))
        except OSError:
            return  # the client left: what the deadline should make it do


@pytest.fixture(scope="module")
def tricklers():
    STOP.clear()
    urls, threads = {}, []
    for kind, headers in HEADERS.items():
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        urls[kind] = f"http://127.0.0.1:{listener.getsockname()[1]}"
        thread = threading.Thread(target=_serve, args=(listener, headers), daemon=True)
        thread.start()
        threads.append(thread)
    yield urls
    STOP.set()
    for thread in threads:
        thread.join(5)


@pytest.mark.parametrize("kind", sorted(HEADERS))
def test_one_fetch_ends_at_its_deadline(tricklers, kind):
    """The transport itself: a trickled body ends in TimeoutError within the deadline
    plus 2 s (without the fix the read waits a byte at a time for minutes)."""
    seconds = 3.0
    began = time.monotonic()
    outcome: list = []

    def fetch() -> None:
        try:
            prometheus.fetch(tricklers[kind], "/api/v1/query", {"query": "up"},
                             prometheus.Deadline(seconds))
            outcome.append("answered")
        except TimeoutError:
            outcome.append("timeout")
        except Exception as err:  # noqa: BLE001 (the test reports what came instead)
            outcome.append(repr(err))

    worker = threading.Thread(target=fetch, daemon=True)
    worker.start()
    worker.join(seconds + 2)
    assert not worker.is_alive(), f"{kind}: fetch still reading {seconds + 2:g} s later"
    assert outcome == ["timeout"], outcome
    assert time.monotonic() - began < seconds + 2


@pytest.mark.parametrize("evaluate, scope", [("engine", ["--fleet"]),
                                             ("engine", ["--node", "n1"]),
                                             ("local", ["--fleet"])])
@pytest.mark.parametrize("kind", sorted(HEADERS))
def test_diagnose_ends_with_one_line_and_exit_3(tricklers, kind, evaluate, scope):
    result = run(["diagnose", "--prometheus", tricklers[kind], "--evaluate", evaluate,
                  *scope, "--timeout", "3"], timeout=90)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 3, (kind, result.returncode, result.stderr[-2000:])
    assert len(lines) == 1, lines
    assert "did not answer within 3 s (--timeout)" in lines[0], lines[0]
