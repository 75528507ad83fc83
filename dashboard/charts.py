"""Plotly figures for the console pages (no streamlit: the pages call st.plotly_chart).

Every axis, hover label and threshold label takes its format from fleetscope/core/units.py, so a
bandwidth axis reads GB/s (not Plotly's "100B"), a ratio reads %, and times are wall-clock
times in the console's zone with the zone in the axis title.
"""

from __future__ import annotations

import math
import textwrap

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fleetscope.core import units
from fleetscope.dashboard import fleet_frames

HEALTH_COLOURS = {"critical": "#d62728", "warning": "#ff9f1c", "ok": "#2ca02c"}
SEVERITY_COLOURS = {"critical": "#d62728", "warning": "#ff9f1c", "info": "#1f77b4"}
MARGIN = {"l": 10, "r": 10, "t": 50, "b": 10}


# st.plotly_chart config of a static bar chart: nothing to zoom or pan, so no toolbar over it
STATIC = {"displayModeBar": False}
MODEBAR_WIDTH = 48  # px: the vertical toolbar's column, with its padding


def _styled(fig: go.Figure) -> go.Figure:
    """The toolbar stands down the right edge, so it never covers a chart's title, in a
    right margin of its own, so it never covers the latest points either."""
    right = fig.layout.margin.r if fig.layout.margin.r is not None else MARGIN["r"]
    fig.update_layout(modebar={"orientation": "v"}, title={"font": {"size": 15}},
                      margin={"r": max(right, MODEBAR_WIDTH)})
    return fig


def _colourbar(**settings) -> dict:
    """A colour bar whose labels stay clear of the toolbar: Plotly widens the right margin to
    fit the bar in place of the toolbar's, so the bar is padded by the toolbar's width."""
    return {"xpad": MODEBAR_WIDTH, **settings}


def _time_axis() -> dict:
    return {"title": {"text": f"time, {units.zone_name()}"}}


def _legend_below(fig: go.Figure, names: list[str], plot_height: int = 200) -> go.Figure:
    """Legends go under the x axis and its title, in as many rows as they need: a ten-entry
    legend adds height instead of squeezing the plot, and never covers an axis title. Long
    names take a row each (a half-width chart has room for one)."""
    entries = len(names)
    longest = max((len(str(n)) for n in names), default=0)
    per_row = 1 if longest > 26 else 2 if longest > 14 else 3
    rows = math.ceil(entries / per_row) if entries > 1 else 0
    below_axis = 80  # px under the plot: tick labels (two lines for dates) and the title
    legend = 22 * rows + (8 if rows else 0)
    top = MARGIN["t"]
    fig.update_layout(height=top + plot_height + below_axis + legend,
                      legend={"orientation": "h", "yanchor": "top",
                              "y": -below_axis / plot_height, "xanchor": "left", "x": 0,
                              "entrywidth": 1 / per_row, "entrywidthmode": "fraction",
                              "title": {"text": ""}},
                      showlegend=entries > 1,
                      margin={**MARGIN, "b": below_axis + legend})
    return _styled(fig)


