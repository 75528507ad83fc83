"""Data shaping for the console: sources in, pandas frames out. No streamlit here.

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

The pages call the functions below on a `Snapshot` and draw the frames they return, so the
same code draws a simulated fleet, a bundle and a Prometheus server.
"""

from __future__ import annotations

import bisect
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from fleetscope.core import units
from fleetscope.core.runbooks import runbook_dir
from fleetscope.dashboard import evidence_views, fleet_eval
from fleetscope.rules.catalog import CATALOG, WINDOW, by_id, evidence_picks
from fleetscope.rules.promql import (
    Rate,
    Selector,
    Series,
    bucket_bound,
    bucket_quantile,
    extrapolated_delta,
)
from fleetscope.rules.recording import NODE_SIGNALS, SESSIONS, STAGE_SECONDS, Recording

RUNBOOKS = runbook_dir()
SOURCE_ENV = "FLEETSCOPE_CONSOLE_SOURCE"
DEFAULT_SOURCE = "demo"
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
UNLABELLED = "(unlabelled)"

# Heatmap signals: label -> (unit, how it is computed)
SIGNALS: dict[str, tuple[str, str]] = {
    "health": ("", "worst finding on the node: ok, warning or critical"),
    "findings": ("", "findings on the node (every rule, every pool)"),
    "busy (median core)": ("ratio", "fleetscope_cpu_core_busy_ratio{stat=p50}"),
    "busiest core": ("ratio", "fleetscope_cpu_core_busy_ratio{stat=max}"),
    "steal (p90 core)": ("ratio", "fleetscope_cpu_core_steal_ratio{stat=p90}"),
    "memory bandwidth % of peak": ("ratio", "fleetscope_memory_bandwidth_utilization_ratio"),
    "L3 miss ratio": ("ratio", "max by socket of fleetscope_llc_miss_ratio"),
    "PFC pauses /s": ("1/s", "rate of fleetscope_nic_pfc_pause_frames_total, all ports"),
    "queue depth": ("tasks", "max of agent_queue_depth"),
    "P99 session latency (online)": ("s", "histogram_quantile(0.99, "
                                     "agent_session_duration_seconds{class=online})"),
}
# Fixed colour ranges so a colour means the same on every fleet and every load.
SIGNAL_RANGE = {"health": (0, 2), "findings": (0, 4),
                "busy (median core)": (0, 1), "busiest core": (0, 1), "steal (p90 core)": (0, 0.3),
                "memory bandwidth % of peak": (0, 1), "L3 miss ratio": (0, 0.5),
                "PFC pauses /s": (0, 1000), "queue depth": (0, 200),
                "P99 session latency (online)": (0, 5)}

SIGNAL_COLOURS = {"health": [[0, "#e8f5e9"], [0.33, "#e8f5e9"], [0.33, "#ff9f1c"],
                             [0.67, "#ff9f1c"], [0.67, "#d62728"], [1, "#d62728"]],
                  "findings": "Reds"}
HEALTH_LEVEL = {"ok": 0, "warning": 1, "critical": 2}
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
})


class SourceError(Exception):
    """The console's source cannot be used; the message is one line for the user."""


@dataclass
class Snapshot:
    """One source, loaded: what every page draws from."""

    kind: str  # demo | bundle | prometheus
    description: str
    series: Series  # the fleet (every node, `instance` on every series)
    findings: list[dict]  # CONTRACT section 5 findings, worst first
    not_evaluated: list[dict]
    window: tuple[float, float]
    node_loader: Callable[[str], Series] | None = None  # one node's history
    notes: list[str] = field(default_factory=list)
    # Recorded series name -> its vector, answered by a query engine (rules/recording.py);
    # None: the frames evaluate the same expressions over `series` in-process.
    aggregates: dict[str, dict] | None = None


# -- sources -------------------------------------------------------------------------------
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


def load(spec: str) -> Snapshot:
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
    """CONTRACT section 5 findings, plus the labels they fired on (for the charts)."""
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
                    (first / 1000, last / 1000), fleet.node_series,
                    notes=[how, *answer.notes], aggregates=answer.aggregates)


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
                    not_evaluated, (first / 1000, last / 1000), lambda _: node, notes)


# What the node table reads of every node, as instant queries: the metadata series (one a
# node) and a presence count (a node without fleetscope_cpu_info still shows).
NODE_TABLE_QUERIES = {
    "fleetscope_cpu_info": "fleetscope_cpu_info",
    "node_uname_info": "node_uname_info",
    "fleetscope_scrape_collector_success":
        "count by (instance) (fleetscope_scrape_collector_success)",
}


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

    def node_loader(instance: str) -> Series:
        try:
            history, _ = prometheus_series(url, set(NODE_METRICS), 3 * 3600, instance,
                                           step=step)
        except PrometheusError as err:
            raise SourceError(str(err)) from None
        return history

    nodes = len({dict(labels).get("instance") for vector in tables.values()
                 for labels in vector} - {None})
    how = ("findings: the alerts this engine fires for the exported rules" if
           answered.from_alerts else "findings: every rule evaluated on this engine over "
           f"the last {seconds / 60:g} min")
    return Snapshot("prometheus", f"Prometheus {url}: {nodes:,} nodes", series,
                    _to_json(answered.findings), answered.not_evaluated, answered.window,
                    node_loader, notes=[how], aggregates=aggregates)


