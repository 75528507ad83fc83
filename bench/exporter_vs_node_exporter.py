#!/usr/bin/env python3
"""Server CPU per scrape and series count: fleetscope exporter vs node_exporter, one run.

The default deployment: every fleetscope collector in summary mode against node_exporter's
default collectors, side by side on three roots: the 256-core x86 fixture
(tests/fixtures/bundles/x86-256, sample s0000), the 128-core Kunpeng fixture (kunpeng-128,
s0000) and this machine's live root (/). The fixtures' recorded config (two pools) is used on
all three, and on the live root once more without pools (the pools' process-table scan
apart). For each fleetscope server it also prints the three collectors that took longest
(fleetscope_scrape_collector_duration_seconds, averaged over the measured scrapes' last
round).

On the 256-core fixture, also: node_exporter (Debian's prometheus-node-exporter) with only its
cpu and stat collectors (the anchor of the per-core path), with the collectors that read what
fleetscope's cpu and pressure collectors read (adding pressure, schedstat, loadavg), and with a
broad set close to fleetscope's collectors; fleetscope's cpu and pressure collectors in full
per-core mode (every core's series, as node_exporter) and in summary mode.

Scrapes go over one keep-alive connection each, with the headers Prometheus sends, in
alternating rounds so drift on a shared machine hits all alike. Server CPU is the process's
utime+stime from /proc/<pid>/stat (all threads, exited ones included: fleetscope's perf
sampler thread counts). A fixture is the same file on every scrape, so caches keyed on
unchanged input (a /proc/interrupts row that did not move) help there as they help on an
idle node; the live root changes between scrapes.

    python bench/exporter_vs_node_exporter.py [--scrapes 300] [--rounds 5] [--quick]

Prints the medians and the ratios fleetscope/node_exporter; exit 0 whatever they are
(benchmarks report, tests assert behaviour). `--quick` runs only the default-deployment
comparison.
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
BUNDLES = REPO / "tests" / "fixtures" / "bundles"
BUNDLE = BUNDLES / "x86-256"
SAMPLE = BUNDLE / "samples" / "s0000"
# The default deployment's roots: (label, bundle or None for the live root)
ROOTS = (("x86-256 fixture", BUNDLE), ("kunpeng-128 fixture", BUNDLES / "kunpeng-128"),
         ("live root /", None))
DURATION = "fleetscope_scrape_collector_duration_seconds"
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

    def collector_durations(self, scrapes: int) -> dict[str, float]:
        """Mean seconds per collector over `scrapes` scrapes, as the exporter reports them."""
        total: dict[str, float] = {}
        for _ in range(scrapes):
            for line in self.scrape().decode().splitlines():
                if line.startswith(DURATION + "{"):
                    name = line.split('collector="', 1)[1].split('"', 1)[0]
                    total[name] = total.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return {name: value / scrapes for name, value in total.items()}

    def stop(self) -> None:
        self.conn.close()
        self.proc.terminate()
        self.proc.wait(timeout=10)


def node_exporter_args(binary: str, port: int, collectors: tuple[str, ...] | None,
                       bundle: Path | None) -> list[str]:
    """node_exporter on a fixture sample (procfs of the sample, sysfs of the bundle's
    static/), or on the live root; `collectors` None: its default set."""
    args = [binary, f"--web.listen-address=127.0.0.1:{port}", "--log.level=error"]
    if collectors is not None:
        args += ["--collector.disable-defaults", *(f"--collector.{c}" for c in collectors)]
    if bundle is not None:
        sample = bundle / "samples" / "s0000"
        args += [f"--path.procfs={sample / 'proc'}", f"--path.sysfs={bundle / 'static' / 'sys'}",
                 f"--path.rootfs={sample}"]
    return args


def fleetscope_args(port: int, config: Path, bundle: Path | None) -> list[str]:
    root = str(bundle / "samples" / "s0000") if bundle is not None else "/"
    return [sys.executable, "-m", "fleetscope", "--log-level", "error", "exporter",
            "--listen", f"127.0.0.1:{port}", "--root", root, "--config", str(config)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=300, help="scrapes per round (300)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (5)")
    parser.add_argument("--quick", action="store_true",
                        help="only the default deployment on the three roots")
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
    default_config = workdir / "config-default.json"
    default_config.write_text(json.dumps({**recorded, "per_core": "summary"}))

    # (name, argv); the default deployment's pairs: (root label, node_exporter, fleetscope)
    specs: list[tuple[str, list[str]]] = []
    pairs: list[tuple[str, str, str]] = []
    for label, bundle in ROOTS:
        ne, fs = f"node_exporter defaults, {label}", f"fleetscope default, {label}"
        specs.append((ne, node_exporter_args(node_exporter, 0, None, bundle)))
        specs.append((fs, fleetscope_args(0, default_config, bundle)))
        pairs.append((label, ne, fs))
    # The live root again without pools: what the process-table scan of the pools costs on
    # this machine's processes, apart from everything else.
    bare_config = workdir / "config-no-pools.json"
    bare_config.write_text(json.dumps({"per_core": "summary"}))
    bare = "fleetscope default without pools, live root /"
    specs.append((bare, fleetscope_args(0, bare_config, None)))
    pairs.append(("live root / (no pools configured)", pairs[-1][1], bare))
    if not args.quick:
        for name, collectors in ANCHORS.items():
            specs.append((name, node_exporter_args(node_exporter, 0, collectors, BUNDLE)))
        for name, *_ in FLEETSCOPE:
            specs.append((name, fleetscope_args(0, configs[name], BUNDLE)))

    servers = []
    try:
        for name, argv in specs:
            port = free_port()
            argv = [a.replace("127.0.0.1:0", f"127.0.0.1:{port}") for a in argv]
            servers.append(Server(name, argv, port))
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
        durations = {s.name: s.collector_durations(min(args.scrapes, 50)) for s in servers
                     if s.name.startswith("fleetscope default")}
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform_line()}")
    print(f"{args.rounds} rounds x {args.scrapes} scrapes each, Prometheus's Accept and gzip "
          "headers; fixtures: sample s0000 of tests/fixtures/bundles/<name>")
    print(f"node_exporter: {(version.stdout or version.stderr).splitlines()[0]}")
    width = max(len(name) for name in per_scrape) + 2
    print(f"{'server':<{width}}{'CPU ms/scrape (median)':>24}{'min':>8}{'max':>8}{'series':>8}"
          f"{'latency ms':>12}")
    for name, values in per_scrape.items():
        print(f"{name:<{width}}{statistics.median(values) * 1e3:>24.3f}"
              f"{min(values) * 1e3:>8.3f}{max(values) * 1e3:>8.3f}{series[name]:>8}"
              f"{statistics.median(latency[name]) * 1e3:>12.2f}")
    print("default deployment (every fleetscope collector, summary mode) / node_exporter's "
          "default collectors:")
    for label, ne, fs in pairs:
        ratio = statistics.median(per_scrape[fs]) / statistics.median(per_scrape[ne])
        top = sorted(durations[fs].items(), key=lambda item: -item[1])[:3]
        print(f"ratio {label}: CPU per scrape {ratio:.2f}x, series "
              f"{series[fs] / series[ne]:.3f}x; slowest collectors: "
              + ", ".join(f"{name} {seconds * 1e3:.2f} ms" for name, seconds in top))
    if not args.quick:
        for name, _, _, anchors in FLEETSCOPE:
            for anchor in anchors:
                ratio = statistics.median(per_scrape[name]) / statistics.median(per_scrape[anchor])
                print(f"ratio {name} / {anchor}: CPU per scrape {ratio:.2f}x, "
                      f"series {series[name] / series[anchor]:.3f}x")
    return 0


def platform_line() -> str:
    """This machine, for the record: CPU model and count."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs"


if __name__ == "__main__":
    raise SystemExit(main())
