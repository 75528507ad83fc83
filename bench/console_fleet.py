"""Console at fleet scale: the Fleet page on a simulated 4,096-node x 128-core fleet.

    python bench/console_fleet.py [--nodes 4096]

Prints, in one fresh process: the time to build the fleet and run the catalog's rules over it
(the Fleet page's first, uncached render pays it once per source), the time of each data
function the Fleet page calls, the Fleet page's server render under Streamlit's AppTest cold
and warm (cached), and the process RSS. Targets: render < 3 s, RSS < 1.5 GB.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
TARGET_SECONDS = 3.0
TARGET_RSS = 1.5 * 1024**3


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timed(label: str, function, *args):
    start = time.perf_counter()
    value = function(*args)
    elapsed = time.perf_counter() - start
    print(f"  {label:<38} {elapsed:7.3f} s")
    return value, elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4096)
    args = parser.parse_args()
    from fleetscope.dashboard import data, fleet_frames

    spec = f"demo:{args.nodes}"
    print(f"fleet: {args.nodes:,} nodes x 128 cores; load average before the run "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print("data functions (no cache):")
    snap, load_s = timed("build fleet, rules + recordings (load)", data.load, spec)
    nodes, a = timed("node_table", fleet_frames.node_table, snap)
    signals, b = timed("node_signals (8 recorded signals)", fleet_frames.node_signals, snap)
    findings, c = timed("findings_frame", fleet_frames.findings_frame, snap.findings)
    _, d = timed("rule_counts", fleet_frames.rule_counts, findings)
    _, e = timed("health_by pool + rack",
                 lambda: (fleet_frames.health_by(nodes, findings, "node_pool"),
                          fleet_frames.health_by(nodes, findings, "rack")))
    health = fleet_frames.node_health(nodes, findings)
    _, f = timed("heatmap grid (health signal)",
                 lambda: fleet_frames.heatmap(nodes, fleet_frames.with_health(signals, health),
                                              "health"))
    first_rule = findings["rule"].iloc[0]
    _, g = timed("grouping of one rule (4 dimensions)",
                 lambda: [fleet_frames.rule_grouping(nodes, findings, first_rule, d)
                          for d in fleet_frames.GROUPINGS] + [fleet_frames.grouping_summary(
                              nodes, findings, first_rule)])
    dimension = next(iter(fleet_frames.GROUPINGS))
    top_group = fleet_frames.rule_grouping(nodes, findings, first_rule, dimension)["group"][0]
    _, h = timed("its top group beside healthy peers",
                 lambda: fleet_frames.peer_comparison(
                     health, fleet_frames.with_health(signals, health), findings, first_rule,
                     dimension, top_group))
    _, i = timed("findings search (two words)",
                 fleet_frames.search_findings, findings, nodes, f"{first_rule} r0")
    page_s = a + b + c + d + e + f + g + h + i
    print(f"  {'Fleet page frames, given the load':<38} {page_s:7.3f} s")
    print(f"  {'; '.join(snap.notes)}; findings {len(snap.findings):,}, rules firing "
          f"{findings['rule'].nunique()}")
    del snap

    from streamlit.testing.v1 import AppTest

    os.environ[data.SOURCE_ENV] = spec
    print("Fleet page server render (AppTest):")
    # Streamlit's own first run in a process (it scans every installed package for
    # components: half a second here) happens when `fleetscope console` starts its server,
    # before anyone opens a page: done here first, so "cold" is the page's own cold start.
    warmup = AppTest.from_string("import streamlit as st\nst.write('up')", default_timeout=60)
    warmup.run()
    app = AppTest.from_file(str(APP), default_timeout=300)
    # AppTest (not a server) rescans every installed package for components on each new
    # instance's first run: the warm-up's scan is handed on, as a server scans once at start.
    if getattr(warmup, "_bidi_component_manager", None) is not None:
        app._bidi_component_manager = warmup._bidi_component_manager
    start = time.perf_counter()
    app.run()
    cold = time.perf_counter() - start
    assert not app.exception, [x.message for x in app.exception]
    start = time.perf_counter()
    app.run()
    warm = time.perf_counter() - start
    print(f"  {'cold (builds and caches the source)':<38} {cold:7.3f} s")
    print(f"  {'warm (cached: every later view)':<38} {warm:7.3f} s")
    print(f"  load average after the run {os.getloadavg()[0]:.2f}")
    rss = rss_bytes()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"RSS now {rss / 1024**2:,.0f} MiB, peak {peak / 1024**2:,.0f} MiB")
    ok = cold < TARGET_SECONDS and peak < TARGET_RSS
    print(f"targets: render < {TARGET_SECONDS:g} s (cold {cold:.2f} s, warm {warm:.2f} s), "
          f"RSS < 1.5 GB: {'met' if ok else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