# -- frames from series --------------------------------------------------------------------
# Tiles and rules read the same numbers: every value below is an expression of
# rules/promql.py (the tree the rule engine evaluates), at the source's last sample, with
# the rate window the rules use (WINDOW, capped like the engine's by series.max_window_ms).
def _rows(vector: dict) -> pd.DataFrame:
    rows = [{**{k: v for k, v in labels if k != "__name__"}, "value": value}
            for labels, value in vector.items()]
    return pd.DataFrame(rows, columns=None if rows else ["instance", "value"])


def _instant(series: Series, expr, name: str) -> pd.DataFrame:
    at_ms = series.last_sample_ms([name])
    return _rows({} if at_ms is None else expr.evaluate(series, at_ms))


def latest(series: Series, name: str, matchers: dict | None = None) -> pd.DataFrame:
    """`name{matchers}` now (Prometheus's instant selector at the last sample, 5-minute
    look-back): one row per label set, column `value`."""
    return _instant(series, Selector(name, matchers or None), name)


def last_rate(series: Series, name: str, matchers: dict | None = None) -> pd.DataFrame:
    """`rate(name{matchers}[WINDOW])` now, as the rules compute it (extrapolated, counter
    resets counted from 0)."""
    return _instant(series, Rate(Selector(name, matchers or None), WINDOW), name)


def _per_instance(frame: pd.DataFrame, how: str = "max") -> pd.Series:
    if frame.empty or "instance" not in frame:
        return pd.Series(dtype=float)
    return frame.groupby("instance")["value"].agg(how)


