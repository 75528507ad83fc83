"""`fleetscope exporter`: the node's Prometheus endpoint, GET /metrics.

Runs every enabled collector per scrape, each isolated: a collector that fails costs its own
metrics only and shows as `fleetscope_scrape_collector_success{collector="..."} 0`; a source
a machine lacks (no PSI, no schedstat) shows as `fleetscope_scrape_source_available 0` and is
logged once with how to enable it. Serves the text format, or OpenMetrics when the scraper
asks for it, gzip-compressed when accepted. HEAD /metrics answers like GET without the body
(node_exporter does). A client gets HEADER_DEADLINE_SECONDS from its first byte to finish
its request line and headers, and at most MAX_CONNECTIONS are served at once: past that a
new connection takes the slot of the connection idle longest (one waiting for a request,
closed), and gets 503 only when every connection is busy with a request. A slow or hostile
client cannot hold threads without bound, and idle ones cannot keep a scrape out.
"""

from __future__ import annotations

import errno
import gzip
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client import ProcessCollector

from fleetscope import __version__
from fleetscope.collectors import COLLECTORS, NotAvailable, Scrape
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.source import EvidenceSource, evidence_source
from fleetscope.core.config import Config
from fleetscope.core.exposition import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    Family,
    gauge,
    labels,
    render,
    wants_openmetrics,
)
from fleetscope.webconfig import WebConfig

log = logging.getLogger("fleetscope.exporter")
HEADER_DEADLINE_SECONDS = 10.0
MAX_CONNECTIONS = 64
EVICTION_WAIT_SECONDS = 2.0  # an evicted idle connection's thread ends well inside this


