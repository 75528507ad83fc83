"""Parser for /proc/net/tcp and /proc/net/tcp6 (net/ipv4/tcp_ipv4.c tcp4_seq_show(),
net/ipv6/tcp_ipv6.c tcp6_seq_show(); format in the kernel's
Documentation/networking/proc_net_tcp.rst): which peer a socket inode talks to.

      sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid ...
       2: 0100007F:A06B 0100007F:AF2E 01 00000000:00000000 00:00000000 00000000     0 ...
    (then timeout, inode 22523, refcount, the sock's address, timers and windows)

Addresses are the network-order __be32 words printed with %08X as the CPU holds them, so on
the little-endian machines fleetscope runs on (x86-64, arm64 as Linux distributions build it)
127.0.0.1 reads 0100007F; tcp6 prints four such words. Ports are host-order %04X. A listening
or not-yet-connected socket has the peer 00000000:0000.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from typing import NamedTuple

from . import ParseError

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
    lines = text.splitlines()
    if not lines or "local_address" not in lines[0]:
        raise ParseError(f"{what}: no header line")
    wanted = None if inodes is None else {str(i) for i in inodes}
    sockets: dict[int, TcpSocket] = {}
    for line in lines[1:]:
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 10 or not fields[0].endswith(":"):
            raise ParseError(f"{what}: malformed line {line[:48]!r}")
        inode = fields[9]
        if inode == "0":
            continue  # TIME_WAIT and orphaned sockets: no file, no fd points at them
        if wanted is not None and inode not in wanted:
            continue
        if not (inode.isdigit() and inode.isascii() and fields[3].isascii()):
            raise ParseError(f"{what}: inode is not a number in {line[:48]!r}")
        local, local_port = _address(fields[1], what)
        peer, peer_port = _address(fields[2], what)
        try:
            state = TCP_STATES.get(int(fields[3], 16), fields[3])
        except ValueError:
            raise ParseError(f"{what}: state is not hex in {line[:48]!r}") from None
        unconnected = peer_port == 0 and peer in ("0.0.0.0", "[::]")
        sockets[int(inode)] = TcpSocket(f"{local}:{local_port}",
                                        "" if unconnected else f"{peer}:{peer_port}", state)
    return sockets
