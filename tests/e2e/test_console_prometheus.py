"""End to end on a real Prometheus holding hours of data: `fleetscope console --source
prometheus:URL` in headless Chromium at 1600x1000.

Three simulated nodes (bench/fleet_prometheus.py's profiles: one with the oom-kill fault,
one healthy and busy, one with roce-congestion) backfilled with `promtool tsdb
create-blocks-from openmetrics`, 2.5 h at 15 s ending 20 minutes past now, and Prometheus
over the blocks on 127.0.0.1. What the
console draws is compared with the timestamps written into the blocks, not with its own
answers. A second Prometheus holds a node whose data stopped 20 minutes ago. Every process
started here (Prometheus, the console) is stopped by its pid.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
import urllib.parse

import pytest

from tests.conftest import fleet_bench, require_tool
from tests.e2e.test_console_browser import (
    chromium,
    free_port,
    path_and_query,
    shoot,
    stop,
    wait_for,
    wait_healthy,
)

MINUTES_OF_DATA = 150  # more than one hour, less than the sidebar's 3 h and 6 h
AHEAD_S = 20 * 60  # the data runs this far past now: "now" stays inside it on a slow run
FAULTY, HEALTHY, CONGESTED = "node-00000:9105", "node-00001:9105", "node-00002:9105"


@pytest.fixture(scope="module")
def hours_of_prometheus(tmp_path_factory):
    """Prometheus over 2.5 h of three nodes and the console on it: (console URL, Prometheus URL,
    first and last backfilled sample in epoch seconds, the profiles written)."""
    require_tool("promtool")
    require_tool("prometheus")
    bench = fleet_bench()
    workdir = tmp_path_factory.mktemp("hours-of-prometheus")
    profiles = bench.load_profiles()
    fleet = [bench.Node(FAULTY, "oom-kill", "r000", "pool-a", "r1p1"),
             bench.Node(HEALTHY, "healthy-busy", "r000", "pool-a", "r1p1"),
             bench.Node(CONGESTED, "roce-congestion", "r000", "pool-a", "r1p1")]
    points = MINUTES_OF_DATA * 60 // bench.STEP_S + 1
    start_s = int((time.time() + AHEAD_S) // bench.STEP_S * bench.STEP_S) - (
        points - 1) * bench.STEP_S
    bench.write_samples(workdir / "fleet.om", fleet, profiles, start_s, points, True)
    last_s = start_s + (points - 1) * bench.STEP_S
    engine = bench.start_prometheus(workdir / "fleet.om", workdir)
    proc = log = None
    try:
        port = free_port()
        log = open(workdir / "console.log", "w")  # noqa: SIM115 (closed below)
        # times drawn in UTC, so the charts' wall-clock x values read as epoch seconds
        proc = subprocess.Popen([sys.executable, "-m", "fleetscope", "console", "--source",
                                 f"prometheus:{engine.url}", "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "FLEETSCOPE_CONSOLE_TZ": "UTC"})
        url = f"http://127.0.0.1:{port}/"
        wait_healthy(url, proc)
        yield {"url": url, "prometheus": engine.url, "first_s": start_s, "last_s": last_s,
               "profiles": profiles}
    finally:
        if proc is not None:
            stop(proc)
        if log is not None:
            log.close()
        engine.stop()


# Each chart's title and its traces' first and last x (Plotly keeps them on the graph div).
CHART_XS = """
return Array.from(document.querySelectorAll('.js-plotly-plot'), p => ({
  title: String((p.layout && p.layout.title && p.layout.title.text) || ''),
  xs: (p.data || []).filter(t => t.x && t.x.length).map(t => [t.x[0], t.x[t.x.length - 1]])}))
"""


def _epoch(text: str) -> float:
    """A chart's x value (wall-clock time in the console's zone, UTC here) as epoch seconds."""
    return dt.datetime.fromisoformat(str(text).replace(" ", "T")).replace(
        tzinfo=dt.timezone.utc).timestamp()


def drawn_span(driver, title: str, seconds: float = 120) -> tuple[float, float]:
    """First and last time drawn by the chart whose title holds `title`, over its traces."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        charts = [c for c in driver.execute_script(CHART_XS) if title in c["title"]]
        xs = [x for c in charts for trace in c["xs"] for x in trace]
        if xs:
            stamps = [_epoch(x) for x in xs]
            return min(stamps), max(stamps)
        time.sleep(0.5)
    raise AssertionError(f"no {title!r} chart drawn at {driver.current_url}")


