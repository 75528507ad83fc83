"""`fleetscope demo` started from a folder that holds a directory named `fleetscope` (the
folder a clone usually sits in): the Fleet page still draws in headless Chromium.

Streamlit is run with `python -m`, which puts the working directory first on sys.path; a
`fleetscope` directory there shadowed the installed package (an editable install's modules
are found after sys.path), and the page showed only an ImportError.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_console_browser import browser, free_port, stop, wait_for, wait_healthy


@pytest.mark.live
def test_demo_from_a_folder_holding_a_fleetscope_directory(tmp_path):
    home = tmp_path / "home"
    (home / "fleetscope" / "fleetscope").mkdir(parents=True)  # a clone's layout, no code
    (home / "fleetscope" / "README.md").write_text("a clone\n")
    port = free_port()
    log_path = tmp_path / "demo.log"
    with open(log_path, "w") as log:
        # The console script, as a user types it (`python -m` would itself put the folder
        # first on sys.path before fleetscope is imported).
        command = shutil.which("fleetscope", path=str(Path(sys.executable).parent))
        assert command, "the fleetscope console script is not installed beside this Python"
        proc = subprocess.Popen([command, "demo", "--nodes", "64", "--port", str(port)],
                                cwd=home, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    driver = profile = None
    try:
        wait_healthy(url, proc)
        driver, profile = browser()
        driver.set_page_load_timeout(60)
        driver.get(url)
        text = wait_for(driver, lambda t: "Worst racks" in t or "Error" in t,
                        "the Fleet page")
        assert "ImportError" not in text and "Error" not in text, text[:1000]
        assert "nodes\n64" in wait_for(driver, lambda t: "nodes\n64" in t, "the node count")
    finally:
        if driver is not None:
            driver.quit()
            shutil.rmtree(profile, ignore_errors=True)
        stop(proc)
    assert "Traceback" not in log_path.read_text()
