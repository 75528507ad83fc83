"""Fleet scale on a real query engine: `fleetscope diagnose --prometheus URL --fleet`.

    python bench/fleet_prometheus.py [--nodes 4096] [--minutes 30] [--engines prometheus,vm]
                                     [--all-series] [--before] [--keep DIR]

Builds a fleet of N simulated nodes from the exporter's collectors replaying the rule
scenario bundles (tests/fixtures/scenarios/*: healthy-idle and healthy-busy for the healthy
nodes, each rule's bundle for the nodes that carry its fault): counters (and queue depths)
keep the rate they had in the bundle, other gauges their last value, 30 min at 15 s ending
a few minutes in the future (so "now" lies inside the data whatever the generation took;
past it, the diagnosis is made at the data's end). Faults sit on known nodes: isa-mismatch
on every node of the older CPU stepping (r1p0, one node in 128), roce-congestion on 29 of
the 32 nodes of one rack, each other rule on a few nodes.

The same samples go to Prometheus (`promtool tsdb create-blocks-from openmetrics`, then
Prometheus over the blocks) and to VictoriaMetrics (its /api/v1/import/prometheus), both on
127.0.0.1. For each engine it prints the diagnosis's wall time, peak RSS, queries made and
bytes received, and checks every node's findings against what the in-process engine finds
on that node's profile (the injected fault on its node, nothing on healthy nodes).
`--before` also times the old in-process path once (every series fetched, rules in Python).

Targets at 4,096 nodes: diagnosis < 10 s and < 300 MB RSS; at 16,384 nodes < 30 s.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"
STEP_S = 15
GENERATOR = 2  # bump when the samples written change: a kept fleet is rebuilt
SETTLE_SECONDS = 30  # diagnose/remote.py SETTLE_SECONDS: the window ends this far back
HEALTHY = ("healthy-idle", "healthy-busy")
NODES_PER_RACK = 32
OLD_STEPPING_EVERY = 128  # one node in 128 runs the older stepping (r1p0)
CONGESTED_RACK = 121  # roce-congestion on 29 of its 32 nodes ("r121"), or the middle rack
CONGESTED_NODES = 29
EXTRA_FAULT_NODES = 3  # nodes per other rule
# The CPU every node reports (fleetscope_cpu_info / fleetscope_cpu_features_info): two
# steppings of one model; the older lacks the dot-product extension (asimddp).
CPU_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid " \
               "asimdrdm jscvt fcma dcpop asimddp asimdfhm ssbs"
STEPPINGS = {
    "r1p1": {"revision": "1", "features": CPU_FEATURES},
    "r1p0": {"revision": "0", "features": CPU_FEATURES.replace(" asimddp", "")},
}
CPU_METRICS = ("fleetscope_cpu_info", "fleetscope_cpu_features_info", "fleetscope_cpu_model_cpus")
ATTRIBUTE_METRICS = ("fleetscope_exporter_build_info", "fleetscope_sigill_reports_suppressed_total")
SIGILL = "fleetscope_sigill_crashes_total"
# Gauges that keep growing as they grew in the bundle (a backlog); the others keep their
# last value.
GROWING_GAUGES = ("agent_queue_depth",)
SIGILL_PER_SECOND = 1 / 60  # a crash a minute on a node that cannot run the binary


@dataclass
class Series:
    name: str
    labels: tuple[tuple[str, str], ...]
    first: float
    slope: float  # per second; 0 for gauges


@dataclass
class Node:
    instance: str
    profile: str
    rack: str
    node_pool: str
    stepping: str


def _rule_metrics() -> set[str]:
    from fleetscope.rules.catalog import CATALOG

    names = set()
    for rule in CATALOG:
        names |= rule.requires()
        for item in rule.evidence:
            names |= item.expr.metrics()
    return names


def _is_counter(name: str) -> bool:
    return name.endswith(("_total", "_sum", "_count", "_bucket"))


def load_profiles(all_series: bool = False) -> dict[str, list[Series]]:
    """Scenario name -> its series (the exporter's collectors replaying the bundle)."""
    from fleetscope.bundle.read import open_bundle
    from fleetscope.diagnose.evidence import bundle_series

    logging.getLogger("fleetscope.exporter").setLevel(logging.ERROR)
    keep = _rule_metrics() | set(ATTRIBUTE_METRICS)
    profiles: dict[str, list[Series]] = {}
    for directory in sorted(p for p in SCENARIOS.iterdir() if (p / "meta.json").exists()):
        bundle = open_bundle(str(directory))
        try:
            recorded = bundle_series(bundle, bundle.config(None))
        finally:
            bundle.close()
        out = []
        for name, by_labels in sorted(recorded.by_name.items()):
            if name in CPU_METRICS or not (all_series or name in keep):
                continue  # the CPU identity is the node's, set below
            for labels, points in sorted(by_labels.items()):
                (t0, v0), (t1, v1) = points[0], points[-1]
                moving = _is_counter(name) or name in GROWING_GAUGES
                slope = (v1 - v0) / ((t1 - t0) / 1000) if moving and t1 > t0 else 0
                first = v0 if moving else v1
                if name == SIGILL and directory.name == "isa-mismatch":
                    slope = SIGILL_PER_SECOND  # crashing now, not only in the kernel log
                out.append(Series(name, labels, first, max(slope, 0.0)))
        profiles[directory.name] = out
    return profiles


def plan(nodes: int) -> list[Node]:
    """Which node is which: racks of 32, two node pools, the older stepping one in 128,
    the faults on known nodes."""
    racks = max(1, (nodes + NODES_PER_RACK - 1) // NODES_PER_RACK)
    congested = CONGESTED_RACK if CONGESTED_RACK < racks else racks // 2
    out = []
    for index in range(nodes):
        rack = index // NODES_PER_RACK
        old = index % OLD_STEPPING_EVERY == OLD_STEPPING_EVERY // 2 or (
            nodes < OLD_STEPPING_EVERY and index % 16 == 8)
        profile = HEALTHY[index % 2]
        if old:
            profile = "isa-mismatch"
        elif rack == congested and index % NODES_PER_RACK < (
                CONGESTED_NODES if racks > 4 else 3):  # a small CI fleet keeps its healthy nodes
            profile = "roce-congestion"
        out.append(Node(f"node-{index:05d}:9105", profile, f"r{rack:03d}",
                        "pool-a" if rack % 2 == 0 else "pool-b", "r1p0" if old else "r1p1"))
    others = sorted(p.name for p in SCENARIOS.iterdir() if (p / "meta.json").exists()
                    and p.name not in (*HEALTHY, "isa-mismatch", "roce-congestion"))
    free = [n for n in out if n.profile in HEALTHY]
    stride = max(1, len(free) // (len(others) * EXTRA_FAULT_NODES + 1))
    for position, node in enumerate(free[stride // 2::stride][:len(others) * EXTRA_FAULT_NODES]):
        node.profile = others[position % len(others)]
    return out


def _labels_text(labels) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels)


def node_series(node: Node, profiles: dict[str, list[Series]]) -> list[Series]:
    """The node's series with its target labels and its CPU's identity."""
    target = (("instance", node.instance), ("job", "fleetscope"), ("node_pool", node.node_pool),
              ("rack", node.rack))
    stepping = STEPPINGS[node.stepping]
    cpu = (("arch", "aarch64"), ("architecture", "8"), ("implementer", "0x48"),
           ("model_name", "HiSilicon Kunpeng 920"), ("part", "0xd01"),
           ("revision", stepping["revision"]), ("variant", "0x1"), ("vendor", "HiSilicon"))
    features = (("arch", "aarch64"), ("features", stepping["features"]),
                ("fingerprint", f"kp920{node.stepping}"))
    out = [Series("fleetscope_cpu_info", cpu, 1.0, 0.0),
           Series("fleetscope_cpu_features_info", features, 1.0, 0.0)]
    out += profiles[node.profile]
    return [Series(s.name, tuple(sorted(s.labels + target)), s.first, s.slope) for s in out]


def write_samples(path: Path, fleet: list[Node], profiles, start_s: int, points: int,
                  openmetrics: bool) -> int:
    """The fleet's samples as text, grouped by metric family (OpenMetrics for promtool,
    timestamps in seconds; else the Prometheus text format with milliseconds, which
    VictoriaMetrics imports). Returns the sample count."""
    by_name: dict[str, list[Series]] = {}
    for node in fleet:
        for series in node_series(node, profiles):
            by_name.setdefault(series.name, []).append(series)
    stamps = [str(start_s + k * STEP_S) if openmetrics else str((start_s + k * STEP_S) * 1000)
              for k in range(points)]
    offsets = [k * STEP_S for k in range(points)]
    count = 0
    with open(path, "w", buffering=1 << 20) as out:
        for name, members in sorted(by_name.items()):
            if openmetrics:
                out.write(f"# TYPE {name} unknown\n")
            for series in members:
                prefix = f"{name}{{{_labels_text(series.labels)}}} "
                first, slope = series.first, series.slope
                out.write("".join(f"{prefix}{first + slope * offset!r} {stamp}\n"
                                  for offset, stamp in zip(offsets, stamps, strict=True)))
                count += points
        if openmetrics:
            out.write("# EOF\n")
    return count


def expected_findings(profiles, start_s: int, points: int, seconds: float, end_s: float
                      ) -> dict[str, set[str]]:
    """Profile -> rules the in-process engine finds on one node of it, over the window the
    diagnosis reads (the same samples the engines hold)."""
    from fleetscope.diagnose import engine
    from fleetscope.rules.promql import Series as Recorded

    out = {}
    first_ms = int((end_s - seconds) * 1000)
    for profile in profiles:
        node = Node("probe:9105", profile, "r000", "pool-a",
                    "r1p0" if profile == "isa-mismatch" else "r1p1")
        recorded = Recorded()
        for series in node_series(node, profiles):
            labels = {k: v for k, v in series.labels if k != "job"}
            for k in range(points):
                at_ms = (start_s + k * STEP_S) * 1000
                if first_ms <= at_ms <= end_s * 1000:
                    recorded.add(series.name, labels, at_ms, series.first + series.slope *
                                 k * STEP_S)
        findings, _ = engine.evaluate(recorded, node.instance)
        out[profile] = {f.rule.id for f in findings}
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready in {seconds:g} s")


class Engine:
    """A query engine process on 127.0.0.1, stopped by pid."""

    def __init__(self, name: str, args: list[str], url: str, ready: str, log: Path):
        self.name, self.url = name, url
        self._log = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_ready(url + ready)
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def start_prometheus(openmetrics: Path, workdir: Path) -> Engine:
    promtool = shutil.which("promtool")
    prometheus = shutil.which("prometheus")
    if not (promtool and prometheus):
        raise RuntimeError("promtool and prometheus are needed (Debian package prometheus)")
    tsdb = workdir / "prometheus-tsdb"
    if not tsdb.exists():
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics),
                        str(tsdb)], check=True, stdout=subprocess.DEVNULL)
    config = workdir / "prometheus.yml"
    config.write_text("global: {scrape_interval: 15s}\n")
    port = free_port()
    return Engine("prometheus", [prometheus, f"--config.file={config}",
                                 f"--storage.tsdb.path={tsdb}",
                                 "--storage.tsdb.retention.time=3650d",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                  f"http://127.0.0.1:{port}", "/-/ready", workdir / "prometheus.log")


def start_victoria(text: Path, workdir: Path) -> Engine:
    binary = shutil.which("victoria-metrics")
    if not binary:
        raise RuntimeError("victoria-metrics is needed (Debian package victoria-metrics)")
    port = free_port()
    imported = (workdir / "vm-data").exists() and (workdir / "vm-imported").exists()
    engine = Engine("victoriametrics", [
        binary, f"-storageDataPath={workdir / 'vm-data'}", f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=100y", "-search.disableCache", "-search.latencyOffset=0s"],
        f"http://127.0.0.1:{port}", "/health", workdir / "victoria-metrics.log")
    try:
        if not imported:
            import_victoria(engine.url, text)
            (workdir / "vm-imported").write_text("")
    except Exception:
        engine.stop()
        raise
    return engine


def import_victoria(url: str, text: Path, chunk_bytes: int = 32 << 20) -> None:
    """POST the samples in chunks of whole lines, then flush them to be searchable."""
    with open(text, "rb") as source:
        while True:
            chunk = source.read(chunk_bytes)
            if not chunk:
                break
            chunk += source.readline()
            request = urllib.request.Request(f"{url}/api/v1/import/prometheus", data=chunk,
                                             method="POST")
            with urllib.request.urlopen(request, timeout=600) as response:
                response.read()
    with urllib.request.urlopen(f"{url}/internal/force_flush", timeout=120) as response:
        response.read()


def run_diagnosis(url: str, seconds: float, at: float, python_code: str) -> dict:
    """A diagnosis in a fresh child (AFTER or BEFORE): its JSON, wall time and peak RSS."""
    command = [sys.executable, "-c", PEAK_RSS + python_code, url, f"{seconds:g}", f"{at:.3f}"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read().decode()
        error = err.read().decode().strip()
    if proc.returncode not in (0, 1, 2):
        raise RuntimeError(f"diagnosis exited {proc.returncode}: {error[-500:]}")
    peak = [line.split()[1] for line in error.splitlines() if line.startswith("VmHWM:")]
    return {"document": json.loads(text), "wall_s": wall,
            "peak_rss_bytes": int(peak[-1]) * 1024 if peak else usage.ru_maxrss * 1024}


# The child's own peak RSS (VmHWM of its address space, printed at exit): wait4's
# ru_maxrss starts from the parent's size at the fork, which is this bench's.
PEAK_RSS = """
import atexit, sys
def _peak():
    with open("/proc/self/status") as status:
        sys.stderr.write("".join(l for l in status if l.startswith("VmHWM:")))
atexit.register(_peak)
"""
# `fleetscope diagnose --prometheus URL --fleet --json` as diagnose/command.py runs it, at a
# given time (the data may lie behind the clock).
AFTER = """
import json, sys
from fleetscope.diagnose import engine, remote
from fleetscope.rules.catalog import CATALOG
answer = remote.diagnose_remote(sys.argv[1], float(sys.argv[2]), now=float(sys.argv[3]))
document = engine.diagnosis("prometheus", answer.nodes, answer.window, answer.findings,
                            answer.not_evaluated, len(CATALOG))
document["fleet_findings"] = answer.fleet_findings
document["query_engine"] = answer.stats.to_json()
print(json.dumps(document))
"""


# The old path, for --before: every series of every rule metric over the window, rules in
# Python (diagnose/prometheus.py + engine.evaluate).
BEFORE = """
import json, sys
from fleetscope.diagnose import engine, prometheus, remote
from fleetscope.diagnose.prometheus import prometheus_series
class _Clock:  # the window ends where the engine-side one does
    time = staticmethod(lambda: float(sys.argv[3]) - remote.SETTLE_SECONDS)
prometheus.time = _Clock
from fleetscope.rules.catalog import CATALOG
metrics = set().union(*(rule.requires() for rule in CATALOG))
series, nodes = prometheus_series(sys.argv[1], metrics, float(sys.argv[2]), None,
                                  timeout=600)
findings, not_evaluated = engine.evaluate(series, "?")
print(json.dumps({"findings": [f.to_json() for f in findings], "nodes": nodes,
                  "queries": len(metrics)}))
"""


def check(document: dict, fleet: list[Node], expected: dict[str, set[str]]) -> list[str]:
    """Differences between the findings and what each node's profile must give."""
    found: dict[str, set[str]] = {}
    for finding in document["findings"]:
        found.setdefault(finding["node"], set()).add(finding["rule"])
    problems = []
    for node in fleet:
        want = expected[node.profile]
        got = found.pop(node.instance, set())
        if got != want:
            problems.append(f"{node.instance} ({node.profile}): found {sorted(got)}, "
                            f"expected {sorted(want)}")
    problems += [f"{n}: findings on an unknown node: {sorted(r)}" for n, r in found.items()]
    return problems


def prometheus_response_bytes(url: str) -> float:
    """Bytes Prometheus has answered on its query API (its own /metrics: it does not scrape
    itself here)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('prometheus_http_response_size_bytes_sum{handler="/api/v1/'))


def build(nodes: int, minutes: float, workdir: Path, all_series: bool, engines: list[str]):
    """Generate the fleet's samples (or reuse those of an earlier run with the same fleet in
    `workdir`); returns (fleet, profiles, start_s, points)."""
    profiles = load_profiles(all_series)
    fleet = plan(nodes)
    points = int(minutes * 60 // STEP_S) + 1
    meta_path = workdir / "fleet.json"
    meta = {"nodes": nodes, "points": points, "all_series": all_series,
            "generator": GENERATOR}
    if meta_path.exists():
        earlier = json.loads(meta_path.read_text())
        if {k: earlier.get(k) for k in meta} == meta:
            return fleet, profiles, earlier["start_s"], points
    ahead = min(10 * 60, minutes * 60 / 3)  # data runs this far past "now"
    start_s = int((time.time() + ahead) // STEP_S * STEP_S) - (points - 1) * STEP_S
    for stale in ("prometheus-tsdb", "vm-data"):
        shutil.rmtree(workdir / stale, ignore_errors=True)
    if "prometheus" in engines:
        write_samples(workdir / "fleet.om", fleet, profiles, start_s, points, True)
    if "vm" in engines:
        write_samples(workdir / "fleet.prom", fleet, profiles, start_s, points, False)
    meta_path.write_text(json.dumps({**meta, "start_s": start_s}))
    return fleet, profiles, start_s, points


def evaluation_time(start_s: int, points: int) -> float:
    """When to diagnose: now, or, once the clock has passed the data (a slow load, a reused
    fleet), a minute before the data ends."""
    return min(time.time(), start_s + (points - 1) * STEP_S - 60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4096)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--seconds", type=float, default=300, help="diagnosis window")
    parser.add_argument("--engines", default="prometheus,vm")
    parser.add_argument("--all-series", action="store_true",
                        help="every series the exporter writes (~550 a node), not only the "
                        "ones rules read (~125)")
    parser.add_argument("--before", action="store_true", help="also time the old in-process "
                        "path once (Prometheus only)")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep it")
    args = parser.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="fleet-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    fleet, profiles, start_s, points = build(args.nodes, args.minutes, workdir,
                                             args.all_series, engines)
    per_node = {p: len(s) + 2 for p, s in profiles.items()}
    samples = sum(per_node[n.profile] for n in fleet) * points
    print(f"fleet: {args.nodes:,} nodes, {samples // points:,} series, {samples:,} samples "
          f"({args.minutes:g} min at {STEP_S} s); text written in "
          f"{time.perf_counter() - started:.0f} s")
    faults: dict[str, int] = {}
    for node in fleet:
        faults[node.profile] = faults.get(node.profile, 0) + 1
    print("profiles:", ", ".join(f"{p} {n}" for p, n in sorted(faults.items())))
    failures = 0
    for name in engines:
        loaded = time.perf_counter()
        engine = (start_prometheus(workdir / "fleet.om", workdir) if name == "prometheus"
                  else start_victoria(workdir / "fleet.prom", workdir))
        try:
            print(f"\n{engine.name}: loaded in {time.perf_counter() - loaded:.0f} s")
            at = evaluation_time(start_s, points)
            end_s = (at - SETTLE_SECONDS) // STEP_S * STEP_S
            expected = expected_findings(profiles, start_s, points, args.seconds, end_s)
            result = run_diagnosis(engine.url, args.seconds, at, AFTER)
            document = result["document"]
            stats = document.get("query_engine", {})
            problems = check(document, fleet, expected)
            failures += bool(problems)
            print(f"  diagnose --fleet: {result['wall_s']:.2f} s wall, peak RSS "
                  f"{result['peak_rss_bytes'] / 2**20:.0f} MiB, {stats.get('queries')} queries, "
                  f"{stats.get('bytes_received', 0) / 2**20:.2f} MiB received, "
                  f"{len(document['findings'])} findings")
            verdict = ("every injected fault on its node, nothing else" if not problems
                       else f"{len(problems)} nodes differ")
            print(f"  faults: {verdict}")
            for line in problems[:10]:
                print(f"    {line}")
            for entry in document.get("fleet_findings", [])[:5]:
                print(f"  fleet: {entry['summary']}")
            if args.before and name == "prometheus":
                before_bytes = prometheus_response_bytes(engine.url)
                old = run_diagnosis(engine.url, args.seconds, at, BEFORE)
                received = prometheus_response_bytes(engine.url) - before_bytes
                print(f"  before (in-process rules, every series): {old['wall_s']:.2f} s wall, "
                      f"peak RSS {old['peak_rss_bytes'] / 2**20:.0f} MiB, "
                      f"{old['document']['queries']} queries, {received / 2**20:.1f} MiB "
                      f"received, {len(old['document']['findings'])} findings; ratio "
                      f"{old['wall_s'] / result['wall_s']:.1f}x wall, "
                      f"{old['peak_rss_bytes'] / result['peak_rss_bytes']:.1f}x RSS")
        finally:
            engine.stop()
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