def histogram_quantile(q: float, buckets: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Prometheus's histogram_quantile over a frame of bucket rates (`le`, `value`), summed
    by `by`: rules.promql.bucket_quantile, the function the HistogramQuantile node uses.
    Returns `by` columns and `value`."""
    if buckets.empty:
        return pd.DataFrame(columns=[*by, "value"])
    frame = buckets.assign(bound=buckets["le"].map(lambda le: bucket_bound(str(le))))
    table = frame.groupby([*by, "bound"])["value"].sum().reset_index()
    rows = [{**dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)),
             "value": bucket_quantile(q, zip(group["bound"], group["value"], strict=True))}
            for key, group in table.groupby(by, sort=True)]
    return pd.DataFrame(rows, columns=[*by, "value"])


def _stepping(record: dict) -> str:
    """arm64: part and rNpM from MIDR variant/revision; x86: family/model/stepping."""
    if "variant" in record:
        variant = str(record["variant"])
        variant = str(int(variant, 16)) if variant.startswith("0x") else variant
        return f"{record.get('part', '?')} r{variant}p{record.get('revision', '?')}"
    if "stepping" in record:
        return f"{record.get('family', '?')}/{record.get('model', '?')}/{record['stepping']}"
    return "?"


# Metrics every node exports: a node without fleetscope_cpu_info still gets a row.
_PRESENCE = ("fleetscope_cpu_core_busy_ratio", "fleetscope_scrape_collector_success",
             "fleetscope_pool_processes")


def node_table(snapshot: Snapshot) -> pd.DataFrame:
    """One row per node: instance, node_pool, rack, cpu_model, stepping, arch, kernel. From
    fleetscope_cpu_info (a fleet's scrape config adds `rack` and `node_pool` as target
    labels); a label missing shows as "(unlabelled)"."""
    rows = {}
    for labels in snapshot.series.by_name.get("fleetscope_cpu_info", {}):
        record = dict(labels)
        name = record.get("instance")
        if not name:
            continue
        rows[name] = {"instance": name, "node_pool": record.get("node_pool") or UNLABELLED,
                      "rack": record.get("rack") or UNLABELLED,
                      "cpu_model": record.get("model_name") or "?",
                      "stepping": _stepping(record), "arch": record.get("arch") or "?",
                      "kernel": record.get("kernel") or "?"}
    for metric in _PRESENCE:
        for labels in snapshot.series.by_name.get(metric, {}):
            name = dict(labels).get("instance")
            if name and name not in rows:
                rows[name] = {"instance": name, "node_pool": UNLABELLED, "rack": UNLABELLED,
                              "cpu_model": "?", "stepping": "?", "arch": "?", "kernel": "?"}
    # node_exporter's node_uname_info{release} names the kernel, where the fleet has it.
    for labels in snapshot.series.by_name.get("node_uname_info", {}):
        record = dict(labels)
        if record.get("instance") in rows and record.get("release"):
            rows[record["instance"]]["kernel"] = record["release"]
    table = pd.DataFrame(list(rows.values()),
                         columns=["instance", "node_pool", "rack", "cpu_model", "stepping",
                                  "arch", "kernel"])
    return table.sort_values(["node_pool", "rack", "instance"]).reset_index(drop=True)


def recorded(snapshot: Snapshot, recording: Recording) -> pd.DataFrame:
    """A recording rule's vector as a frame (labels..., value): what the query engine
    answered for a Prometheus source, else the same expression over the snapshot's series
    at its last sample of those metrics."""
    if snapshot.aggregates is not None:
        return _rows(snapshot.aggregates.get(recording.record, {}))
    at_ms = snapshot.series.last_sample_ms(recording.expr.metrics())
    return _rows({} if at_ms is None else recording.expr.evaluate(snapshot.series, at_ms))


def node_signals(snapshot: Snapshot) -> pd.DataFrame:
    """Per node, every heatmap signal at the last sample (NaN where the node lacks it)."""
    columns = {}
    for name, recording in NODE_SIGNALS.items():
        frame = recorded(snapshot, recording)
        columns[name] = _per_instance(frame.dropna(subset=["value"]) if not frame.empty
                                      else frame)
    frame = pd.DataFrame(columns)
    frame.index.name = "instance"
    return frame.reindex(columns=list(SIGNALS))


def findings_frame(findings: list[dict]) -> pd.DataFrame:
    columns = ["rule", "severity", "node", "confidence", "summary", "cause", "action",
               "runbook"]
    if not findings:
        return pd.DataFrame(columns=columns)
    return pd.DataFrame([{k: f[k] for k in columns} for f in findings], columns=columns)


def filter_nodes(nodes: pd.DataFrame, pools=(), racks=(), models=()) -> pd.DataFrame:
    keep = pd.Series(True, index=nodes.index)
    if pools:
        keep &= nodes["node_pool"].isin(pools)
    if racks:
        keep &= nodes["rack"].isin(racks)
    if models:
        keep &= nodes["cpu_model"].isin(models)
    return nodes[keep]


def findings_for(findings: pd.DataFrame, nodes: pd.DataFrame) -> pd.DataFrame:
    return findings[findings["node"].isin(set(nodes["instance"]))]


def rule_counts(findings: pd.DataFrame) -> pd.DataFrame:
    """Findings per rule, worst first: rule, severity, findings, nodes."""
    if findings.empty:
        return pd.DataFrame(columns=["rule", "severity", "findings", "nodes"])
    grouped = findings.groupby(["rule", "severity"]).agg(findings=("node", "size"),
                                                         nodes=("node", "nunique"))
    out = grouped.reset_index()
    out["rank"] = out["severity"].map(SEVERITY_ORDER)
    out = out.sort_values(["rank", "nodes", "rule"], ascending=[True, False, True])
    return out.drop(columns="rank").reset_index(drop=True)


def node_health(nodes: pd.DataFrame, findings: pd.DataFrame) -> pd.DataFrame:
    """Per node its worst severity: critical, warning or ok; and how many findings."""
    worst = {}
    count = findings.groupby("node").size() if not findings.empty else pd.Series(dtype=int)
    for node, severity in zip(findings["node"], findings["severity"], strict=True):
        if SEVERITY_ORDER[severity] < SEVERITY_ORDER.get(worst.get(node, "ok"), 9):
            worst[node] = severity
    out = nodes.copy()
    out["health"] = [worst.get(node, "ok") for node in out["instance"]]
    out["findings"] = out["instance"].map(count).fillna(0).astype(int)
    return out


def worst_node(health: pd.DataFrame, rack: str) -> str | None:
    """The rack's node to open first: the worst health, then the most findings."""
    frame = health[health["rack"] == rack]
    if frame.empty:
        return None
    rank = frame["health"].map({"critical": 0, "warning": 1}).fillna(2)
    frame = frame.assign(rank=rank).sort_values(["rank", "findings", "instance"],
                                                ascending=[True, False, True])
    return str(frame["instance"].iloc[0])


def health_by(nodes: pd.DataFrame, findings: pd.DataFrame, by: str) -> pd.DataFrame:
    """Nodes per group by health (critical / warning / ok), worst groups first."""
    health = node_health(nodes, findings)
    table = pd.crosstab(health[by], health["health"])
    for column in ("critical", "warning", "ok"):
        if column not in table:
            table[column] = 0
    table = table[["critical", "warning", "ok"]]
    table["nodes"] = table.sum(axis=1)
    table = table.sort_values(["critical", "warning"], ascending=False)
    return table.reset_index()


def with_health(signals: pd.DataFrame, health: pd.DataFrame) -> pd.DataFrame:
    """The heatmap signals plus each node's health level (0 ok, 1 warning, 2 critical) and
    its number of findings, from node_health."""
    out = signals.copy()
    by_node = health.set_index("instance")
    out = out.reindex(out.index.union(by_node.index))
    out["health"] = by_node["health"].map(HEALTH_LEVEL).reindex(out.index).astype(float)
    out["findings"] = by_node["findings"].reindex(out.index).astype(float)
    return out


GROUPINGS = {"CPU model / stepping": "cpu", "rack": "rack", "node pool": "node_pool",
             "kernel": "kernel"}


def rule_grouping(nodes: pd.DataFrame, findings: pd.DataFrame, rule: str, dimension: str
                  ) -> pd.DataFrame:
    """Where one rule fires, per group of nodes (CPU model and stepping, rack, pool, kernel):
    group, nodes, firing, share of group (its nodes that fire) and share of firing (of all
    the rule's nodes, the part in this group). Groups with a firing node, most firing first:
    "all 32 crashing nodes are stepping 0xd01 r1p0" reads as one full row."""
    column = GROUPINGS.get(dimension, dimension)
    frame = nodes.copy()
    frame["cpu"] = frame["cpu_model"] + " " + frame["stepping"]
    if column not in frame:
        frame[column] = "?"
    firing = set(findings.loc[findings["rule"] == rule, "node"])
    frame["firing"] = frame["instance"].isin(firing)
    table = frame.groupby(column).agg(nodes=("instance", "size"), firing=("firing", "sum"))
    table = table[table["firing"] > 0].reset_index().rename(columns={column: "group"})
    if table.empty:
        return pd.DataFrame(columns=["group", "nodes", "firing", "share of group",
                                     "share of firing"])
    table["share of group"] = table["firing"] / table["nodes"]
    table["share of firing"] = table["firing"] / max(1, len(firing & set(frame["instance"])))
    table["firing"] = table["firing"].astype(int)
    return table.sort_values(["firing", "share of group"], ascending=False).reset_index(
        drop=True)[["group", "nodes", "firing", "share of group", "share of firing"]]


def not_evaluated_table(not_evaluated: list[dict]) -> pd.DataFrame:
    """The rules a source could not evaluate: rule, what is missing (the reason the engine
    gave: the metrics and, where known, how to get them)."""
    return pd.DataFrame([{"rule": item["rule"], "missing": item.get("reason", "")}
                         for item in not_evaluated], columns=["rule", "missing"])


def _one_rack(pairs: pd.DataFrame, nodes: pd.DataFrame) -> str:
    """Where a few nodes of one rack fire: 'rack r003: 2 of its 32 nodes'."""
    if "rack" not in pairs or pairs.empty:
        return "spread"
    rack = pairs["rack"].iloc[0]
    return f"rack {rack}: {len(pairs)} of its {int((nodes['rack'] == rack).sum())} nodes"


def incidents(nodes: pd.DataFrame, findings: pd.DataFrame) -> pd.DataFrame:
    """One row per rule firing at warning or worse: its worst severity, how many nodes, and
    where they concentrate (the CPU stepping, rack, pool or kernel holding most of them,
    where most of that group fires), worst first then widest: a rack-wide fault leads, not
    its rows. One pass per grouping for every rule (4,096 nodes cost no more per rule)."""
    columns = ["severity", "rule", "nodes", "where"]
    serious = findings[findings["severity"].isin(("critical", "warning"))] \
        if not findings.empty else findings
    if serious.empty:
        return pd.DataFrame(columns=columns)
    per_rule = serious.groupby("rule").agg(nodes=("node", "nunique"),
                                           rank=("severity", lambda s: min(
                                               SEVERITY_ORDER[v] for v in s)))
    frame = nodes.copy()
    frame["cpu"] = frame["cpu_model"] + " " + frame["stepping"]
    pairs = serious[["rule", "node"]].drop_duplicates().merge(
        frame, left_on="node", right_on="instance")
    best: dict[str, tuple] = {}
    for dimension, column in GROUPINGS.items():
        if column not in frame:
            continue
        sizes = frame.groupby(column).size()
        for (rule, group), firing in pairs.groupby(["rule", column]).size().items():
            if group in ("?", "", UNLABELLED):
                continue
            score = firing / per_rule.at[rule, "nodes"] * firing / sizes[group]
            if score > best.get(rule, (0.0,))[0]:
                best[rule] = (score, dimension, group, int(firing), int(sizes[group]))
    racks = pairs.groupby("rule")["rack"].nunique() if "rack" in pairs else {}
    rows = []
    for rule, row in per_rule.iterrows():
        found = best.get(rule)
        if found is not None and found[0] >= 0.25 and found[3] > 1:  # most of both
            _, dimension, group, firing, size = found
            where = f"{dimension} {group}: {firing} of its {size} nodes"
        elif row["nodes"] == 1:
            where = f"node {serious.loc[serious['rule'] == rule, 'node'].iloc[0]}"
        else:
            spread = int(racks.get(rule, 0)) if len(racks) else 0
            where = f"spread over {spread} racks" if spread > 1 else \
                _one_rack(pairs[pairs["rule"] == rule], frame)
        rows.append({"severity": next(k for k, v in SEVERITY_ORDER.items()
                                      if v == row["rank"]),
                     "rule": rule, "nodes": int(row["nodes"]), "where": where,
                     "_rank": row["rank"]})
    out = pd.DataFrame(rows).sort_values(["_rank", "nodes", "rule"],
                                         ascending=[True, False, True])
    return out[columns].reset_index(drop=True)


def grouping_summary(nodes: pd.DataFrame, findings: pd.DataFrame, rule: str) -> str:
    """One sentence per rule: the dimension where its nodes concentrate the most."""
    best = None
    for dimension in GROUPINGS:
        table = rule_grouping(nodes, findings, rule, dimension)
        if table.empty or table["group"].iloc[0] == "?":
            continue
        top = table.iloc[0]
        # Concentrated: a large part of the firing nodes, in a group that mostly fires.
        score = top["share of firing"] * top["share of group"]
        if best is None or score > best[0]:
            best = (score, dimension, top)
    if best is None:
        return ""
    _, dimension, top = best
    return (f"{int(top['firing'])} of the {rule} nodes ({top['share of firing']:.0%}) are in "
            f"{dimension} {top['group']}, where {top['share of group']:.0%} of its "
            f"{int(top['nodes'])} nodes fire it")


def heatmap(nodes: pd.DataFrame, signals: pd.DataFrame, signal: str) -> dict:
    """A grid for the fleet heatmap: one row per rack (grouped by pool), one column per node
    position in the rack. Returns z (values), text (instances), y (row labels), x."""
    frame = nodes.merge(signals[[signal]], left_on="instance", right_index=True, how="left")
    frame = frame.sort_values(["node_pool", "rack", "instance"])
    frame["position"] = frame.groupby(["node_pool", "rack"]).cumcount()
    frame["row"] = frame["node_pool"] + " / " + frame["rack"]
    z = frame.pivot(index="row", columns="position", values=signal)
    text = frame.pivot(index="row", columns="position", values="instance")
    order = frame.drop_duplicates("row")["row"].tolist()
    z, text = z.reindex(order), text.reindex(order)
    return {"z": z.to_numpy(dtype=float), "text": text.fillna("").to_numpy(),
            "y": order, "x": [int(c) for c in z.columns]}


# -- one node ------------------------------------------------------------------------------
def _frame_of(series: Series, name: str, matchers: dict | None, counter: bool) -> pd.DataFrame:
    """Long frame: labels..., time (datetime), value: the instant selector at each sample,
    or `rate(...[WINDOW])` at each sample after the first when `counter` (the rule engine's
    extrapolated rate, so a chart and a rule read the same number at the same time)."""
    rows = []
    window_ms = series.window_ms(WINDOW)
    for labels, points in Selector(name, matchers or None).matching(series):
        as_dict = dict(labels)
        if counter:
            times = [t for t, _ in points]
            for index in range(1, len(points)):
                end = times[index]
                first = bisect.bisect_left(times, end - window_ms, 0, index)
                value = extrapolated_delta(points[first:index + 1], end - window_ms, end, True)
                if value is not None:
                    rows.append({**as_dict, "t_ms": end, "value": value})
        else:
            rows.extend({**as_dict, "t_ms": t, "value": v} for t, v in points)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=["time", "value"])
    frame["time"] = local_times(frame["t_ms"])
    return frame.drop(columns="t_ms")


