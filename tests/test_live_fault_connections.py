"""Live: connections that wait for a pool, produced for real on 127.0.0.1.

A server pool holds three listeners: one whose owner never calls accept() (the clients'
connections wait in its accept queue), one with a backlog of 0 that one connection fills (Linux
then drops every further SYN: tcp_conn_request() sees sk_acceptq_is_full and counts
ListenOverflows), and one that accepts and never reads what the clients send. A client pool
fills them, sends 500 bytes on a connection whose peer (this test) drops everything it receives
(a socket filter on the accepted socket: nothing on the machine is changed), and a worker
thread calls connect() on the full listener: its SYN goes unanswered and is retransmitted.

The exporter shows what was injected, the connect() waits as long as it has (not the
machine's uptime, what tcp_info's never-set timestamps gave), and a bundle recorded while it
holds replays the same values. Every child ends by itself (an alarm) and is killed at the end.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetscope.collectors import COLLECTORS
from fleetscope.collectors.base import Scrape
from fleetscope.collectors.parsers.process import parse_fd_sockets
from fleetscope.collectors.source import RecordedSample
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from tests.conftest import record_bundle, samples

pytestmark = pytest.mark.live

LIFETIME_S = 120
QUEUED, UNREAD = 3, 2  # connections left in the never-accepting listener's queue, unread

CHILD = r"""
import signal, socket, sys, threading, time
signal.alarm(int(sys.argv[2]))

def listener(backlog):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(backlog)
    return server

if sys.argv[1] == "server":
    never = listener(8)            # nobody accepts: connections wait in its accept queue
    full = listener(0)             # one connection fills it; the kernel drops later SYNs
    deaf = listener(8)             # accepts, never reads
    print(never.getsockname()[1], full.getsockname()[1], deaf.getsockname()[1], flush=True)
    held = [deaf.accept()[0] for _ in range(int(sys.argv[3]))]
    time.sleep(3600)
else:
    never, full, deaf, hole, queued, unread = map(int, sys.argv[3:9])
    kept = [socket.create_connection(("127.0.0.1", never)) for _ in range(queued)]
    for _ in range(unread):
        kept.append(socket.create_connection(("127.0.0.1", deaf)))
        kept[-1].sendall(b"POST /tool HTTP/1.1\r\n\r\n")
    kept.append(socket.create_connection(("127.0.0.1", full)))
    lost = socket.create_connection(("127.0.0.1", hole))
    print("connected", flush=True)
    sys.stdin.readline()           # the peer drops everything from now on
    lost.sendall(b"x" * 500)       # never acknowledged: retransmitted
    def tool_call():               # its SYN dropped at the full queue: SYN_SENT
        socket.create_connection(("127.0.0.1", full))
    print("connecting", flush=True)
    threading.Thread(target=tool_call, daemon=True).start()
    time.sleep(3600)
