"""Live: an agent gateway whose accept loop cannot keep up, produced for real on 127.0.0.1.

The gateway listens with a backlog of 2 and accepts one connection every few seconds (a
synchronous call per connection in its accept loop); a bounded client loop keeps opening
connections to it, so the kernel drops handshakes at the full accept queue (TcpExt
ListenOverflows rises by thousands in the window). A busy gateway that accepts at once, under
the same kind of client load, must stay silent.

The fault is diagnosed three ways, each naming listen-overflow: live `fleetscope diagnose`
(the bench scenario, logged like tests/test_live_accuracy.py's), a bundle recorded while it
runs, and the exported rules evaluated by a real Prometheus scraping the live exporter.
Every child ends by itself (an alarm or a deadline) and is killed at the end of its test.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import Recording, require_tool
from tests.test_live_accuracy import (
    LIFETIME_S,
    NOISE,
    ForeignLoad,
    Lab,
    Scenario,
    _diagnose,
    _kernel_sigills,
    _record,
    _wait_line,
    assert_healthy_verdict,
    earlier_events,
)
from tests.test_prometheus_scrape import _free_port, _query

pytestmark = pytest.mark.live

# Arguments: lifetime in seconds, listen backlog.
LISTENER = """
import signal, socket, sys, threading, time
signal.alarm(int(float(sys.argv[1])))
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(int(sys.argv[2]))
print(server.getsockname()[1], flush=True)
"""
STUCK_GATEWAY = LISTENER + """
while True:                       # an accept loop blocked on a slow call per connection
    conn, _ = server.accept()
    conn.close()
    time.sleep(5)
"""
BUSY_GATEWAY = LISTENER + """
def answer(conn):
    with conn:
        conn.recv(1024)
        conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok")
while True:                       # accepts at once, answers on a thread
    conn, _ = server.accept()
    threading.Thread(target=answer, args=(conn,), daemon=True).start()
"""
# Arguments: port, lifetime, connections per round, "request" to send one and read the answer.
CLIENTS = """
import contextlib, socket, sys, time
port, end, batch = int(sys.argv[1]), time.time() + float(sys.argv[2]), int(sys.argv[3])
request = len(sys.argv) > 4
print("ready", flush=True)
while time.time() < end:          # agent clients connecting to the gateway
    opened = []
    for _ in range(batch):
        client = socket.socket()
        client.settimeout(2.0)
        if request:
            with contextlib.suppress(OSError):
                client.connect(("127.0.0.1", port))
                client.sendall(b"GET / HTTP/1.1\\r\\n\\r\\n")
                client.recv(1024)
        else:
            client.setblocking(False)
            with contextlib.suppress(OSError):
                client.connect(("127.0.0.1", port))
        opened.append(client)
    time.sleep(0.1)
    for client in opened:
        client.close()