def is_counter(name: str) -> bool:
    return name.endswith(("_total", "_sum", "_count", "_bucket"))


def timeline(series: Series, name: str, matchers: dict | None = None) -> pd.DataFrame:
    """A metric over time: gauges as they are, counters as per-second rates."""
    return _frame_of(series, name, matchers, is_counter(name))


def per_core_busy(series: Series) -> pd.DataFrame:
    """cpu x time busy fraction from fleetscope_cpu_seconds_total (per_core: full): busy is
    every mode but idle and iowait, over all modes. Empty when the source has no per-core
    series."""
    frame = _frame_of(series, "fleetscope_cpu_seconds_total", None, True)
    if frame.empty:
        return frame
    frame["idle"] = frame["mode"].isin(["idle", "iowait"])
    total = frame.groupby(["cpu", "time"])["value"].sum()
    idle = frame[frame["idle"]].groupby(["cpu", "time"])["value"].sum()
    busy = (1 - idle.reindex(total.index).fillna(0) / total).clip(0, 1)
    table = busy.unstack("time")
    table.index = table.index.astype(int)
    return table.sort_index()


def core_summary(busy: pd.DataFrame) -> dict:
    """What the per-core view says in numbers: the spread now and the pinned hogs."""
    if busy.empty:
        return {}
    now = busy.iloc[:, -1]
    hogs = busy[busy.iloc[:, -10:].mean(axis=1) > 0.9].index.tolist()  # the last 10 samples
    return {"median": float(now.median()), "max": float(now.max()),
            "spread": float(now.max() - now.median()), "hogs": hogs,
            "saturated_now": int((now > 0.9).sum())}


