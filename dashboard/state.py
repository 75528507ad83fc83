"""The console's caches and shared widgets (streamlit); the data itself comes from data.py.

`st.cache_resource` holds each source's loaded `Snapshot` (one per source, shared by every
session: a 4,096-node fleet is built once) and one node's history; `st.cache_data` holds the
frames the pages draw. A Prometheus source is reloaded after TTL_LIVE seconds; a demo or a
bundle never changes.
"""

from __future__ import annotations

import streamlit as st

from fleetscope.dashboard import data

TTL_LIVE = 60  # seconds: how stale a Prometheus view may get


def source() -> str:
    return data.source_from_env()


def _ttl(spec: str) -> float | None:
    return TTL_LIVE if spec.startswith("prometheus:") else None


@st.cache_resource(show_spinner="Loading the source and running the rules...", max_entries=4)
def _snapshot(spec: str, bucket: int) -> data.Snapshot:
    return data.load(spec)


def snapshot() -> data.Snapshot:
    """The current source, loaded (raises data.SourceError with one line)."""
    import time

    spec = source()
    ttl = _ttl(spec)
    return _snapshot(spec, int(time.time() // ttl) if ttl else 0)


def _key(snap: data.Snapshot) -> str:
    return f"{source()}@{snap.window[1]}"


@st.cache_data(show_spinner=False, max_entries=8)
def _nodes(key: str, _snap: data.Snapshot):
    return data.node_table(_snap)


@st.cache_data(show_spinner=False, max_entries=8)
def _signals(key: str, _snap: data.Snapshot):
    return data.node_signals(_snap)


@st.cache_data(show_spinner=False, max_entries=8)
def _findings(key: str, _snap: data.Snapshot):
    return data.findings_frame(_snap.findings)


def nodes(snap: data.Snapshot):
    return _nodes(_key(snap), snap)


def signals(snap: data.Snapshot):
    return _signals(_key(snap), snap)


def findings(snap: data.Snapshot):
    return _findings(_key(snap), snap)


@st.cache_resource(show_spinner="Loading the node's history...", max_entries=16)
def _node_history(key: str, instance: str, _snap: data.Snapshot):
    return _snap.node_loader(instance) if _snap.node_loader else _snap.series


def node_history(snap: data.Snapshot, instance: str):
    return _node_history(_key(snap), instance, snap)


@st.cache_data(show_spinner=False, max_entries=32)
def per_core(key: str, instance: str, _snap: data.Snapshot):
    return data.per_core_busy(node_history(_snap, instance))


def filters() -> dict:
    """The sidebar filters chosen in the entry point (pool, rack, CPU model)."""
    return {"pools": st.session_state.get("filter_pools", []),
            "racks": st.session_state.get("filter_racks", []),
            "models": st.session_state.get("filter_models", [])}


def filtered_nodes(snap: data.Snapshot):
    return data.filter_nodes(nodes(snap), **filters())


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


def open_finding(rule: str, node: str | None = None) -> None:
    st.switch_page(page("findings"), query_params={"rule": rule, **({"node": node} if node
                                                                     else {})})


def from_url(param: str, key: str, allowed) -> None:
    """A deep link's query parameter wins over the widget's remembered value: set the
    widget's session state from it before the widget is drawn (when it is a valid choice)."""
    value = st.query_params.get(param)
    if value is not None and value in allowed:
        st.session_state[key] = value


def to_url(param: str, key: str, drop: tuple[str, ...] = ()):
    """An on_change callback: the widget's new value goes into the address bar."""
    def callback() -> None:
        st.query_params[param] = str(st.session_state[key])
        for name in drop:
            st.query_params.pop(name, None)
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