def fleet_heatmap(grid: dict, signal: str) -> go.Figure:
    """One row per rack (every row labelled), one cell per node. A transparent marker sits
    on every cell: Plotly's selection does not select heatmap cells, markers it does, so a
    click on a cell selects its node (st.plotly_chart on_select)."""
    low, high = fleet_frames.SIGNAL_RANGE.get(signal, (None, None))
    unit = fleet_frames.SIGNALS[signal][0]
    rows = len(grid["y"])
    height = max(320, 16 * rows + 130)
    # no longer than the plot: a longer bar hides the labels that fall below it
    colourbar = _colourbar(title={"text": units.unit_words(unit)}, len=min(320, height - 130),
                           lenmode="pixels", y=1, yanchor="top")
    colourbar.update({k: v for k, v in units.axis(unit).items() if k != "title"})
    if signal == "health":
        colourbar.update({"tickvals": [0, 1, 2], "ticktext": ["ok", "warning", "critical"]})
    z = [[None if v != v else float(v) for v in row] for row in grid["z"].tolist()]
    heat = go.Heatmap(z=z, x=grid["x"], y=grid["y"], zmin=low, zmax=high,
                      colorscale=fleet_frames.SIGNAL_COLOURS.get(signal, "YlOrRd"),
                      hoverongaps=False, colorbar=colourbar, hoverinfo="skip")
    xs, ys, names, texts = [], [], [], []
    for r, row in enumerate(grid["text"]):
        for c, name in enumerate(row):
            if name:
                xs.append(grid["x"][c])
                ys.append(grid["y"][r])
                names.append(name)
                value = grid["z"][r][c]
                texts.append(units.format_value(value, unit) if value == value else "no data")
    # On a second x axis along the top (the same slots): a tall fleet's slots read at both ends.
    markers = go.Scatter(x=xs, y=ys, xaxis="x2", mode="markers", customdata=names, text=texts,
                         marker={"symbol": "square", "size": 10, "opacity": 0,
                                 "color": "#000"},
                         selected={"marker": {"opacity": 0}},
                         unselected={"marker": {"opacity": 0}},
                         hovertemplate="%{customdata}<br>" + signal + ": %{text}"
                                       "<extra>%{y}</extra>", showlegend=False)
    fig = go.Figure([heat, markers])
    slots = {"dtick": 1 if len(grid["x"]) <= 16 else 4, "showgrid": False, "zeroline": False}
    fig.update_layout(height=height, margin={**MARGIN, "t": MARGIN["t"] + 20},
                      xaxis={"title": {"text": "node slot in the rack"}, **slots},
                      xaxis2={"overlaying": "x", "matches": "x", "side": "top", **slots},
                      yaxis={"autorange": "reversed", "dtick": 1, "type": "category",
                             "tickfont": {"size": 10 if rows > 60 else 12},
                             "showgrid": False},
                      title={"text": f"{signal} per node, by pool and rack "
                                     f"(click a cell to open the node)"},
                      clickmode="event+select", dragmode=False)
    return _styled(fig)


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
    return _styled(fig)


def rule_bars(counts: pd.DataFrame) -> go.Figure:
    fig = px.bar(counts, x="nodes", y="rule", color="severity", orientation="h",
                 color_discrete_map=SEVERITY_COLOURS, title="Nodes per firing rule")
    fig.update_layout(height=max(260, 28 * len(counts) + 90), yaxis={"autorange": "reversed",
                                                                     "title": {"text": ""}},
                      xaxis={"title": {"text": "nodes"}},
                      margin=MARGIN, legend={"orientation": "h", "y": 1.02,
                                             "yanchor": "bottom", "x": 1, "xanchor": "right",
                                             "title": {"text": ""}})
    return _styled(fig)


def grouping_bars(table: pd.DataFrame, rule: str, dimension: str) -> go.Figure:
    """Where a rule fires: each group's part of the firing nodes, labelled with how many of
    the group's own nodes fire, so "all 32 crashing nodes are stepping r1p0" is one bar."""
    frame = table.copy()
    frame["label"] = [f"{f} of the group's {n:,} nodes ({s:.0%})" for f, n, s in zip(
        frame["firing"], frame["nodes"], frame["share of group"], strict=True)]
    fig = px.bar(frame, x="share of firing", y="group", orientation="h", text="label",
                 title=f"{rule}: where its nodes are, per {dimension}")
    fig.update_traces(marker_color="#d62728", textposition="auto",
                      hovertemplate="%{y}: %{x:.0%} of the firing nodes; %{text}"
                                    "<extra></extra>")
    fig.update_layout(height=max(200, 30 * len(frame) + 110), margin=MARGIN,
                      xaxis={"tickformat": ".0%", "range": [0, 1],
                             "title": {"text": "share of the rule's firing nodes"}},
                      yaxis={"autorange": "reversed", "title": {"text": ""},
                             "type": "category"})
    return _styled(fig)