def numa_view(series: Series) -> pd.DataFrame:
    """Per NUMA node: CPUs, busy, run-queue wait per CPU and pages allocated off-node /s."""
    secs = _frame_of(series, "fleetscope_cpu_numa_node_seconds_total", None, True)
    if secs.empty:
        return pd.DataFrame()
    last = secs[secs["time"] == secs["time"].max()]
    total = last.groupby("numa_node")["value"].sum()
    idle = last[last["mode"].isin(["idle", "iowait"])].groupby("numa_node")["value"].sum()
    out = pd.DataFrame({"busy": 1 - idle / total})
    cpus = _per_label(latest(series, "fleetscope_cpu_numa_node_cpus"), "numa_node")
    out["cpus"] = cpus
    wait = last_rate(series, "fleetscope_schedstat_numa_node_waiting_seconds_total")
    if not wait.empty:
        out["run-queue wait s/s per CPU"] = _per_label(wait, "numa_node") / out["cpus"]
    for field_name, column in (("other_node", "pages off-node /s"),
                               ("local_node", "pages local /s")):
        pages = last_rate(series, "fleetscope_numastat_pages_total", {"field": field_name})
        if not pages.empty:
            out[column] = _per_label(pages, "numa_node")
    out.index.name = "numa_node"
    out = out.reset_index().sort_values("numa_node", key=lambda s: s.astype(int))
    return _merge_alike(out)