def choose_range(driver, label: str) -> None:
    """Pick `label` in the sidebar's History range (a combo box: open it, click the
    option)."""
    from selenium.webdriver.common.by import By

    opener = driver.find_element(By.CSS_SELECTOR, '[data-testid="stSidebar"] '
                                 '[data-testid="stSelectbox"] button[aria-haspopup="listbox"]')
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", opener)
    opener.click()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        options = [o for o in driver.find_elements(By.CSS_SELECTOR, '[role="option"]')
                   if o.text.strip() == label]
        if options:
            options[0].click()
            return
        time.sleep(0.3)
    raise AssertionError(f"no {label!r} in the History range select")


def node_page(driver, range_label: str) -> str:
    """Wait for the Node page drawn over `range_label` (its caption says the range)."""
    return wait_for(driver, lambda t: f"history: the last {range_label}" in t
                    and "Busy across cores" in t, f"the Node page over {range_label}", 180)


@pytest.mark.live
def test_the_history_range_sets_the_span_drawn_keeps_it_in_the_url_and_across_a_reload(
        hours_of_prometheus, tmp_path):
    """On 2.5 h of backfilled data: `?range=1+h` draws the last hour only; 6 h chosen in the
    sidebar goes into the URL and draws every backfilled sample from the first; a reload of
    that URL draws the same."""
    from fleetscope.core import units

    fleet = hours_of_prometheus
    first_s, last_s = fleet["first_s"], fleet["last_s"]
    step = 60  # the node loader's widest step for these ranges (at most 720 points a range)
    link = f"{fleet['url']}node?{urllib.parse.urlencode({'node': HEALTHY, 'range': '1 h'})}"
    with chromium() as driver:
        driver.get(link)
        text = node_page(driver, "1 h")
        assert "its data from" not in text  # the hour is all data
        first, last = drawn_span(driver, "Busy across cores")
        shoot(driver, tmp_path, "prometheus-node-1h")
        assert path_and_query(driver.current_url)[1].get("range") == "1 h"
        assert first_s <= first and last <= last_s, (first_s, first, last, last_s)
        assert 3600 - step <= last - first <= 3600, (first, last)
        # an hour drawn of 2.5 h backfilled: the first hour of the data is not on the chart
        assert first - first_s > 3600, (first_s, first)

        choose_range(driver, "6 h")
        wait_for(driver, lambda t: path_and_query(driver.current_url)[1].get("range") == "6 h",
                 "range=6 h in the URL", 60)
        text = node_page(driver, "6 h")
        for when in ("chosen", "reloaded"):
            first, last = drawn_span(driver, "Busy across cores")
            # every backfilled sample from the first (within the loader's step) to now
            assert first_s <= first < first_s + step, (when, first_s, first)
            # and the caption says the 6 h asked for hold 2.5 h of data, from when
            assert f"its data from {units.local_time(first, dt.timezone.utc)}" in text, (
                when, text[:1500])
            assert last <= last_s and last - first > MINUTES_OF_DATA * 60 - AHEAD_S - step, (
                when, first, last, last_s)
            shoot(driver, tmp_path, f"prometheus-node-6h-{when}")
            if when == "chosen":
                driver.refresh()
                text = node_page(driver, "6 h")
                assert path_and_query(driver.current_url)[1].get("range") == "6 h"


@pytest.mark.live
def test_a_findings_evidence_charts_come_from_prometheus(hours_of_prometheus):
    """The node's history a Prometheus source loads holds the series of its finding's
    evidence views: each oom-kill view whose series were backfilled for the node is drawn."""
    from fleetscope.dashboard import data, evidence_frames, evidence_views

    backfilled = {s.name for s in hours_of_prometheus["profiles"]["oom-kill"]}
    expected = {panel.title for panel in evidence_views.views_for("oom-kill")
                if panel.expr.metrics() <= backfilled}
    assert expected
    snap = data.load_prometheus(hours_of_prometheus["prometheus"])
    history = snap.node_loader(FAULTY, 3600)
    drawn = {panel.title for panel, _ in evidence_frames.evidence_panels("oom-kill", history)}
    assert expected <= drawn, sorted(expected - drawn)


# Each chart's bounding box and the text drawn in it (titles, axis titles, tick labels).
CHART_TEXT = """
return Array.from(document.querySelectorAll('.js-plotly-plot'), p => {
  const box = p.getBoundingClientRect();
  return {title: String((p.layout && p.layout.title && p.layout.title.text) || ''),
          left: box.left, right: box.right,
          texts: Array.from(p.querySelectorAll('.main-svg text'), t => {
            const r = t.getBoundingClientRect();
            return [t.textContent, r.left, r.right];}).filter(t => t[0])};})
"""


