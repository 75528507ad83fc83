"""Shared test helpers: real exporter processes on 127.0.0.1, fixture bundles, tool checks.

The generated fixture trees (BUNDLES, SCENARIOS) are not committed: the session fixture
`generated_trees` writes them once per run into GENERATED, a temporary directory that
pytest-xdist's workers share (tests/fixture_trees.py; their hashes are in
tests/fixtures/generated.sha256).

Tests marked `live` run real processes (faults, servers, browsers), one at a time. Tests on the
session's query engines (`engine_fleet`) and under tests/e2e are marked `live` and `served` here:
they read servers and judge nothing of this node, so .ci/run runs them serially beside the
parallel group (the tests not `live`); the rest of `live` (real faults on this node) runs alone
after both, on a machine no other test keeps busy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests import fixture_trees, session_servers
from tests.session_servers import ENGINE_FLEET_NODES, fleet_bench  # noqa: F401 (tests import them here)

FIXTURES = Path(__file__).parent / "fixtures"
# One directory per session, named in the environment so child processes of the tests (which
# may import this module) agree on it instead of making their own.
_OWN = "FLEETSCOPE_TEST_GENERATED" not in os.environ
if _OWN:  # made only here: the others (pytest-xdist's workers too) find it in the environment
    os.environ["FLEETSCOPE_TEST_GENERATED"] = tempfile.mkdtemp(prefix="fleetscope-fixtures-")
GENERATED = Path(os.environ["FLEETSCOPE_TEST_GENERATED"])
BUNDLES = GENERATED / "bundles"
SCENARIOS = GENERATED / "scenarios"


@pytest.fixture(scope="session", autouse=True)
def generated_trees():
    """Write the generated bundles and scenarios once for the whole run (the first worker to
    get here builds them, the others wait for it)."""
    return fixture_trees.generate_once(GENERATED)


def pytest_unconfigure(config):
    # In the process that made GENERATED: pytest-xdist's controller runs no fixture.
    if _OWN:
        shutil.rmtree(GENERATED, ignore_errors=True)
        fixture_trees.lock_path(GENERATED).unlink(missing_ok=True)


E2E = Path(__file__).parent / "e2e"
# Fixtures that start servers for the whole session: their tests join the serial `live` run.
SESSION_SERVERS = {"engine_fleet"}


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if E2E in item.path.parents or SESSION_SERVERS & set(item.fixturenames):
            item.add_marker(pytest.mark.live)
            # They wait on servers and pages and judge no fault of this node: .ci/run runs
            # them beside the parallel group (both run slower for it, the pair sooner than one
            # after the other), the node's faults after.
            item.add_marker(pytest.mark.served)
    # The query engines' tests last: what runs before them is time their alerts need to hold.
    on_engines = [item for item in items if SESSION_SERVERS & set(item.fixturenames)]
    if on_engines:
        items[:] = [item for item in items if item not in on_engines] + on_engines


def require_tool(name: str) -> str:
    """Path of a system tool the test needs. In CI (.ci/run installs them) a missing tool is a
    failure, never a silent skip."""
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not installed; .ci/run must install it")
    pytest.skip(f"{name} is not installed")


class ExporterProcess:
    """`fleetscope exporter` in a child process, listening on 127.0.0.1 (an OS-chosen port)."""

    def __init__(self, root: str | Path, config: dict | None, tmp_path: Path, extra=()):
        args = [sys.executable, "-m", "fleetscope", "exporter", "--listen", "127.0.0.1:0",
                "--root", str(root)]
        if config is not None:
            config_path = tmp_path / f"config-{time.monotonic_ns()}.yaml"
            config_path.write_text(yaml.safe_dump(config))
            args += ["--config", str(config_path)]
        args += list(extra)
        self.stderr_path = tmp_path / f"exporter-{time.monotonic_ns()}.log"
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.stop()
            raise AssertionError(f"exporter did not start: {line!r} {self.stderr()}")
        self.url = line.split("listening on ", 1)[1].strip()

    def scrape(self, headers: dict | None = None, context=None) -> tuple[int, dict, bytes]:
        request = urllib.request.Request(self.url, headers=headers or {})
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, dict(response.headers), response.read()

    def text(self) -> str:
        return self.scrape()[2].decode()

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._stderr.close()


def record_bundle(config: dict, tmp_path: Path, seconds: int, name: str = "bundle") -> Path:
    """`fleetscope bundle record` of this machine under `config`, one sample a second for
    `seconds`, into tmp_path/name (a directory)."""
    config_path = tmp_path / f"{name}-config.json"
    config_path.write_text(json.dumps(config))
    output = tmp_path / name
    result = subprocess.run([sys.executable, "-m", "fleetscope", "bundle", "record",
                             "--seconds", str(seconds), "--interval", "1", "--config",
                             str(config_path), "-o", str(output)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return output


class Recording:
    """`fleetscope bundle record ARGS` running while the test goes on to watch the same fault
    another way (a live diagnose, Prometheus): `wait()` gives its CompletedProcess."""

    def __init__(self, args: list[str], timeout: float = 300):
        self.args = [sys.executable, "-m", "fleetscope", "bundle", "record", *args]
        self.deadline = time.monotonic() + timeout
        # files, not pipes: nobody reads its output until it ends
        self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(self.args, stdout=self._out, stderr=self._err, text=True)

    def wait(self) -> subprocess.CompletedProcess:
        try:
            self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        finally:
            self.stop()
        self._out.seek(0)
        self._err.seek(0)
        return subprocess.CompletedProcess(self.args, self.proc.returncode, self._out.read(),
                                           self._err.read())

    def stop(self) -> None:
        """End it if it still runs (the test failed before waiting for it)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def exporter_factory(tmp_path):
    started: list[ExporterProcess] = []

    def start(root, config=None, extra=()):
        process = ExporterProcess(root, config, tmp_path, extra)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def scrape_until_perf_ran(exporter: ExporterProcess, seconds: float = 20.0
                          ) -> tuple[dict[str, float], float]:
    """Scrape until the exporter's perf sampler completed a run (or `seconds` passed):
    (the last scrape's samples, the runs counted over every outcome)."""
    deadline = time.monotonic() + seconds
    while True:
        parsed = samples(exporter.text())
        runs = sum(v for k, v in parsed.items() if k.startswith("fleetscope_perf_runs_total"))
        if runs or time.monotonic() > deadline:
            return parsed, runs
        time.sleep(0.2)


