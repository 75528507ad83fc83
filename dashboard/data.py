"""The console's sources: what it draws from, loaded into a `Snapshot`. No streamlit or
pandas here.

Every source ends as the same thing, a `rules.promql.Series` named as the exporter's metrics
with an `instance` label on every series, plus the findings the rule engine makes of it:

    demo                 the simulated fleet (dashboard/fleet_sim.py); `demo:512` for 512 nodes,
                         answered as a query engine would (dashboard/fleet_eval.py): findings,
                         node table and recorded signals, a node's history when it is opened
    bundle:PATH          a `fleetscope bundle record` bundle, replayed through the collectors
                         (diagnose.evidence.bundle_series), one node named by its hostname
    prometheus:URL       the rules where the data is (its firing alerts, or the rules evaluated
                         there: diagnose/remote.py), the node table and recorded signals as
                         instant queries, a node's history when it is opened

The pages draw frames made from a `Snapshot` (fleet_frames.py, node_frames.py,
evidence_frames.py, latency_frames.py; frames.py holds what they share), so the same code
draws a simulated fleet, a bundle and a Prometheus server.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetscope.dashboard import evidence_views, fleet_eval
from fleetscope.rules.catalog import CATALOG
from fleetscope.rules.promql import Series

SOURCE_ENV = "FLEETSCOPE_CONSOLE_SOURCE"
DEFAULT_SOURCE = "demo"
# What the fleet view asks every node for: the rule inputs, the heatmap signals, metadata.
FLEET_METRICS = sorted(fleet_eval.metrics())
# And one node, over time, for the node view.
NODE_METRICS = sorted(set(FLEET_METRICS) | {
    "fleetscope_cpu_seconds_total", "fleetscope_cpu_numa_node_seconds_total",
    "fleetscope_cpu_numa_node_cpus", "fleetscope_schedstat_numa_node_waiting_seconds_total",
    "fleetscope_pool_memory_bytes", "fleetscope_memory_bandwidth_bytes_per_second",
    "fleetscope_memory_bandwidth_peak_bytes_per_second", "fleetscope_nic_port_bytes_total",
    "fleetscope_instructions_per_cycle", "fleetscope_rdma_hw_stats_total",
    "fleetscope_cpu_saturated_cores", "fleetscope_pool_threads",
} | {f"fleetscope_accelerator_{name}" for name in (
    "info", "utilization_ratio", "memory_used_bytes", "memory_total_bytes",
    "temperature_celsius", "power_watts", "ecc_uncorrected_errors", "ecc_corrected_errors",
    "last_xid", "error_codes", "healthy", "matrix_listed")} | {
    # and what each rule's evidence views draw (a finding's charts on the Node and Findings
    # pages): a query engine is asked only for these names
    name for rule in CATALOG for panel in evidence_views.views_for(rule.id)
    for name in panel.expr.metrics()})
# How far back a node's history goes (the sidebar's choice, `?range=` in the URL), on the
# sources that make a history for any range: the demo and Prometheus. A bundle has its own.
HISTORY_RANGES = {"15 min": 900, "1 h": 3600, "3 h": 3 * 3600, "6 h": 6 * 3600,
                  "24 h": 24 * 3600}
DEFAULT_HISTORY = "3 h"
HISTORY_POINTS = 720  # at most this many steps a history series: a longer range steps wider


class SourceError(Exception):
    """The console's source cannot be used; the message is one line for the user."""


@dataclass
class Snapshot:
    """One source, loaded: what every page draws from."""

    kind: str  # demo | bundle | prometheus
    description: str
    series: Series  # the fleet (every node, `instance` on every series)
    findings: list[dict]  # findings as docs/diagnosis-json.md has them, worst first
    not_evaluated: list[dict]
    window: tuple[float, float]
    # One node's history over the last N seconds (a bundle: its own, whatever N).
    node_loader: Callable[[str, float], Series] | None = None
    notes: list[str] = field(default_factory=list)
    # Recorded series name -> its vector, answered by a query engine (rules/recording.py);
    # None: the frames evaluate the same expressions over `series` in-process.
    aggregates: dict[str, dict] | None = None
    # A query engine with no current node sample (none within its 5-minute look-back):
    # the newest one's time, 0.0 when there is none within a day; None while data is current.
    newest_sample: float | None = None
    # A query engine's pending alerts (diagnose/remote.py pending_alerts): conditions that
    # hold, not yet for their rule's `for:`; a node with one is not "nothing fires".
    pending: list[dict] = field(default_factory=list)
    # The pools over their targets with the rules explaining them (docs/diagnosis-json.md
    # `harm`); None where the source does not judge harm (a query engine's firing alerts).
    harm: list[dict] | None = None

    @property
    def history_ranged(self) -> bool:
        """Whether a node's history follows the range asked (a bundle's is what it recorded)."""
        return self.kind != "bundle"


