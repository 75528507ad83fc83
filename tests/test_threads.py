"""Every thread of a pool process (collectors/tasks.py, the pools collector): the TCP table
and syscall parsers on real text, the thread counters on fixture trees, and on this machine's
/proc: hundreds of busy threads, idle threads, and a worker parked on a socket to a listener
that never answers (the exporter, a recorded bundle replayed, the finding's subjects, and
`fleetscope stacks`)."""

from __future__ import annotations

import doctest
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import strategies as st

from fleetscope.collectors import tasks as tasks_module
from fleetscope.collectors.base import Scrape
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers import net_tcp as net_tcp_module
from fleetscope.collectors.parsers import process as process_parsers
from fleetscope.collectors.parsers.net_tcp import (
    TcpSocket,
    parse_inet_diag_idle_ms,
    parse_net_tcp,
)
from fleetscope.collectors.parsers.process import (
    TaskSyscall,
    parse_fd_sockets,
    parse_task_syscall,
    parse_wchan,
)
from fleetscope.collectors.source import LiveHost, RecordedSample
from fleetscope.collectors.tasks import WaitTracker
from fleetscope.core.config import ConfigError, parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import record_bundle, require_tool, samples
from tests.fuzzing import parser_fuzz_tests
from tests.test_pools import STATUS_REAL, write, write_process

# ---- real samples -----------------------------------------------------------------------

# /proc/net/tcp of this project's CI machine (Linux 6.18 x86-64), lines kept verbatim: a
# listener on every address, a loopback listener, a connection to it from both sides, and a
# TIME_WAIT line (inode 0, fewer fields).
NET_TCP_REAL = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
    "timeout inode                                                     \n"
    "   2: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        "
    "0 1681 1 00000000b3fbb35a 100 0 0 10 0                      \n"
    "   3: 0100007F:B5EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        "
    "0 101013 1 0000000006f60350 100 0 0 10 0                    \n"
    "   7: 0100007F:B5EB 0100007F:AEDC 01 00000000:00000000 02:00000514 00000000     0        "
    "0 101020 2 00000000f40691ee 22 4 26 18 -1                   \n"
    "   8: 0100007F:A489 0100007F:C766 06 00000000:00000000 03:00001547 00000000     0        "
    "0 0 3 00000000ca9c5908                                      \n"
    " 206: 0100007F:AEDC 0100007F:B5EB 01 00000000:00000000 00:00000000 00000000     0        "
    "0 101019 1 000000007029ec62 21 4 20 29 -1                   \n"
)
# /proc/net/tcp6 of the same machine: a listener on ::1, a connection over ::1, and an IPv4
# client connected to a dual-stack listener (the v4-mapped address ::ffff:127.0.0.1).
NET_TCP6_REAL = (
    "  sl  local_address                         remote_address                        st "
    "tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   1: 00000000000000000000000001000000:C325 00000000000000000000000000000000:0000 0A "
    "00000000:00000000 00:00000000 00000000     0        0 111091 1 00000000dea5b95a 100 0 0 "
    "10 0\n"
    "   3: 00000000000000000000000001000000:81F6 00000000000000000000000001000000:C325 01 "
    "00000000:00000000 00:00000000 00000000     0        0 111092 2 00000000cb119116 20 0 0 "
    "10 -1\n"
    "   5: 0000000000000000FFFF00000100007F:E84B 0000000000000000FFFF00000100007F:A458 01 "
    "00000000:00000000 00:00000000 00000000     0        0 111096 1 00000000c6b8e5f9 20 0 0 "
    "10 -1\n"
)
# The example line of the kernel's Documentation/networking/proc_net_tcp.rst.
NET_TCP_DOC = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
    "timeout inode\n"
    "   46: 010310AC:9C4C 030310AC:1770 01 00000150:00000000 01:00000019 00000000  1000 0 "
    "54165785 4 cd1e6040 25 4 27 3 -1\n"
)
# /proc/<pid>/task/<tid>/syscall of threads on this machine: recvfrom(fd 4) of a plain
# sock.recv, poll(1 fd, 50 s) of a recv with a timeout, clock_nanosleep, running, and a
# thread blocked outside a syscall.
SYSCALL_RECVFROM_REAL = ("45 0x4 0x7f22bfb78a40 0xa 0x0 0x0 0x0 0x7f22bf97da10 "
                         "0x7f22c0128974\n")
SYSCALL_POLL_REAL = ("7 0x7f9d5b270a78 0x1 0xc350 0x0 0x0 0x0 0x7f9d5b270a10 "
                     "0x7f9d5bb1a26f\n")


