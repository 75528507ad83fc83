"""End to end: `fleetscope demo` on a free 127.0.0.1 port, loaded in headless Chromium.

Waits until the Fleet page shows its counts; clicks the first critical finding and follows it
to its node, its runbook and a related runbook, then reloads the node's deep link; shoots
every page at 1600x1000. Deep links that name what is not there (an unknown node or rule, a
rule where it does not fire, a host name without the port) open what they name or say they
cannot, the URL left naming what was asked. Screenshots of each step stay in the test's tmp
dir (and are copied to $FLEETSCOPE_SCREENSHOT_DIR when set).
Chromium comes from Debian (`chromium`, `chromium-driver`); outside CI a machine without
them skips, in CI that is a failure.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from fleetscope.dashboard.rulebook import runbook
from fleetscope.rules.catalog import CATALOG, RULE_IDS
from tests.conftest import require_tool

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1600,1000",
                  "--hide-scrollbars", "--force-device-scale-factor=1")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"fleetscope demo exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}_stcore/health", timeout=5) as response:
                if response.read() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError("the console did not become healthy")


DEMO_NODES = 512


@contextlib.contextmanager
def running(log: Path, *arguments: str):
    """`fleetscope ARGUMENTS --port P` on a free 127.0.0.1 port, its output in `log`: its
    URL once healthy, stopped however the caller ends."""
    port = free_port()
    out = open(log, "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([sys.executable, "-m", "fleetscope", *arguments, "--port",
                             str(port)], stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        stop(proc)
        out.close()


def running_demo(log_dir: Path):
    """`fleetscope demo` of DEMO_NODES nodes: its URL, stopped however the caller ends."""
    return running(log_dir / "demo.log", "demo", "--nodes", str(DEMO_NODES))


@pytest.fixture(scope="module")
def shared_demo(tmp_path_factory):
    """One demo for the tests that only read pages (each opens its own browser session:
    Streamlit keeps each session's state apart)."""
    with running_demo(tmp_path_factory.mktemp("shared-demo")) as url:
        yield url


@pytest.fixture
def demo(shared_demo):
    return shared_demo


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def browser():
    """A new headless Chromium at 1600x1000 and its profile directory (the caller quits it
    and removes the profile)."""
    chromium = require_tool("chromium")
    driver_path = require_tool("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("selenium is not installed: pip install -e '.[test]'")
        pytest.skip("selenium is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="fleetscope-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    # The viewport itself 1600x1000 (a headless window's size includes no browser chrome, but
    # say it exactly so every screenshot is the size people review).
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1600, "height": 1000, "deviceScaleFactor": 1,
                            "mobile": False})
    return driver, profile


_SHARED: dict = {}  # the session's one Chromium: {"driver": ..., "profile": ...}


def _end_shared_chromium() -> None:
    if _SHARED:
        with contextlib.suppress(Exception):
            _SHARED["driver"].quit()
        shutil.rmtree(_SHARED["profile"], ignore_errors=True)
        _SHARED.clear()


@contextlib.contextmanager
def chromium():
    """The session's headless Chromium at 1600x1000, started at the first use (each start
    costs seconds) and handed over blank: one tab, no cookies, no site data. A browser that
    no longer answers is replaced."""
    if _SHARED:
        try:
            _SHARED["driver"].get("about:blank")
        except Exception:
            _end_shared_chromium()
    if not _SHARED:
        driver, profile = browser()
        _SHARED.update(driver=driver, profile=profile)
        atexit.register(_end_shared_chromium)
    driver = _SHARED["driver"]
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        try:  # what this test left (tabs, cookies, storage) is not the next one's
            for handle in driver.window_handles[1:]:
                driver.switch_to.window(handle)
                driver.close()
            driver.switch_to.window(driver.window_handles[0])
            driver.get("about:blank")
            driver.delete_all_cookies()
            driver.execute_cdp_cmd("Storage.clearDataForOrigin",
                                   {"origin": "*", "storageTypes": "all"})
        except Exception:
            _end_shared_chromium()


def body_text(driver) -> str:
    from selenium.webdriver.common.by import By

    try:
        return driver.find_element(By.TAG_NAME, "body").text
    except Exception:  # noqa: BLE001 (a page mid-rerun: read again)
        return ""


def wait_for(driver, check, what: str, seconds: float = 120) -> str:
    """Poll the page until `check(text)` holds; the text it held."""
    deadline = time.monotonic() + seconds
    text = ""
    while time.monotonic() < deadline:
        text = body_text(driver)
        if check(text) and "Running..." not in text:
            return text
        time.sleep(0.5)
    raise AssertionError(f"{what}: not seen within {seconds:.0f} s at {driver.current_url}; "
                         f"the page says:\n{text[:2000]}")


# Streamlit shows a grey skeleton where an element is still coming, and a dataframe is a
# canvas grid drawn after its data arrives: on a busy machine 1.5 s was not always enough.
PAINTED = """
const frames = [...document.querySelectorAll('[data-testid="stDataFrame"]')];
return document.querySelectorAll('[data-testid="stSkeleton"]').length === 0 &&
       frames.every(f => f.querySelector('canvas') && f.getBoundingClientRect().height > 40);
"""


def shoot(driver, tmp_path: Path, name: str) -> Path:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not driver.execute_script(PAINTED):
        time.sleep(0.25)
    time.sleep(1.5)  # let plotly finish drawing
    shot = tmp_path / f"{name}.png"
    driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep = os.environ.get("FLEETSCOPE_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
    return shot


def click_first_row(driver, key: str) -> None:
    """Select the first row of the st.dataframe whose key is `key` (a canvas grid; Streamlit
    marks a keyed element st-key-<key>): its row-marker cell."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    frame = driver.find_element(By.CSS_SELECTOR, f'.st-key-{key} [data-testid="stDataFrame"], '
                                                 f'[data-testid="stDataFrame"].st-key-{key}')
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", frame)
    time.sleep(0.5)
    canvas = frame.find_element(By.TAG_NAME, "canvas")
    size = canvas.size
    # Selenium 4 offsets are from the element's centre: the marker column's first row.
    x = 16 - size["width"] / 2
    y = 35 + 17 - size["height"] / 2
    ActionChains(driver).move_to_element_with_offset(canvas, x, y).pause(0.3).click().perform()


def click_link(driver, label_part: str) -> None:
    from selenium.webdriver.common.by import By

    links = [a for a in driver.find_elements(By.CSS_SELECTOR, "a")
             if label_part in (a.text or "")]
    assert links, f"no link with {label_part!r}"
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", links[0])
    links[0].click()


def path_and_query(url: str) -> tuple[str, dict]:
    parsed = urllib.parse.urlparse(url)
    return parsed.path, dict(urllib.parse.parse_qsl(parsed.query))


def _rules_not_charted(driver, seconds: float = 60) -> list[str]:
    """Rule ids missing from the y-axis labels of the page's charts, after opening the
    "Nodes per firing rule" expander."""
    from selenium.webdriver.common.by import By

    summaries = driver.find_elements(By.XPATH, "//summary[contains(., 'Nodes per firing rule')]")
    assert summaries, "no 'Nodes per firing rule' expander"
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", summaries[0])
    summaries[0].click()
    deadline = time.monotonic() + seconds
    missing = list(RULE_IDS)
    while missing and time.monotonic() < deadline:
        labels = set(driver.execute_script(
            "return Array.from(document.querySelectorAll('.ytick text'), e => e.textContent)"))
        missing = sorted(r for r in RULE_IDS if r not in labels)
        time.sleep(1)
    return missing


@pytest.mark.live
def test_demo_fleet_page_in_chromium(demo, tmp_path):
    with chromium() as driver:
        driver.get(demo)
        text = wait_for(driver, lambda t: "Findings, worst first" in t and "Worst racks" in t
                        and "nodes\n512" in t, "the Fleet page and its counts")
        # The demo fleet carries every rule's fault: each rule is a bar of "Nodes per firing
        # rule" (drawn once its expander opens; the tables are canvas, their text not read).
        missing = _rules_not_charted(driver)
        assert not missing, missing
        assert f"rules not evaluated\n0 of {len(CATALOG)}" in text
        assert "Error" not in text and "Traceback" not in text
        shot = shoot(driver, tmp_path, "fleet")
        assert shot.stat().st_size > 50_000  # a drawn page, not a blank one


@pytest.mark.live
def test_click_through_from_a_critical_finding_to_its_runbooks_and_back(demo, tmp_path):
    """Fleet -> first critical finding -> its node with the finding open -> its runbook ->
    a related runbook -> the node's deep link reloaded: the same page."""
    with chromium() as driver:
        driver.get(demo + "fleet")  # a pasted /fleet link opens the Fleet page
        text = wait_for(driver, lambda t: "Findings, worst first" in t and "Worst racks" in t,
                        "the Fleet page at /fleet")
        assert "Page not found" not in text
        shoot(driver, tmp_path, "1-fleet")
        click_first_row(driver, "findings_table")  # the Harm expander's table is above it
        wait_for(driver, lambda t: driver.current_url.split("?")[0].endswith("/node"),
                 "the Node page after the click", 90)
        path, query = path_and_query(driver.current_url)
        assert set(query) == {"node", "rule"}
        node, rule = query["node"], query["rule"]
        text = wait_for(driver, lambda t: f"CRITICAL · {rule}" in t and "Cores" in t,
                        f"the node {node} with its {rule} finding", 90)
        assert node in text and "Likely cause:" in text
        shoot(driver, tmp_path, "2-node-with-finding")

        click_link(driver, f"Runbook: {rule}")
        wait_for(driver, lambda t: f"/runbook?rule={rule}" in driver.current_url
                 and "Related runbooks" in t, f"the {rule} runbook")
        text = body_text(driver)
        assert "Page not found" not in text
        shoot(driver, tmp_path, "3-runbook")
        from selenium.webdriver.common.by import By

        related = [a for a in driver.find_elements(By.CSS_SELECTOR,
                                                   '[data-testid="stPageLink-NavLink"]')
                   if "rule=" in (a.get_attribute("href") or "")
                   and f"rule={rule}" not in a.get_attribute("href")]
        assert related, "the runbook has no related runbook links"
        other = path_and_query(related[0].get_attribute("href"))[1]["rule"]
        related[0].click()
        heading = runbook(other).splitlines()[0].lstrip("# ").strip()
        text = wait_for(driver, lambda t: f"rule={other}" in driver.current_url
                        and heading in t, f"the related runbook {other}")
        assert "Page not found" not in text
        shoot(driver, tmp_path, "4-related-runbook")

        deep_link = f"{demo}node?{urllib.parse.urlencode({'node': node, 'rule': rule})}"
        driver.get(deep_link)
        text = wait_for(driver, lambda t: f"CRITICAL · {rule}" in t and "Cores" in t,
                        "the deep link after a reload", 90)
        assert node in text and "Page not found" not in text
        driver.refresh()
        text = wait_for(driver, lambda t: f"CRITICAL · {rule}" in t and "Cores" in t,
                        "the same page after a reload", 90)
        assert path_and_query(driver.current_url) == (path, query)
        shoot(driver, tmp_path, "5-deep-link-reloaded")


@pytest.mark.live
def test_every_page_at_1600x1000(demo, tmp_path):
    """A screenshot of every page at 1600x1000, none with an error or "Page not found"."""
    with chromium() as driver:
        for path, marker in (("fleet", "Worst racks"), ("node", "Cores"),
                             ("findings", "Runbook"), ("latency", "model inference"),
                             ("rules", "rules in the catalog"),
                             ("runbook?rule=roce-congestion", "Related runbooks")):
            driver.get(demo + path)
            text = wait_for(driver, lambda t, m=marker: m in t, f"the {path} page")
            assert "Page not found" not in text and "Traceback" not in text, path
            shoot(driver, tmp_path, f"page-{path.split('?')[0]}")


@pytest.mark.live
def test_a_heatmap_cell_opens_its_node(demo, tmp_path):
    """A click on a heatmap cell (a transparent marker over it: Plotly does not select
    heatmap cells) opens the Node page of the node in that cell."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.common.by import By

    with chromium() as driver:
        driver.get(demo + "fleet")
        wait_for(driver, lambda t: "click a cell to open the node" in t, "the fleet heatmap")
        time.sleep(3)  # plotly draws after the text is there
        heat = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stPlotlyChart"]')[-1]
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", heat)
        time.sleep(1)
        plot = heat.find_element(By.CSS_SELECTOR, ".js-plotly-plot")
        x, y, row = driver.execute_script(
            "var gd = arguments[0], xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;"
            "var r = gd.getBoundingClientRect(), row = ya._categories[1];"
            "return [r.left + xa._offset + xa.d2p(2), r.top + ya._offset + ya.d2p(row), row];",
            plot)
        click = ActionBuilder(driver)
        click.pointer_action.move_to_location(int(x), int(y))
        click.pointer_action.pause(0.5)
        click.pointer_action.click()
        click.perform()
        wait_for(driver, lambda t: "/node?node=" in driver.current_url and "Cores" in t,
                 "the Node page after a click on a heatmap cell", 90)
        node = path_and_query(driver.current_url)[1]["node"]
        rack = row.split(" / ")[1]
        assert node == f"{rack}n02:9105", (node, row)  # the clicked row's third slot
        shoot(driver, tmp_path, "heatmap-click-node")


# Of the plotly chart whose title starts with arguments[0]: the toolbar's box, the colour
# bar's labels and the slot labels of both x axes, as [left, top, right, bottom].
HEATMAP_BOXES = """
const box = e => {
    const b = e.getBoundingClientRect();
    return [b.left, b.top, b.right, b.bottom];
};
const chart = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].find(
    c => (c.querySelector('.gtitle') || {}).textContent?.startsWith(arguments[0]));
if (!chart) return null;
chart.scrollIntoView({block: 'start'});
const shown = e => e.getBoundingClientRect().width > 0;
return {toolbar: box(chart.querySelector('.modebar')),
        plot: box(chart.querySelector('.nsewdrag')),
        colourbar: [...chart.querySelectorAll('.colorbar text')].filter(shown).map(
            t => [t.textContent, box(t)]),
        slots: [...chart.querySelectorAll('.xtick text, .x2tick text')].filter(shown).map(box)};
"""


def _heatmap_boxes(driver, title: str) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        boxes = driver.execute_script(HEATMAP_BOXES, title)
        if boxes and boxes["colourbar"] and boxes["slots"]:
            return boxes
        time.sleep(1)
    raise AssertionError(f"no drawn heatmap titled {title!r}")


def _overlap(a: list, b: list) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.live
def test_heatmap_colour_bars_stay_clear_of_the_toolbar_and_a_fleets_slots_read_on_top(
        demo, tmp_path):
    """No label of a heatmap's colour bar (the top one, "critical" or "100 %") lies under the
    plotly toolbar; the fleet heatmap numbers its node slots above the racks as well as
    below (a tall fleet's bottom axis is screens away)."""
    from fleetscope.dashboard.fleet_sim import Fleet

    fleet = Fleet(nodes=512)
    hog = fleet.instances[fleet.faults["core-imbalance"][0]]
    with chromium() as driver:
        driver.get(demo + "fleet")
        wait_for(driver, lambda t: "click a cell to open the node" in t, "the fleet heatmap")
        fleet_map = _heatmap_boxes(driver, "health per node")
        driver.get(f"{demo}node?{urllib.parse.urlencode({'node': hog})}")
        wait_for(driver, lambda t: "Cores" in t and "busiest core" in t, "the node's cores")
        cores = _heatmap_boxes(driver, "Busy per core")
        shoot(driver, tmp_path, "node-core-heatmap")
    for boxes, top_label in ((fleet_map, "critical"), (cores, "100%")):
        labels = [text.replace(" ", "") for text, _ in boxes["colourbar"]]
        assert top_label in labels, labels
        covered = [text for text, where in boxes["colourbar"]
                   if _overlap(where, boxes["toolbar"])]
        assert not covered, (covered, boxes["toolbar"])
    plot_top, plot_bottom = fleet_map["plot"][1], fleet_map["plot"][3]
    assert any(b[3] <= plot_top for b in fleet_map["slots"]), fleet_map["slots"]
    assert any(b[1] >= plot_bottom for b in fleet_map["slots"]), fleet_map["slots"]


@pytest.mark.live
def test_runbook_commands_wrap_instead_of_running_off_the_right_edge(demo, tmp_path):
    """roce-congestion's runbook has commands of 200 characters: its code blocks wrap, none
    is wider than the page shows."""
    fenced = runbook("roce-congestion").split("```")[1::2]  # the code blocks
    assert max(len(line) for block in fenced for line in block.splitlines()) > 150
    with chromium() as driver:
        driver.get(demo + "runbook?rule=roce-congestion")
        wait_for(driver, lambda t: "Related runbooks" in t, "the roce-congestion runbook")
        time.sleep(2)
        blocks = driver.execute_script(
            "return Array.from(document.querySelectorAll('[data-testid=\"stMarkdownPre\"] pre'),"
            " p => [p.scrollWidth, p.clientWidth, p.textContent.length]);")
        shoot(driver, tmp_path, "runbook-code")
    assert blocks and max(length for _, _, length in blocks) > 150, blocks
    assert all(scroll <= client + 1 for scroll, client, _ in blocks), blocks


# The static tables' cells: their text, how wide it is and how wide the cell shows it.
EVIDENCE_CELLS = """
return Array.from(document.querySelectorAll('[data-testid="stTable"] td'),
                  c => [c.textContent.trim(), c.scrollWidth, c.clientWidth]);
"""

# The charts whose title runs past the chart's right edge (cut off there).
CHART_TITLES_CUT = """
return Array.from(document.querySelectorAll('[data-testid="stPlotlyChart"]')).flatMap(c => {
    const title = c.querySelector('.gtitle');
    return title && title.getBoundingClientRect().right > c.getBoundingClientRect().right + 1
        ? [title.textContent] : [];
});
"""


@pytest.mark.live
def test_evidence_cells_show_their_whole_text(demo, tmp_path):
    """cpu-throttling's evidence names its signal in 70 characters: the Findings page's
    evidence table shows all of it (wrapped), no cell cut off; no chart's title runs off its
    chart."""
    from fleetscope.dashboard.fleet_sim import Fleet

    fleet = Fleet(nodes=512)
    node = fleet.instances[fleet.faults["cpu-throttling"][0]]
    signal = "time the pool's cgroups sat throttled (throttled_usec / throttled_time)"
    with chromium() as driver:
        query = urllib.parse.urlencode({"rule": "cpu-throttling", "node": node})
        driver.get(f"{demo}findings?{query}")
        wait_for(driver, lambda t: "Likely cause" in t and "Confirm by hand" in t,
                 "the cpu-throttling finding")
        deadline, cells = time.monotonic() + 60, []
        while time.monotonic() < deadline and not cells:  # the table may come a moment later
            cells = driver.execute_script(EVIDENCE_CELLS)
            time.sleep(0.5)
        time.sleep(2)
        titles_cut = driver.execute_script(CHART_TITLES_CUT)
        shoot(driver, tmp_path, "findings-evidence")
    texts = [text for text, _, _ in cells]
    assert signal in texts, texts  # all of it, as text (a data grid paints a cut canvas)
    assert "needs over 50 ms/s" in texts, texts  # as units.reading words it, whole
    assert all(scroll <= client + 1 for _, scroll, client in cells), cells
    assert not titles_cut, titles_cut


@pytest.mark.live
def test_incidents_lead_the_fleet_page_and_the_data_says_its_age(demo, tmp_path):
    """The demo's rack-wide isa-mismatch (one whole rack, its FleetFault) is the first
    incident, above the rows, naming its rack; the sidebar says how old the data is."""
    from fleetscope.dashboard.fleet_sim import Fleet

    rack_nodes = len(Fleet(nodes=512).faults["isa-mismatch"])
    with chromium() as driver:
        driver.get(demo)
        # The sidebar's age caption can come after the main column on a busy machine (as in
        # the bundle-source test below): the page is read once it has both.
        text = wait_for(driver, lambda t: "Incidents" in t and "Findings, worst first" in t
                        and "data up to " in t, "the Fleet page's incidents and the data's age")
        incidents = text[text.index("Incidents"):text.index("Findings, worst first")]
        first = next(line for line in incidents.splitlines() if " · " in line)
        assert "isa-mismatch · critical" in first, incidents[:600]
        assert f"{rack_nodes} nodes · rack " in first, first
        assert re.search(r"data up to .*, [\d.]+ (s|ms|min) ago", text), text[:600]
        shoot(driver, tmp_path, "fleet-incidents")


@pytest.mark.live
def test_the_bandwidth_line_is_drawn_where_the_rule_fires(demo, tmp_path):
    """On a firing node's page the bandwidth chart's red line is labelled with the rule and
    its threshold (80 % of the peak), the peak drawn apart."""
    from fleetscope.dashboard.fleet_sim import Fleet

    fleet = Fleet(nodes=512)
    node = fleet.instances[fleet.faults["memory-bandwidth-saturation"][0]]
    with chromium() as driver:
        driver.get(f"{demo}node?{urllib.parse.urlencode({'node': node})}")
        text = wait_for(driver, lambda t: "Memory bandwidth" in t and "platform peak" in t,
                        "the node's bandwidth chart")
        from selenium.webdriver.common.by import By

        deadline = time.monotonic() + 60
        labels: list[str] = []
        while time.monotonic() < deadline and not any("fires" in t for t in labels):
            labels = [e.text for e in driver.find_elements(By.CSS_SELECTOR,
                                                           "g.annotation-text-g text")]
            time.sleep(0.5)
        fires = [t for t in labels if t.startswith("memory-bandwidth-saturation fires > ")]
        peak = [t for t in labels if t.startswith("platform peak ")]
        assert fires and peak, labels
        shoot(driver, tmp_path, "node-bandwidth")
        assert "memory-bandwidth-saturation fires above 80 % of it" in text


@pytest.mark.live
def test_a_bundle_source_gets_the_nodes_verdict(tmp_path):
    """`fleetscope console --source bundle:PATH` on a one-node bundle: the Fleet page gives
    the node's verdict and the rules not evaluated, not an empty fleet."""
    from tests.conftest import BUNDLES

    with running(tmp_path / "console.log", "console", "--source",
                 f"bundle:{BUNDLES / 'kunpeng-128'}") as url, chromium() as driver:
        driver.get(url)
        # The sidebar's caption can come after the main column's verdict on a busy machine
        # (it failed twice in the suite, never alone): the page is read once it has both.
        text = wait_for(driver, lambda t: "kunpeng-920-128: critical" in t and
                        "(recorded)" in t, "the bundle's verdict and the data's age")
        assert "evaluated and passed" in text and "Not evaluated on this source" in text
        assert "Worst racks" not in text and "Heatmap signal" not in text
        assert "(recorded)" in text  # the data's age, for a recording
        shoot(driver, tmp_path, "bundle-verdict")


# -- deep links that name what is not there (issue 29) ---------------------------------------
# The browser rewrites its address bar from what a page's run puts in st.query_params (AppTest
# sees only the server's side): these read the page and the URL once the page has settled.


@pytest.fixture(scope="module")
def demo_snapshot():
    """The same simulated fleet the demo serves, its rules run: the links name its own nodes
    and rules, whatever the simulator places where."""
    from fleetscope.dashboard import data

    return data.load(f"demo:{DEMO_NODES}")


@pytest.fixture(scope="module")
def demo_findings(demo_snapshot) -> list[dict]:
    return demo_snapshot.findings


def settled(driver, check, what: str, seconds: float = 120) -> tuple[str, dict]:
    """Wait for `check(text)`, then until the page text and the URL stop changing (a
    warning may be drawn and replaced by a rerun, a URL rewritten after the page is drawn):
    the text and the query parameters then."""
    wait_for(driver, check, what, seconds)
    seen: list = []
    for _ in range(60):  # at most ~60 polls; three alike in a row is settled
        seen.append((body_text(driver), driver.current_url))
        if len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3] and "Running..." not in seen[-1][0]:
            break
        time.sleep(1)
    text, url = seen[-1]
    return text, path_and_query(url)[1]


def selectbox_value(driver, label: str) -> str | None:
    """What the selectbox labelled `label` shows, or None when the page has none."""
    from selenium.webdriver.common.by import By

    boxes = [box.get_attribute("value") for box in driver.find_elements(
        By.CSS_SELECTOR, '[data-testid="stSelectbox"] input[role="combobox"]')
        if box.get_attribute("aria-label") == label]
    assert len(boxes) <= 1, (label, boxes)
    return boxes[0] if boxes else None


# The Findings page's heading of the finding it shows: "CRITICAL: oom-kill on r006n16:9105".
FINDING_HEADING = re.compile(r"^([A-Z]+): (\S+) on (\S+)$", re.MULTILINE)


def all_hold(checks: dict[str, bool], text: str, query: dict) -> None:
    """Fail naming every check that did not hold (not only the first), with the URL's query
    and what the page said."""
    failed = [what for what, held in checks.items() if not held]
    assert not failed, (f"{failed}\nthe URL's query: {query}\nthe page says:\n"
                        f"{text[text.find('History range'):][:1500]}")


# The demo's rules rank findings by values that move with its clock, and the demo ran them at
# another minute than the test: nothing expected here depends on the order of findings of
# one rank (a node with a single finding; the last of a rule's many, never its first).


def _nodes_of(findings: list[dict], key: str) -> dict[str, set]:
    """By rule (key "rule") its nodes, by node (key "node") its rules."""
    other = "node" if key == "rule" else "rule"
    by: dict[str, set] = {}
    for f in findings:
        by.setdefault(f[key], set()).add(f[other])
    return by


def _a_node_where(findings: list[dict], rule_fires_not: str) -> str:
    """A flagged node, not the first (a page's fallback), whose one finding is not
    `rule_fires_not`'s."""
    rules_on = _nodes_of(findings, "node")
    return next(f["node"] for f in findings[1:] if f["node"] != findings[0]["node"]
                and rules_on[f["node"]] != {rule_fires_not} and len(rules_on[f["node"]]) == 1)


def _a_lone_finding(findings: list[dict]) -> dict:
    """A finding on neither the first flagged node nor of the first rule (what a page
    falls back to), its rule on one node only: a page showing anything else is caught."""
    first, nodes_of = findings[0], _nodes_of(findings, "rule")
    return next(f for f in findings if f["node"] != first["node"] and f["rule"] != first["rule"]
                and len(nodes_of[f["rule"]]) == 1)


def _a_later_finding(findings: list[dict]) -> dict:
    """The last finding of a rule that fires on several nodes, the only one on its node: a
    page showing that rule's first finding, or the first flagged node, is caught."""
    nodes_of, rules_on = _nodes_of(findings, "rule"), _nodes_of(findings, "node")
    return next(f for f in reversed(findings) if f["node"] != findings[0]["node"]
                and len(nodes_of[f["rule"]]) > 1 and len(rules_on[f["node"]]) == 1)


# A page has answered a link when it shows what the link names, or says it cannot: text that
# comes either way, so a page answering wrongly is read at once, not waited out.
ANSWERED = {
    "node": lambda t: "Findings on this node" in t or "No node" in t,
    "findings": lambda t: ("does not fire on" in t or "finding in this source" in t
                           or "No node" in t or bool(FINDING_HEADING.search(t))),
}


def open_link(driver, demo_url: str, page: str, params: dict, tmp_path: Path,
              shot: str) -> tuple[str, dict]:
    """Load /page?params, wait until the page has answered and settled, shoot it: its text
    and the URL's query parameters then."""
    link = f"{page}?{urllib.parse.urlencode(params)}"
    driver.get(demo_url + link)
    answer = settled(driver, ANSWERED[page], f"an answer to /{link}")
    shoot(driver, tmp_path, shot)
    return answer


@pytest.mark.live
def test_findings_link_to_a_rule_on_a_node_it_does_not_fire_on(shared_demo, demo_findings,
                                                              tmp_path):
    """/findings?rule=R&node=N, R not firing on N: the page says so and shows no finding,
    and the URL still names R and N (once it showed R on another node and put that node in
    the URL)."""
    rule = _a_lone_finding(demo_findings)["rule"]
    node = _a_node_where(demo_findings, rule)
    with chromium() as driver:
        text, query = open_link(driver, shared_demo, "findings", {"rule": rule, "node": node},
                                tmp_path, "findings-rule-not-on-node")
        all_hold({"the URL names R and N": query == {"rule": rule, "node": node},
                  "says R does not fire on N": f"{rule} does not fire on {node}." in text,
                  "shows no finding": not FINDING_HEADING.search(text),
                  "links to N": f"Open {node}" in text}, text, query)


@pytest.mark.live
@pytest.mark.parametrize("with_rule", [True, False], ids=["rule-and-host", "host-alone"])
def test_findings_link_with_the_host_name_opens_the_finding_there(
        shared_demo, demo_findings, tmp_path, with_rule):
    """/findings?rule=R&node=<host>, and /findings?node=<host> alone: R's finding (the node's
    worst) on that host's instance, the instance and R in the URL; not R's first finding,
    nor the worst rule's, on another node."""
    sick = _a_later_finding(demo_findings)
    rule, host = sick["rule"], sick["node"].rpartition(":")[0]
    with chromium() as driver:
        text, query = open_link(driver, shared_demo, "findings",
                                {**({"rule": rule} if with_rule else {}), "node": host},
                                tmp_path, f"findings-by-host-name-{with_rule}")
    shown = [(sick["severity"].upper(), rule, sick["node"])]
    all_hold({"the URL names R and the host's instance":
              query == {"rule": rule, "node": sick["node"]},
              "shows R's finding there": FINDING_HEADING.findall(text) == shown}, text, query)


@pytest.mark.live
def test_node_link_with_the_host_name_alone_opens_that_node(shared_demo, demo_findings,
                                                            tmp_path):
    """/node?node=<host> (as tickets carry it): that node's page, its instance in the URL
    and in the node selector, no warning; once it warned, then opened the first flagged
    node's critical finding and put that node in the URL."""
    sick = _a_lone_finding(demo_findings)
    node = sick["node"]
    mine = [f["rule"] for f in demo_findings if f["node"] == node]
    with chromium() as driver:
        text, query = open_link(driver, shared_demo, "node", {"node": node.rpartition(":")[0]},
                                tmp_path, "node-by-host-name")
        node_box = selectbox_value(driver, "Node")
    all_hold({"the URL names the host's instance": query == {"node": node},
              "the selector shows it": node_box == node,
              "the page is its page": f"{node} · pool " in text
              and f"Findings on this node ({len(mine)})" in text
              and f" · {sick['rule']} · " in text,
              "no warning": "No node" not in text}, text, query)


@pytest.mark.live
def test_node_link_with_a_rule_that_does_not_fire_there_says_so(shared_demo, demo_findings,
                                                                tmp_path):
    """/node?node=N&rule=R, R not firing on N: N's page with a line saying so and what does
    fire there; the URL still names N and R, so a reload says it again."""
    rule = _a_lone_finding(demo_findings)["rule"]
    node = _a_node_where(demo_findings, rule)
    mine = [f["rule"] for f in demo_findings if f["node"] == node]
    with chromium() as driver:
        answer = open_link(driver, shared_demo, "node", {"node": node, "rule": rule},
                           tmp_path, "node-rule-not-on-node")
        for attempt in ("link", "reload"):
            if attempt == "reload":
                driver.refresh()
                answer = settled(driver, ANSWERED["node"], "the same link reloaded")
            text, query = answer
            all_hold({f"{attempt}: the URL names N and R": query == {"node": node, "rule": rule},
                      f"{attempt}: says R does not fire on N, and what does":
                      f"{rule} does not fire on {node}; what does: {', '.join(mine)}." in text,
                      f"{attempt}: the selector shows N": selectbox_value(driver, "Node") == node},
                     text, query)


@pytest.mark.live
@pytest.mark.parametrize(("page", "param", "unknown", "said", "selector", "shown"), [
    ("findings", "rule", "no-such-rule",
     ["No 'no-such-rule' finding in this source (no such rule)."], "Rule (worst first)",
     FINDING_HEADING.search),
    ("node", "node", "no-such-node:9105",
     ["No node 'no-such-node:9105' in this source (instance or host name).",
      "Open the Fleet page"], "Node", re.compile("Findings on this node").search),
    ("findings", "node", "no-such-node:9105",
     ["No node 'no-such-node:9105' in this source (instance or host name).",
      "Open the Fleet page"], "Rule (worst first)", FINDING_HEADING.search),
], ids=["findings-unknown-rule", "node-unknown-node", "findings-unknown-node"])
def test_a_link_to_what_does_not_exist_says_so_and_opens_nothing_else(
        shared_demo, demo_snapshot, tmp_path, page, param, unknown, said, selector, shown):
    """/findings?rule=<no such rule>, /node?node=<no such node>, /findings?node=<no such
    node>: said plainly; no other rule's finding or node's page in its place (nothing to
    choose one with) and the URL unchanged."""
    from fleetscope.dashboard.fleet_frames import node_table

    assert unknown not in {*RULE_IDS, *node_table(demo_snapshot)["instance"]}
    with chromium() as driver:
        text, query = open_link(driver, shared_demo, page, {param: unknown}, tmp_path,
                                f"{page}-unknown-{param}")
        box = selectbox_value(driver, selector)
    all_hold({"the URL names what was asked": query == {param: unknown},
              "says there is none": all(line in text for line in said),
              "shows nothing in its place": not shown(text) and box is None}, text, query)


@pytest.mark.live
def test_a_node_with_harm_leads_with_it_above_its_findings(shared_demo, demo_snapshot,
                                                          tmp_path):
    """/node?node=N, N a demo node whose pool is over its targets: the harm block (the pool,
    what hurts against its target, since when, the rule explaining it) comes first, above
    the node's findings."""
    harm = next(item for item in demo_snapshot.harm if item["explained_by"])
    node, pool, rule = harm["node"], harm["pool"], harm["explained_by"][0]
    with chromium() as driver:
        text, query = open_link(driver, shared_demo, "node", {"node": node}, tmp_path,
                                "node-harm-first")
    top = text.find("Harm now: ")
    findings = text.find("Findings on this node")
    block = text[top:findings]
    all_hold({"the URL names N": query == {"node": node},
              "the harm block comes above the findings": 0 <= top < findings,
              "it names the pool, its target and since when":
              f"pool {pool}: {harm['title']} " in block and "(target " in block
              and " since " in block,
              "it names the rule explaining it": f"← {rule} (" in block}, text, query)


@pytest.mark.live
def test_a_crashing_binary_named_like_a_command_is_quoted_in_the_console(tmp_path):
    """The isa-mismatch scenario with its crashing library renamed `x;reboot #` in the
    kernel log: the Findings page's Action reads `fleetscope isa check 'x;reboot #'`, never
    the bare name an SRE would copy into a shell and run."""
    from tests.conftest import SCENARIOS

    bundle = tmp_path / "hostile-isa"
    shutil.copytree(SCENARIOS / "isa-mismatch", bundle)
    for relative in ("static/dmesg.txt", "static/cmd/sigill-faults.json"):
        path = bundle / relative
        path.write_text(path.read_text().replace("libagentcore.so", "x;reboot #"))
    with running(tmp_path / "console.log", "console", "--source", f"bundle:{bundle}") as url, \
            chromium() as driver:
        driver.get(f"{url}findings?rule=isa-mismatch")
        text = wait_for(driver, lambda t: "Action:" in t and "Confirm by hand" in t,
                        "the isa-mismatch finding")
        shoot(driver, tmp_path, "hostile-action")
    action = next(line for line in text.splitlines() if line.startswith("Action:"))
    assert "fleetscope isa check 'x;reboot #'" in action, action
    assert "check x;reboot" not in text, text
