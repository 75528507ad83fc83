"""The fleetscope ops console: `fleetscope console --source demo|bundle:PATH|prometheus:URL`.

    streamlit run dashboard/app.py        # the source comes from FLEETSCOPE_CONSOLE_SOURCE

One entry point: it loads the source (cached), draws the sidebar (source, filters by pool,
rack and CPU model) and hands over to the page chosen with st.navigation. The pages in
dashboard/views/ only render; the frames come from the *_frames.py modules beside them.
"""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from fleetscope.core import units
from fleetscope.dashboard import data, state

HERE = Path(__file__).resolve().parent
STALE_AFTER_S = 600  # a live source's data older than this is called stale

st.set_page_config(page_title="fleetscope", page_icon=":material/monitor_heart:",
                   layout="wide")

# Code blocks (runbook commands) wrap: a long command scrolled out of sight reads as cut off.
# (important: the highlighter puts white-space: pre on the code element itself)
st.html("<style>[data-testid='stMarkdownPre'] pre, [data-testid='stMarkdownPre'] code "
        "{white-space: pre-wrap !important; overflow-wrap: anywhere;}</style>")

VIEWS = HERE / "views"
PAGES = [
    st.Page(str(VIEWS / "fleet.py"), title="Fleet", icon=":material/grid_view:",
            default=True, url_path="overview"),
    st.Page(str(VIEWS / "node.py"), title="Node", icon=":material/memory:", url_path="node"),
    st.Page(str(VIEWS / "findings.py"), title="Findings", icon=":material/report:",
            url_path="findings"),
    st.Page(str(VIEWS / "latency.py"), title="Latency breakdown", icon=":material/timer:",
            url_path="latency"),
    st.Page(str(VIEWS / "rules.py"), title="Rules", icon=":material/rule:", url_path="rules"),
    st.Page(str(VIEWS / "runbook.py"), title="Runbooks", icon=":material/menu_book:",
            url_path="runbook"),
    # The default page is served at "/" only (Streamlit ignores its url_path): the same page
    # under /fleet, hidden from the menu, so a pasted /fleet link opens it.
    st.Page(str(VIEWS / "fleet.py"), title="Fleet", icon=":material/grid_view:",
            url_path="fleet", visibility="hidden"),
]
page = st.navigation(PAGES)
state.remember_pages({"fleet": PAGES[0], "node": PAGES[1], "findings": PAGES[2],
                      "latency": PAGES[3], "rules": PAGES[4], "runbook": PAGES[5]})

st.sidebar.caption(f"source: `{state.source()}`")
try:
    snap = state.load_snapshot()
except data.SourceError as err:
    st.error(f"Cannot load the source: {err}")
    st.stop()

nodes = state.nodes(snap)
st.sidebar.caption(snap.description)
# How old the data is, every run: a page left open in an incident must say it is stale;
# an engine holding no current sample is as old as its newest one, not the query's time.
until = snap.window[1] if snap.newest_sample is None else snap.newest_sample
age = max(0.0, time.time() - until)
when = f"{units.local_time(until)}, {units.duration(round(age) if age >= 1 else age)} ago"
since = f"data up to {when}" if until else "no data in the last day"
if snap.newest_sample is not None:
    st.error("No current data: this source holds no node sample from the last 5 minutes ("
             + (f"the newest at {when}" if until else "none in the last day")
             + "). Are the exporters up and scraped? Empty counts below mean no data, not "
             "a healthy fleet.")
if snap.kind != "bundle" and (age > STALE_AFTER_S or not until):
    st.sidebar.warning(f"{since}: stale. Refresh to load the source again.")
else:
    st.sidebar.caption(since + (" (recorded)" if snap.kind == "bundle" else ""))
if st.sidebar.button("Refresh", icon=":material/refresh:", key="refresh",
                     help="load the source again and run the rules on what it has now"):
    state.reload()
    st.rerun()
for note in snap.notes:
    st.sidebar.caption(note)
# The filters live in the address bar too (?pool=chat&rack=r07): a pasted link opens the
# same slice of the fleet. A value the source does not have is dropped, never guessed.
for label, param, key, column in (("Pool", "pool", "filter_pools", "node_pool"),
                                  ("CPU model", "cpu", "filter_models", "cpu_model"),
                                  ("Rack", "rack", "filter_racks", "rack")):
    options = sorted(nodes[column].unique())
    asked = [value for value in st.query_params.get_all(param) if value in options]
    if asked:
        st.session_state[key] = asked
    st.sidebar.multiselect(label, options, key=key, on_change=state.filter_to_url(param, key))
# How far back a node's history goes, in the URL too (?range=6+h); the default left out.
if snap.history_ranged:
    state.from_url("range", "history_range", data.HISTORY_RANGES)
    st.session_state.setdefault("history_range", data.DEFAULT_HISTORY)
    st.sidebar.selectbox("History range", list(data.HISTORY_RANGES), key="history_range",
                         on_change=state.to_url("range", "history_range"),
                         help="how far back a node's charts go")
    chosen = st.session_state["history_range"]
    state.keep_in_url(range=None if chosen == data.DEFAULT_HISTORY else chosen)
else:
    st.sidebar.caption("history: the bundle's own samples (no range to choose)")

page.run()
