"""The console's caches and shared widgets (streamlit); the sources and frames come from
data.py and the *_frames.py modules.

`st.cache_resource` holds each source's loaded `Snapshot` (one per source, shared by every
session: a 4,096-node fleet is built once) and one node's history; `st.cache_data` holds the
frames the pages draw. A Prometheus source is reloaded once it is TTL_LIVE seconds old; a
demo or a bundle never changes. The entry point loads the snapshot once a run and pins it
there, so the page it runs draws from the same snapshot even when the cached one expires
in between (one load a run, never two).
"""

from __future__ import annotations

import re

import streamlit as st

from fleetscope.dashboard import data, fleet_frames, node_frames

TTL_LIVE = 60  # seconds: how stale a Prometheus view may get
_PINNED_KEY = "_fleetscope_snapshot"  # this run's snapshot (session state)


def source() -> str:
    return data.source_from_env()


@st.cache_resource(show_spinner="Loading the source and running the rules...", max_entries=2)
def _fixed_snapshot(spec: str) -> data.Snapshot:
    return data.load(spec)


# One entry: a reload replaces the old snapshot rather than keeping stale ones beside it.
@st.cache_resource(show_spinner="Loading the source and running the rules...", max_entries=1,
                   ttl=TTL_LIVE)
def _live_snapshot(spec: str) -> data.Snapshot:
    return data.load(spec)


def load_snapshot() -> data.Snapshot:
    """The entry point's load of the current source, pinned for this run's page (raises
    data.SourceError with one line)."""
    spec = source()
    loaded = (_live_snapshot if spec.startswith("prometheus:") else _fixed_snapshot)(spec)
    st.session_state[_PINNED_KEY] = (spec, loaded)
    return loaded


def reload() -> None:
    """Forget the loaded source and everything drawn from it: the next run loads it again
    (a demo fleet is simulated up to now, Prometheus queried again)."""
    _fixed_snapshot.clear()
    _live_snapshot.clear()
    st.cache_data.clear()
    st.session_state.pop(_PINNED_KEY, None)


def snapshot() -> data.Snapshot:
    """The snapshot this run's entry point loaded (a page run on its own loads it)."""
    pinned = st.session_state.get(_PINNED_KEY)
    if pinned and pinned[0] == source():
        return pinned[1]
    return load_snapshot()


def _key(snap: data.Snapshot) -> str:
    return f"{source()}@{snap.window[1]}"


@st.cache_data(show_spinner=False, max_entries=2)
def _nodes(key: str, _snap: data.Snapshot):
    return fleet_frames.node_table(_snap)


@st.cache_data(show_spinner=False, max_entries=2)
def _signals(key: str, _snap: data.Snapshot):
    return fleet_frames.node_signals(_snap)


@st.cache_data(show_spinner=False, max_entries=2)
def _findings(key: str, _snap: data.Snapshot):
    return fleet_frames.findings_frame(_snap.findings)


def nodes(snap: data.Snapshot):
    return _nodes(_key(snap), snap)


def signals(snap: data.Snapshot):
    return _signals(_key(snap), snap)


def findings(snap: data.Snapshot):
    return _findings(_key(snap), snap)


def history_seconds(snap: data.Snapshot) -> float:
    """How far back a node's history goes: the sidebar's range where the source follows one
    (0 for a bundle, whose history is what it recorded)."""
    return data.HISTORY_RANGES[history_range()] if snap.history_ranged else 0.0


def history_range() -> str:
    """The sidebar's history range, as it is named there and in the URL ("6 h")."""
    chosen = st.session_state.get("history_range")
    return chosen if chosen in data.HISTORY_RANGES else data.DEFAULT_HISTORY


@st.cache_resource(show_spinner="Loading the node's history...", max_entries=16)
def _node_history(key: str, instance: str, seconds: float, _snap: data.Snapshot):
    return _snap.node_loader(instance, seconds) if _snap.node_loader else _snap.series


def node_history(snap: data.Snapshot, instance: str):
    return _node_history(_key(snap), instance, history_seconds(snap), snap)


@st.cache_data(show_spinner=False, max_entries=32)
def _per_core(key: str, instance: str, seconds: float, _snap: data.Snapshot):
    return node_frames.per_core_busy(node_history(_snap, instance))


def per_core(snap: data.Snapshot, instance: str):
    return _per_core(_key(snap), instance, history_seconds(snap), snap)