def test_net_tcp_real_and_documented_lines():
    sockets = parse_net_tcp(NET_TCP_REAL)
    assert sockets[1681] == TcpSocket("0.0.0.0:2024", "", "LISTEN")
    assert sockets[101020] == TcpSocket("127.0.0.1:46571", "127.0.0.1:44764", "ESTABLISHED")
    assert sockets[101019].peer == "127.0.0.1:46571"  # the other end of the same connection
    assert 0 not in sockets  # TIME_WAIT: no file points at it
    six = parse_net_tcp(NET_TCP6_REAL, what="/proc/net/tcp6")
    assert six[111091] == TcpSocket("[::1]:49957", "", "LISTEN")
    assert six[111092].peer == "[::1]:49957"
    assert six[111096] == TcpSocket("127.0.0.1:59467", "127.0.0.1:42072", "ESTABLISHED")
    assert parse_net_tcp(NET_TCP_DOC)[54165785] == TcpSocket(
        "172.16.3.1:40012", "172.16.3.3:6000", "ESTABLISHED")
    assert set(parse_net_tcp(NET_TCP_REAL, inodes={101019, 5})) == {101019}


def test_net_tcp_of_this_machine_names_a_connection_it_makes():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    try:
        inode = os.fstat(client.fileno()).st_ino
        with open("/proc/net/tcp") as handle:
            entry = parse_net_tcp(handle.read())[inode]
        assert entry.peer == f"127.0.0.1:{server.getsockname()[1]}"
        assert entry.local == f"127.0.0.1:{client.getsockname()[1]}"
        assert entry.state == "ESTABLISHED"
        # the kernel's tcp_info for exactly that connection: silent since it was made
        client.sendall(b"request")
        sent = time.monotonic()
        time.sleep(0.3)
        idle = tasks_module.tcp_idle_ms(entry.local, entry.peer)
        assert idle is not None and idle >= 250
        assert idle <= (time.monotonic() - sent) * 1000 + 50  # jiffies granularity
        assert tasks_module.tcp_idle_ms(entry.local, "127.0.0.1:1") is None  # no such socket
    finally:
        client.close()
        server.close()


def test_syscall_and_wchan_real_samples():
    assert parse_task_syscall(SYSCALL_RECVFROM_REAL) == TaskSyscall(
        45, (4, 0x7f22bfb78a40, 10, 0, 0, 0))
    poll = parse_task_syscall(SYSCALL_POLL_REAL)
    assert poll.nr == 7 and poll.args[1] == 1 and poll.args[2] == 50_000
    assert parse_task_syscall("running\n") is None
    assert parse_task_syscall("-1 0x7ffcfa48cad0 0x7f91abaed545\n") is None
    assert parse_wchan("wait_woken") == "wait_woken"
    assert parse_wchan("poll_schedule_timeout.constprop.0") == "poll_schedule_timeout"
    assert parse_wchan("0") == ""
    assert parse_fd_sockets("4 22523 91500\n\n7 22530\n") == {4: (22523, 91500),
                                                               7: (22530, None)}


@pytest.mark.parametrize("parser, text", [
    (parse_net_tcp, ""),
    (parse_net_tcp, NET_TCP_REAL.replace("0100007F:B5EB", "0100007F-B5EB")),
    (parse_net_tcp, NET_TCP_REAL.replace(" 101020 ", " 10x020 ")),
    (parse_task_syscall, "45 0x4 0x7f22\n"),
    (parse_task_syscall, SYSCALL_RECVFROM_REAL.replace("0x4", "zz")),
    (parse_fd_sockets, "4\n"),
    (parse_inet_diag_idle_ms, b"\x10\x00"),
])
def test_parsers_reject_malformed(parser, text):
    with pytest.raises(ParseError):
        parser(text)


PARSERS = {
    "net_tcp": (parse_net_tcp, NET_TCP_REAL),
    "net_tcp6": (parse_net_tcp, NET_TCP6_REAL),
    "syscall": (parse_task_syscall, SYSCALL_RECVFROM_REAL),
    "fd_sockets": (parse_fd_sockets, "4 22523 91500\n7 22530\n"),
}
tcpish = st.text(alphabet="0123456789ABCDEFx: \n", max_size=300)
test_fuzz_garbage, test_fuzz_cut_and_corrupted = parser_fuzz_tests(PARSERS, tcpish)


@pytest.mark.parametrize("module", [net_tcp_module, process_parsers])
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0