def _merge_alike(table: pd.DataFrame) -> pd.DataFrame:
    """NUMA nodes that read the same (within 1 %) are one row, "0-3": four identical rows
    say less than one row that says they are alike."""
    values = [c for c in table.columns if c != "numa_node"]
    if table.empty or not values:
        return table
    rounded = table[values].apply(lambda col: col.map(
        lambda v: float(f"{v:.2g}") if isinstance(v, float) and v == v else v))
    groups: list[list[int]] = []
    for position in range(len(table)):
        if groups and rounded.iloc[position].equals(rounded.iloc[groups[-1][0]]):
            groups[-1].append(position)
        else:
            groups.append([position])
    rows = []
    for members in groups:
        row = table.iloc[members[0]].copy()
        names = [str(table["numa_node"].iloc[m]) for m in members]
        row["numa_node"] = names[0] if len(names) == 1 else f"{names[0]}-{names[-1]}"
        rows.append(row)
    return pd.DataFrame(rows).reset_index(drop=True)


NUMA_UNITS = {"busy": "ratio", "cpus": "cpus", "run-queue wait s/s per CPU": "s/s",
              "pages off-node /s": "pages/s", "pages local /s": "pages/s"}


def numa_display(numa: pd.DataFrame) -> pd.DataFrame:
    """The NUMA table in units people read (%, ms/s, k pages/s)."""
    out = numa.copy()
    for column, unit in NUMA_UNITS.items():
        if column in out:
            out[column] = out[column].map(lambda v, u=unit: units.format_value(v, u))
    return out.rename(columns={"numa_node": "NUMA node", "run-queue wait s/s per CPU":
                               "run-queue wait per CPU", "pages off-node /s": "pages off-node",
                               "pages local /s": "pages local"})


def bytes_display(frame: pd.DataFrame) -> pd.DataFrame:
    """Byte columns (every column but the first) as GiB/MiB."""
    out = frame.copy()
    for column in out.columns[1:]:
        out[column] = out[column].map(lambda v: units.format_value(v, "bytes"))
    return out


def _per_label(frame: pd.DataFrame, label: str) -> pd.Series:
    if frame.empty or label not in frame:
        return pd.Series(dtype=float)
    return frame.groupby(label)["value"].sum()


def pool_memory(series: Series) -> pd.DataFrame:
    """Each pool's resident memory by locality (local / remote NUMA node)."""
    frame = latest(series, "fleetscope_pool_memory_bytes")
    if frame.empty or "locality" not in frame:
        return pd.DataFrame()
    return frame.pivot_table(index="pool", columns="locality", values="value",
                             aggfunc="sum").reset_index()


