"""Connections waiting for a pool, read from the kernel alone (collectors/tasks.py, the pools
collector): the TCP table's queue and timer columns on real lines, the age of a connect()
whose SYN goes unanswered against the kernel's retransmission schedule, and waits on fixture
trees in the bundle's format (a SYN_SENT wait, a wait no older than its thread, a pool whose
sockets cannot be read). The same on this machine's /proc: tests/test_live_fault_connections.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import strategies as st

from fleetscope.collectors.base import Scrape
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers.net_tcp import (
    TcpQueues,
    parse_sockstat_inuse,
    parse_tcp_queues,
)
from fleetscope.collectors.source import RecordedSample
from fleetscope.collectors.tasks import pool_sockets, syn_sent_age, waiting_sockets
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import samples
from tests.fuzzing import parser_fuzz_tests
from tests.test_pools import NET_TCP_WAITING_REAL, write, write_process

# /proc/net/tcp6 of this project's CI machine (Linux 6.18), lines verbatim: a listener on ::1
# with 2 connections nobody accepted, and an accepted connection holding 64 unread bytes.
NET_TCP6_WAITING_REAL = (
    "  sl  local_address                         remote_address                        st "
    "tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 00000000000000000000000001000000:EBB5 00000000000000000000000000000000:0000 0A "
    "00000000:00000002 00:00000000 00000000     0        0 246278 3 000000006af74433 100 0 0 "
    "10 0\n"
    "   6: 00000000000000000000000001000000:D3BB 00000000000000000000000001000000:C480 01 "
    "00000000:00000040 00:00000000 00000000     0        0 246283 1 00000000c95b1022 20 4 30 "
    "10 -1\n"
)
SOCKSTAT_REAL = ("sockets: used 12\nTCP: inuse 1 orphan 0 tw 243 alloc 1 mem 180\n"
                 "UDP: inuse 0 mem 0\nUDPLITE: inuse 0\nRAW: inuse 0\nFRAG: inuse 0 memory 0\n")
SOCKSTAT6_REAL = ("TCP6: inuse 0\nUDP6: inuse 0\nUDPLITE6: inuse 0\nRAW6: inuse 0\n"
                  "FRAG6: inuse 0 memory 0\n")
# task/<tid>/syscall of a thread blocked in connect(fd 5) to a listener whose accept queue is
# full (wchan wait_woken), on the same machine.
SYSCALL_CONNECT_REAL = "42 0x5 0x7f5fddd5ba30 0x10 0x0 0x0 0x0 0x7f5fddd5b990 0x7f5fde5287fb\n"
SYSCALL_RECVFROM_REAL = "45 0x4 0x7f22bfb78a40 0xa 0x0 0x0 0x0 0x7f22bf97da10 0x7f22c0128974\n"
# A SYN_SENT socket's retrnsmt and tm->when read at known times after its connect() (seconds,
# on the same machine, tcp_syn_linear_timeouts 4): the retransmit timer, fired 1, 1, 1, 1 s
# apart, then 2 s after the fifth; at 5.10 s the fifth was due and not yet sent.
SYN_SENT_OBSERVED = [(0.50, 0, 0x31), (1.02, 1, 0x63), (1.54, 1, 0x2F), (2.06, 2, 0x62),
                     (3.08, 3, 0x63), (4.09, 4, 0x63), (5.10, 4, 0x00), (6.11, 5, 0x63)]


def test_queue_and_timer_columns_of_real_lines():
    rows = parse_tcp_queues(NET_TCP_WAITING_REAL)
    assert rows == {
        73410: TcpQueues("LISTEN", 3, 0, 0, 0),  # 3 connections not accepted
        73416: TcpQueues("ESTABLISHED", 1000, 0, 0, 0),  # 1,000 bytes not read
        73417: TcpQueues("SYN_SENT", 0, 3, 1, 0x36),  # the SYN sent 4 times, 0.54 s to the 5th
        74343: TcpQueues("ESTABLISHED", 0, 3, 1, 0x51),  # 500 bytes unacknowledged
        232834: TcpQueues("CLOSE_WAIT", 1, 0, 0, 0),  # the peer's FIN
        73408: TcpQueues("LISTEN", 1, 0, 0, 0),
    }
    six = parse_tcp_queues(NET_TCP6_WAITING_REAL, what="/proc/net/tcp6")
    assert six == {246278: TcpQueues("LISTEN", 2, 0, 0, 0),
                   246283: TcpQueues("ESTABLISHED", 64, 0, 0, 0)}
    # asked for by inode: idle sockets too, nothing else
    table = NET_TCP_WAITING_REAL.replace(" 00000000:000003E8 ", " 00000000:00000000 ")
    assert parse_tcp_queues(table, {73416, 5}) == {73416: TcpQueues("ESTABLISHED", 0, 0, 0, 0)}
    assert 73416 not in parse_tcp_queues(table)


def test_sockstat_counts_of_real_files():
    assert parse_sockstat_inuse(SOCKSTAT_REAL, "TCP") == 1
    assert parse_sockstat_inuse(SOCKSTAT6_REAL, "TCP6") == 0
    with pytest.raises(ParseError):
        parse_sockstat_inuse(SOCKSTAT6_REAL, "TCP")


@pytest.mark.parametrize("parser, text", [
    (parse_tcp_queues, ""),
    (parse_tcp_queues, NET_TCP_WAITING_REAL.replace("00000000:00000003", "00000000-00000003")),
    (parse_tcp_queues, NET_TCP_WAITING_REAL.replace("01:00000036", "01:000000zz")),
    (parse_tcp_queues, NET_TCP_WAITING_REAL.replace(" 73417 ", " 73x17 ")),
    (parse_sockstat_inuse, "TCP: inuse many\n"),
])
def test_parsers_reject_malformed(parser, text):
    with pytest.raises(ParseError):
        parser(text) if parser is parse_tcp_queues else parser(text, "TCP")


test_fuzz_garbage, test_fuzz_cut_and_corrupted = parser_fuzz_tests(
    {"tcp_queues": (parse_tcp_queues, NET_TCP_WAITING_REAL),
     "tcp6_queues": (parse_tcp_queues, NET_TCP6_WAITING_REAL),
     "sockstat": (lambda text: parse_sockstat_inuse(text, "TCP"), SOCKSTAT_REAL)},
    st.text(alphabet="0123456789ABCDEFTCP:inuse \n", max_size=300))


@pytest.mark.parametrize("seconds, retransmits, ticks", SYN_SENT_OBSERVED)
def test_syn_sent_age_matches_the_time_since_connect(seconds, retransmits, ticks):
    age = syn_sent_age(TcpQueues("SYN_SENT", 0, retransmits, 1, ticks), 4, 100)
    # the timer fires within a jiffy or two of its time; the observation took some ms
    assert age == pytest.approx(seconds, abs=0.15)


def test_syn_sent_age_refuses_rows_off_the_schedule():
    assert syn_sent_age(TcpQueues("SYN_SENT", 0, 0, 1, 300), 4, 100) is None  # 3 s left of 1
    assert syn_sent_age(TcpQueues("SYN_SENT", 0, 2, 0, 0), 4, 100) is None  # no timer
    assert syn_sent_age(TcpQueues("SYN_SENT", 0, 4096, 1, 0), 4, 100) is None  # not a u8


# ---- fixture trees in the bundle's format ------------------------------------------------

POOL = [{"name": "agents", "class": "online", "match": {"cmdline": "agent.worker"}}]
AGENTS = 'class="online",pool="agents"'
BTIME = 1764880000
START_TICKS = 300_000  # the worker started 3,000 s after boot


def worker_tree(tmp_path: Path, syscall: str, fd_sockets: str, linear: str | None = "4\n"
                ) -> Path:
    """A worker whose main thread sleeps in `syscall`, with its socket fds as `bundle record`
    writes them, the TCP table above, /proc/stat's btime and the SYN timeouts sysctl."""
    root = tmp_path / f"root-{len(list(tmp_path.iterdir()))}"
    write_process(root, 500, "python3\0-m\0agent.worker\0", starttime=START_TICKS)
    write(root / "proc/500/syscall", syscall)
    write(root / "proc/500/wchan", "wait_woken")
    write(root / "proc/500/fd_sockets", fd_sockets)
    write(root / "proc/net/tcp", NET_TCP_WAITING_REAL)
    write(root / "proc/stat", f"cpu  1 0 1 100 0 0 0 0 0 0\ncpu0 1 0 1 100 0 0 0 0 0 0\n"
          f"intr 7 0 0\nctxt 42\nbtime {BTIME}\nprocesses 900\nprocs_running 1\n")
    write(root / "proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\n")
    if linear is not None:
        write(root / "proc/sys/net/ipv4/tcp_syn_linear_timeouts", linear)
    return root