def test_wait_tracker_counts_one_unbroken_wait():
    tracker = WaitTracker()
    recv = (45, 4, 0x7F00, 10, 0, 0, 0)
    assert tracker.observe({"t": (recv, 1000)}, 100.0) == {"t": 0.0}
    assert tracker.observe({"t": (recv, 1000)}, 115.0) == {"t": 15.0}
    # it ran (CPU time moved) and went back into the same call: a new wait
    assert tracker.observe({"t": (recv, 1200)}, 130.0) == {"t": 0.0}
    assert tracker.observe({"t": (recv, 1200)}, 145.0) == {"t": 15.0}
    # another call, or the same call on another buffer: a new wait
    assert tracker.observe({"t": ((45, 4, 0x7F08, 10, 0, 0, 0), 1200)}, 160.0) == {"t": 0.0}
    # gone from the waits, then back: counted afresh
    assert tracker.observe({}, 175.0) == {}
    assert tracker.observe({"t": (recv, 1200)}, 190.0) == {"t": 0.0}
    # without schedstat nothing proves it did not run in between
    assert tracker.observe({"u": (recv, None)}, 200.0) == {"u": 0.0}
    assert tracker.observe({"u": (recv, None)}, 215.0) == {"u": 0.0}
    # a connection silent for 90 s when first seen: the wait counts from then
    assert tracker.observe({"v": (recv, 5, 90.0)}, 300.0) == {"v": 90.0}
    assert tracker.observe({"v": (recv, 5, 105.0)}, 315.0) == {"v": 105.0}


# ---- the collector on fixture trees -----------------------------------------------------

POOL = [{"name": "agents", "class": "online", "match": {"cmdline": "agent.worker"}}]
AGENTS = 'class="online",pool="agents"'


def write_task(root: Path, pid: int, tid: int, state: str, voluntary: int,
               nonvoluntary: int, run_ns: int, delay_ns: int) -> None:
    """A non-leader thread's status and schedstat, in the kernel's format (the real sample
    with this thread's values)."""
    base = root / "proc" / str(pid) / "task" / str(tid)
    letter = {"R": "R (running)", "S": "S (sleeping)", "D": "D (disk sleep)"}[state]
    status = (STATUS_REAL.replace("State:\tS (sleeping)", f"State:\t{letter}")
              .replace("Pid:\t30168", f"Pid:\t{tid}")
              .replace("voluntary_ctxt_switches:\t1\nnonvoluntary_ctxt_switches:\t0",
                       f"voluntary_ctxt_switches:\t{voluntary}\n"
                       f"nonvoluntary_ctxt_switches:\t{nonvoluntary}"))
    write(base / "status", status)
    write(base / "schedstat", f"{run_ns} {delay_ns} 7\n")


def thread_tree(tmp_path: Path, threads: dict[int, tuple]) -> Path:
    root = tmp_path / "root"
    write_process(root, 500, "python3\0-m\0agent.worker\0", threads=1 + len(threads),
                  voluntary=10, nonvoluntary=3, run_delay_ns=1_000_000_000)
    for tid, values in threads.items():
        write_task(root, 500, tid, *values)
    return root


def pools_exporter(root: Path) -> Exporter:
    return Exporter(str(root), parse_config({"pools": POOL, "collectors": ["pools"]},
                                            ("pools",)))


def test_counters_sum_every_thread_and_never_fall_when_one_exits(tmp_path):
    root = thread_tree(tmp_path, {501: ("R", 5, 400, 10**9, 2 * 10**9),
                                  502: ("R", 7, 600, 10**9, 3 * 10**9),
                                  503: ("S", 90, 1, 10**6, 0)})
    exporter = pools_exporter(root)
    got = samples(render(exporter.collect(now=1000.0)))
    switches = 'fleetscope_pool_context_switches_total{{class="online",kind="{}",pool="agents"}}'
    assert got[f"fleetscope_pool_threads{{{AGENTS}}}"] == 4
    assert got[f"fleetscope_pool_threads_read{{{AGENTS}}}"] == 4
    assert got[f"fleetscope_pool_runnable_threads{{{AGENTS}}}"] == 2  # the leader sleeps
    assert got[switches.format("nonvoluntary")] == 3 + 400 + 600 + 1
    assert got[switches.format("voluntary")] == 10 + 5 + 7 + 90
    assert got[f"fleetscope_pool_thread_run_delay_seconds_total{{{AGENTS}}}"] == 6.0
    assert got[f"fleetscope_pool_run_delay_seconds_total{{{AGENTS}}}"] == 1.0  # main thread
    # thread 502 exits; 501 runs on and is preempted 100 more times: the total keeps 502's
    for name in ("status", "schedstat"):
        (root / f"proc/500/task/502/{name}").unlink()
    (root / "proc/500/task/502").rmdir()
    write_task(root, 500, 501, "R", 5, 500, 2 * 10**9, 2 * 10**9)
    # 503 has not run (the same schedstat): its status is not read again
    (root / "proc/500/task/503/status").write_text("not read\n")
    got = samples(render(exporter.collect(now=1015.0)))
    assert got[switches.format("nonvoluntary")] == 3 + 500 + 600 + 1
    assert got[switches.format("voluntary")] == 10 + 5 + 7 + 90
    assert got[f"fleetscope_pool_runnable_threads{{{AGENTS}}}"] == 1
    assert got[f"fleetscope_pool_threads_read{{{AGENTS}}}"] == 3