# -- latency breakdown ---------------------------------------------------------------------
def stage_breakdown(snapshot: Snapshot, nodes: pd.DataFrame | None = None) -> pd.DataFrame:
    """Where session time goes, per workload pool: seconds per second spent in each stage
    (rate of agent_stage_duration_seconds_sum) and its share of the pool's total."""
    spent = recorded(snapshot, STAGE_SECONDS)
    if spent.empty or "stage" not in spent:
        return pd.DataFrame(columns=["node_pool", "pool", "stage", "seconds_per_second",
                                     "share", "seconds_per_session"])
    pools = node_table(snapshot) if nodes is None else nodes
    pool_of = dict(zip(pools["instance"], pools["node_pool"], strict=True))
    if nodes is not None:
        spent = spent[spent["instance"].isin(set(nodes["instance"]))]
    # The sidebar's node pools (chat, batch, mixed...) first, the workload pools inside.
    spent = spent.assign(node_pool=spent["instance"].map(lambda i: pool_of.get(i, UNLABELLED)))
    keys = ["node_pool", "pool"]
    table = spent.groupby([*keys, "stage"])["value"].sum().rename("seconds_per_second")
    table = table.reset_index()
    table["share"] = table["seconds_per_second"] / table.groupby(keys)[
        "seconds_per_second"].transform("sum")
    counts = recorded(snapshot, SESSIONS)
    if nodes is not None and not counts.empty:
        counts = counts[counts["instance"].isin(set(nodes["instance"]))]
    if counts.empty:
        sessions = pd.Series(dtype=float)
    else:
        counts = counts.assign(node_pool=counts["instance"].map(
            lambda i: pool_of.get(i, UNLABELLED)))
        sessions = counts.groupby(keys)["value"].sum()
    table["seconds_per_session"] = table["seconds_per_second"] / pd.Series(
        [sessions.get((a, b), float("nan")) for a, b in zip(table["node_pool"], table["pool"],
                                                             strict=True)], index=table.index)
    stages = ["queue_wait", "context_assembly", "inference", "tool_call", "state_io",
              "model_load", "other"]
    table["order"] = table["stage"].map({s: i for i, s in enumerate(stages)}).fillna(99)
    return table.sort_values([*keys, "order"]).drop(columns="order").reset_index(drop=True)


def inference_share(breakdown: pd.DataFrame) -> pd.DataFrame:
    """Per node pool and workload pool: the share of session time that is model inference."""
    if breakdown.empty:
        return pd.DataFrame(columns=["node_pool", "pool", "inference share"])
    inference = breakdown[breakdown["stage"] == "inference"]
    return inference[["node_pool", "pool", "share"]].rename(
        columns={"share": "inference share"}).reset_index(drop=True)


# -- rules and runbooks --------------------------------------------------------------------
def rule_table() -> pd.DataFrame:
    return pd.DataFrame([{
        "rule": rule.id, "severity": rule.severity, "symptom": rule.symptom,
        "cause": rule.cause, "action": rule.action, "alert": rule.alert_name,
        "for": f"{rule.for_seconds}s", "condition (PromQL)": rule.condition.promql(),
    } for rule in CATALOG])


def rules_yaml() -> str:
    from fleetscope.rules.export import export_yaml

    return export_yaml()


def runbook(rule_id: str) -> str:
    path = RUNBOOKS / f"{rule_id}.md"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return f"(runbook {path.name} not found beside the console: see runbooks/ in the " \
               f"fleetscope repository)"


_RUNBOOK_LINK = re.compile(r"\]\((?:\.?/?runbooks/)?([a-z0-9-]+)\.md(#[^)]*)?\)")


# Placeholders in commands (runbooks, actions) -> the subject kind that names them.
PLACEHOLDERS = {"PID": "pids", "ONLINE_PID": "pids", "BINARY": "binaries",
                "IFACE": "interfaces", "POD": "pods"}
_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)


def placeholder_values(subjects: dict) -> dict[str, str]:
    """What a finding's subjects say each command placeholder is: PID -> its first pid."""
    out = {}
    for word, kind in PLACEHOLDERS.items():
        values = subjects.get(kind) or []
        if values:
            value = str(values[0])
            out[word] = value.rsplit("/", 1)[-1] if kind == "pods" else value
    return out


def fill_commands(markdown: str, values: dict[str, str], code_only: bool = True) -> str:
    """The commands of a text with their placeholders replaced by the finding's own values:
    `fleetscope stacks PID` -> `fleetscope stacks 6387`. A runbook's prose keeps its words
    (code spans and blocks only); a rule's one-line action is all commands and names."""
    if not values:
        return markdown
    word = re.compile(r"\b(" + "|".join(sorted(values, key=len, reverse=True)) + r")\b")

    def fill(text: str) -> str:
        return word.sub(lambda w: values[w.group(1)], text)

    if not code_only:
        return fill(markdown)
    return _CODE.sub(lambda match: fill(match.group(0)), markdown)


def runbook_markdown(rule_id: str, base: str = "/runbook") -> str:
    """The runbook with its links to other runbooks pointing inside the console
    (`[x](x.md)` -> `[x](/runbook?rule=x)`), so "Related" never opens "Page not found"."""
    known = {rule.id for rule in CATALOG} | {p.stem for p in RUNBOOKS.glob("*.md")}

    def link(match: re.Match) -> str:
        name = match.group(1)
        if name not in known:
            return match.group(0)
        return f"]({base}?rule={name})"

    return _RUNBOOK_LINK.sub(link, runbook(rule_id))


def related_runbooks(rule_id: str) -> list[str]:
    """The rule ids the runbook links to, in order (its "Related" section first)."""
    text = runbook(rule_id)
    known = {rule.id for rule in CATALOG} | {p.stem for p in RUNBOOKS.glob("*.md")}
    head, _, related = text.partition("## Related")
    out: list[str] = []
    for part in (related, head):
        for match in _RUNBOOK_LINK.finditer(part):
            name = match.group(1)
            if name in known and name != rule_id and name not in out:
                out.append(name)
    return out


