"""`fleetscope stacks` on real Python workers: blocked on a socket that never answers, on a
lock, burning CPU, idle."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

# A worker with four threads; it exits by itself after 60 s whatever the test does.
WORKER = r'''
import sys, threading, time, urllib.request
from fleetscope.collectors.source import LiveHost
port = int(sys.argv[1])
lock = threading.Lock(); lock.acquire()
def tool_call():
    urllib.request.urlopen(f"http://127.0.0.1:{port}/tool", timeout=120).read()
def waits_for_lock():
    lock.acquire()
def burns_cpu():
    end = time.time() + 60
    while time.time() < end:
        sum(i * i for i in range(1000))
for target in (tool_call, waits_for_lock, burns_cpu):
    threading.Thread(target=target, name=target.__name__, daemon=True).start()
print("ready", flush=True)
time.sleep(60)
'''


@pytest.fixture
def worker(tmp_path):
    # A server that accepts connections into its backlog and never answers.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    script = tmp_path / "agent_worker.py"  # a file, as real workers are: stacks read its lines
    script.write_text(WORKER)
    process = subprocess.Popen([sys.executable, str(script), str(silent.getsockname()[1])],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    time.sleep(1.0)  # let the threads reach their waits
    yield process.pid
    process.kill()
    process.wait()
    silent.close()


def _stacks(*pids):
    return subprocess.run([sys.executable, "-m", "fleetscope", "stacks", "--json",
                           *map(str, pids)], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(os.geteuid() != 0, reason="py-spy needs ptrace rights (root here)")
def test_threads_are_classified(worker):
    result = _stacks(worker)
    assert result.returncode == 0, result.stderr
    threads = {t["thread_name"]: t for t in json.loads(result.stdout)}
    assert threads["tool_call"]["state"] == "network"
    assert any("socket.py" in f or "client.py" in f for f in threads["tool_call"]["frames"])
    assert threads["waits_for_lock"]["state"] == "lock"
    assert "lock.acquire()" in threads["waits_for_lock"]["blocking_call"]
    assert threads["MainThread"]["state"] == "idle"
    # The CPU thread holds the GIL part of the time; py-spy sees it running or between slices.
    assert threads["burns_cpu"]["state"] in ("cpu", "idle")


def test_no_such_process_is_one_line_and_exit_3():
    result = _stacks(2**22 + 12345)
    assert result.returncode == 3
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="py-spy needs ptrace rights (root here)")
def test_diagnose_shows_where_blocked_workers_wait(worker):
    """A worker-blocked-external-call finding on the live node carries the workers' stacks:
    the pid waiting on the network and the call it waits in."""
    from fleetscope.collectors.source import LiveHost
    from fleetscope.core.config import parse_config
    from fleetscope.diagnose.engine import Finding
    from fleetscope.diagnose.enrich import Enricher
    from fleetscope.rules.catalog import by_id

    config = parse_config({"pools": [{"name": "chat-online", "class": "online",
                                      "match": {"cmdline": "agent_worker.py"}}]})
    finding = Finding(by_id("worker-blocked-external-call"), "node", {"pool": "chat-online"},
                      300.0, 0.8)
    Enricher(config, LiveHost(), LiveHost())(finding)
    assert finding.subjects["pids"] == [worker]
    waits = [e for e in finding.evidence if "waiting on the network" in e["signal"]]
    assert waits and waits[0]["value"] >= 1
    assert "urlopen" in waits[0]["signal"] or "read" in waits[0]["signal"]
