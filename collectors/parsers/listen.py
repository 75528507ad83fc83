"""Parsers for a node's TCP listening sockets and their accept queues, from three sources:

  - the kernel's sock_diag answer to a dump of LISTEN sockets (net/ipv4/inet_diag.c,
    tcp_diag.c tcp_diag_get_info): for a listener `idiag_rqueue` is sk_ack_backlog (the
    accept-queue length) and `idiag_wqueue` is sk_max_ack_backlog (the backlog: listen()'s
    argument capped at net.core.somaxconn), what `ss -lnt` prints as Recv-Q and Send-Q;
  - /proc/net/tcp and tcp6 (tcp_ipv4.c get_tcp4_sock): a LISTEN row (st 0A) has the accept
    queue in rx_queue, but no backlog (tx_queue is 0, the last field is the TCP Fast Open
    queue's max_qlen);
  - a bundle's `cmd/tcp-listeners.txt`, written by `fleetscope bundle record` from the first
    one (docs/tcp-listeners.md):

        # listener accept_queue backlog inode pids
        127.0.0.1:8080 3 2 4711023 5210

The kernel drops a connection when the queue is already over the backlog
(sk_acceptq_is_full: sk_ack_backlog > sk_max_ack_backlog), counting TcpExt ListenOverflows
and ListenDrops: a queue of backlog + 1 is a full one.
"""

from __future__ import annotations

import socket
import struct
from typing import NamedTuple

from . import ParseError, parse_int
from .net_tcp import _address

TCP_LISTEN = 10  # include/net/tcp_states.h
NLMSG_DONE = 3
NLMSG_ERROR = 2
SOCK_DIAG_BY_FAMILY = 20
_NLMSG_HEADER = struct.Struct("=IHHII")
# struct inet_diag_msg: family, state, timer, retrans, then the socket id (ports in network
# order, 16-byte addresses, interface, cookie), expires, rqueue, wqueue, uid, inode
_INET_DIAG_MSG = struct.Struct("=BBBB2s2s16s16sI8sIIIII")
HEADER = "# listener accept_queue backlog inode pids"


class Listener(NamedTuple):
    address: str  # "127.0.0.1:8080", "[::]:9105"
    queue: int  # connections accepted by the kernel, not yet by the process
    backlog: int | None  # the accept queue's bound; None where the source does not say
    inode: int
    pids: tuple[int, ...] = ()  # the processes holding it, where known

    @property
    def full(self) -> bool:
        return self.backlog is not None and self.queue >= self.backlog

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])


def _endpoint(family: int, raw: bytes, port: bytes) -> str:
    number = struct.unpack("!H", port)[0]
    if family == socket.AF_INET:
        return f"{socket.inet_ntop(socket.AF_INET, raw[:4])}:{number}"
    text = socket.inet_ntop(socket.AF_INET6, raw)
    return f"{text.removeprefix('::ffff:')}:{number}" if text.startswith("::ffff:") and \
        "." in text else f"[{text}]:{number}"


def listen_dump_request(family: int, sequence: int = 1) -> bytes:
    """A SOCK_DIAG_BY_FAMILY dump request for `family`'s TCP sockets in LISTEN only: the
    kernel then walks the listening hash alone, never the established connections."""
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN) \
        + bytes(48)
    flags = 0x1 | 0x300  # NLM_F_REQUEST | NLM_F_DUMP
    return _NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY, flags,
                              sequence, 0) + request