def longest_wait(root: Path, thread_age: float) -> float:
    config = parse_config({"pools": POOL, "collectors": ["pools"]}, ("pools",))
    now = BTIME + START_TICKS / 100 + thread_age
    got = samples(render(Exporter(str(root), config).collect(now=now)))
    return got[f"fleetscope_pool_network_wait_longest_seconds{{{AGENTS}}}"]


def test_a_connect_whose_syn_goes_unanswered_is_as_old_as_its_first_syn(tmp_path):
    # Recorded with tcp_info's idle time: 6,500 s, the machine's uptime (the socket never
    # carried data). The SYN's timer says 3 timeouts of 1 s, 0.54 s left of the fourth.
    root = worker_tree(tmp_path, SYSCALL_CONNECT_REAL, "5 73417 6500000\n")
    assert longest_wait(root, 600.0) == pytest.approx(1 + 1 + 1 + (1 - 0.54))
    # a kernel before 6.5 (no tcp_syn_linear_timeouts) doubles from the first: 1, 2, 4, 8
    root = worker_tree(tmp_path, SYSCALL_CONNECT_REAL, "5 73417 6500000\n", linear=None)
    assert longest_wait(root, 600.0) == pytest.approx(1 + 2 + 4 + (8 - 0.54))


def test_no_wait_is_older_than_its_thread(tmp_path):
    # a pooled connection silent for 900 s, picked up by a thread that started 60 s ago
    root = worker_tree(tmp_path, SYSCALL_RECVFROM_REAL, "4 73416 900000\n")
    assert longest_wait(root, 60.0) == pytest.approx(60.0, abs=0.01)
    assert longest_wait(root, 1200.0) == pytest.approx(900.0)
    root = worker_tree(tmp_path, SYSCALL_CONNECT_REAL, "5 73417\n")
    assert longest_wait(root, 2.0) == pytest.approx(2.0, abs=0.01)


