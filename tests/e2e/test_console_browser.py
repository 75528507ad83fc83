"""End to end: `fleetscope demo` on a free 127.0.0.1 port, loaded in headless Chromium.

Waits until the Fleet page shows its counts; clicks the first critical finding and follows it
to its node, its runbook and a related runbook, then reloads the node's deep link; shoots
every page at 1600x1000. Screenshots of each step stay in the test's tmp dir (and are copied
to $FLEETSCOPE_SCREENSHOT_DIR when set).
Chromium comes from Debian (`chromium`, `chromium-driver`); outside CI a machine without
them skips, in CI that is a failure.
"""

from __future__ import annotations

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


@pytest.fixture
def demo(tmp_path):
    port = free_port()
    log = open(tmp_path / "demo.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([sys.executable, "-m", "fleetscope", "demo", "--nodes", "512",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        stop(proc)
        log.close()


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def browser():
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


@contextlib.contextmanager
def chromium():
    """A headless Chromium at 1600x1000, quit and its profile removed however the test
    ends."""
    driver, profile = browser()
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


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


def click_first_row(driver, table_index: int = 0) -> None:
    """Select the first row of a st.dataframe (a canvas grid): its row-marker cell."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    frame = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stDataFrame"]')[table_index]
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
    driver, profile = browser()
    try:
        driver.set_page_load_timeout(60)
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
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.live
def test_click_through_from_a_critical_finding_to_its_runbooks_and_back(demo, tmp_path):
    """Fleet -> first critical finding -> its node with the finding open -> its runbook ->
    a related runbook -> the node's deep link reloaded: the same page."""
    driver, profile = browser()
    try:
        driver.set_page_load_timeout(60)
        driver.get(demo + "fleet")  # a pasted /fleet link opens the Fleet page
        text = wait_for(driver, lambda t: "Findings, worst first" in t and "Worst racks" in t,
                        "the Fleet page at /fleet")
        assert "Page not found" not in text
        shoot(driver, tmp_path, "1-fleet")
        click_first_row(driver)
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
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.live
def test_every_page_at_1600x1000(demo, tmp_path):
    """A screenshot of every page at 1600x1000, none with an error or "Page not found"."""
    driver, profile = browser()
    try:
        driver.set_page_load_timeout(60)
        for path, marker in (("fleet", "Worst racks"), ("node", "Cores"),
                             ("findings", "Runbook"), ("latency", "model inference"),
                             ("rules", "rules in the catalog"),
                             ("runbook?rule=roce-congestion", "Related runbooks")):
            driver.get(demo + path)
            text = wait_for(driver, lambda t, m=marker: m in t, f"the {path} page")
            assert "Page not found" not in text and "Traceback" not in text, path
            shoot(driver, tmp_path, f"page-{path.split('?')[0]}")
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.live
def test_a_heatmap_cell_opens_its_node(demo, tmp_path):
    """A click on a heatmap cell (a transparent marker over it: Plotly does not select
    heatmap cells) opens the Node page of the node in that cell."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.common.by import By

    driver, profile = browser()
    try:
        driver.set_page_load_timeout(60)
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
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


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
    assert "> 50 ms/s" in texts, texts  # as written (Markdown would make "> " a quote)
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
        text = wait_for(driver, lambda t: "Incidents" in t and "Findings, worst first" in t,
                        "the Fleet page's incidents")
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

    port = free_port()
    log = open(tmp_path / "console.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([sys.executable, "-m", "fleetscope", "console", "--source",
                             f"bundle:{BUNDLES / 'kunpeng-128'}", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_healthy(url, proc)
        with chromium() as driver:
            driver.get(url)
            text = wait_for(driver, lambda t: "kunpeng-920-128: critical" in t,
                            "the bundle's verdict")
            assert "evaluated and passed" in text and "Not evaluated on this source" in text
            assert "Worst racks" not in text and "Heatmap signal" not in text
            assert "(recorded)" in text  # the data's age, for a recording
            shoot(driver, tmp_path, "bundle-verdict")
    finally:
        stop(proc)
        log.close()