"""

SO_ATTACH_FILTER = 26  # include/uapi/asm-generic/socket.h


def drop_everything(sock: socket.socket) -> None:
    """A classic BPF socket filter `ret #0` (BPF_RET | BPF_K, 0 bytes kept): the socket
    discards every segment it receives, acknowledging nothing. The kernel copies the
    program at setsockopt(), so the buffer need not outlive the call."""
    program = ctypes.create_string_buffer(struct.pack("=HBBI", 0x06, 0, 0, 0))
    fprog = struct.pack("=HxxxxxxQ", 1, ctypes.addressof(program))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


class Scene:
    def __init__(self, tmp_path: Path):
        script = tmp_path / "connections_child.py"
        script.write_text(CHILD)
        self.children: list[subprocess.Popen] = []
        self.hole = socket.socket()
        self.hole.bind(("127.0.0.1", 0))
        self.hole.listen(1)
        self.server = self._start([script, "server", LIFETIME_S, UNREAD])
        ports = self.server.stdout.readline().split()
        assert len(ports) == 3, ports
        self.full_port = int(ports[1])
        self.client = self._start([script, "client", LIFETIME_S, *ports,
                                   self.hole.getsockname()[1], QUEUED, UNREAD])
        assert self.client.stdout.readline().strip() == "connected"
        self.peer, _ = self.hole.accept()
        drop_everything(self.peer)
        self.before_connect = time.time()
        self.client.stdin.write("go\n")
        self.client.stdin.flush()
        assert self.client.stdout.readline().strip() == "connecting"
        self.connecting = time.time()  # the connect() began before this, after before_connect

    def _start(self, argv) -> subprocess.Popen:
        child = subprocess.Popen([sys.executable, *map(str, argv)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        self.children.append(child)
        return child

    def config(self) -> dict:
        pid = {"server": self.server.pid, "client": self.client.pid}
        return {"pools": [{"name": name, "class": "online",
                           "match": {"cmdline": f"connections_child.py {name} {LIFETIME_S} "}}
                          for name in pid],
                "collectors": ["pools"], "blocked_call_seconds": 2}

    def close(self) -> None:
        for child in self.children:
            child.kill()
        for child in self.children:
            child.wait()
            for stream in (child.stdin, child.stdout):
                stream.close()
        self.peer.close()
        self.hole.close()


@pytest.fixture
def scene(tmp_path):
    built = Scene(tmp_path)
    yield built
    built.close()


def series(pool: str, family: str, **labels) -> str:
    pairs = {"class": "online", "pool": pool, **labels}
    return f"{family}{{{','.join(f'{k}={json.dumps(v)}' for k, v in sorted(pairs.items()))}}}"


WAITING = "fleetscope_pool_connections_waiting"
RETRANSMITTING = "fleetscope_pool_connections_retransmitting"
# What the scene injected, once the SYN and the 500 bytes have been retransmitted.
EXPECTED = {
    series("server", WAITING, queue="accept"): QUEUED + 1,  # the full listener's one
    series("server", WAITING, queue="unread"): UNREAD,
    series("server", RETRANSMITTING, state="syn_sent"): 0,
    series("server", RETRANSMITTING, state="established"): 0,
    series("client", WAITING, queue="accept"): 0,
    series("client", WAITING, queue="unread"): 0,
    series("client", RETRANSMITTING, state="syn_sent"): 1,
    series("client", RETRANSMITTING, state="established"): 1,
}


def connections(got: dict[str, float]) -> dict[str, float]:
    return {key: value for key, value in got.items()
            if key.startswith("fleetscope_pool_connections_")}


def scrape_until(exporter, done, seconds: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + seconds
    while True:
        got = samples(exporter.text())
        if done(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def test_exporter_counts_what_waits_for_each_pool(scene, exporter_factory):
    exporter = exporter_factory("/", scene.config())
    got = scrape_until(exporter, lambda g: connections(g) == EXPECTED)
    assert connections(got) == EXPECTED
    for source in ("proc/<pid>/net/tcp", "proc/<pid>/fd/<n>"):
        assert got[f'fleetscope_scrape_source_available{{collector="pools",'
                   f'source="{source}"}}'] == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="syscall files of a process need root here")
def test_a_connect_whose_syn_is_dropped_waits_as_long_as_it_has(scene, exporter_factory):
    exporter = exporter_factory("/", scene.config())
    longest = series("client", "fleetscope_pool_network_wait_longest_seconds")
    blocked = series("client", "fleetscope_pool_blocked_network_threads")
    readings = []
    while not readings or time.time() < scene.connecting + 3.5:
        start = time.time()
        got = samples(exporter.text())
        readings.append((start, time.time(), got[longest]))
        time.sleep(0.5)
    for start, end, waited in readings:
        # no more than the connect() has existed (tcp_info said the machine's uptime), and
        # not less than since it certainly began (the SYN timer's own time, 10 ms ticks)
        assert start - scene.connecting - 0.3 <= waited <= end - scene.before_connect + 0.3
    assert got[blocked] == 1  # past blocked_call_seconds: the tool call, nothing else


@pytest.mark.skipif(os.geteuid() != 0, reason="syscall files of a process need root here")
def test_a_bundle_recorded_meanwhile_replays_the_live_values(scene, exporter_factory,
                                                             tmp_path):
    exporter = exporter_factory("/", scene.config())
    scrape_until(exporter, lambda g: connections(g) == EXPECTED)
    output = record_bundle(scene.config(), tmp_path, 2)
    before = time.time()
    live = samples(exporter.text())
    after = time.time()
    meta = json.loads((output / "meta.json").read_text())
    last = output / meta["samples"][-1]["dir"]
    assert (last / "proc/net/tcp").is_file()
    # every socket fd of both pools' processes, as their fd links name them now
    for child in (scene.server, scene.client):
        links = {int(fd): os.readlink(f"/proc/{child.pid}/fd/{fd}")
                 for fd in os.listdir(f"/proc/{child.pid}/fd")}
        recorded = parse_fd_sockets((last / f"proc/{child.pid}/fd_sockets").read_text())
        assert {fd: f"socket:[{inode}]" for fd, (inode, _) in recorded.items()} == {
            fd: link for fd, link in links.items() if link.startswith("socket:")}

    collector = COLLECTORS["pools"](parse_config(meta["config"]))
    for sample in meta["samples"]:  # replayed sample by sample, as the exporter saw them
        source = RecordedSample(str(output / sample["dir"]), str(output / "static"))
        replayed = samples(render(collector.collect(Scrape(source, sample["time"]))))
    assert connections(replayed) == connections(live) == EXPECTED
    # the connect()'s wait: the live one less the time since the sample, and as old as the
    # connect() at the sample's time (it began between before_connect and connecting)
    longest = series("client", "fleetscope_pool_network_wait_longest_seconds")
    at = meta["samples"][-1]["time"]
    assert live[longest] - (after - at) - 0.2 <= replayed[longest] <= \
        live[longest] - (before - at) + 0.2
    assert at - scene.connecting - 0.2 <= replayed[longest] <= at - scene.before_connect + 0.2
