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

from tests.e2e.test_console_browser import chromium, free_port, stop, wait_for, wait_healthy


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
    try:
        text = read_page(f"http://127.0.0.1:{port}/", proc,
                         lambda t: "nodes\n64" in t or "Error" in t, "the Fleet page")
    finally:
        stop(proc)
    assert "ImportError" not in text and "Error" not in text, text[:1000]
    assert "Traceback" not in log_path.read_text()


def read_page(url: str, proc: subprocess.Popen, check, what: str) -> str:
    """One page load in headless Chromium, once the server is healthy: the text `check`
    waited for."""
    wait_healthy(url, proc)
    with chromium() as driver:
        driver.get(url)
        return wait_for(driver, check, what)


@pytest.mark.live
def test_an_exception_on_a_page_also_goes_to_stderr(tmp_path):
    """The console's own Streamlit command line on a page that raises: the traceback is on
    the page and on stderr (where systemd and the terminal look), not only on stdout."""
    from fleetscope.dashboard.launch import APP, streamlit_args

    page = tmp_path / "broken.py"
    page.write_text("raise RuntimeError('fleetscope-test-page-broke')\n")
    port = free_port()
    args = [str(page) if arg == str(APP) else arg for arg in streamlit_args("127.0.0.1", port)]
    stdout, stderr = open(tmp_path / "out.log", "w"), open(tmp_path / "err.log", "w")
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=stdout, stderr=stderr,
                            start_new_session=True)
    try:
        read_page(f"http://127.0.0.1:{port}/", proc,
                  lambda t: "fleetscope-test-page-broke" in t, "the page's exception")
    finally:
        stop(proc)
        stdout.close()
        stderr.close()
    logged = (tmp_path / "err.log").read_text()
    assert "RuntimeError: fleetscope-test-page-broke" in logged, logged[-2000:]