def parse_source(spec: str) -> tuple[str, str]:
    """`demo`, `demo:N`, `bundle:PATH`, `prometheus:URL` -> (kind, argument)."""
    spec = (spec or DEFAULT_SOURCE).strip()
    kind, _, argument = spec.partition(":")
    if kind == "demo":
        if argument and not (argument.isdigit() and 16 <= int(argument) <= 16384):
            raise SourceError(f"demo size must be a node count from 16 to 16384, not "
                              f"{argument!r}")
        return "demo", argument or "4096"
    if kind == "bundle" and argument:
        return "bundle", argument
    if kind == "prometheus" and argument.startswith(("http://", "https://")):
        return "prometheus", argument
    raise SourceError(f"unknown source {spec!r}: use demo, bundle:PATH or prometheus:URL")


def check_source(spec: str) -> None:
    """Fail early, before a server starts: the bundle exists and opens, the URL answers."""
    kind, argument = parse_source(spec)
    if kind == "bundle":
        from fleetscope.bundle.read import BundleError, open_bundle

        try:
            open_bundle(argument).close()
        except BundleError as err:
            raise SourceError(str(err)) from None
    elif kind == "prometheus":
        from fleetscope.diagnose.prometheus import PrometheusError, _get

        try:
            _get(argument, "/api/v1/query", {"query": "vector(1)"}, 10.0)
        except PrometheusError as err:
            raise SourceError(str(err)) from None


# Snapshots made before the server took its first visitor (`fleetscope demo` simulates its
# fleet, then serves): the first load of that source takes it, a Refresh makes a new one.
_PRELOADED: dict[str, Snapshot] = {}


def preload(spec: str) -> None:
    """Load a demo source now, in this process, for its first visitor (other sources are
    current only when asked: they are not made ahead)."""
    if parse_source(spec)[0] == "demo":
        _PRELOADED[spec] = load(spec)


def load(spec: str) -> Snapshot:
    preloaded = _PRELOADED.pop(spec, None)
    if preloaded is not None:
        return preloaded
    kind, argument = parse_source(spec)
    if kind == "demo":
        return load_demo(int(argument))
    if kind == "bundle":
        return load_bundle(argument)
    return load_prometheus(argument)


def _span(series: Series) -> tuple[int, int]:
    stamps = series.timestamps()
    return (stamps[0], stamps[-1]) if stamps else (0, 0)


def _to_json(found: list) -> list[dict]:
    """The findings of docs/diagnosis-json.md, plus the labels they fired on (for the charts)."""
    return [{**f.to_json(), "labels": dict(f.labels)} for f in found]


