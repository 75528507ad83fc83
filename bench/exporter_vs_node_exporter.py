#!/usr/bin/env python3
"""Server CPU per scrape and series count: fleetscope exporter vs node_exporter, one run.

Both serve the same 256-core fixture root (tests/fixtures/bundles/x86-256, sample s0000):
node_exporter (Debian's prometheus-node-exporter) with only its cpu and stat collectors (the
anchor), with the collectors that read what fleetscope's cpu and pressure collectors read
(adding pressure, schedstat, loadavg), and with a broad set close to fleetscope's defaults;
fleetscope's cpu and pressure collectors in full per-core mode (every core's series, as
node_exporter) and in summary mode, and every fleetscope collector in summary mode.
Scrapes go over one keep-alive connection each, with the headers Prometheus sends, in
alternating rounds so drift on a shared machine hits both alike. Server CPU is the
process's utime+stime from /proc/<pid>/stat (exited threads included).

    python bench/exporter_vs_node_exporter.py [--scrapes 300] [--rounds 5]

Prints the medians and the ratios fleetscope/node_exporter; exit 0 whatever they are
(benchmarks report, tests assert behaviour).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUNDLE = REPO / "tests" / "fixtures" / "bundles" / "x86-256"
SAMPLE = BUNDLE / "samples" / "s0000"
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}
TICKS = os.sysconf("SC_CLK_TCK")
# The anchor the issue names (cpu and stat collectors), and node_exporter reading everything
# fleetscope's cpu and pressure collectors read (PSI, schedstat, loadavg too), like for like.
ANCHORS = {
    "node_exporter": ("cpu", "stat"),
    "node_exporter (same sources)": ("cpu", "stat", "pressure", "schedstat", "loadavg"),
    # Roughly what fleetscope's default collector set reads (interrupts, NUMA, TCP too).
    "node_exporter (broad)": ("cpu", "stat", "pressure", "schedstat", "loadavg", "interrupts",
                              "meminfo_numa", "netstat", "infiniband", "processes"),
}
# fleetscope configurations: (name, per_core, collectors or None for all, compare with)
FLEETSCOPE = (
    ("fleetscope cpu+pressure (full)", "full", ["cpu", "pressure"],
     ("node_exporter", "node_exporter (same sources)")),
    ("fleetscope cpu+pressure (summary)", "summary", ["cpu", "pressure"],
     ("node_exporter", "node_exporter (same sources)")),
    ("fleetscope all collectors (summary)", "summary", None, ("node_exporter (broad)",)),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def wait_ready(port: int, proc: subprocess.Popen, name: str) -> None:
    deadline = time.time() + 20
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{name} exited at start (code {proc.returncode})")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{name} did not listen on 127.0.0.1:{port}")


class Server:
    def __init__(self, name: str, args: list[str], port: int):
        self.name = name
        self.port = port
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(port, self.proc, name)
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def scrape(self) -> bytes:
        try:
            self.conn.request("GET", "/metrics", headers=PROMETHEUS_HEADERS)
            response = self.conn.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            # The server closed an idle keep-alive connection while others were measured.
            self.conn.close()
            self.conn.request("GET", "/metrics", headers=PROMETHEUS_HEADERS)
            response = self.conn.getresponse()
        body = response.read()
        if response.status != 200:
            sys.exit(f"{self.name}: HTTP {response.status}")
        if response.getheader("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return body

    def cpu_per_scrape(self, scrapes: int) -> tuple[float, float]:
        """(server CPU seconds, client-seen wall seconds) per scrape."""
        before, start = cpu_seconds(self.proc.pid), time.perf_counter()
        for _ in range(scrapes):
            self.scrape()
        wall = (time.perf_counter() - start) / scrapes
        return (cpu_seconds(self.proc.pid) - before) / scrapes, wall

    def series(self) -> int:
        return sum(
            1 for line in self.scrape().decode().splitlines() if line and not line.startswith("#")
        )

    def stop(self) -> None:
        self.conn.close()
        self.proc.terminate()
        self.proc.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=300, help="scrapes per round (300)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (5)")
    args = parser.parse_args()
    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if not node_exporter:
        sys.exit("node_exporter not found: apt-get install prometheus-node-exporter")
    version = subprocess.run([node_exporter, "--version"], capture_output=True, text=True)
    workdir = Path(tempfile.mkdtemp(prefix="fleetscope-bench-"))
    recorded = json.loads((BUNDLE / "meta.json").read_text()).get("config", {})
    configs = {}
    for index, (name, per_core, collectors, _) in enumerate(FLEETSCOPE):
        config = {**recorded, "per_core": per_core}
        if collectors is not None:
            config["collectors"] = collectors
        configs[name] = workdir / f"config-{index}.json"  # JSON is YAML
        configs[name].write_text(json.dumps(config))

    servers = []
    try:
        for name, collectors in ANCHORS.items():
            port = free_port()
            servers.append(Server(name, [
                node_exporter, f"--web.listen-address=127.0.0.1:{port}",
                "--collector.disable-defaults", *(f"--collector.{c}" for c in collectors),
                f"--path.procfs={SAMPLE / 'proc'}", f"--path.sysfs={BUNDLE / 'static' / 'sys'}",
                "--log.level=error",
            ], port))
        for name, *_ in FLEETSCOPE:
            port = free_port()
            servers.append(Server(name, [
                sys.executable, "-m", "fleetscope", "--log-level", "error", "exporter",
                "--listen", f"127.0.0.1:{port}", "--root", str(SAMPLE),
                "--config", str(configs[name]),
            ], port))
        for server in servers:
            for _ in range(20):  # warm-up: imports, caches, connection
                server.scrape()

        per_scrape: dict[str, list[float]] = {s.name: [] for s in servers}
        latency: dict[str, list[float]] = {s.name: [] for s in servers}
        for _ in range(args.rounds):
            for server in servers:
                cpu, wall = server.cpu_per_scrape(args.scrapes)
                per_scrape[server.name].append(cpu)
                latency[server.name].append(wall)
        series = {s.name: s.series() for s in servers}
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"fixture: 256-core x86 ({SAMPLE.relative_to(REPO)}); {args.rounds} rounds x "
          f"{args.scrapes} scrapes each, Prometheus's Accept and gzip headers")
    print(f"node_exporter: {(version.stdout or version.stderr).splitlines()[0]}")
    print(f"{'server':<38}{'CPU ms/scrape (median)':>24}{'min':>8}{'max':>8}{'series':>8}"
          f"{'latency ms':>12}")
    for name, values in per_scrape.items():
        print(f"{name:<38}{statistics.median(values) * 1e3:>24.3f}{min(values) * 1e3:>8.3f}"
              f"{max(values) * 1e3:>8.3f}{series[name]:>8}"
              f"{statistics.median(latency[name]) * 1e3:>12.2f}")
    for name, _, _, anchors in FLEETSCOPE:
        for anchor in anchors:
            ratio = statistics.median(per_scrape[name]) / statistics.median(per_scrape[anchor])
            print(f"ratio {name} / {anchor}: CPU per scrape {ratio:.2f}x, "
                  f"series {series[name] / series[anchor]:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
