"""Parser for the kernel's SYN-flood notice: a listener's SYN queue overflowed, and the kernel
answered with SYN cookies (or, with net.ipv4.tcp_syncookies=0, dropped the SYN).

net/ipv4/tcp_input.c tcp_syn_flood_action() prints it once per listening socket
(queue->synflood_warned, rate limited too), with pr_fmt "TCP: " and the request-sock slab's
name for the protocol: `"%s: Possible SYN flooding on port %d. %s.  Check SNMP counters."`;
kernels since 2022 ("tcp: Add listening address to SYN flood message") print the listener's
address, `port 0.0.0.0:9001.`, `port [::]:9001.`, and no "Check SNMP counters". Real lines:

    [31617.809376] TCP: request_sock_TCP: Possible SYN flooding on port 5000. Sending
        cookies.  Check SNMP counters.
    TCP: request_sock_TCPv6: Possible SYN flooding on port 830. Sending cookies. Check SNMP
        counters
    [  255.126921] TCP: request_sock_TCP: Possible SYN flooding on port 0.0.0.0:80. Dropping
        request.
    [2320864.954447] TCP: Possible SYN flooding on port 7001. Dropping request.  Check SNMP
        counters.                                                   (3.x: no slab name)

Printed once per listener, it names the port whose queue overflowed first: the counters
(TcpExt TCPReqQFullDoCookies / TCPReqQFullDrop, ListenOverflows) say how often since.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .kmsg import LogClock, messages_with

_SYN_FLOOD = re.compile(
    r"TCP: (?:request_sock_(?P<proto>TCP|TCPv6|MPTCP|MPTCPv6): )?Possible SYN flooding on "
    r"port (?:(?P<address>\[[0-9a-fA-F:.%a-z]{1,64}\]|[0-9.]{7,15}):)?(?P<port>[0-9]{1,5})\. "
    r"(?P<action>Sending cookies|Dropping request)\.?(?:\s+Check SNMP counters\.?)?",
    re.ASCII)


@dataclass(frozen=True, slots=True)
class SynFlood:
    """One SYN-flood notice."""

    port: int
    address: str  # the listener's address (6.x kernels), "" when the line has none
    protocol: str  # "TCP", "TCPv6" ... ("TCP" on 3.x kernels, which do not say)
    cookies: bool  # True: "Sending cookies"; False: "Dropping request"
    seconds: float | None  # seconds since boot, when the line is stamped


def syn_floods(text: str, clock: LogClock | None = None) -> list[SynFlood]:
    """The SYN-flood notices of a kernel log, in log order (`clock` times the lines stamped
    with the wall clock).

    >>> [(f.port, f.protocol, f.cookies, f.seconds) for f in syn_floods(
    ...     "[31617.809376] TCP: request_sock_TCP: Possible SYN flooding on port 5000. "
    ...     "Sending cookies.  Check SNMP counters.\\n")]
    [(5000, 'TCP', True, 31617.809376)]
    """
    found = []
    for message, seconds in messages_with(text, "Possible SYN flooding on port ", clock):
        match = _SYN_FLOOD.fullmatch(message)
        if match and 0 < int(match.group("port")) < 65536:
            found.append(SynFlood(int(match.group("port")), match.group("address") or "",
                                  match.group("proto") or "TCP",
                                  match.group("action") == "Sending cookies", seconds))
    return found
