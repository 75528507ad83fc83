"""The session's query engines, started once: a simulated fleet (every rule's fault on known
nodes, two CPU steppings) in a real Prometheus, which evaluates `fleetscope rules export`
every 5 s (alerts and recording rules), and in a real VictoriaMetrics, on which vmalert
evaluates the same file (alerts to a real Alertmanager, recorded series to a VictoriaMetrics
of their own), all on 127.0.0.1.

The `engine_fleet` fixture (tests/conftest.py) starts them itself, or attaches to the ones a
long-lived process started earlier: `python3 -m tests.session_servers DIR` starts them,
writes DIR/state.json when every server answers and keeps them until it is terminated (or its
lifetime ends). .ci/run starts it before the parallel group, so the alerts' longest `for:` has
passed by the time the serial group asks for them, instead of each run waiting five minutes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ENGINE_FLEET_NODES = 64
# Eight minutes of history before the start, and data for the next 80 minutes: the servers
# are started at the session's first use (or before the suite) and read until it ends.
ENGINE_FLEET_AHEAD_MINUTES = 80
ENGINE_FLEET_MINUTES = 8 + ENGINE_FLEET_AHEAD_MINUTES
LIFETIME_S = 3 * 3600  # a server process nobody stops ends by itself after this
STATE = "state.json"
FAILED = "failed.txt"


def fleet_bench():
    """bench/fleet_prometheus.py, imported (it builds fleets and starts engines)."""
    name = "fleet_prometheus"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parent.parent / "bench" / "fleet_prometheus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Endpoint:
    """A server started by another process: the tests need only its URL."""

    name: str
    url: str


def start_engine_fleet(workdir: Path) -> tuple[dict, list]:
    """Build the fleet's samples in `workdir` and start the engines: (the state a test needs,
    as JSON-ready values; the started processes, to stop)."""
    bench = fleet_bench()
    workdir.mkdir(parents=True, exist_ok=True)
    _nodes, _profiles, start_s, _points = bench.build(
        ENGINE_FLEET_NODES, ENGINE_FLEET_MINUTES, workdir, False, ["prometheus", "vm"],
        ENGINE_FLEET_AHEAD_MINUTES)
    rule_file = workdir / "fleetscope.rules.yml"
    subprocess.run([sys.executable, "-m", "fleetscope", "rules", "export", "-o",
                    str(rule_file)], check=True, timeout=120)
    engines, evaluators = {}, {}
    try:
        engines["prometheus"] = bench.start_prometheus(workdir / "fleet.om", workdir,
                                                       rule_file, "5s")
        engines["victoriametrics"] = bench.start_victoria(workdir / "fleet.prom", workdir)
        evaluators = dict(zip(("vmalert", "alertmanager", "vmalert-store"),
                              bench.start_vmalert(engines["victoriametrics"].url, rule_file,
                                                  workdir, "5s"), strict=True))
    except BaseException:
        for process in [*evaluators.values(), *engines.values()]:
            process.stop()
        raise
    state = {"engines": {name: e.url for name, e in engines.items()},
             "evaluators": {name: e.url for name, e in evaluators.items()},
             "start_s": start_s, "workdir": str(workdir), "rule_file": str(rule_file),
             "started": time.time()}
    return state, [*evaluators.values(), *engines.values()]


def fleet_from_state(state: dict) -> dict:
    """What the tests read of the engine fleet (`engine_fleet`), from its state."""
    bench = fleet_bench()
    nodes = bench.plan(ENGINE_FLEET_NODES)
    profiles = bench.load_profiles(False)
    return {"bench": bench, "nodes": nodes,
            "engines": {n: Endpoint(n, url) for n, url in state["engines"].items()},
            "evaluators": {n: Endpoint(n, url) for n, url in state["evaluators"].items()},
            # each node's injected fault, as its profile names it: the ground truth
            "expected": {profile: bench.injected(profile) for profile in profiles},
            "start_s": state["start_s"], "workdir": Path(state["workdir"]),
            "rule_file": Path(state["rule_file"]), "started": state["started"]}


def attach(directory: Path, seconds: float = 900) -> dict:
    """The state written by `python3 -m tests.session_servers DIRECTORY`, waiting (bounded)
    while it starts; RuntimeError if it failed or did not finish in time."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (directory / FAILED).exists():
            raise RuntimeError("the session's servers did not start: "
                               + (directory / FAILED).read_text()[-2000:])
        if (directory / STATE).exists():
            return json.loads((directory / STATE).read_text())
        time.sleep(1)
    raise RuntimeError(f"the session's servers did not start within {seconds:g} s")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 -m tests.session_servers DIRECTORY", file=sys.stderr)
        return 2
    directory = Path(argv[0])
    directory.mkdir(parents=True, exist_ok=True)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    try:
        state, processes = start_engine_fleet(directory / "engine-fleet")
    except Exception as error:  # one line for the test that attaches
        (directory / FAILED).write_text(f"{type(error).__name__}: {error}\n")
        return 1
    try:
        partial = directory / (STATE + ".part")
        partial.write_text(json.dumps(state))
        os.replace(partial, directory / STATE)  # whole or absent for a reader
        end = time.monotonic() + LIFETIME_S
        while not stopping and time.monotonic() < end:
            time.sleep(0.5)
    finally:
        for process in processes:
            process.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