def demo_end(now: float | None = None) -> int:
    """The simulated fleet's last scrape: the current minute, so the demo's clock is now."""
    import time

    return int((time.time() if now is None else now) // 60 * 60)


def load_demo(nodes: int = 4096, cores: int = 128, processes: int | None = None) -> Snapshot:
    """The simulated fleet as a query engine answers it: the rules and the recording rules
    evaluated rack by rack (on every CPU for a large fleet: dashboard/fleet_eval.py), the
    node table, and a node's history made when its page opens."""
    from .fleet_eval import evaluate_fleet
    from .fleet_sim import Fleet

    fleet = Fleet(nodes=nodes, cores=cores, end_s=demo_end())
    answer = evaluate_fleet(fleet, processes=processes)
    first, last = _span(answer.tables)
    how = (f"rules evaluated over {answer.series_evaluated:,} series, rack by rack"
           + (f", in {answer.processes} processes" if answer.processes > 1 else ""))
    return Snapshot("demo", f"simulated fleet: {nodes:,} nodes x {cores} cores",
                    answer.tables, answer.findings, answer.not_evaluated,
                    (first / 1000, last / 1000),
                    lambda instance, seconds: fleet.node_series(instance, round(seconds / 60)),
                    notes=[how, *answer.notes], aggregates=answer.aggregates,
                    harm=answer.harm)


def with_instance(series: Series, instance: str) -> Series:
    """A bundle's series carry no `instance` (the exporter never adds one): add it."""
    out = Series()
    pair = ("instance", instance)
    for name, family in series.by_name.items():
        out.by_name[name] = {tuple(sorted((*labels, pair))): points
                             for labels, points in family.items()}
    out.max_window_ms = series.max_window_ms
    return out


def load_bundle(path: str) -> Snapshot:
    import logging

    from fleetscope.bundle.read import BundleError, open_bundle
    from fleetscope.diagnose.bundle_diagnosis import diagnose_bundle
    from fleetscope.diagnose.evidence import bundle_series

    logging.getLogger("fleetscope.exporter").setLevel(logging.ERROR)
    try:
        bundle = open_bundle(path)
    except BundleError as err:
        raise SourceError(str(err)) from None
    with bundle:
        try:
            config = bundle.config()
        except BundleError as err:
            raise SourceError(str(err)) from None
        diagnosed = diagnose_bundle(bundle, config)
        series, found, not_evaluated = (diagnosed.series, diagnosed.findings,
                                        diagnosed.not_evaluated)
        harm = [item.to_json() for item in diagnosed.harm]
        first, last = _span(series)
        # The node view also wants every core: the rules read the per-core summary, so the
        # samples are replayed once more with `per_core: full`.
        history = bundle_series(bundle, config, per_core="full")
        hostname = bundle.hostname
        samples = len(bundle.samples)
    history.max_window_ms = series.max_window_ms  # the engine's: charts rate as rules do
    fleet = with_instance(series, hostname)
    node = with_instance(history, hostname)
    notes = [f"bundle {path}: {samples} samples of {hostname}"]
    if samples < 3:
        notes.append("few samples: timelines have one interval; record longer bundles "
                     "(fleetscope bundle record --seconds 60) for trends")
    return Snapshot("bundle", f"bundle: {hostname}", fleet, _to_json(found),
                    not_evaluated, (first / 1000, last / 1000), lambda _node, _seconds: node,
                    notes, harm=harm)


# What the node table reads of every node, as instant queries: the metadata series (one a
# node) and a presence count (a node without fleetscope_cpu_info still shows).
NODE_TABLE_QUERIES = {
    "fleetscope_cpu_info": "fleetscope_cpu_info",
    "node_uname_info": "node_uname_info",
    "fleetscope_scrape_collector_success":
        "count by (instance) (fleetscope_scrape_collector_success)",
}
# When none of them is current: the newest sample of either within a day. timestamp() of a
# raw selector is the sample's own time; a 5-minute step under the 5-minute look-back sees
# every sample once.
NEWEST_SAMPLE_QUERY = ("max(max_over_time(timestamp({__name__=~\"fleetscope_cpu_info|"
                       "fleetscope_scrape_collector_success\"})[1d:5m]))")


def load_prometheus(url: str, seconds: float = 300.0, step: float = 60.0,
                    timeout: float = 60.0) -> Snapshot:
    """The fleet as the query engine sees it, without fetching the fleet: the rules run where
    the data is (diagnose/remote.py: only the firing nodes come back, with their evidence),
    the node table and the per-node aggregates the pages draw are instant queries
    (rules/recording.py: the recorded series when the exported rules are loaded), and a
    node's history is range-queried only when its page opens. Memory and answers follow the
    findings and the nodes' one-number-a-signal, not the raw series."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from fleetscope.diagnose import remote
    from fleetscope.diagnose.prometheus import PrometheusError, prometheus_series
    from fleetscope.rules.recording import RECORDINGS

    now = time.time()
    at = now - remote.SETTLE_SECONDS  # where the diagnosis's settled window ends
    client = remote.QueryClient(url, timeout)

    def findings_now() -> remote.RemoteDiagnosis:
        # The alerts the engine already fires for the exported rules, else every rule
        # evaluated there now (the same conditions: tests/test_remote_engines.py).
        return (remote.alerts_diagnosis(url, seconds, deadline_seconds=timeout, now=now)
                or remote.diagnose_remote(url, seconds, None, deadline_seconds=timeout,
                                          now=now))

    # The engine works on the three at once: the findings, the node table, the aggregates.
    with ThreadPoolExecutor(max_workers=3) as pool:
        diagnosis = pool.submit(findings_now)
        tables_answer = pool.submit(remote.instant_vectors, client, NODE_TABLE_QUERIES, at)
        aggregates_answer = pool.submit(remote.recorded_vectors, client, RECORDINGS, at)
        try:
            answered = diagnosis.result()
            tables, aggregates = tables_answer.result(), aggregates_answer.result()
        except remote.RemoteError as err:
            raise SourceError(str(err)) from None
    at = answered.window[1]
    series = Series()
    at_ms = int(round(at * 1000))
    for name, vector in tables.items():
        for labels, value in vector.items():
            series.add_key(name, labels, at_ms, value)

    def node_loader(instance: str, history_seconds: float) -> Series:
        try:
            history, _ = prometheus_series(url, set(NODE_METRICS), history_seconds, instance,
                                           step=max(step, history_seconds / HISTORY_POINTS))
        except PrometheusError as err:
            raise SourceError(str(err)) from None
        return history

    nodes = len({dict(labels).get("instance") for vector in tables.values()
                 for labels in vector} - {None})
    newest = None
    if not nodes:  # an engine that answers but holds nothing current: say since when
        try:
            newest = max(remote.instant_vectors(client, {"newest": NEWEST_SAMPLE_QUERY},
                                                now)["newest"].values(), default=0.0)
        except remote.RemoteError as err:
            raise SourceError(str(err)) from None
    how = ("findings: the alerts this engine fires for the exported rules" if
           answered.from_alerts else "findings: every rule evaluated on this engine over "
           f"the last {seconds / 60:g} min")
    return Snapshot("prometheus", f"Prometheus {url}: {nodes:,} nodes", series,
                    _to_json(answered.findings), answered.not_evaluated, answered.window,
                    node_loader, notes=[how], aggregates=aggregates, newest_sample=newest,
                    pending=answered.pending,
                    harm=None if answered.from_alerts else [
                        item.to_json() for item in answered.harm])


def source_from_env() -> str:
    return os.environ.get(SOURCE_ENV, DEFAULT_SOURCE)
