"""Plotly figures for the console pages (no streamlit: the pages call st.plotly_chart).

Every axis, hover label and threshold label takes its format from dashboard/units.py, so a
bandwidth axis reads GB/s (not Plotly's "100B"), a ratio reads %, and times are wall-clock
times in the console's zone with the zone in the axis title.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from fleetscope.dashboard import data, units

HEALTH_COLOURS = {"critical": "#d62728", "warning": "#ff9f1c", "ok": "#2ca02c"}
SEVERITY_COLOURS = {"critical": "#d62728", "warning": "#ff9f1c", "info": "#1f77b4"}
MARGIN = {"l": 10, "r": 10, "t": 50, "b": 10}


def _time_axis() -> dict:
    return {"title": {"text": f"time ({units.zone_name()})"}}


def _legend_below(fig: go.Figure, entries: int, height: int = 300) -> go.Figure:
    """Legends go under the plot, in as many rows as they need: a ten-entry legend adds
    height instead of squeezing the plot, and never covers the axis titles."""
    per_row = 3
    rows = max(1, math.ceil(entries / per_row)) if entries > 1 else 0
    fig.update_layout(height=height + 22 * rows,
                      legend={"orientation": "h", "yanchor": "top", "y": -0.18,
                              "xanchor": "left", "x": 0, "entrywidth": 1 / per_row,
                              "entrywidthmode": "fraction", "title": {"text": ""}},
                      showlegend=entries > 1,
                      margin={**MARGIN, "b": 60 + 22 * rows})
    return fig


def fleet_heatmap(grid: dict, signal: str) -> go.Figure:
    """One row per rack (every row labelled), one cell per node. A transparent marker sits
    on every cell: Plotly's selection does not select heatmap cells, markers it does, so a
    click on a cell selects its node (st.plotly_chart on_select)."""
    low, high = data.SIGNAL_RANGE.get(signal, (None, None))
    unit = data.SIGNALS[signal][0]
    colourbar = {"title": {"text": units.unit_words(unit)}}
    colourbar.update({k: v for k, v in units.axis(unit).items() if k != "title"})
    if signal == "health":
        colourbar.update({"tickvals": [0, 1, 2], "ticktext": ["ok", "warning", "critical"]})
    z = [[None if v != v else float(v) for v in row] for row in grid["z"].tolist()]
    heat = go.Heatmap(z=z, x=grid["x"], y=grid["y"], zmin=low, zmax=high,
                      colorscale=data.SIGNAL_COLOURS.get(signal, "YlOrRd"), hoverongaps=False,
                      colorbar=colourbar, hoverinfo="skip")
    xs, ys, names, texts = [], [], [], []
    for r, row in enumerate(grid["text"]):
        for c, name in enumerate(row):
            if name:
                xs.append(grid["x"][c])
                ys.append(grid["y"][r])
                names.append(name)
                value = grid["z"][r][c]
                texts.append(units.format_value(value, unit) if value == value else "no data")
    markers = go.Scatter(x=xs, y=ys, mode="markers", customdata=names, text=texts,
                         marker={"symbol": "square", "size": 10, "opacity": 0,
                                 "color": "#000"},
                         selected={"marker": {"opacity": 0}},
                         unselected={"marker": {"opacity": 0}},
                         hovertemplate="%{customdata}<br>" + signal + ": %{text}"
                                       "<extra>%{y}</extra>", showlegend=False)
    rows = len(grid["y"])
    fig = go.Figure([heat, markers])
    fig.update_layout(height=max(320, 16 * rows + 110), margin=MARGIN,
                      xaxis={"title": {"text": "node slot in the rack"}, "dtick": 1
                             if len(grid["x"]) <= 16 else 4, "showgrid": False,
                             "zeroline": False},
                      yaxis={"autorange": "reversed", "dtick": 1, "type": "category",
                             "tickfont": {"size": 10 if rows > 60 else 12},
                             "showgrid": False},
                      title={"text": f"{signal} per node, by pool and rack "
                                     f"(click a cell to open the node)"},
                      clickmode="event+select", dragmode=False)
    return fig


def health_bars(table: pd.DataFrame, by: str) -> go.Figure:
    """Sick nodes per group on their own scale (healthy nodes would squash them to slivers):
    critical and warning bars, the group's size in the hover and the label."""
    long = table.melt(id_vars=[by, "nodes"], value_vars=["critical", "warning"],
                      var_name="health", value_name="sick nodes")
    long["share"] = long["sick nodes"] / long["nodes"].where(long["nodes"] > 0)
    fig = px.bar(long, x=by, y="sick nodes", color="health", color_discrete_map=HEALTH_COLOURS,
                 custom_data=["nodes", "share"],
                 title=f"Sick nodes by {by.replace('_', ' ')} (of all nodes in it)")
    fig.update_traces(hovertemplate="%{x}: %{y} %{fullData.name} of %{customdata[0]} nodes "
                                    "(%{customdata[1]:.1%})<extra></extra>")
    labels = [f"{row[by]}<br>({int(row['nodes']):,} nodes)" for _, row in table.iterrows()]
    fig.update_xaxes(tickvals=list(table[by]), ticktext=labels, title={"text": ""})
    fig.update_yaxes(title={"text": "nodes with a finding"}, rangemode="tozero")
    fig.update_layout(height=340, margin=MARGIN, barmode="stack",
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1,
                              "xanchor": "right", "title": {"text": ""}})
    return fig