@pytest.mark.live
@pytest.mark.parametrize("rule,node", [("oom-kill", FAULTY), ("roce-congestion", CONGESTED)])
def test_the_evidence_bars_say_how_to_read_them_in_full(hours_of_prometheus, tmp_path, rule,
                                                        node):
    """The Findings page's "Evidence against its threshold" (a narrow column) shows how to
    read the bars and its signals' names whole: no text past the chart's edges, whatever
    the length of the signal's name (roce-congestion's is long)."""
    link = (f"{hours_of_prometheus['url']}findings?"
            f"{urllib.parse.urlencode({'rule': rule, 'node': node})}")
    with chromium() as driver:
        driver.get(link)
        wait_for(driver, lambda t: "Evidence against its threshold" in t and "Runbook" in t,
                 f"the {rule} finding's evidence bars", 180)
        deadline = time.monotonic() + 60
        charts: list[dict] = []
        while time.monotonic() < deadline and not any(
                "1x at it" in "".join(t[0] for t in c["texts"]) for c in charts):
            charts = [c for c in driver.execute_script(CHART_TEXT)
                      if "Evidence against" in c["title"]]
            time.sleep(0.5)
        shoot(driver, tmp_path, f"prometheus-findings-evidence-bars-{rule}")
        assert charts and any("1x at it" in "".join(t[0] for t in c["texts"])
                              for c in charts), charts
        for chart in charts:
            for text, left, right in chart["texts"]:
                assert chart["left"] <= left and right <= chart["right"], (
                    text, left, right, chart["left"], chart["right"])


@pytest.mark.live
def test_the_bandwidth_chart_knows_the_peak_the_rules_ratio_is_over(hours_of_prometheus,
                                                                    tmp_path):
    """A Prometheus holding the exporter's bandwidth and its ratio to the platform peak (what
    the rules read) but not the peak series: the Node page gives the bandwidth as the share
    of the peak that was backfilled, never "no platform peak known" beside a finding that
    names that share."""
    from fleetscope.core import units

    written = {s.name: s for s in hours_of_prometheus["profiles"]["healthy-busy"]}
    assert "fleetscope_memory_bandwidth_peak_bytes_per_second" not in written
    ratio = written["fleetscope_memory_bandwidth_utilization_ratio"].first
    link = f"{hours_of_prometheus['url']}node?{urllib.parse.urlencode({'node': HEALTHY})}"
    with chromium() as driver:
        driver.get(link)
        text = wait_for(driver, lambda t: "DRAM bandwidth now" in t, "the bandwidth chart", 180)
        shoot(driver, tmp_path, "prometheus-node-bandwidth")
        caption = next(line for line in text.splitlines() if "DRAM bandwidth now" in line)
        assert "no platform peak known" not in caption, caption
        assert f"({units.format_value(ratio, 'ratio')}; memory-bandwidth-saturation fires" \
            in caption, (caption, ratio)


@pytest.fixture(scope="module")
def stopped_prometheus(tmp_path_factory):
    """Prometheus holding an hour of one node that stopped being scraped 20 minutes ago (the
    data ends there): (its URL, the last sample written, epoch seconds)."""
    require_tool("promtool")
    require_tool("prometheus")
    bench = fleet_bench()
    workdir = tmp_path_factory.mktemp("stopped-prometheus")
    profiles = bench.load_profiles()
    points = 60 * 60 // bench.STEP_S + 1
    last_s = int((time.time() - 20 * 60) // bench.STEP_S * bench.STEP_S)
    bench.write_samples(workdir / "fleet.om",
                        [bench.Node(HEALTHY, "healthy-busy", "r000", "pool-a", "r1p1")],
                        profiles, last_s - (points - 1) * bench.STEP_S, points, True)
    engine = bench.start_prometheus(workdir / "fleet.om", workdir)
    try:
        yield engine.url, last_s
    finally:
        engine.stop()


@pytest.mark.live
def test_a_prometheus_without_current_data_says_so_and_since_when(monkeypatch,
                                                                  stopped_prometheus):
    """Nothing within the engine's 5-minute look-back: not "0 nodes, data up to now, no rule
    fires" but an error naming the newest sample written, and the data called stale."""
    from fleetscope.core import units
    from tests.test_dashboard_app import run_app

    url, last_s = stopped_prometheus
    app = run_app(monkeypatch, f"prometheus:{url}")
    errors = [e.value for e in app.error]
    assert any("No current data" in e and units.local_time(last_s) in e for e in errors), (
        errors, units.local_time(last_s))
    stale = [w.value for w in app.sidebar.warning]
    assert any(units.local_time(last_s) in w and "stale" in w for w in stale), stale
