"""The demo's first page in a real browser: `fleetscope demo` started fresh, headless Chromium
opening its URL.

    python bench/demo_first_page.py [--nodes 4096] [--runs 3] [--vs PYTHON]

Each run starts `fleetscope demo --nodes N --port P` on 127.0.0.1, waits until the server
answers its health check (the time it takes to be ready is printed too: the demo simulates
its fleet before it serves), then opens the URL in headless Chromium (Debian's chromium and
chromium-driver, through selenium; the browser is started once, before the runs) and times:

    first screen   the tiles and the incidents drawn (the page's text holds "Incidents")
    settled        the whole Fleet page drawn: its findings table, its charts, and the app
                   no longer running

`--vs PYTHON`: the same runs under another fleetscope install's interpreter (the anchor,
e.g. the release before), alternated run by run, and the ratio of each measure. Goal: the
first page settled under 3 s (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.e2e.test_console_browser import browser, free_port, stop  # noqa: E402

TARGET_SECONDS = 3.0
SERVER_SECONDS = 300  # a demo not healthy by then has failed


def start_demo(python: str, nodes: int, log: Path) -> tuple[subprocess.Popen, str, float]:
    """A fresh demo server: (process, URL, seconds until it answered its health check)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen([python, "-m", "fleetscope", "demo", "--nodes", str(nodes),
                                 "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                cwd=None if python == sys.executable else "/")
    deadline = time.monotonic() + SERVER_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the demo exited with {proc.returncode}: {log.read_text()[-500:]}")
        try:
            with urllib.request.urlopen(f"{url}_stcore/health", timeout=5) as response:
                if response.read() == b"ok":
                    return proc, url, time.perf_counter() - started
        except OSError:
            pass
        time.sleep(0.05)
    stop(proc)
    raise RuntimeError(f"the demo was not healthy in {SERVER_SECONDS} s")


SETTLED = """
const app = document.querySelector('[data-testid="stApp"]');
return [document.body.innerText,
        app ? app.getAttribute('data-test-script-state') : null,
        document.querySelectorAll('.js-plotly-plot').length];
"""


def open_page(driver, url: str, seconds: float = 120) -> tuple[float, float]:
    """(seconds to the first screen, seconds to the settled page) from the browser's
    opening of `url`."""
    started = time.perf_counter()
    driver.get(url)
    first = None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text, state, charts = driver.execute_script(SETTLED)
        now = time.perf_counter() - started
        if first is None and "Incidents" in text:
            first = now
        if (first is not None and "Findings, worst first" in text and charts
                and state == "notRunning"):
            return first, now
        time.sleep(0.02)
    raise RuntimeError(f"the page did not settle in {seconds:g} s")


def one_run(driver, python: str, nodes: int, log: Path) -> dict:
    proc, url, ready = start_demo(python, nodes, log)
    try:
        first, settled = open_page(driver, url)
    finally:
        stop(proc)
    driver.get("about:blank")
    return {"ready": ready, "first": first, "settled": settled}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--vs", metavar="PYTHON", help="another install's interpreter")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    import shutil
    import tempfile


    logs = Path(tempfile.mkdtemp(prefix="demo-bench-"))
    driver, profile = browser()
    sides = {"this": sys.executable, **({"anchor": args.vs} if args.vs else {})}
    results: dict[str, list[dict]] = {side: [] for side in sides}
    try:
        for run in range(args.runs):
            for side, python in (reversed(sides.items()) if run % 2 else sides.items()):
                result = one_run(driver, python, args.nodes, logs / f"{side}-{run}.log")
                results[side].append(result)
                print(f"run {run + 1} {side}: ready {result['ready']:.2f} s, first screen "
                      f"{result['first']:.2f} s, settled {result['settled']:.2f} s",
                      flush=True)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
    print(f"\nfleetscope demo --nodes {args.nodes}, {args.runs} runs, medians:")
    for side, runs in results.items():
        medians = {k: statistics.median(r[k] for r in runs) for k in ("ready", "first",
                                                                        "settled")}
        print(f"  {side} ({sides[side]}): ready {medians['ready']:.2f} s, first screen "
              f"{medians['first']:.2f} s, settled {medians['settled']:.2f} s "
              f"({medians['settled'] / TARGET_SECONDS:.2f}x the {TARGET_SECONDS:g} s goal)")
    if args.vs:
        for key in ("ready", "first", "settled"):
            ratios = sorted(a[key] / b[key] for a, b in zip(results["this"], results["anchor"],
                                                            strict=True))
            print(f"  {key}: this / anchor {statistics.median(ratios):.2f}x "
                  f"(min-max {ratios[0]:.2f}-{ratios[-1]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