def test_threads_read_per_pool_are_bounded_and_say_so(tmp_path, monkeypatch):
    monkeypatch.setattr(tasks_module, "TASKS_READ_PER_POOL", 2)
    from fleetscope.collectors import pools as pools_module

    monkeypatch.setattr(pools_module, "TASKS_READ_PER_POOL", 2)
    root = thread_tree(tmp_path, {tid: ("R", 1, 1, 1, 1) for tid in range(501, 506)})
    got = samples(render(pools_exporter(root).collect(now=1000.0)))
    assert got[f"fleetscope_pool_threads{{{AGENTS}}}"] == 6  # every thread is counted
    assert got[f"fleetscope_pool_threads_read{{{AGENTS}}}"] == 3  # the leader and two
    assert got[f"fleetscope_pool_threads_read_limit{{{AGENTS}}}"] == 2
    assert got[f"fleetscope_pool_runnable_threads{{{AGENTS}}}"] == 2


def test_a_bundle_without_threads_falls_back_to_the_main_thread(tmp_path):
    root = tmp_path / "root"
    write_process(root, 500, "python3\0-m\0agent.worker\0", threads=64, nonvoluntary=77)
    got = samples(render(pools_exporter(root).collect(now=1000.0)))
    assert got[f"fleetscope_pool_threads{{{AGENTS}}}"] == 64
    assert got[f"fleetscope_pool_threads_read{{{AGENTS}}}"] == 1
    assert got['fleetscope_pool_context_switches_total{class="online",kind="nonvoluntary",'
               'pool="agents"}'] == 77


def test_without_syscall_files_the_wait_metrics_are_absent_not_zero(tmp_path):
    root = tmp_path / "root"
    write_process(root, 500, "python3\0-m\0agent.worker\0",
                  files=("cmdline", "cgroup", "stat", "status", "schedstat", "limits",
                         "fd_count"))
    got = samples(render(pools_exporter(root).collect(now=1000.0)))
    assert f"fleetscope_pool_blocked_network_threads{{{AGENTS}}}" not in got
    assert f"fleetscope_pool_runnable_threads{{{AGENTS}}}" in got


# ---- live: hundreds of busy threads, idle threads ----------------------------------------

# Threads that burn CPU outside the GIL (hashlib releases it for large buffers), as native
# inference threads do; started together on an event. A call is long (64 MiB) so that few
# threads queue on the GIL between calls. Bounded to 30 s whatever happens.
THREADS = r"""
import hashlib, os, sys, threading, time
count, busy = int(sys.argv[1]), sys.argv[2] == "busy"
data, go, never = b"x" * (64 << 20), threading.Event(), threading.Event()
# Killed by the test when done; this bound only ends it if the test cannot. Under 400 busy
# threads on 2 cores the exporter's scrape gets a sliver of the CPU and took 17-27 s: a
# 30 s life ended the process between the test's two scrapes (the second found a zombie).
end = time.time() + 600
def burn():
    go.wait()
    while time.time() < end:
        hashlib.sha256(data).digest()
for _ in range(count):
    threading.Thread(target=burn if busy else never.wait, daemon=True).start()
go.set()
print("ready", flush=True)
time.sleep(max(0.0, end - time.time()))
os._exit(0)
"""


