"""Collector `listen`: each TCP listening socket's accept queue against its backlog, the
cause side of TcpExt ListenOverflows (collectors/tcp.py): a server whose accept loop does not
keep up holds a queue at its backlog, and the kernel drops the handshakes beyond it.

    fleetscope_tcp_listen_queue_connections{listener="127.0.0.1:8080"}    3
    fleetscope_tcp_listen_backlog_connections{listener="127.0.0.1:8080"}  2

Sources (collectors/parsers/listen.py): live, a sock_diag netlink dump of LISTEN sockets
(the kernel walks its listening hash only, so a node with 100k connections costs what a
node with none does; `ss -lnt` asks the same); in a bundle, `cmd/tcp-listeners.txt` recorded
from that dump. Where neither answers (sock_diag refused, a bundle from another recorder),
/proc/net/tcp{,6} LISTEN rows give the queue without the backlog.

The listeners are those of the network namespace the exporter runs in, as ListenOverflows
is: run it with the host network to see the node's.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

from fleetscope.core.exposition import Family, gauge, labels

from .base import Collector, Evidence, NotAvailable, Scrape, Signal
from .parsers import ParseError
from .parsers.listen import (
    Listener,
    listen_dump_request,
    parse_listen_dump,
    parse_listen_rows,
    parse_listeners_file,
)

NETLINK_SOCK_DIAG = 4  # include/uapi/linux/netlink.h
LISTENERS_FILE = "cmd/tcp-listeners.txt"
MAX_LISTENERS = 64  # series per node: the fullest listeners first
MAX_DUMP_MESSAGES = 256  # datagrams read from one dump before giving up on it


def dump_listeners() -> list[Listener]:
    """This network namespace's listeners with their backlogs, from sock_diag (OSError when
    the kernel or the sandbox refuses netlink)."""
    listeners: list[Listener] = []
    for sequence, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as query:
            query.settimeout(1.0)
            query.sendto(listen_dump_request(family, sequence), (0, 0))
            for _ in range(MAX_DUMP_MESSAGES):
                try:
                    found, done = parse_listen_dump(query.recv(65536))
                except ParseError as err:
                    raise OSError(str(err)) from None
                listeners += found
                if done:
                    break
    return listeners


def read_listeners(scrape: Scrape) -> list[Listener]:
    """The listeners as this source holds them (see the module docstring)."""
    def read() -> list[Listener]:
        if scrape.evidence.live:
            try:
                return dump_listeners()
            except OSError:
                pass
        else:
            try:
                return parse_listeners_file(scrape.read_text(LISTENERS_FILE))
            except NotAvailable:
                pass
        rows, found = [], False
        for name in ("tcp", "tcp6"):
            try:
                text = scrape.read_text(f"proc/net/{name}")
            except NotAvailable:
                continue
            found = True
            rows += parse_listen_rows(text, f"/proc/net/{name}")
        if not found:
            raise NotAvailable("no listening sockets recorded (sock_diag, /proc/net/tcp)")
        return rows

    return scrape.memo("listen.listeners", read)


def socket_owners(scrape: Scrape, inodes: set[int]) -> dict[int, list[int]]:
    """inode -> the pids holding a `socket:[inode]` fd, from the fd links of every process
    (costly on a busy node: for a few sockets of a diagnosis, never per scrape)."""
    owners: dict[int, list[int]] = {}
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    try:
        pids = [name for name in scrape.listdir("proc") if name.isdigit()]
    except NotAvailable:
        return owners
    for pid in pids:
        directory = scrape.path(f"proc/{pid}/fd")
        try:
            fds = os.listdir(directory)
        except OSError:
            continue
        for fd in fds:
            try:
                inode = wanted.get(os.readlink(os.path.join(directory, fd)))
            except OSError:
                continue
            if inode is not None and int(pid) not in owners.get(inode, []):
                owners.setdefault(inode, []).append(int(pid))
    return owners


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_tcp_listen_backlog_connections",
           "listening socket's accept-queue bound", "connections"),
    Signal("fleetscope_tcp_listen_queue_connections",
           "connections waiting in a listening socket's accept queue", "connections"),
)


class ListenCollector(Collector):
    name = "listen"
    evidence = Evidence(signals=SIGNALS)

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        queue = gauge("fleetscope_tcp_listen_queue_connections",
                      "Connections in a listening socket's accept queue, not yet accepted "
                      "by its process (sk_ack_backlog).")
        backlog = gauge("fleetscope_tcp_listen_backlog_connections",
                        "A listening socket's accept-queue bound (listen() backlog capped at "
                        "net.core.somaxconn; sk_max_ack_backlog); the kernel drops "
                        "handshakes once the queue is over it.")
        with scrape.source(self.name, "sock_diag"):
            listeners = read_listeners(scrape)
            fullest = sorted(listeners, key=lambda item: (
                -(item.queue / max(item.backlog or 0, 1)), item.address))
            seen = set()
            for item in fullest:
                if item.address in seen:
                    continue  # SO_REUSEPORT groups: the fullest socket of the address
                seen.add(item.address)
                if len(seen) > MAX_LISTENERS:
                    break
                queue.add(item.queue, labels(listener=item.address))
                if item.backlog is not None:
                    backlog.add(item.backlog, labels(listener=item.address))
        for family in (queue, backlog):
            if family.samples:
                yield family