def core_heatmap(busy: pd.DataFrame) -> go.Figure:
    times = [t.to_pydatetime() if hasattr(t, "to_pydatetime") else t for t in busy.columns]
    fig = go.Figure(go.Heatmap(z=busy.to_numpy(), x=times, y=list(busy.index),
                               zmin=0, zmax=1, colorscale="YlOrRd",
                               colorbar=_colourbar(title={"text": "busy"},
                                                   tickformat=".0%"),
                               hovertemplate="cpu %{y}<br>%{x}<br>busy %{z:.0%}"
                                             "<extra></extra>"))
    cores = len(busy.index)
    # few cores: a tick on each (2 CPUs drew ticks at -0.5, 0.5, 1.5), no more than ~32 ticks
    yaxis = {"title": {"text": "cpu"}, "tickmode": "linear", "dtick": max(1, cores // 32)}
    fig.update_layout(height=max(220, min(520, 60 + 8 * cores)), margin=MARGIN,
                      title={"text": "Busy per core over time (%)"}, yaxis=yaxis,
                      xaxis=_time_axis())
    return _styled(fig)


def lines(frame: pd.DataFrame, title: str, colour: str | None = None,
          threshold: float | None = None, unit: str = "", pick: str = "max",
          window: tuple | None = None, threshold_label: str = "threshold",
          reference: tuple[float, str] | None = None) -> go.Figure:
    """A timeline in the unit's format, with the threshold (where the rule fires) as a
    labelled dashed line, and a `reference` (value, label: a platform peak) dotted in grey."""
    frame = frame.copy()
    if colour is None:
        keys = [c for c in frame.columns if c not in ("time", "value", "instance", "__name__")]
        varying = [k for k in keys if frame[k].nunique() > 1]  # "port 1" on every line: noise
        keys = varying or keys[:1]
        frame["series"] = frame[keys].astype(str).agg(" · ".join, axis=1) if keys else "value"
        colour = "series"
    names = sorted(frame[colour].astype(str).unique())
    if len(names) == 1 and names[0] not in ("value", "read + write"):
        title = f"{title}: {names[0]}"  # no legend for one line: its name in the title
    words = units.unit_words(unit)
    fig = px.line(frame.sort_values("time"), x="time", y="value", color=colour,
                  title=f"{title} ({words})" if words and not title.endswith(")") else title)
    fig.update_traces(hovertemplate=units.hover_format(unit) + "<extra>%{fullData.name}"
                                                               "</extra>")
    if threshold is not None:
        fig.add_hline(y=threshold, line_dash="dash", line_color="#d62728",
                      annotation_text=f"{threshold_label} "
                                      f"{units.format_threshold(threshold, unit, pick)}",
                      annotation_position="top left")
    if reference is not None:
        fig.add_hline(y=reference[0], line_dash="dot", line_color="#7f7f7f",
                      annotation_text=f"{reference[1]} {units.format_value(reference[0], unit)}",
                      annotation_position="bottom right")
    top = frame["value"].max() if not frame.empty else None
    if reference is not None and top is not None:
        top = max(top, reference[0])
    fig.update_yaxes(**units.axis(unit, top), rangemode="tozero")
    fig.update_xaxes(**_time_axis())
    if window:  # the whole history, so a series that starts late shows when it started
        fig.update_xaxes(range=list(window))
    return _legend_below(fig, names)


def small_multiples(frame: pd.DataFrame, title: str, facet: str, unit: str = "",
                    window: tuple | None = None, panel_height: int = 110) -> go.Figure:
    """One panel per `facet` value (each RDMA counter) on its own scale, stacked on one time
    axis: counters hundreds of times apart drawn on one axis flatten all but the largest.
    Within a panel one line per other varying label (each device), coloured alike in all."""
    keys = [c for c in frame.columns if c not in ("time", "value", "instance", "__name__", facet)]
    varying = [k for k in keys if frame[k].nunique() > 1]
    frame = frame.sort_values("time").assign(
        series=frame[varying].astype(str).agg(" · ".join, axis=1) if varying else "value")
    panels = sorted(frame[facet].astype(str).unique())
    names = sorted(frame["series"].unique())
    colours = dict(zip(names, px.colors.qualitative.Plotly * (len(names) // 10 + 1),
                       strict=False))
    gap = 46  # px between panels: the next panel's title
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, subplot_titles=panels,
                        vertical_spacing=gap / (len(panels) * (panel_height + gap)))
    for row, (panel, rows) in enumerate(frame.groupby(frame[facet].astype(str)), start=1):
        for name, line in rows.groupby("series"):
            fig.add_trace(go.Scatter(x=line["time"], y=line["value"], mode="lines", name=name,
                                     legendgroup=name, showlegend=row == 1,
                                     line={"color": colours[name]},
                                     hovertemplate=units.hover_format(unit)
                                     + f"<extra>{panel} · {name}</extra>"),
                          row=row, col=1)
        settings = units.axis(unit, rows["value"].max())
        fig.update_yaxes(**{**settings, "title": {"text": ""}}, rangemode="tozero",
                         row=row, col=1)
    fig.update_annotations(font={"size": 12}, xanchor="left", x=0)
    words = units.unit_words(unit)
    fig.update_layout(title={"text": f"{title} ({words})" if words else title})
    fig.update_xaxes(range=list(window) if window else None)
    fig.update_xaxes(**_time_axis(), row=len(panels), col=1)
    plot_height = len(panels) * (panel_height + gap)
    return _legend_below(fig, names if len(names) > 1 else [], plot_height)


def evidence_chart(panel, frame: pd.DataFrame, window: tuple | None = None) -> go.Figure:
    """A rule's evidence panel (dashboard/evidence_views.py) over time."""
    title = panel.title if not panel.role else f"{panel.role.capitalize()}: {panel.title}"
    # 'fires < 15 min' at the line: 'threshold < 15 min' read as a claim about the threshold
    return lines(frame, title, colour="series", threshold=panel.threshold, unit=panel.unit,
                 pick=panel.pick, window=window, threshold_label="fires")


def evidence_bars(evidence: pd.DataFrame) -> go.Figure:
    frame = evidence.dropna(subset=["ratio"]).copy()
    # The chart sits in a narrow column: a signal's long name on one line left the bars a
    # sliver, and how to read the scale, centred under that sliver, ran past the right edge.
    # Names wrap; the reading goes under the title, which has the chart's whole width.
    frame["signal"] = frame["signal"].map(lambda name: "<br>".join(textwrap.wrap(name, 26)))
    # A bar's hover says what the table's row says (units.reading): a floor's ratio is
    # threshold over value, which '%{x}x' alone would not tell.
    frame["reading"] = frame.get("reading", frame["value"]).map(
        lambda text: "<br>".join(textwrap.wrap(str(text), 40)))
    fig = px.bar(frame, x="ratio", y="signal", orientation="h", custom_data=["reading"])
    fig.add_vline(x=1, line_dash="dash", line_color="#d62728")
    fig.update_traces(marker_color="#d62728", hovertemplate="%{customdata[0]}<extra></extra>")
    lines = sum(name.count("<br>") + 1 for name in frame["signal"])
    fig.update_layout(height=max(220, 22 * lines + 30 * len(frame) + 110),
                      margin={**MARGIN, "t": 70},
                      title={"text": "Evidence against its threshold<br><sup>1x at it, more: "
                                     "further past it on the side that fires</sup>"},
                      xaxis={"ticksuffix": "x", "title": {"text": ""}},
                      yaxis={"title": {"text": ""}})
    return _styled(fig)


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
    plot = max(160, 40 * frame["where"].nunique())
    fig.update_layout(height=MARGIN["t"] + plot + 100,
                      xaxis={"tickformat": ".0%", "title": {"text": "share of session time"}},
                      yaxis={"title": {"text": ""}}, barmode="stack",
                      margin={**MARGIN, "b": 100},
                      legend={"orientation": "h", "yanchor": "top", "y": -70 / plot,
                              "title": {"text": ""}})
    return _styled(fig)


def warm_up() -> None:
    """Build and serialise one small figure of each kind the Fleet page draws: plotly loads
    its figure machinery on first use, which a server pays before its first visitor instead
    of during that visitor's page."""
    frame = pd.DataFrame({"x": [1, 2], "y": ["a", "b"], "c": ["ok", "warning"]})
    px.bar(frame, x="x", y="y", color="c", orientation="h").to_json()
    go.Figure([go.Heatmap(z=[[0.0, 1.0]]), go.Scatter(x=[0], y=[0], mode="markers")]).to_json()