def _thread_pool_rates(count: int, busy: bool, seconds: float = 3.0) -> dict[str, float]:
    marker = f"fleetscope-threads-{os.getpid()}-{time.monotonic_ns()}"
    child = subprocess.Popen([sys.executable, "-c", THREADS, str(count),
                              "busy" if busy else "idle", marker], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        exporter = Exporter("/", parse_config({"collectors": ["pools"], "pools": [
            {"name": "t", "class": "online", "match": {"cmdline": marker}}]}, ("pools",)))
        time.sleep(0.5)
        first = samples(render(exporter.collect()))
        leader_first = _leader_nonvoluntary(child.pid)
        started = time.time()
        time.sleep(seconds)
        leader_last = _leader_nonvoluntary(child.pid)
        last = samples(render(exporter.collect()))
        elapsed = time.time() - started
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    key = 'fleetscope_pool_context_switches_total{class="online",kind="nonvoluntary",pool="t"}'
    delay = 'fleetscope_pool_thread_run_delay_seconds_total{class="online",pool="t"}'
    return {"threads": last['fleetscope_pool_threads{class="online",pool="t"}'],
            "waiting_for_cpu": (last[delay] - first[delay]) / elapsed,
            "runnable": last['fleetscope_pool_runnable_threads{class="online",pool="t"}'],
            "nonvoluntary_per_s": (last[key] - first[key]) / elapsed,
            "leader_nonvoluntary_per_s": (leader_last - leader_first) / elapsed}


def _leader_nonvoluntary(pid: int) -> int:
    """What the pools collector used to read: the main thread's own count."""
    with open(f"/proc/{pid}/status") as handle:
        return int(handle.read().split("nonvoluntary_ctxt_switches:")[1].split()[0])


@pytest.mark.live
def test_hundreds_of_busy_threads_show_runnable_threads_and_preemption():
    cpus = os.cpu_count() or 1
    few = _thread_pool_rates(cpus, busy=True)
    many = _thread_pool_rates(400, busy=True)
    assert many["threads"] == 401
    assert many["runnable"] >= 4 * cpus, many  # runnable threads >> cores
    # Preemption across the pool is high where the main thread (asleep) shows next to none.
    assert many["nonvoluntary_per_s"] >= 100, many
    assert many["nonvoluntary_per_s"] >= 10 * max(many["leader_nonvoluntary_per_s"], 1), many
    # And the harm rises as the problem worsens: with one thread a core the threads barely
    # wait for a CPU; with 400, hundreds of thread-seconds a second... bounded by the
    # machine's other work, so at least five times as much.
    assert many["waiting_for_cpu"] >= 5 * max(few["waiting_for_cpu"], 1.0), (few, many)


@pytest.mark.live
def test_idle_threads_are_not_runnable():
    idle = _thread_pool_rates(400, busy=False, seconds=1.0)
    assert idle["threads"] == 401
    assert idle["runnable"] <= 2, idle
    assert idle["nonvoluntary_per_s"] < 20, idle


# ---- live: a worker parked on a socket that never answers -------------------------------

WORKER = r"""
import socket, sys, threading, time
port = int(sys.argv[1])
def tool_call():                 # no timeout: parked in recvfrom
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /tool HTTP/1.0\r\n\r\n")
    s.recv(4096)
def tool_call_with_timeout():    # a timeout: parked in poll, then recv
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(300)
    s.recv(4096)
def local_pipe():                # a socketpair, as multiprocessing uses: not a network call
    a, b = socket.socketpair()
    a.recv(1)
def accept_loop():               # a server waiting for clients: not a network call
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.accept()
for target in (tool_call, tool_call_with_timeout, local_pipe, accept_loop):
    threading.Thread(target=target, name=target.__name__, daemon=True).start()
time.sleep(0.5)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def parked_worker(tmp_path):
    """(pid, port, marker): a worker whose two tool-call threads wait on a 127.0.0.1
    listener that accepts into its backlog and never answers; ends by itself after 60 s."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    marker = f"fleetscope-parked-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / f"{marker}.py"
    script.write_text(WORKER)
    child = subprocess.Popen([sys.executable, str(script), str(port)], stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "ready"
    yield child.pid, port, marker, time.monotonic()
    child.kill()
    child.wait()
    child.stdout.close()
    silent.close()


def _config(marker: str) -> dict:
    return {"pools": [{"name": "agents", "class": "online", "match": {"cmdline": marker}}],
            "collectors": ["pools"], "blocked_call_seconds": 2}


@pytest.mark.live
@pytest.mark.skipif(os.geteuid() != 0, reason="syscall files of a process need root here")
def test_exporter_shows_blocked_network_threads_and_the_wait_growing(parked_worker,
                                                                    exporter_factory):
    _, _, marker, ready = parked_worker
    exporter = exporter_factory("/", _config(marker))
    blocked = f"fleetscope_pool_blocked_network_threads{{{AGENTS}}}"
    longest = f"fleetscope_pool_network_wait_longest_seconds{{{AGENTS}}}"
    waiting = f"fleetscope_pool_network_wait_threads{{{AGENTS}}}"
    before_first = time.monotonic()
    first = samples(exporter.text())
    assert first[waiting] == 2  # the two tool calls, not the socketpair nor the listener
    # The exporter has just started, yet the wait counts from when the connection went
    # silent (tcp_info), before the worker said ready: earlier, not from the first scrape.
    assert first[longest] >= before_first - ready - 0.05
    readings = [first]
    while time.monotonic() < ready + 2.5 or len(readings) < 3:
        time.sleep(0.6)
        readings.append(samples(exporter.text()))
    assert all(r[waiting] == 2 for r in readings)
    longest_seen = [r[longest] for r in readings]
    assert longest_seen == sorted(longest_seen) and longest_seen[-1] > longest_seen[0]
    assert longest_seen[-1] > 2 and readings[-1][blocked] == 2


@pytest.mark.live
@pytest.mark.skipif(os.geteuid() != 0, reason="syscall files of a process need root here")
def test_recorded_bundle_replays_the_waits_and_the_finding_names_them(parked_worker,
                                                                      tmp_path):
    from fleetscope.bundle.read import open_bundle
    from fleetscope.diagnose.engine import Finding
    from fleetscope.diagnose.enrich import Enricher
    from fleetscope.diagnose.evidence import bundle_series
    from fleetscope.rules.catalog import by_id
    from fleetscope.rules.promql import Selector

    pid, port, marker, _ = parked_worker
    output = record_bundle(_config(marker), tmp_path, 3, "parked")
    meta = json.loads((output / "meta.json").read_text())
    last = output / meta["samples"][-1]["dir"]
    assert (last / "proc/net/tcp").is_file()
    tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    for tid in tids:
        for name in ("stat", "status", "schedstat", "syscall", "wchan"):
            assert (last / f"proc/{pid}/task/{tid}/{name}").is_file()
    fd_sockets = parse_fd_sockets((last / f"proc/{pid}/fd_sockets").read_text())
    # the two waits with their connections' silence, among every socket fd of the worker
    # (the listener's accept queue holds them: the pools collector reads the fd links)
    assert len([idle for _, idle in fd_sockets.values() if idle is not None]) == 2
    links = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert {fd: f"socket:[{inode}]" for fd, (inode, _) in fd_sockets.items()} == {
        fd: link for fd, link in links.items() if link.startswith("socket:")}
    assert any((last / f"proc/{pid}/task/{tid}/pollfds").is_file() for tid in tids)

    # Replayed sample by sample: the waits last as long as the recording did.
    bundle = open_bundle(str(output))
    config = bundle.config(None)
    series = bundle_series(bundle, config)
    stamps = series.timestamps()
    longest = [Selector("fleetscope_pool_network_wait_longest_seconds").evaluate(series, t)
               for t in stamps]
    values = [next(iter(v.values())) for v in longest]
    times = [s["time"] for s in meta["samples"]]
    # The first sample's waits count from when their connections went silent (recorded
    # beside the fds), then grow with the samples' times.
    first_sockets = parse_fd_sockets(
        (output / meta["samples"][0]["dir"] / f"proc/{pid}/fd_sockets").read_text())
    silent_for = max(idle for _, idle in first_sockets.values() if idle is not None) / 1000
    assert values[0] == pytest.approx(silent_for, abs=0.01) and values[0] > 0
    for value, at in zip(values, times, strict=True):
        assert value == pytest.approx(silent_for + at - times[0], abs=0.01)
    blocked = Selector("fleetscope_pool_blocked_network_threads").evaluate(series, stamps[-1])
    assert list(blocked.values()) == [2]

    finding = Finding(by_id("worker-blocked-external-call"), "node", {"pool": "agents"},
                      1.0, 0.8)
    sources = tuple((bundle.source(sample), sample.time) for sample in bundle.samples)
    Enricher(config, sources[0][0], sources[-1][0], series, sources)(finding)
    assert finding.subjects["pids"] == [pid]
    assert f"pid {pid} thread " in finding.extra_summary
    assert f"127.0.0.1:{port}" in finding.extra_summary
    calls = {e["signal"].split(" in ")[1].split("(")[0] for e in finding.evidence
             if e["unit"] == "seconds"}
    assert calls == {"recvfrom", "poll"}
    assert max(e["value"] for e in finding.evidence if e["unit"] == "seconds") == (
        pytest.approx(values[-1], abs=0.1))
    bundle.close()


@pytest.mark.live
@pytest.mark.skipif(os.geteuid() != 0, reason="py-spy and syscall files need root here")
def test_live_finding_and_stacks_name_the_call_the_peer_and_the_frame(parked_worker):
    from fleetscope.diagnose.engine import Finding
    from fleetscope.diagnose.enrich import Enricher
    from fleetscope.rules.catalog import by_id

    pid, port, marker, _ = parked_worker
    result = subprocess.run([sys.executable, "-m", "fleetscope", "stacks", "--json", str(pid)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    threads = {t["thread_name"]: t for t in json.loads(result.stdout)}
    # A plain sock.recv in the worker's own function: the kernel says network.
    assert threads["tool_call"]["state"] == "network"
    assert threads["tool_call"]["syscall"] == "recvfrom"
    assert threads["tool_call"]["peer"] == f"127.0.0.1:{port}"
    # py-spy's stop turned its poll into restart_syscall: still the poll on the same socket
    assert threads["tool_call_with_timeout"]["syscall"] == "poll"
    assert threads["tool_call_with_timeout"]["peer"] == f"127.0.0.1:{port}"
    for local in ("local_pipe", "accept_loop", "MainThread"):  # no TCP peer behind these
        assert threads[local]["syscall"] == "" and threads[local]["peer"] == "", local
    # The frames say network (a.recv(1), self._accept()); the kernel says waiting for work.
    assert threads["local_pipe"]["state"] == "idle"
    assert "local socket" in threads["local_pipe"]["blocking_call"]
    assert threads["accept_loop"]["state"] == "idle"
    assert "accept" in threads["accept_loop"]["blocking_call"]

    enricher = Enricher(parse_config(_config(marker)), LiveHost(), LiveHost())
    enricher.snapshot()
    time.sleep(1.5)
    finding = Finding(by_id("worker-blocked-external-call"), "node", {"pool": "agents"},
                      1.0, 0.8)
    enricher(finding)
    assert finding.subjects["pids"] == [pid]
    assert f"127.0.0.1:{port}" in finding.extra_summary
    assert "tool_call" in finding.extra_summary  # the py-spy frame it waits in
    waits = [e for e in finding.evidence if e["unit"] == "seconds"]
    assert len(waits) == 2 and all(e["value"] >= 1.0 for e in waits)


# ---- config and subjects ------------------------------------------------------------------

QUEUE_WORKER = r"""
import socket, sys, threading, time
import redis
port, url = int(sys.argv[1]), sys.argv[2]
def next_task():                 # a queue consumer waiting for work: BLPOP on the work queue
    redis.Redis.from_url(url).blpop(["tasks:idle-queue"], timeout=0)
def tool_call():                 # an external call that never answers
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /tool HTTP/1.0\r\n\r\n")
    s.recv(4096)
for target in (next_task, tool_call):
    threading.Thread(target=target, name=target.__name__, daemon=True).start()
time.sleep(0.5)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.live
@pytest.mark.skipif(os.geteuid() != 0, reason="syscall files of a process need root here")
def test_worker_waiting_on_its_work_queue_is_idle_not_blocked(tmp_path, exporter_factory,
                                                               redis_url):
    # Reproduces a false alarm: a consumer parked in BLPOP on a real Redis (the work queue the
    # config names) counted as a thread blocked in an external call. With the redis_url set,
    # only the thread waiting on the silent tool endpoint is; without it both are.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    marker = f"fleetscope-queue-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / f"{marker}.py"
    script.write_text(QUEUE_WORKER)
    child = subprocess.Popen([sys.executable, str(script), str(silent.getsockname()[1]),
                              redis_url], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        waiting = f"fleetscope_pool_network_wait_threads{{{AGENTS}}}"
        blocked = f"fleetscope_pool_blocked_network_threads{{{AGENTS}}}"
        plain = exporter_factory("/", _config(marker))
        queued = exporter_factory("/", {**_config(marker), "redis_url": redis_url})
        deadline = time.monotonic() + 30
        while True:
            without, with_queue = samples(plain.text()), samples(queued.text())
            if without.get(blocked, 0) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert without[waiting] == 2 and without[blocked] == 2
        assert with_queue[waiting] == 1 and with_queue[blocked] == 1
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        silent.close()


def test_work_queue_peers_are_addresses_as_the_tcp_table_prints_them():
    config = parse_config({"redis_url": "redis://localhost:6380/0",
                           "work_queue_peers": ["10.0.0.5:6379", "[::ffff:10.0.0.6]:6379"]})
    assert config.work_queue_peers == ("10.0.0.5:6379", "10.0.0.6:6379", "127.0.0.1:6380",
                                       "[::1]:6380")
    assert parse_config({"redis_url": "redis://10.1.2.3/0"}).work_queue_peers == (
        "10.1.2.3:6379",)
    assert parse_config({"redis_url": "redis://queue.svc/0"}).work_queue_peers == ()
    for bad in (["queue.svc:6379"], ["10.0.0.5"], ["10.0.0.5:0"], "10.0.0.5:6379", [6379]):
        with pytest.raises(ConfigError, match="work_queue_peers"):
            parse_config({"work_queue_peers": bad})


def test_blocked_call_seconds_is_a_config_key_with_a_default():
    assert parse_config({}).blocked_call_seconds == 30.0
    assert parse_config({"blocked_call_seconds": 2}).blocked_call_seconds == 2.0
    for bad in (-1, "30", True):
        with pytest.raises(ConfigError, match="blocked_call_seconds"):
            parse_config({"blocked_call_seconds": bad})


def test_thread_oversubscription_names_the_pids_with_the_most_threads(tmp_path):
    from fleetscope.diagnose.engine import Finding
    from fleetscope.diagnose.enrich import Enricher
    from fleetscope.rules.catalog import by_id

    root = tmp_path / "root"
    for pid, threads in ((500, 8), (501, 400), (502, 1), (503, 64)):
        write_process(root, pid, "python3\0-m\0agent.worker\0", threads=threads)
    write_process(root, 600, "python3\0other.py\0", threads=900)  # not in the pool
    finding = Finding(by_id("thread-oversubscription"), "node", {"pool": "agents"}, 3.0, 0.8)
    tree = RecordedSample(str(root))
    Enricher(parse_config({"pools": POOL}), tree, tree)(finding)
    assert finding.subjects["pids"] == [501, 503, 500]  # single-threaded 502 is no suspect
    assert finding.extra_summary.startswith("most threads: pid 501 (400)")


# ---- live: threads taking turns on one mutex, beside threads parked for work ------------

LOCKED = r"""
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER;
static volatile unsigned long sink;
static void spin_ms(int ms) {     /* compute: CPU time, no syscall */
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do { for (int i = 0; i < 10000; i++) sink += i;
         clock_gettime(CLOCK_MONOTONIC, &b);
    } while ((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000 < ms);
}
static void *serialised(void *arg) {  /* the whole request under the one lock */
    for (;;) { pthread_mutex_lock(&lock); spin_ms(20); pthread_mutex_unlock(&lock);
               spin_ms(1); }
}
static void *parked(void *arg) {      /* a pool thread waiting for work that never comes */
    pthread_mutex_lock(&lock);
    for (;;) pthread_cond_wait(&work, &lock);
}
int main(int argc, char **argv) {
    alarm(atoi(argv[2]));             /* ends by itself */
    void *(*body)(void *) = strcmp(argv[1], "serialised") == 0 ? serialised : parked;
    pthread_t t;
    for (int i = 0; i < 4; i++) pthread_create(&t, 0, body, 0);
    pause();
}
"""


@pytest.mark.live
@pytest.mark.skipif(os.geteuid() != 0, reason="syscall files of a process need root here")
def test_threads_taking_turns_on_a_mutex_count_as_lock_waits_parked_ones_do_not(tmp_path):
    """A real process whose four threads do their work under one pthread mutex: the ones
    not holding it sleep in futex() and run again between scrapes, counted in
    fleetscope_pool_lock_wait_threads; four threads parked on a condition variable (a pool
    waiting for work) sleep in futex() too but never run, and count 0."""
    from fleetscope.collectors.pools import PoolsCollector
    from fleetscope.collectors.source import evidence_source

    require_tool("gcc")
    source = tmp_path / "locked.c"
    source.write_text(LOCKED)
    binary = tmp_path / f"fs_locked_{os.getpid()}"
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(binary), str(source)], check=True)
    children = [subprocess.Popen([str(binary), kind, "60"]) for kind in ("serialised",
                                                                          "parked")]
    try:
        config = parse_config({"pools": [
            {"name": "serialised", "class": "online",
             "match": {"cmdline": f"{binary.name} serialised"}},
            {"name": "parked", "class": "online",
             "match": {"cmdline": f"{binary.name} parked"}}]})
        collector = PoolsCollector(config)
        live = evidence_source("/", "live")
        counts: dict[str, list[float]] = {"serialised": [], "parked": []}
        for _ in range(8):
            parsed = samples(render(list(collector.collect(Scrape(live)))))
            for pool in counts:
                counts[pool].append(parsed.get(
                    f'fleetscope_pool_lock_wait_threads{{class="online",pool="{pool}"}}'))
            time.sleep(0.5)
    finally:
        for child in children:
            child.kill()
            child.wait()
    serialised, parked = counts["serialised"][1:], counts["parked"][1:]  # first: no history
    assert None not in serialised + parked, counts
    # the waiters glibc wakes run between scrapes; one it never wakes (an unfair mutex: the
    # holder takes it back first) sleeps on uncounted, and a busy machine may catch the
    # holder preempted: at least one waiter on most scrapes, two or more on some
    assert statistics.median(serialised) >= 1 and max(serialised) >= 2, counts
    assert max(parked) == 0, counts