"""

# backlog 2 holds 3 (the kernel drops past `> backlog`); 2 right after the gateway accepted
FULL_LISTENER = re.compile(r"127\.0\.0\.1:\d+ accept queue [23] of backlog 2 \(pid \d+ "
                           r"\(fs_acc_gateway\.py")

SCENARIOS = [
    Scenario("listen-overflow", "listen-overflow"),
    Scenario("busy-gateway-healthy", None),
]


def _listen_overflows() -> int:
    with open("/proc/net/netstat") as netstat:
        lines = netstat.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split(), strict=True))["ListenOverflows"])
    raise AssertionError("no TcpExt line in /proc/net/netstat")


def _produce(name: str, lab: Lab) -> None:
    if name == "listen-overflow":
        gateway = lab.script("fs_acc_gateway.py", STUCK_GATEWAY, LIFETIME_S, 2,
                             stdout=subprocess.PIPE)
        port = int(_wait_line(gateway))
        clients = lab.script("fs_acc_clients.py", CLIENTS, port, LIFETIME_S, 40,
                             stdout=subprocess.PIPE)
    else:
        gateway = lab.script("fs_acc_gateway.py", BUSY_GATEWAY, LIFETIME_S, 128,
                             stdout=subprocess.PIPE)
        port = int(_wait_line(gateway))
        clients = lab.script("fs_acc_clients.py", CLIENTS, port, LIFETIME_S, 20, "request",
                             stdout=subprocess.PIPE)
    assert _wait_line(clients) == "ready"
    lab.pool("gateway", "online", "fs_acc_gateway")
    time.sleep(2)  # let the fault settle before the window opens


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_live_diagnosis_names_the_listen_overflow_and_nothing_else(scenario, tmp_path):
    lab = Lab(tmp_path)
    with ForeignLoad() as foreign_load:
        lab.script("fs_acc_noise.py", NOISE, tmp_path, LIFETIME_S)
        try:
            _produce(scenario.name, lab)
            before = _listen_overflows()
            document, code, wall = _diagnose(lab)
            overflowed = _listen_overflows() - before
        finally:
            lab.stop()
    findings = document["findings"]
    # SIGILLs of other programs on this machine (every binary of these tests is fs_acc_*)
    foreign_crash = any(c.seconds is not None and foreign_load.began <= c.seconds
                        and not c.binary.rpartition("/")[2].startswith("fs_acc")
                        for c in _kernel_sigills())
    earlier = earlier_events(findings, {scenario.expect})
    serious = [f for f in findings if f["severity"] in ("warning", "critical")
               and not (foreign_crash and f["rule"] == "isa-mismatch") and f not in earlier]
    primary = serious[0]["rule"] if serious else None
    allowed = {scenario.expect} - {None}
    if foreign_load.saturated:
        allowed.add("cpu-saturation")  # other programs filled the CPUs beside the fault
    false_alarms = sorted({f["rule"] for f in serious} - allowed)
    summary = [(f["rule"], f["severity"], f["summary"]) for f in findings]
    # Healthy: right when nothing the node does not show is raised. On a machine other
    # programs keep busy, cpu-saturation is then the truth, and the gateway still silent.
    correct = primary in ({scenario.expect} if scenario.expect else {None, "cpu-saturation"}) \
        and not false_alarms
    _record({"scenario": scenario.name, "expected": scenario.expect, "primary": primary,
             "correct": correct, "false_alarms": false_alarms,
             "wall_seconds": round(wall, 2), "status": document["status"],
             "slipped": document.get("sampling", {}).get("slipped"),
             "delayed_seconds": document.get("sampling", {}).get("started_late_seconds"),
             "findings": [(f["rule"], f["severity"]) for f in findings],
             "foreign_cpus": round(foreign_load.cpus, 2), "foreign_crash": foreign_crash,
             "listen_overflows": overflowed})
    if scenario.expect is None:
        assert overflowed == 0, overflowed  # busy, and every connection accepted
        assert correct, summary
        assert all(f["rule"] != "listen-overflow" for f in findings), summary
        assert_healthy_verdict(document, code, [f for f in findings if f not in serious
                                                or f["rule"] == "cpu-saturation"])
        return
    assert overflowed > 1000, overflowed  # the fault is real: thousands dropped
    assert primary == "listen-overflow", summary
    assert not false_alarms, (false_alarms, summary)
    finding = serious[0]
    gateway = lab.children[1].pid
    assert gateway in finding["subjects"]["pids"], finding
    assert FULL_LISTENER.search(finding["summary"]), finding["summary"]
    values = {e["signal"]: e["value"] for e in finding["evidence"]}
    assert any("somaxconn" in signal for signal in values), values


def test_stuck_gateway_named_from_a_recorded_bundle_and_by_prometheus(tmp_path,
                                                                       exporter_factory):
    """The same fault, recorded into a bundle and diagnosed from it, and seen by the exported
    rules on a real Prometheus that scrapes the live exporter."""
    prometheus = require_tool("prometheus")
    lab = Lab(tmp_path)
    processes: list[subprocess.Popen] = []
    recording = None
    try:
        _produce("listen-overflow", lab)
        gateway = lab.children[0].pid
        config = tmp_path / "node.yaml"
        config.write_text(json.dumps({"pools": lab.pools}))
        bundle = tmp_path / "incident.tar.gz"
        # recorded while Prometheus below watches the same fault
        recording = Recording(["--seconds", "12", "--interval", "2", "--config", str(config),
                               "-o", str(bundle)])

        # the exported rules (for: 0s, so the test need not wait two minutes) on Prometheus
        rules = tmp_path / "fleetscope.rules.yml"
        exported = subprocess.run([sys.executable, "-m", "fleetscope", "rules", "export",
                                   "--for", "0s", "-o", str(rules)],
                                  capture_output=True, text=True, timeout=60)
        assert exported.returncode == 0, exported.stderr
        exporter = exporter_factory("/", {"pools": lab.pools})
        target = exporter.url.removeprefix("http://").removesuffix("/metrics")
        port = _free_port()
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{rules}']\n"
            f"scrape_configs: [{{job_name: node, static_configs: [{{targets: ['{target}']}}]}}]\n")
        processes.append(subprocess.Popen(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        base = f"http://127.0.0.1:{port}"
        alert = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not alert:
            try:
                alert = _query(base, 'ALERTS{fleetscope_rule="listen-overflow",'
                                     'alertstate="firing"}')
            except OSError:
                pass  # Prometheus still starting
            time.sleep(1)
        listener = _query(base, "fleetscope_tcp_listen_queue_connections"
                                " / fleetscope_tcp_listen_backlog_connections >= 1")
        recorded = recording.wait()
        assert recorded.returncode == 0, recorded.stderr
    finally:
        if recording is not None:
            recording.stop()
        lab.stop()
        for process in processes:
            process.terminate()
            process.wait(timeout=20)
    assert alert and alert[0]["metric"]["alertname"] == "FleetscopeListenOverflow", alert
    assert alert[0]["metric"]["instance"] == target
    assert any(r["metric"]["listener"].startswith("127.0.0.1:") for r in listener), listener

    # the bundle, diagnosed anywhere: the same rule, the same listener and owner
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                             str(bundle), "--json"], capture_output=True, text=True, timeout=300)
    document = json.loads(result.stdout)
    assert result.returncode in (1, 2), result.stderr
    # an earlier crash or OOM kill inside the look-back is this node's, not the gateway's
    ours = [f for f in document["findings"]
            if f not in earlier_events(document["findings"], {"listen-overflow"})]
    assert ours[0]["rule"] == "listen-overflow", document["findings"]
    finding = ours[0]
    assert gateway in finding["subjects"]["pids"]
    assert FULL_LISTENER.search(finding["summary"]), finding["summary"]