def runbook_ids() -> list[str]:
    """Every runbook the console can show: the catalog's rules first, then other pages."""
    ids = [rule.id for rule in CATALOG if (RUNBOOKS / f"{rule.id}.md").is_file()]
    return ids + sorted(p.stem for p in RUNBOOKS.glob("*.md")
                        if p.stem not in ids and p.stem != "README")


def finding_metrics(rule_id: str) -> list[str]:
    """The metrics a rule reads, in a stable order: what its evidence charts plot."""
    return sorted(by_id(rule_id).condition.metrics())


def finding_timelines(rule_id: str, series: Series, labels: dict | None = None
                      ) -> list[tuple[str, pd.DataFrame]]:
    """Each metric the rule reads over time on the finding's node, narrowed to the finding's
    labels (pool, binary, ...) where the metric has them."""
    out = []
    for name in finding_metrics(rule_id):
        frame = timeline(series, name)
        if frame.empty:
            continue
        for key, value in (labels or {}).items():
            if key in frame and key != "instance":
                frame = frame[frame[key] == value]
        if not frame.empty:
            out.append((name, frame))
    return out


def evidence_frame(finding: dict) -> pd.DataFrame:
    """The finding's evidence for people: value and threshold in their units, and how far
    past the threshold the value is in words (the ratio stays numeric for the bars)."""
    rows = []
    picks = evidence_picks(finding.get("rule", ""))
    for e in finding.get("evidence", []):
        pick = e.get("pick") or picks.get(e["signal"], "max")
        # how far past the threshold, 1 at it and more when firing, whichever side fires
        # (a floor: threshold over value); a moment against a moment is no ratio: words only
        ratio = None
        if e["threshold"] and e["unit"] != units.TIME_UNIT:
            if pick != "min":
                ratio = e["value"] / e["threshold"]
            elif e["value"] > 0:
                ratio = e["threshold"] / e["value"]
        rows.append({"signal": e["signal"], "value": units.format_value(e["value"], e["unit"]),
                     "threshold": units.format_threshold(e["threshold"], e["unit"], pick)
                     if e["threshold"] else "–",
                     "over threshold": units.over_threshold(e["value"], e["threshold"], pick,
                                                            e["unit"]),
                     "ratio": ratio})
    return pd.DataFrame(rows, columns=["signal", "value", "threshold", "over threshold",
                                       "ratio"])


def panel_frame(panel: evidence_views.Panel, series: Series, labels: dict | None = None
                ) -> pd.DataFrame:
    """A panel's expression at every sample of `series`: time, series (legend), value;
    narrowed to the finding's labels (pool, binary, ...) where the panel says so."""
    keep = {k: v for k, v in (labels or {}).items() if k not in ("instance", "__name__")}
    rows = []
    for stamp in series.timestamps():
        for key, value in panel.expr.evaluate(series, stamp).items():
            as_dict = {k: v for k, v in key if k not in ("__name__", "instance")}
            if panel.narrow and any(as_dict.get(k, v) != v for k, v in keep.items()):
                continue
            if value != value or math.isinf(value):
                continue
            rows.append({"t_ms": stamp, "series": " · ".join(
                f"{v}" for _, v in sorted(as_dict.items())) or "value", "value": value})
    if not rows:
        return pd.DataFrame(columns=["time", "series", "value"])
    frame = pd.DataFrame(rows)
    frame["time"] = local_times(frame.pop("t_ms"))
    return frame[["time", "series", "value"]]


def evidence_panels(rule_id: str, series: Series, labels: dict | None = None
                    ) -> list[tuple[evidence_views.Panel, pd.DataFrame]]:
    """The rule's evidence views (dashboard/evidence_views.py) on one node's history; panels
    without data are left out."""
    out = []
    for panel in evidence_views.views_for(rule_id):
        try:
            frame = panel_frame(panel, series, labels)
        except (ArithmeticError, ValueError, KeyError, TypeError):
            continue  # a panel must never break the page it is on
        if not frame.empty:
            out.append((panel, frame))
    return out


def history_window(series: Series) -> tuple | None:
    """First and last sample of a node's history, as the charts' time axis range."""
    stamps = series.timestamps()
    if len(stamps) < 2:
        return None
    first, last = local_times([stamps[0], stamps[-1]])
    # wall-clock times without the offset: what plotly draws the (local) data at
    return first.tz_localize(None).to_pydatetime(), last.tz_localize(None).to_pydatetime()


def local_times(t_ms) -> pd.Series:
    """Epoch milliseconds -> datetimes in the console's zone (charts show wall-clock time)."""
    index = t_ms.index if isinstance(t_ms, pd.Series) else None
    stamps = pd.to_datetime(pd.Series(t_ms, index=index), unit="ms", utc=True)
    return stamps.dt.tz_convert(units.console_zone())


def source_from_env() -> str:
    return os.environ.get(SOURCE_ENV, DEFAULT_SOURCE)