def samples(text: str) -> dict[str, float]:
    """Parse exposition text into {'name{labels}': value}, with prometheus-client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label_string = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{label_string}}}" if label_string else sample.name] = sample.value
    return out


# -- a real redis-server ---------------------------------------------------------------------
@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """redis-server on 127.0.0.1 at a free port, no persistence; one for the session (each
    test flushes it or uses keys of its own)."""
    server = require_tool("redis-server")
    import redis

    from tests.test_agent_signals import free_port, stop_process

    workdir = tmp_path_factory.mktemp("redis")
    for _attempt in range(3):  # the port may be taken between probing and binding
        port = free_port()
        proc = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1,
                             socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                client.ping()
                break
            except redis.RedisError:
                time.sleep(0.05)
        else:
            client.close()
            stop_process(proc)
            continue
        client.close()
        yield f"redis://127.0.0.1:{port}/0"
        stop_process(proc)
        return
    pytest.fail("redis-server did not start")


# -- a small fleet on real query engines ---------------------------------------------------
ENGINE_FLEET_SECONDS = 300  # the diagnosis window the tests use
# Started by .ci/run before the suite (tests/session_servers.py), named here; else by the
# fixture at its first use.
SERVERS_DIRECTORY = "FLEETSCOPE_TEST_SERVERS"


def until_alerts_held(fleet: dict) -> None:
    """Wait (bounded) until the engine fleet's evaluators have run the rules' longest `for:`
    and a few rounds: their alerts fire."""
    from fleetscope.rules.catalog import CATALOG

    hold = max(rule.for_seconds for rule in CATALOG) + 20
    remaining = fleet["started"] + hold - time.time()
    if remaining > 0:
        time.sleep(remaining)


@pytest.fixture(scope="session")
def engine_fleet(tmp_path_factory):
    """The session's query engines (tests/session_servers.py): a simulated fleet with every
    rule's fault on known nodes in a real Prometheus and a real VictoriaMetrics, the exported
    rules evaluated by Prometheus and by vmalert (alerting a real Alertmanager), on
    127.0.0.1. Attached to when .ci/run started them, else started here and stopped at the
    end of the session."""
    for tool in ("promtool", "prometheus", "victoria-metrics", "vmalert",
                 "prometheus-alertmanager"):
        require_tool(tool)
    started = os.environ.get(SERVERS_DIRECTORY)
    if started:
        try:
            state = session_servers.attach(Path(started))
        except RuntimeError as error:
            pytest.fail(str(error))
        yield session_servers.fleet_from_state(state)
        return
    state, processes = session_servers.start_engine_fleet(tmp_path_factory.mktemp("engine-fleet"))
    try:
        yield session_servers.fleet_from_state(state)
    finally:
        for process in processes:
            process.stop()
