"""Plotly figures for the console pages (no streamlit: the pages call st.plotly_chart)."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from fleetscope.dashboard import data

HEALTH_COLOURS = {"critical": "#d62728", "warning": "#ff9f1c", "ok": "#2ca02c"}


def fleet_heatmap(grid: dict, signal: str) -> go.Figure:
    low, high = data.SIGNAL_RANGE.get(signal, (None, None))
    unit = data.SIGNALS[signal][0]
    fig = go.Figure(go.Heatmap(
        z=grid["z"], x=grid["x"], y=grid["y"], text=grid["text"], zmin=low, zmax=high,
        colorscale="YlOrRd", hoverongaps=False, colorbar={"title": unit},
        hovertemplate="%{text}<br>" + signal + ": %{z:.3g}<extra>%{y}</extra>"))
    fig.update_layout(height=max(300, 12 * len(grid["y"]) + 80),
                      margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      xaxis_title="node position in rack",
                      yaxis={"autorange": "reversed",
                             "dtick": 1 if len(grid["y"]) <= 40 else None},
                      title=f"{signal} by pool / rack")
    return fig


def health_bars(table: pd.DataFrame, by: str) -> go.Figure:
    long = table.melt(id_vars=[by], value_vars=["critical", "warning", "ok"],
                      var_name="health", value_name="count")
    fig = px.bar(long, x=by, y="count", color="health", color_discrete_map=HEALTH_COLOURS,
                 title=f"Node health by {by.replace('_', ' ')}")
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig


def rule_bars(counts: pd.DataFrame) -> go.Figure:
    fig = px.bar(counts, x="nodes", y="rule", color="severity", orientation="h",
                 color_discrete_map={"critical": "#d62728", "warning": "#ff9f1c",
                                     "info": "#1f77b4"},
                 title="Nodes per firing rule")
    fig.update_layout(height=max(260, 28 * len(counts) + 80), yaxis={"autorange": "reversed"},
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig


def core_heatmap(busy: pd.DataFrame) -> go.Figure:
    fig = go.Figure(go.Heatmap(z=busy.to_numpy(), x=list(busy.columns), y=list(busy.index),
                               zmin=0, zmax=1, colorscale="YlOrRd",
                               colorbar={"title": "busy"},
                               hovertemplate="cpu %{y}<br>%{x}<br>busy %{z:.0%}<extra></extra>"))
    fig.update_layout(height=520, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      yaxis_title="cpu", title="Busy per core over time")
    return fig


def lines(frame: pd.DataFrame, title: str, colour: str | None = None,
          threshold: float | None = None, unit: str = "") -> go.Figure:
    frame = frame.copy()
    if colour is None:
        keys = [c for c in frame.columns if c not in ("time", "value", "instance", "__name__")]
        frame["series"] = frame[keys].astype(str).agg(" ".join, axis=1) if keys else "value"
        colour = "series"
    fig = px.line(frame.sort_values("time"), x="time", y="value", color=colour, title=title)
    if threshold is not None:
        fig.add_hline(y=threshold, line_dash="dash", line_color="#d62728",
                      annotation_text=f"threshold {threshold:g}")
    fig.update_layout(height=300, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      yaxis_title=unit, legend={"orientation": "h"})
    return fig


def evidence_bars(evidence: pd.DataFrame) -> go.Figure:
    frame = evidence.dropna(subset=["over threshold"])
    fig = px.bar(frame, x="over threshold", y="signal", orientation="h",
                 title="Evidence: value / threshold (1 = at the threshold)")
    fig.add_vline(x=1, line_dash="dash", line_color="#d62728")
    fig.update_layout(height=max(200, 50 * len(frame) + 80),
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig


def stage_bars(breakdown: pd.DataFrame) -> go.Figure:
    fig = px.bar(breakdown, x="share", y="pool", color="stage", orientation="h",
                 title="Where session time goes, by pool (share of time per stage)",
                 hover_data={"seconds_per_session": ":.3f"})
    fig.update_layout(height=320, xaxis_tickformat=".0%", barmode="stack",
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig
