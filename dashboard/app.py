"""The fleetscope ops console: `fleetscope console --source demo|bundle:PATH|prometheus:URL`.

    streamlit run dashboard/app.py        # the source comes from FLEETSCOPE_CONSOLE_SOURCE

One entry point: it loads the source (cached), draws the sidebar (source, filters by pool,
rack and CPU model) and hands over to the page chosen with st.navigation. The pages in
dashboard/views/ only render; the frames come from dashboard/data.py.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from fleetscope.core import units
from fleetscope.dashboard import data, state

HERE = Path(__file__).resolve().parent

st.set_page_config(page_title="fleetscope", page_icon=":material/monitor_heart:",
                   layout="wide")

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
st.sidebar.caption(f"data up to {units.local_time(snap.window[1])}")
for note in snap.notes:
    st.sidebar.caption(note)
st.sidebar.multiselect("Pool", sorted(nodes["node_pool"].unique()), key="filter_pools")
st.sidebar.multiselect("CPU model", sorted(nodes["cpu_model"].unique()), key="filter_models")
st.sidebar.multiselect("Rack", sorted(nodes["rack"].unique()), key="filter_racks")

page.run()