def rule_bars(counts: pd.DataFrame) -> go.Figure:
    fig = px.bar(counts, x="nodes", y="rule", color="severity", orientation="h",
                 color_discrete_map=SEVERITY_COLOURS, title="Nodes per firing rule")
    fig.update_layout(height=max(260, 28 * len(counts) + 90), yaxis={"autorange": "reversed",
                                                                     "title": {"text": ""}},
                      xaxis={"title": {"text": "nodes"}},
                      margin=MARGIN, legend={"orientation": "h", "y": 1.02,
                                             "yanchor": "bottom", "x": 1, "xanchor": "right",
                                             "title": {"text": ""}})
    return fig


def grouping_bars(table: pd.DataFrame, rule: str, dimension: str) -> go.Figure:
    """Where a rule fires: share of each group's nodes that fire it (the group's counts in the
    hover), so "every r1p0 node crashes" is a full bar."""
    fig = px.bar(table, x="share of group", y="group", orientation="h",
                 custom_data=["firing", "nodes"],
                 title=f"{rule}: share of nodes firing, per {dimension}")
    fig.update_traces(marker_color="#d62728",
                      hovertemplate="%{y}: %{customdata[0]} of %{customdata[1]} nodes "
                                    "(%{x:.0%})<extra></extra>")
    fig.update_layout(height=max(200, 26 * len(table) + 90), margin=MARGIN,
                      xaxis={"tickformat": ".0%", "range": [0, 1],
                             "title": {"text": "share of the group's nodes"}},
                      yaxis={"autorange": "reversed", "title": {"text": ""},
                             "type": "category"})
    return fig


def core_heatmap(busy: pd.DataFrame) -> go.Figure:
    times = [t.to_pydatetime() if hasattr(t, "to_pydatetime") else t for t in busy.columns]
    fig = go.Figure(go.Heatmap(z=busy.to_numpy(), x=times, y=list(busy.index),
                               zmin=0, zmax=1, colorscale="YlOrRd",
                               colorbar={"title": {"text": "busy"}, "tickformat": ".0%"},
                               hovertemplate="cpu %{y}<br>%{x}<br>busy %{z:.0%}"
                                             "<extra></extra>"))
    fig.update_layout(height=520, margin=MARGIN, title={"text": "Busy per core over time (%)"},
                      yaxis={"title": {"text": "cpu"}}, xaxis=_time_axis())
    return fig


def lines(frame: pd.DataFrame, title: str, colour: str | None = None,
          threshold: float | None = None, unit: str = "", pick: str = "max") -> go.Figure:
    """A timeline in the unit's format, with the threshold as a labelled dashed line."""
    frame = frame.copy()
    if colour is None:
        keys = [c for c in frame.columns if c not in ("time", "value", "instance", "__name__")]
        frame["series"] = frame[keys].astype(str).agg(" · ".join, axis=1) if keys else "value"
        colour = "series"
    entries = frame[colour].nunique()
    words = units.unit_words(unit)
    fig = px.line(frame.sort_values("time"), x="time", y="value", color=colour,
                  title=f"{title} ({words})" if words and not title.endswith(")") else title)
    fig.update_traces(hovertemplate=units.hover_format(unit) + "<extra>%{fullData.name}"
                                                               "</extra>")
    if threshold is not None:
        fig.add_hline(y=threshold, line_dash="dash", line_color="#d62728",
                      annotation_text=f"threshold {units.format_threshold(threshold, unit, pick)}",
                      annotation_position="top left")
    fig.update_yaxes(**units.axis(unit), rangemode="tozero")
    fig.update_xaxes(**_time_axis())
    return _legend_below(fig, entries)


def evidence_chart(panel, frame: pd.DataFrame) -> go.Figure:
    """A rule's evidence panel (dashboard/evidence_views.py) over time."""
    title = panel.title if not panel.role else f"{panel.role.capitalize()}: {panel.title}"
    return lines(frame, title, colour="series", threshold=panel.threshold, unit=panel.unit,
                 pick=panel.pick)


def evidence_bars(evidence: pd.DataFrame) -> go.Figure:
    frame = evidence.dropna(subset=["ratio"])
    fig = px.bar(frame, x="ratio", y="signal", orientation="h",
                 title="Evidence against its threshold (1x = at the threshold)")
    fig.add_vline(x=1, line_dash="dash", line_color="#d62728")
    fig.update_traces(marker_color="#d62728", hovertemplate="%{x:.2f}x<extra></extra>")
    fig.update_layout(height=max(200, 50 * len(frame) + 90), margin=MARGIN,
                      xaxis={"ticksuffix": "x", "title": {"text": "value / threshold"}},
                      yaxis={"title": {"text": ""}})
    return fig


def stage_bars(breakdown: pd.DataFrame) -> go.Figure:
    frame = breakdown.copy()
    frame["where"] = frame["node_pool"] + " · " + frame["pool"] if "node_pool" in frame \
        else frame["pool"]
    frame["per session"] = frame["seconds_per_session"].map(lambda v: units.format_value(v, "s"))
    fig = px.bar(frame, x="share", y="where", color="stage", orientation="h",
                 custom_data=["per session"],
                 title="Where session time goes, by node pool and workload (share per stage)")
    fig.update_traces(hovertemplate="%{fullData.name}: %{x:.0%} of session time, "
                                    "%{customdata[0]} per session<extra></extra>")
    fig.update_layout(height=max(320, 40 * frame["where"].nunique() + 120),
                      xaxis={"tickformat": ".0%", "title": {"text": "share of session time"}},
                      yaxis={"title": {"text": ""}}, barmode="stack", margin=MARGIN,
                      legend={"orientation": "h", "y": -0.2, "title": {"text": ""}})
    return fig