class Exporter:
    """Collects every enabled collector into metric families; no HTTP here.

    The evidence source is decided once, here: a source given by the caller (a LiveHost, a
    bundle's RecordedSample), or `evidence_source(root, evidence)` for `--root DIR
    --evidence auto|live|recorded` (collectors/source.py says what auto takes for live)."""

    def __init__(self, root: str | EvidenceSource, config: Config, evidence: str = "auto"):
        self.source = root if isinstance(root, EvidenceSource) \
            else evidence_source(root, evidence)
        self.roots = self.source.roots
        self.config = config
        enabled = config.collectors
        self.collectors = [
            cls(config) for name, cls in COLLECTORS.items()
            if (enabled is None and cls.wanted_on(config, self.source))
            or (enabled and name in enabled)
        ]
        # The exporter's own process (CPU, RSS, fds) comes from prometheus-client: it is about
        # this process, so it reads the real /proc whatever the root.
        self._process = ProcessCollector(registry=None)
        self._problems: dict[tuple[str, str], str] = {}
        self._problems_lock = threading.Lock()

    def leave_out(self, collector_name: str) -> None:
        """Collect without this collector from now on."""
        self.collectors = [c for c in self.collectors if c.name != collector_name]

    def collect(self, now: float | None = None,
                source: EvidenceSource | None = None) -> list[Family]:
        """One pass of every collector over the exporter's source, or over `source` at
        `now` (a bundle's sample, replayed)."""
        scrape = Scrape(source or self.source, now)
        families: list[Family] = []
        durations: list[tuple[str, float]] = []
        for collector in self.collectors:
            start = time.perf_counter()
            try:
                for family in collector.collect(scrape):
                    families.append(family)
            except (NotAvailable, ParseError) as err:
                scrape.errors.setdefault(collector.name, str(err))
            except Exception as err:  # a bug in one collector must not cost the others
                log.debug("collector %s crashed", collector.name, exc_info=True)
                scrape.errors.setdefault(collector.name, f"{type(err).__name__}: {err}")
            durations.append((collector.name, time.perf_counter() - start))
        families.extend(self._scrape_meta(scrape, durations))
        self._log_problems(scrape)
        return families

    def _scrape_meta(self, scrape: Scrape, durations) -> list[Family]:
        success = gauge(
            "fleetscope_scrape_collector_success",
            "Whether the collector ran without error (missing optional sources are not errors).",
        )
        duration = gauge(
            "fleetscope_scrape_collector_duration_seconds", "Time the collector took this scrape."
        )
        for name, seconds in durations:
            success.add(0 if name in scrape.errors else 1, labels(collector=name))
            duration.add(round(seconds, 6), labels(collector=name))
        available = gauge(
            "fleetscope_scrape_source_available",
            "Whether a collector's source exists and parses on this node (0: see the log).",
        )
        for (collector, source), (ok, _) in sorted(scrape.sources.items()):
            available.add(1 if ok else 0, labels(collector=collector, source=source))
        info = gauge("fleetscope_exporter_build_info", "fleetscope version; always 1.")
        info.add(1, labels(version=__version__))
        return [success, duration, available, info]

    def _log_problems(self, scrape: Scrape) -> None:
        """Log a problem when it appears or changes, and its recovery: once, not per scrape."""
        current = {(c, "collector"): msg for c, msg in scrape.errors.items()}
        current.update({key: reason for key, (ok, reason) in scrape.sources.items() if not ok})
        with self._problems_lock:
            for key, message in current.items():
                if self._problems.get(key) != message:
                    collector, source = key
                    what = "failed" if source == "collector" else f"source {source} not available"
                    log.warning("collector %s %s: %s", collector, what, message)
            for key in self._problems.keys() - current.keys():
                log.info("collector %s %s recovered", *key)
            self._problems = current

    def _own_process(self) -> list[Family]:
        """prometheus-client's process metrics, through our renderer (its exposition path
        costs more than the rest of a summary scrape)."""
        families = []
        for metric in self._process.collect():
            name = metric.name + "_total" if metric.type == "counter" else metric.name
            family = Family(name, metric.type, metric.documentation)
            for sample in metric.samples:
                family.add(sample.value, labels(**sample.labels))
            families.append(family)
        return families

    def render(self, openmetrics: bool = False) -> bytes:
        body = render(self.collect() + self._own_process(), openmetrics)
        return (body + "# EOF\n" if openmetrics else body).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Prometheus scrapes
    server_version = f"fleetscope/{__version__}"
    timeout = 30  # a client that stops talking must not hold a thread forever
    server: ExporterServer

    _head = False
    _headers_read = False

    def handle_one_request(self) -> None:
        # Wait for the request's first byte under the idle timeout (keep-alive connections
        # sit idle between scrapes); from then on the headers have a deadline.
        self.server.idle(self, True)  # the slot a new connection may take while we wait
        try:
            if not self.rfile.peek(1):
                self.close_connection = True
                return
        except (OSError, ValueError):  # idle timeout, reset, closed by an eviction
            self.close_connection = True
            return
        finally:
            self.server.idle(self, False)
        self._headers_read = False
        watchdog = threading.Timer(HEADER_DEADLINE_SECONDS, self._drop_slow_client)
        watchdog.daemon = True
        watchdog.start()
        try:
            super().handle_one_request()
        finally:
            watchdog.cancel()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self._headers_read = True
        return ok

    def _drop_slow_client(self) -> None:
        if not self._headers_read:
            log.debug("%s sent no complete request within %gs: dropped",
                      self.client_address[0], HEADER_DEADLINE_SECONDS)
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def do_HEAD(self) -> None:  # noqa: N802
        self._head = True
        try:
            self.do_GET()
        finally:
            self._head = False

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        web = self.server.web
        if web.auth is not None and not web.auth.check(self.headers.get("Authorization")):
            self._reply(
                401,
                b"Unauthorized\n",
                "text/plain; charset=utf-8",
                {"WWW-Authenticate": 'Basic realm="fleetscope"'},
            )
            return
        path = urlsplit(self.path).path
        if path == "/metrics":
            openmetrics = wants_openmetrics(self.headers.get("Accept"))
            body = self.server.exporter.render(openmetrics)
            content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
            extra = {}
            if "gzip" in (self.headers.get("Accept-Encoding") or ""):
                body = gzip.compress(body, compresslevel=1)
                extra["Content-Encoding"] = "gzip"
            self._reply(200, body, content_type, extra)
        elif path == "/":
            page = (
                "<html><head><title>fleetscope exporter</title></head><body>"
                f"<h1>fleetscope exporter {__version__}</h1>"
                '<p><a href="metrics">Metrics</a></p></body></html>\n'
            )
            self._reply(200, page.encode(), "text/html; charset=utf-8")
        else:
            self._reply(404, b"Not Found: try /metrics\n", "text/plain; charset=utf-8")

    def _reply(self, status: int, body: bytes, content_type: str, extra=None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in {**self.server.web.headers, **(extra or {})}.items():
            self.send_header(key, value)
        # Headers and body leave in one write: written apart, Nagle's algorithm holds the
        # body until the client ACKs the headers, and delayed ACKs make that 40 ms a scrape.
        self._headers_buffer.append(b"\r\n")
        if not self._head:
            self._headers_buffer.append(body)
        self.flush_headers()

    def log_message(self, format: str, *args) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s", self.address_string(), format % args)


class ExporterServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # Prometheus HA pairs plus ad-hoc curls must not be refused

    def __init__(self, address: tuple[str, int], exporter: Exporter | None, web: WebConfig):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.exporter = exporter
        self.web = web
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._idle: dict[_Handler, float] = {}  # waiting for a request: since when
        self._idle_lock = threading.Lock()
        super().__init__(address, _Handler)

    def idle(self, handler: _Handler, waiting: bool) -> None:
        with self._idle_lock:
            if waiting:
                self._idle[handler] = time.monotonic()
            else:
                self._idle.pop(handler, None)

    def _evict_idle(self) -> bool:
        """Close the connection idle longest (its handler ends and frees its slot)."""
        with self._idle_lock:
            if not self._idle:
                return False
            handler = min(self._idle, key=self._idle.__getitem__)
            del self._idle[handler]
        try:
            handler.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return True

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False) and not (
                self._evict_idle() and self._slots.acquire(timeout=EVICTION_WAIT_SECONDS)):
            log.warning("%d connections already open: refusing %s", MAX_CONNECTIONS,
                        client_address[0])
            if self.web.tls is None:
                try:
                    request.sendall(b"HTTP/1.1 503 Service Unavailable\r\n"
                                    b"Content-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def get_request(self):
        request, client_address = super().get_request()
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return request, client_address

    def finish_request(self, request, client_address) -> None:
        # The TLS handshake runs here, in the request's own thread, so a slow or hostile
        # client cannot stall the accept loop.
        if self.web.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(10)
        try:
            tls_socket = self.web.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as err:
            log.debug("TLS handshake with %s failed: %s", client_address, err)
            return
        try:
            super().finish_request(tls_socket, client_address)
        finally:
            tls_socket.close()

    def url(self) -> str:
        host, port = self.server_address[:2]
        scheme = "https" if self.web.tls else "http"
        host = f"[{host}]" if ":" in host else host
        return f"{scheme}://{host}:{port}/metrics"


def parse_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' (all interfaces) or '[::1]:PORT' -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        meant = (f" (did you mean :{listen}, every interface, or 127.0.0.1:{listen}?)"
                 if listen.isdigit() and int(listen) <= 65535 else "")
        raise ValueError(f"--listen must be HOST:PORT, got {listen!r}{meant}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class ListenError(OSError):
    """The address cannot be listened on; the message names it."""


def serve(listen: str, root: str, config: Config, web: WebConfig, evidence: str = "auto",
          beside: Callable[[EvidenceSource], Callable[[], None] | None] | None = None) -> None:
    """Start the exporter and serve until interrupted. `beside(source)`, once the address is
    taken, starts what runs beside the server on its evidence source (the flight recorder)
    and returns how to stop it."""
    if not os.path.isdir(root):
        raise NotADirectoryError(f"--root {root} is not a directory")
    # Listen first: a taken port is one line naming the address, before the collectors
    # log what this node lacks.
    host, port = parse_listen(listen)
    try:
        server = ExporterServer((host, port), None, web)
    except OSError as err:
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        hint = ""
        if err.errno == errno.EADDRINUSE:
            from fleetscope.core.port_holder import port_holder

            holder = port_holder(port)
            hint = (f": {holder} listens there" if holder else
                    ": another program listens there (`ss -ltnp` names it)")
            hint += "; stop it or give --listen HOST:PORT"
        raise ListenError(f"cannot listen on {shown}: {err.strerror or err}{hint}") from None
    exporter = Exporter(root, config, evidence)
    server.exporter = exporter
    log.info("evidence source: %s %s", "live host" if exporter.source.live
             else "recorded sample", exporter.source.roots[0])
    exporter.collect()  # first snapshot for interval metrics; logs what this node lacks
    stop_beside = beside(exporter.source) if beside is not None else None
    print(f"fleetscope exporter listening on {server.url()}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        if stop_beside is not None:
            stop_beside()
