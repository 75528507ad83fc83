"""The Latency breakdown page's frames: where session time goes per node pool and workload
pool, from the recorded stage seconds and session counts. No streamlit here."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from fleetscope.dashboard.fleet_frames import UNLABELLED, node_table
from fleetscope.dashboard.frames import recorded
from fleetscope.rules.recording import SESSIONS, STAGE_SECONDS

if TYPE_CHECKING:
    from fleetscope.dashboard.data import Snapshot


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
