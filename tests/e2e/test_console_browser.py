"""End to end: `fleetscope demo` on a free 127.0.0.1 port, loaded in headless Chromium.

Waits until the Fleet page shows every injected rule, checks the counts, and saves a
screenshot (kept in $FLEETSCOPE_SCREENSHOT_DIR when set, else in the test's tmp dir).
Chromium comes from Debian (`chromium`, `chromium-driver`); outside CI a machine without
them skips, in CI that is a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from fleetscope.rules.catalog import RULE_IDS
from tests.conftest import require_tool

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1600,2300")


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
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


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
    return webdriver.Chrome(service=Service(driver_path), options=options), profile


@pytest.mark.live
def test_demo_fleet_page_in_chromium(demo, tmp_path):
    from selenium.webdriver.common.by import By

    driver, profile = browser()
    try:
        driver.set_page_load_timeout(60)
        driver.get(demo)
        deadline = time.monotonic() + 120
        text = ""
        while time.monotonic() < deadline:
            text = driver.find_element(By.TAG_NAME, "body").text
            if all(rule in text for rule in RULE_IDS) and "Findings, worst first" in text:
                break
            time.sleep(1)
        missing = [rule for rule in RULE_IDS if rule not in text]
        assert not missing, f"the Fleet page does not show {missing}"
        assert f"rules firing\n{len(RULE_IDS)}" in text
        assert "nodes\n512" in text
        assert "Error" not in text and "Traceback" not in text
        time.sleep(2)  # let the charts finish drawing
        shot = tmp_path / "fleet.png"
        driver.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert shot.stat().st_size > 50_000  # a drawn page, not a blank one
        keep = os.environ.get("FLEETSCOPE_SCREENSHOT_DIR")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, Path(keep) / "fleet.png")
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
