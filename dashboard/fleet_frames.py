"""The fleet's frames: the node table and the sidebar's filters every page uses, and what
the Fleet page draws: node health, incidents, where each rule concentrates, the worst racks
and the heatmap of every node. No streamlit here."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from fleetscope.core import units
from fleetscope.dashboard.frames import recorded
from fleetscope.rules.recording import NODE_SIGNALS

if TYPE_CHECKING:
    from fleetscope.dashboard.data import Snapshot

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
    "module utilisation": ("ratio", "mean of fleetscope_accelerator_utilization_ratio over "
                           "the node's inference modules"),
    "module memory (fullest)": ("ratio", "the fullest module's device memory: "
                                "fleetscope_accelerator_memory_used_bytes / _total_bytes"),
}
# Fixed colour ranges so a colour means the same on every fleet and every load.
SIGNAL_RANGE = {"health": (0, 2), "findings": (0, 4),
                "busy (median core)": (0, 1), "busiest core": (0, 1), "steal (p90 core)": (0, 0.3),
                "memory bandwidth % of peak": (0, 1), "L3 miss ratio": (0, 0.5),
                "PFC pauses /s": (0, 1000), "queue depth": (0, 200),
                "P99 session latency (online)": (0, 5), "module utilisation": (0, 1),
                "module memory (fullest)": (0, 1)}

SIGNAL_COLOURS = {"health": [[0, "#e8f5e9"], [0.33, "#e8f5e9"], [0.33, "#ff9f1c"],
                             [0.67, "#ff9f1c"], [0.67, "#d62728"], [1, "#d62728"]],
                  "findings": "Reds"}
HEALTH_LEVEL = {"ok": 0, "warning": 1, "critical": 2}


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


def _per_instance(frame: pd.DataFrame, how: str = "max") -> pd.Series:
    if frame.empty or "instance" not in frame:
        return pd.Series(dtype=float)
    return frame.groupby("instance")["value"].agg(how)


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


def search_findings(findings: pd.DataFrame, nodes: pd.DataFrame, text: str) -> pd.DataFrame:
    """The findings whose node, rule, rack or pool holds every word of `text` (any case,
    each word in any of them: "chat r003" is the chat pool's findings on rack r003)."""
    words = text.lower().split()
    if not words or findings.empty:
        return findings
    where = nodes.set_index("instance").reindex(findings["node"])
    haystack = (findings["node"].str.cat([findings["rule"], where["rack"].fillna("").to_numpy(),
                                          where["node_pool"].fillna("").to_numpy()], sep=" ")
                .str.lower())
    keep = pd.Series(True, index=findings.index)
    for word in words:
        keep &= haystack.str.contains(word, regex=False)
    return findings[keep]


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
    """Per node its worst severity: critical, warning or ok (an info finding is context, ok
    as the diagnosis status counts it); and how many findings."""
    worst = {}
    count = findings.groupby("node").size() if not findings.empty else pd.Series(dtype=int)
    for node, severity in zip(findings["node"], findings["severity"], strict=True):
        if severity == "info":
            continue
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


def peer_comparison(health: pd.DataFrame, signals: pd.DataFrame, findings: pd.DataFrame,
                    rule: str, dimension: str, group: str) -> tuple[int, int, pd.DataFrame]:
    """The nodes firing `rule` in one group (a rack, a pool, a stepping) beside the group's
    healthy peers (no finding at warning or worse): (sick nodes, healthy peers, a table of
    each heatmap signal's median and p90 on both sides, in its unit, the signals that differ
    most first).
    A signal where the sick nodes sit apart from their own peers points at the cause."""
    column = GROUPINGS.get(dimension, dimension)
    frame = health.assign(cpu=health["cpu_model"] + " " + health["stepping"])
    in_group = frame[frame[column] == group]
    firing = set(findings.loc[findings["rule"] == rule, "node"])
    sick = in_group["instance"].isin(firing)
    peers = ~sick & (in_group["health"] == "ok")
    shown = [name for name in SIGNALS if name not in ("health", "findings")]
    values = signals.reindex(columns=shown)
    sides = {}
    for side, mask in (("sick", sick), ("healthy peers", peers)):
        chosen = values.reindex(in_group.loc[mask, "instance"])
        sides[f"{side} median"] = chosen.median()
        sides[f"{side} p90"] = chosen.quantile(0.9)
    table = pd.DataFrame(sides).dropna(how="all")
    low, high = (pd.Series({n: SIGNAL_RANGE[n][i] for n in table.index}) for i in (0, 1))
    apart = ((table["sick median"] - table["healthy peers median"]).abs() / (high - low))
    table = table.assign(apart=apart.fillna(-1)).sort_values("apart", ascending=False)
    shown_values = {side: [units.format_value(value, SIGNALS[name][0])
                           for name, value in table[side].items()] for side in sides}
    table = pd.DataFrame({"signal": table.index, **shown_values})
    return int(sick.sum()), int(peers.sum()), table


def titled_signal(name: str) -> str:
    """A metric family as people read it: the title and unit its collector declares
    (collectors/evidence.py) before the name, or the name alone."""
    from fleetscope.collectors import COLLECTORS

    signal = COLLECTORS.signal(name)
    if signal is None:
        return name
    return f"{signal.title} ({name}{', ' + signal.unit if signal.unit else ''})"


def not_evaluated_table(not_evaluated: list[dict]) -> pd.DataFrame:
    """The rules a source could not evaluate: rule, what is missing (the reason the engine
    gave: the metrics and, where known, how to get them), and the absent signals titled."""
    return pd.DataFrame([{"rule": item["rule"], "missing": item.get("reason", ""),
                          "signals": "; ".join(titled_signal(name)
                                               for cause in item.get("causes", ())
                                               for name in cause["signals"])}
                         for item in not_evaluated], columns=["rule", "missing", "signals"])


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