def parse_listen_dump(data: bytes) -> tuple[list[Listener], bool]:
    """The listeners in one datagram of the kernel's answer, and whether it ended the dump
    (NLMSG_DONE). An NLMSG_ERROR (sock_diag unavailable) is a ParseError.

    >>> sock = struct.pack("=BBBB", socket.AF_INET, TCP_LISTEN, 0, 0) + struct.pack(
    ...     "!HH", 8080, 0) + socket.inet_aton("127.0.0.1").ljust(16, b"\\0") + bytes(28) \\
    ...     + struct.pack("=IIIII", 0, 3, 2, 0, 4711023)
    >>> message = _NLMSG_HEADER.pack(16 + len(sock), SOCK_DIAG_BY_FAMILY, 2, 1, 0) + sock
    >>> parse_listen_dump(message + _NLMSG_HEADER.pack(20, NLMSG_DONE, 2, 1, 0) + bytes(4))
    ([Listener(address='127.0.0.1:8080', queue=3, backlog=2, inode=4711023, pids=())], True)
    """
    listeners, offset = [], 0
    while offset + _NLMSG_HEADER.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSG_HEADER.unpack_from(data, offset)
        if length < _NLMSG_HEADER.size or offset + length > len(data):
            raise ParseError(f"sock_diag answer: message length {length} out of bounds")
        if kind == NLMSG_DONE:
            return listeners, True
        if kind == NLMSG_ERROR:
            raise ParseError("sock_diag answer: the kernel refused the dump")
        if kind == SOCK_DIAG_BY_FAMILY:
            if length < _NLMSG_HEADER.size + _INET_DIAG_MSG.size:
                raise ParseError("sock_diag answer: shorter than an inet_diag_msg")
            (family, state, _timer, _retrans, sport, _dport, src, _dst, _if, _cookie,
             _expires, rqueue, wqueue, _uid, inode) = _INET_DIAG_MSG.unpack_from(
                data, offset + _NLMSG_HEADER.size)
            if family not in (socket.AF_INET, socket.AF_INET6):
                raise ParseError(f"sock_diag answer: address family {family}")
            if state == TCP_LISTEN:
                listeners.append(Listener(_endpoint(family, src, sport), rqueue, wqueue,
                                          inode))
        offset += (length + 3) & ~3
    return listeners, False


def parse_listen_rows(text: str, what: str = "/proc/net/tcp") -> list[Listener]:
    """LISTEN rows of /proc/net/tcp or tcp6: address, accept queue (rx_queue), inode; the
    backlog is not in this file.

    >>> parse_listen_rows("  sl  local_address rem_address   st tx_queue rx_queue tr "
    ...     "tm->when retrnsmt   uid  timeout inode\\n"
    ...     "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000003 00:00000000 00000000"
    ...     "     0        0 4711023 1 0000000000000000 100 0 0 10 0\\n")
    [Listener(address='127.0.0.1:8080', queue=3, backlog=None, inode=4711023, pids=())]
    """
    lines = text.splitlines()
    if not lines or "local_address" not in lines[0]:
        raise ParseError(f"{what}: no header line")
    listeners = []
    for line in lines[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != "0A":
            continue
        queues = fields[4].partition(":")[2]
        try:
            queue = int(queues, 16)
        except ValueError:
            raise ParseError(f"{what}: malformed queues in {line[:48]!r}") from None
        host, port = _address(fields[1], what)
        listeners.append(Listener(f"{host}:{port}", queue, None,
                                  parse_int(fields[9], f"{what} inode")))
    return listeners


def parse_listeners_file(text: str, what: str = "cmd/tcp-listeners.txt") -> list[Listener]:
    """The bundle's record of the listeners (see the module docstring).

    >>> parse_listeners_file(HEADER + "\\n[::]:9105 0 4096 88 901,902\\n")
    [Listener(address='[::]:9105', queue=0, backlog=4096, inode=88, pids=(901, 902))]
    """
    lines = text.splitlines()
    if not lines or lines[0].strip() != HEADER:
        raise ParseError(f"{what}: no header line")
    listeners = []
    for line in lines[1:]:
        fields = line.split()
        if not fields:
            continue
        if len(fields) not in (4, 5) or ":" not in fields[0]:
            raise ParseError(f"{what}: malformed line {line[:48]!r}")
        queue, inode = parse_int(fields[1], what), parse_int(fields[3], what)
        backlog = None if fields[2] == "-" else parse_int(fields[2], what)
        pids = tuple(parse_int(p, what) for p in fields[4].split(",")) \
            if len(fields) == 5 else ()
        listeners.append(Listener(fields[0], queue, backlog, inode, pids))
    return listeners


def format_listeners_file(listeners: list[Listener]) -> str:
    lines = [HEADER]
    for item in listeners:
        backlog = "-" if item.backlog is None else item.backlog
        pids = ",".join(map(str, item.pids))
        lines.append(f"{item.address} {item.queue} {backlog} {item.inode} {pids}".rstrip())
    return "\n".join(lines) + "\n"