def test_a_pool_whose_sockets_cannot_be_read_reports_nothing(tmp_path):
    root = worker_tree(tmp_path, SYSCALL_RECVFROM_REAL, "")
    (root / "proc/500/fd_sockets").unlink()
    config = parse_config({"pools": POOL, "collectors": ["pools"]}, ("pools",))
    got = samples(render(Exporter(str(root), config).collect(now=BTIME + 4000.0)))
    assert not [k for k in got if k.startswith("fleetscope_pool_connections_")]
    assert got['fleetscope_scrape_source_available{collector="pools",'
               'source="proc/<pid>/fd/<n>"}'] == 0
    # no TCP table at all: unknown too, and said so
    (root / "proc/net/tcp").unlink()
    got = samples(render(Exporter(str(root), config).collect(now=BTIME + 4000.0)))
    assert not [k for k in got if k.startswith("fleetscope_pool_connections_")]
    assert got['fleetscope_scrape_source_available{collector="pools",'
               'source="proc/<pid>/net/tcp"}'] == 0
    # a table where nothing waits: a real 0 without reading any fd
    write(root / "proc/net/tcp", NET_TCP_WAITING_REAL.splitlines(True)[0])
    got = samples(render(Exporter(str(root), config).collect(now=BTIME + 4000.0)))
    assert got[f'fleetscope_pool_connections_waiting{{{AGENTS},queue="accept"}}'] == 0
    assert got[f'fleetscope_pool_connections_retransmitting{{{AGENTS},state="syn_sent"}}'] == 0


def test_fds_are_read_within_the_pool_budget_and_not_past_what_waits(tmp_path):
    root = tmp_path / "root"
    write(root / "proc/net/tcp", NET_TCP_WAITING_REAL)
    for pid, lines in ((600, "3 73410\n"), (601, "3 73410\n4 73416\n"), (602, "3 73417\n")):
        write(root / f"proc/{pid}/fd_sockets", lines)
    scrape = Scrape(RecordedSample(str(root)), 1000.0)
    members = [(600, "root"), (601, "root"), (602, "root")]
    assert set(waiting_sockets(scrape, 600, "root")) == {73410, 73416, 73417, 74343, 73408}
    found = pool_sockets(scrape, members)
    assert set(found.waiting) == {73410, 73416, 73417} and set(found.read) == {600, 601, 602}
    # a budget of one fd: the first process's, then no more
    found = pool_sockets(scrape, members, budget=1)
    assert set(found.read) == {600} and set(found.waiting) == {73410}
    # once every waiting socket of the namespace is the pool's, the rest are not read
    write(root / "proc/net/tcp", "".join(NET_TCP_WAITING_REAL.splitlines(True)[:2]))
    scrape = Scrape(RecordedSample(str(root)), 1000.0)
    found = pool_sockets(scrape, members)
    assert set(found.read) == {600} and set(found.waiting) == {73410} and found.known
