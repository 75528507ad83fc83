"""Listening sockets and their accept queues (collectors/listen.py, parsers/listen.py): the
kernel's sock_diag answer and /proc/net/tcp read on this machine against a listener this
test made (backlog 2, five connections: 3 queued, the kernel's `> backlog` bound), the
bundle file's format, and the collector on recorded trees."""

from __future__ import annotations

import contextlib
import doctest
import os
import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetscope.collectors.base import Scrape
from fleetscope.collectors.listen import (
    LISTENERS_FILE,
    ListenCollector,
    dump_listeners,
    read_listeners,
    socket_owners,
)
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers import listen as listen_parsers
from fleetscope.collectors.parsers.listen import (
    HEADER,
    Listener,
    format_listeners_file,
    parse_listen_dump,
    parse_listen_rows,
    parse_listeners_file,
)
from fleetscope.collectors.source import LiveHost, RecordedSample
from fleetscope.core.config import Config
from tests.fuzzing import parser_fuzz_tests
from tests.test_fuzz_parsers import procish


@contextlib.contextmanager
def _full_listener(backlog: int = 2, clients: int = 5):
    """A listener on 127.0.0.1 that never accepts, and `clients` connections to it."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(backlog)
    opened = []
    try:
        for _ in range(clients):
            client = socket.socket()
            client.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                client.connect(server.getsockname())
            opened.append(client)
        # the handshakes complete in softirq context: wait (bounded) for the queue to fill
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            mine = [item for item in dump_listeners() if item.address ==
                    f"127.0.0.1:{server.getsockname()[1]}"]
            if mine and mine[0].queue > backlog:
                break
            time.sleep(0.05)
        yield server
    finally:
        for client in opened:
            client.close()
        server.close()


def test_sock_diag_and_proc_net_tcp_show_the_queue_this_test_filled():
    with _full_listener() as server:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        inode = int(os.readlink(f"/proc/self/fd/{server.fileno()}")[len("socket:["):-1])
        by_diag = {item.address: item for item in dump_listeners()}[address]
        with open("/proc/net/tcp") as table:
            by_proc = {item.address: item for item in parse_listen_rows(table.read())}[address]
        owners = socket_owners(Scrape(LiveHost("/")), {inode})
    # listen(2): the queue holds backlog + 1 before the kernel drops (sk_acceptq_is_full)
    assert (by_diag.queue, by_diag.backlog, by_diag.inode) == (3, 2, inode)
    assert by_diag.full
    assert (by_proc.queue, by_proc.backlog, by_proc.inode) == (3, None, inode)
    assert owners == {inode: [os.getpid()]}


def test_the_backlog_is_capped_at_somaxconn():
    with open("/proc/sys/net/core/somaxconn") as handle:
        somaxconn = int(handle.read())
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(somaxconn + 1000)
    try:
        mine = {item.address: item for item in dump_listeners()}[
            f"127.0.0.1:{server.getsockname()[1]}"]
    finally:
        server.close()
    assert mine.backlog == somaxconn and mine.queue == 0 and not mine.full


def test_listeners_file_round_trip_and_bad_lines():
    listeners = [Listener("127.0.0.1:8080", 3, 2, 4711023, (5210, 5211)),
                 Listener("[::]:9105", 0, 4096, 88), Listener("0.0.0.0:22", 0, None, 1068)]
    text = format_listeners_file(listeners)
    assert text.splitlines()[0] == HEADER
    assert parse_listeners_file(text) == listeners
    for bad in ("", "127.0.0.1:8080 3 2 1\n", HEADER + "\n127.0.0.1:8080 three 2 1\n",
                HEADER + "\nnot-an-address 3 2 1\n", HEADER + "\n127.0.0.1:1 3 2 1 x,y\n"):
        with pytest.raises(ParseError):
            parse_listeners_file(bad)


def test_dump_parser_refuses_truncated_and_error_answers():
    header = b"\x10\x00\x00\x00\x02\x00\x00\x00" + bytes(8)  # NLMSG_ERROR, 16 bytes
    with pytest.raises(ParseError):
        parse_listen_dump(header + bytes(4))
    with pytest.raises(ParseError):  # a SOCK_DIAG_BY_FAMILY message cut short
        parse_listen_dump(b"\x20\x00\x00\x00\x14\x00\x02\x00" + bytes(24))
    assert parse_listen_dump(b"") == ([], False)


def test_collector_reads_the_bundle_file_then_falls_back_to_proc_net_tcp(tmp_path):
    recorded = tmp_path / "with-file"
    (recorded / "cmd").mkdir(parents=True)
    (recorded / LISTENERS_FILE).write_text(format_listeners_file(
        [Listener("127.0.0.1:8080", 3, 2, 4711023, (5210,)), Listener("[::]:9105", 0, 4096, 88)]))
    scrape = Scrape(RecordedSample(str(recorded)))
    assert [(i.address, i.queue, i.backlog) for i in read_listeners(scrape)] == [
        ("127.0.0.1:8080", 3, 2), ("[::]:9105", 0, 4096)]
    families = {f.name: f for f in ListenCollector(Config()).collect(scrape)}
    assert len(families["fleetscope_tcp_listen_queue_connections"].samples) == 2
    assert len(families["fleetscope_tcp_listen_backlog_connections"].samples) == 2
    assert scrape.sources[("listen", "sock_diag")] == (True, "")

    # another recorder's bundle with the TCP table only: queues, no backlog
    table = tmp_path / "table-only"
    (table / "proc/net").mkdir(parents=True)
    (table / "proc/net/tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode\n"
        "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000003 00:00000000 00000000     0"
        "        0 4711023 1 0000000000000000 100 0 0 10 0\n"
        "   1: 0100007F:1F90 0100007F:B5EB 01 00000000:00000000 00:00000000 00000000     0"
        "        0 4711099 1 0000000000000000 20 4 30 10 -1\n")
    scrape = Scrape(RecordedSample(str(table)))
    families = {f.name: f for f in ListenCollector(Config()).collect(scrape)}
    assert [s[1] for s in families["fleetscope_tcp_listen_queue_connections"].samples] == [3]
    assert "fleetscope_tcp_listen_backlog_connections" not in families

    # neither: not available, said so, no metric
    empty = tmp_path / "none"
    empty.mkdir()
    scrape = Scrape(RecordedSample(str(empty)))
    assert list(ListenCollector(Config()).collect(scrape)) == []
    assert scrape.sources[("listen", "sock_diag")][0] is False

    # a corrupt file costs the listener metrics, never the scrape
    (recorded / LISTENERS_FILE).write_text("garbage\n")
    scrape = Scrape(RecordedSample(str(recorded)))
    assert list(ListenCollector(Config()).collect(scrape)) == []
    assert scrape.errors["listen"]


# A real /proc/net/tcp of this machine: a listener with 3 queued (backlog 2), a connection.
NET_TCP_LISTENING = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
    "timeout inode\n"
    "   0: 0100007F:D115 00000000:0000 0A 00000000:00000003 00:00000000 00000000     0"
    "        0 16936 1 000000006b073d4d 100 0 0 10 0\n"
    "   1: 0100007F:D115 0100007F:B5EB 01 00000000:00000000 00:00000000 00000000     0"
    "        0 18791 1 0000000040ecf2bb 20 4 30 10 -1\n")
LISTEN_PARSERS = {
    "listeners_file": (parse_listeners_file, format_listeners_file(
        [Listener("127.0.0.1:8080", 3, 2, 4711023, (5210,)), Listener("[::]:9105", 0, 4096, 88),
         Listener("0.0.0.0:22", 0, None, 1068)])),
    "listen_rows": (parse_listen_rows, NET_TCP_LISTENING),
}
test_fuzz_listen_garbage, test_fuzz_listen_cut_and_corrupted = parser_fuzz_tests(
    LISTEN_PARSERS, procish)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400))
def test_fuzz_sock_diag_answers_raise_parse_error_only(data):
    with contextlib.suppress(ParseError):
        parse_listen_dump(data)


def test_listen_parser_docstring_examples():
    failures, tried = doctest.testmod(listen_parsers)
    assert tried and not failures
