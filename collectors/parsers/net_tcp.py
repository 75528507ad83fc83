"""Parser for /proc/net/tcp and /proc/net/tcp6 (net/ipv4/tcp_ipv4.c tcp4_seq_show(),
net/ipv6/tcp_ipv6.c tcp6_seq_show(); format in the kernel's
Documentation/networking/proc_net_tcp.rst): which peer a socket inode talks to, and what
waits on it.

      sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid ...
       2: 0100007F:A06B 0100007F:AF2E 01 00000000:00000000 00:00000000 00000000     0 ...
    (then timeout, inode 22523, refcount, the sock's address, timers and windows)

Addresses are the network-order __be32 words printed with %08X as the CPU holds them, so on
the little-endian machines fleetscope runs on (x86-64, arm64 as Linux distributions build it)
127.0.0.1 reads 0100007F; tcp6 prints four such words. Ports are host-order %04X. A listening
or not-yet-connected socket has the peer 00000000:0000.

The columns after the state (tcp_ipv4.c get_tcp4_sock(), tcp_ipv6.c get_tcp6_sock()), all hex:
  - tx_queue:rx_queue  write_seq - snd_una (bytes sent, not yet acknowledged) : for a LISTEN
    socket sk_ack_backlog, the connections in its accept queue that the process has not
    accepted; for any other, rcv_nxt - copied_seq, bytes received that the process has not
    read (a received FIN counts one until the process reads the end of the stream, so a
    CLOSE_WAIT socket shows 1);
  - tr:tm->when  the pending timer (0 none, 1 retransmit, loss probe or reordering, 2
    keepalive, 3 TIME_WAIT, 4 zero-window probe) and the clock ticks (USER_HZ) until it
    fires, 0 once it is due;
  - retrnsmt  icsk_retransmits: the retransmission timeouts in a row since the peer last
    acknowledged anything (a SYN's too), back to 0 at the next acknowledgement.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Collection, Iterator
from typing import NamedTuple

from . import ParseError, parse_int

# include/net/tcp_states.h
TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
              6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN",
              11: "CLOSING", 12: "NEW_SYN_RECV"}


class TcpSocket(NamedTuple):
    local: str  # "127.0.0.1:40555", "[::1]:8080"
    peer: str  # "" when there is none (listening, not connected)
    state: str  # "ESTABLISHED", "SYN_SENT", ...


def _address(token: str, what: str) -> tuple[str, int]:
    host, sep, port_hex = token.partition(":")
    if not sep or len(host) not in (8, 32) or len(port_hex) != 4 or not token.isascii():
        raise ParseError(f"{what}: malformed address {token[:48]!r}")
    try:
        raw = bytes.fromhex(host)
        port = int(port_hex, 16)
    except ValueError:
        raise ParseError(f"{what}: malformed address {token[:48]!r}") from None
    # each 32-bit word back from the little-endian CPU's order into network order
    packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(packed)
    if address.version == 6 and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped), port
    return (f"[{address}]" if address.version == 6 else str(address)), port


def parse_net_tcp(text: str, inodes: Collection[int] | None = None,
                  what: str = "/proc/net/tcp") -> dict[int, TcpSocket]:
    """{socket inode: TcpSocket} for every line, or only for `inodes` (a node with 100k
    connections has 100k lines; the lines not asked for are not decoded).

    The example of proc_net_tcp.rst, and a line of this project's CI machine (a socket
    connected to a local listener):

    >>> doc = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
    ...        "   uid  timeout inode\\n"
    ...        "   46: 010310AC:9C4C 030310AC:1770 01 00000150:00000000 01:00000019 00000000"
    ...        "  1000 0 54165785 4 cd1e6040 25 4 27 3 -1\\n")
    >>> parse_net_tcp(doc)[54165785]
    TcpSocket(local='172.16.3.1:40012', peer='172.16.3.3:6000', state='ESTABLISHED')
    """
    sockets: dict[int, TcpSocket] = {}
    for inode, fields, line in _rows(text, inodes, what):
        local, local_port = _address(fields[1], what)
        peer, peer_port = _address(fields[2], what)
        try:
            state = TCP_STATES.get(int(fields[3], 16), fields[3])
        except ValueError:
            raise ParseError(f"{what}: state is not hex in {line[:48]!r}") from None
        unconnected = peer_port == 0 and peer in ("0.0.0.0", "[::]")
        sockets[inode] = TcpSocket(f"{local}:{local_port}",
                                   "" if unconnected else f"{peer}:{peer_port}", state)
    return sockets


def _rows(text: str, inodes: Collection[int] | None,
          what: str) -> Iterator[tuple[int, list[str], str]]:
    """(inode, fields, line) of the table's rows that have an inode (asked for, when
    `inodes` is given): TIME_WAIT, request and orphaned sockets have none, no fd points at
    them."""
    lines = text.splitlines()
    if not lines or "local_address" not in lines[0]:
        raise ParseError(f"{what}: no header line")
    wanted = None if inodes is None else {str(i) for i in inodes}
    for line in lines[1:]:
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 10 or not fields[0].endswith(":") or not line.isascii():
            raise ParseError(f"{what}: malformed line {line[:48]!r}")
        inode = fields[9]
        if inode == "0" or (wanted is not None and inode not in wanted):
            continue
        if not inode.isdigit():
            raise ParseError(f"{what}: inode is not a number in {line[:48]!r}")
        yield int(inode), fields, line


class TcpQueues(NamedTuple):
    state: str  # "LISTEN", "ESTABLISHED", "SYN_SENT", ... (include/net/tcp_states.h)
    rx_queue: int  # LISTEN: connections in the accept queue; else bytes received, not read
    retransmits: int  # retrnsmt: retransmission timeouts in a row
    timer: int  # tr: 1 retransmit, 2 keepalive, 3 TIME_WAIT, 4 zero-window probe, 0 none
    timer_ticks: int  # tm->when: clock ticks (USER_HZ) until the timer fires


def parse_tcp_queues(text: str, inodes: Collection[int] | None = None,
                     what: str = "/proc/net/tcp") -> dict[int, TcpQueues]:
    """{socket inode: TcpQueues} of the sockets with something waiting: received data or
    connections not taken by the process (rx_queue > 0) or a retransmission outstanding
    (retrnsmt > 0); or, given `inodes`, of exactly those sockets. The others (a node's
    thousands of idle connections) are skipped before anything is decoded.

    Lines of this project's CI machine (Linux 6.18): a loopback listener with three
    connections nobody accepted, a connection whose process has not read the 1,000 bytes it
    received, and a connect() whose SYN went unanswered three times (the listener's accept
    queue full), its next retransmission 0.54 s away:

    >>> table = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
    ...     "   uid  timeout inode\\n"
    ...     "   2: 0100007F:B1D1 00000000:0000 0A 00000000:00000003 00:00000000 00000000     0"
    ...     "        0 73410 4 00000000ec033339 100 0 0 10 0\\n"
    ...     "  13: 0100007F:D955 0100007F:CA0E 01 00000000:000003E8 00:00000000 00000000     0"
    ...     "        0 73416 1 000000006d19b16b 20 4 32 10 -1\\n"
    ...     "   6: 0100007F:BAC6 0100007F:C707 02 00000001:00000000 01:00000036 00000003     0"
    ...     "        0 73417 2 00000000259be316 100 0 0 1 -1\\n"
    ...     "  14: 0100007F:CA0E 0100007F:D955 01 00000000:00000000 00:00000000 00000000     0"
    ...     "        0 73415 1 00000000ed25184e 20 0 0 11 -1\\n")
    >>> for inode, row in parse_tcp_queues(table).items():
    ...     print(inode, row)
    73410 TcpQueues(state='LISTEN', rx_queue=3, retransmits=0, timer=0, timer_ticks=0)
    73416 TcpQueues(state='ESTABLISHED', rx_queue=1000, retransmits=0, timer=0, timer_ticks=0)
    73417 TcpQueues(state='SYN_SENT', rx_queue=0, retransmits=3, timer=1, timer_ticks=54)
    >>> parse_tcp_queues(table, inodes={73415})[73415].rx_queue
    0
    """
    rows: dict[int, TcpQueues] = {}
    for inode, fields, line in _rows(text, inodes, what):
        if inodes is None and fields[4].endswith(":00000000") and fields[6] == "00000000":
            continue  # nothing waits on it
        _, sep, rx = fields[4].partition(":")
        timer, sep2, when = fields[5].partition(":")
        try:
            if not (sep and sep2):
                raise ValueError
            rows[inode] = TcpQueues(TCP_STATES.get(int(fields[3], 16), fields[3]), int(rx, 16),
                                    int(fields[6], 16), int(timer, 16), int(when, 16))
        except ValueError:
            raise ParseError(f"{what}: malformed queues or timer in {line[:48]!r}") from None
    return rows


def parse_sockstat_inuse(text: str, protocol: str, what: str = "/proc/net/sockstat") -> int:
    """The sockets of `protocol` ("TCP" in /proc/net/sockstat, "TCP6" in sockstat6) hashed
    in this network namespace (net/ipv4/proc.c sockstat_seq_show(), net/ipv6/proc.c
    sockstat6_seq_show(): sock_prot_inuse_get(), counted as a socket enters or leaves the
    listening or connection hash): the rows of /proc/net/tcp (tcp6) that have an inode.

    >>> parse_sockstat_inuse("sockets: used 12\\nTCP: inuse 1 orphan 0 tw 243 alloc 1 mem 180\\n"
    ...                      "UDP: inuse 0 mem 0\\n", "TCP")
    1
    >>> parse_sockstat_inuse("TCP6: inuse 0\\nUDP6: inuse 0\\n", "TCP6")
    0
    """
    for line in text.splitlines():
        fields = line.split()
        if fields[:2] == [f"{protocol}:", "inuse"] and len(fields) > 2:
            return parse_int(fields[2], f"{what} {protocol} inuse")
    raise ParseError(f"{what}: no {protocol} inuse line")


# include/uapi/linux/sock_diag.h, inet_diag.h, tcp.h
SOCK_DIAG_BY_FAMILY = 20
INET_DIAG_INFO = 2
NLMSG_ERROR = 2
_NLMSG_HEADER = 16
_INET_DIAG_MSG = 72  # struct inet_diag_msg
_TCP_INFO_LAST_DATA_SENT = 44  # then last_ack_sent, last_data_recv, last_ack_recv (ms)


def parse_inet_diag_idle_ms(data: bytes) -> int | None:
    """How long a TCP connection has been silent, from the kernel's answer to a sock_diag
    query for one socket with INET_DIAG_INFO: the lesser of tcp_info's tcpi_last_data_sent
    and tcpi_last_data_recv, in ms. None when the kernel answered with an error (the socket
    is gone, or lives in another network namespace) or without tcp_info.

    >>> header = struct.pack("=IHHII", 16 + 72 + 4 + 60, SOCK_DIAG_BY_FAMILY, 0, 1, 0)
    >>> info = bytes(44) + struct.pack("=IIII", 91500, 91500, 120000, 91500)
    >>> parse_inet_diag_idle_ms(header + bytes(72) + struct.pack("=HH", 64, 2) + info[:60])
    91500
    """
    if len(data) < _NLMSG_HEADER:
        raise ParseError("sock_diag answer: shorter than a netlink header")
    length, kind = struct.unpack_from("=IH", data)
    if kind == NLMSG_ERROR:
        return None
    if kind != SOCK_DIAG_BY_FAMILY or length > len(data) or length < _NLMSG_HEADER + 72:
        raise ParseError(f"sock_diag answer: unexpected message type {kind} or length {length}")
    offset = _NLMSG_HEADER + _INET_DIAG_MSG
    while offset + 4 <= length:
        size, attribute = struct.unpack_from("=HH", data, offset)
        if size < 4:
            raise ParseError("sock_diag answer: attribute shorter than its header")
        if attribute == INET_DIAG_INFO and size >= 4 + _TCP_INFO_LAST_DATA_SENT + 12:
            sent, _, received = struct.unpack_from("=III", data,
                                                   offset + 4 + _TCP_INFO_LAST_DATA_SENT)
            return min(sent, received)
        offset += (size + 3) & ~3
    return None
