#!/usr/bin/env python3
"""A scrape while hundreds of connections sit idle: fleetscope exporter vs node_exporter.

Each server gets N connections (default 500) on 127.0.0.1 that send nothing, as a broken
peer or a slow-loris client holds them; then a scrape on a fresh connection is timed, K times
in alternating rounds (the server's slots are taken by the idle crowd: fleetscope gives the
slot of the connection idle longest to the newcomer). Both serve the x86-256 fixture
(tests/fixtures/make_bundles.py), fleetscope with its recorded config, node_exporter with its
default collectors on the same sample.

    python bench/idle_connections.py [--idle 500] [--scrapes 20]

Prints each server's median and worst scrape time and how many were answered 200, and the
ratio fleetscope/node_exporter; exit 0 whatever they are.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exporter_vs_node_exporter import (  # noqa: E402 (the bench beside it builds the fixture)
    BUNDLE,
    PROMETHEUS_HEADERS,
    Server,
    fleetscope_args,
    free_port,
    node_exporter_args,
)


def idle_crowd(port: int, count: int) -> list[socket.socket]:
    """`count` connections that send nothing (fewer if the accept backlog refuses some)."""
    crowd = []
    for _ in range(count):
        with contextlib.suppress(OSError):
            crowd.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    return crowd


def timed_scrape(port: int) -> tuple[float, int]:
    """(seconds, HTTP status) of one scrape on a new connection; status 0 if it failed."""
    began = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/metrics", headers=PROMETHEUS_HEADERS)
        response = connection.getresponse()
        response.read()
        status = response.status
    except OSError:
        status = 0
    finally:
        connection.close()
    return time.perf_counter() - began, status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=500, help="idle connections (500)")
    parser.add_argument("--scrapes", type=int, default=20, help="timed scrapes each (20)")
    args = parser.parse_args()
    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if not node_exporter:
        sys.exit("node_exporter not found: apt-get install prometheus-node-exporter")
    from fleetscope.bundle.read import open_bundle

    with open_bundle(str(BUNDLE)) as bundle:
        recorded = bundle.config_raw
    with tempfile.TemporaryDirectory(prefix="fleetscope-bench-") as work:
        config = Path(work) / "config.json"
        config.write_text(json.dumps(recorded))
        ports = {"fleetscope": free_port(), "node_exporter": free_port()}
        servers = {
            "fleetscope": Server("fleetscope", fleetscope_args(ports["fleetscope"], config,
                                                               BUNDLE), ports["fleetscope"]),
            "node_exporter": Server("node_exporter", node_exporter_args(
                node_exporter, ports["node_exporter"], None, BUNDLE), ports["node_exporter"])}
        crowds = {}
        try:
            for name, server in servers.items():
                server.scrape()  # warm: the first scrape fills caches
                crowds[name] = idle_crowd(server.port, args.idle)
            time.sleep(1)  # the servers accepted what they will
            times: dict[str, list[float]] = {name: [] for name in servers}
            answered = dict.fromkeys(servers, 0)
            for _ in range(args.scrapes):
                for name, server in servers.items():  # alternating: drift hits both alike
                    seconds, status = timed_scrape(server.port)
                    times[name].append(seconds)
                    answered[name] += status == 200
        finally:
            for crowd in crowds.values():
                for sock in crowd:
                    sock.close()
            for server in servers.values():
                server.stop()
    opened = ", ".join(f"{name}: {len(crowd)} opened" for name, crowd in crowds.items())
    print(f"{args.idle} idle connections each ({opened}); {args.scrapes} scrapes on a new "
          "connection each")
    for name in servers:
        print(f"  {name:14s} median {statistics.median(times[name]) * 1000:7.1f} ms  "
              f"worst {max(times[name]) * 1000:7.1f} ms  answered {answered[name]}/"
              f"{args.scrapes}")
    ratio = statistics.median(times["fleetscope"]) / statistics.median(times["node_exporter"])
    print(f"  median scrape time, fleetscope/node_exporter: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