def filters() -> dict:
    """The sidebar filters chosen in the entry point (pool, rack, CPU model)."""
    return {"pools": st.session_state.get("filter_pools", []),
            "racks": st.session_state.get("filter_racks", []),
            "models": st.session_state.get("filter_models", [])}


def filtered_nodes(snap: data.Snapshot):
    return fleet_frames.filter_nodes(nodes(snap), **filters())


_PUNCTUATION = re.compile(r"[!-/:-@\[-`{-~]")  # ASCII punctuation: Markdown escapes it


def plain(text: str) -> str:
    """Text shown as written inside Markdown: "> 25 %" no quote, "$" no formula, "*" no
    emphasis."""
    return _PUNCTUATION.sub(r"\\\g<0>", text)


def static_table(frame, where=st) -> None:
    """A table whose cells wrap (st.table, where a data grid cuts long text off), its text
    shown as written: st.table reads cells as Markdown, where "> 25 %" would be a quote."""
    def escaped(value):
        return plain(value) if isinstance(value, str) else value

    where.table(frame.apply(lambda column: column.map(escaped)), hide_index=True)


# -- navigation ----------------------------------------------------------------------------
_PAGES_KEY = "_fleetscope_pages"


def remember_pages(pages: dict) -> None:
    """The entry point's st.Page objects by name, for links and switch_page from the pages."""
    st.session_state[_PAGES_KEY] = pages


def page(name: str):
    return st.session_state[_PAGES_KEY][name]


def open_node(node: str, rule: str | None = None) -> None:
    """Go to the Node page for `node` (with `rule`'s finding open): the deep link
    /node?node=NAME&rule=ID, so the address bar holds what a ticket needs."""
    params = {"node": node, **({"rule": rule} if rule else {})}
    st.switch_page(page("node"), query_params=params)


def resolve_node(asked: str | None, instances) -> str | None:
    """The instance a link names: itself, or the one instance whose host is `asked` (tickets
    and pages carry the host name without the exporter's port); None when there is none."""
    if not asked:
        return None
    known = set(instances)
    if asked in known:
        return asked
    hosts = [i for i in known if i.rpartition(":")[0] == asked]
    return hosts[0] if len(hosts) == 1 else None


def no_such_node(asked: str) -> None:
    """A link's node that no instance or host name of this source matches: said, with the way
    back to the fleet, and the page stops (never another node in its place)."""
    st.error(f"No node {asked!r} in this source (instance or host name).")
    st.page_link(page("fleet"), label="Open the Fleet page", icon=":material/apps:")
    st.stop()


def from_url(param: str, key: str, allowed=None) -> None:
    """A deep link's query parameter wins over the widget's remembered value: set the
    widget's session state from it before the widget is drawn (when it is a valid choice;
    `allowed` None: any text, as a search box takes)."""
    value = st.query_params.get(param)
    if value is not None and (allowed is None or value in allowed):
        st.session_state[key] = value


def to_url(param: str, key: str, drop: tuple[str, ...] = ()):
    """An on_change callback: the widget's new value goes into the address bar (an emptied
    text box takes its parameter out)."""
    def callback() -> None:
        value = str(st.session_state[key])
        if value:
            st.query_params[param] = value
        else:
            st.query_params.pop(param, None)
        for name in drop:
            st.query_params.pop(name, None)
    return callback


def filter_to_url(param: str, key: str):
    """An on_change callback of a multiselect filter: its values into the address bar as a
    repeated parameter (?rack=r07&rack=r08), none when it is cleared."""
    def callback() -> None:
        values = list(st.session_state.get(key) or [])
        if values:
            st.query_params[param] = values
        else:
            st.query_params.pop(param, None)
    return callback


def keep_in_url(**params) -> None:
    """Put what the page shows into the address bar, every run: a link to the page it is
    on changes the page but, left alone, not the browser's URL (a reload would go back)."""
    for name, value in params.items():
        if value is None:
            st.query_params.pop(name, None)
        else:
            st.query_params[name] = str(value)


def selected_row(event) -> int | None:
    """The row index of a single-row dataframe selection event, or None."""
    try:
        rows = event.selection.rows
    except AttributeError:
        return None
    return rows[0] if rows else None


def selected_point(event) -> dict | None:
    try:
        points = event.selection.points
    except AttributeError:
        return None
    return points[0] if points else None
