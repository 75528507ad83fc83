"""Parsers for network congestion evidence: NIC driver counters, the kernel's TCP/IP counters,
routes, and RDMA sysfs counter files. Text in, records out; no I/O.

    `ethtool -S ens1f0`        NIC statistics:
                                    rx_prio3_pause: 41927
    /proc/net/netstat, snmp    TcpExt: SyncookiesSent SyncookiesRecv ...   (a header line, then
                               TcpExt: 0 0 ...                              a value line)
    /proc/net/dev              "  eth0: 55226076    1745    0 ..." (16 counters after the name)
    /proc/net/route            eth0	00000000	010200C0	0003	0	0	0	00000000	...
    /proc/net/ipv6_route       00000000000000000000000000000000 00 ... 00000001 ... 00000003 eth0
    /sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_wait    "18446\\n"
    /sys/class/infiniband/mlx5_0/ports/1/state                      "4: ACTIVE\\n"
"""

from __future__ import annotations

from typing import NamedTuple

from . import ParseError, parse_int

ETHTOOL_HEADER = "NIC statistics:"


def parse_ethtool_stats(text: str) -> dict[str, int]:
    """Parse `ethtool -S IFACE` output into {counter name: value}.

    ethtool's do_gstats() prints the header, then one "     %.*s: %llu" line per driver
    string (ETH_GSTRING_LEN is 32). Names are the driver's and may themselves hold ": "
    (bnx2x prints "[0]: rx_bytes"), so the value is what follows the last ": ". A name the
    driver repeats keeps its first value.

    >>> parse_ethtool_stats("NIC statistics:\\n     rx_prio3_pause: 41927\\n"
    ...                     "     [0]: rx_bytes: 5\\n")
    {'rx_prio3_pause': 41927, '[0]: rx_bytes': 5}
    """
    lines = iter(text.splitlines())
    for line in lines:
        if line.strip():
            if line.strip() != ETHTOOL_HEADER:
                raise ParseError(f"ethtool -S: expected {ETHTOOL_HEADER!r}, got {line[:40]!r}")
            break
    else:
        raise ParseError("ethtool -S: empty output")
    stats: dict[str, int] = {}
    for line in lines:
        if not line.strip():
            continue
        name, sep, value = line.rpartition(": ")
        name = name.strip()
        if not sep or not name:
            raise ParseError(f"ethtool -S: malformed line {line[:40]!r}")
        stats.setdefault(name, parse_int(value.strip(), f"ethtool -S {name[:32]}"))
    return stats


def _parse_signed(token: str, what: str) -> int:
    # /proc/net/snmp prints Tcp MaxConn as -1 (snmp_seq_show_tcp_udp: "%ld" for it).
    if token.startswith("-"):
        return -parse_int(token[1:], what)
    return parse_int(token, what)


def parse_netstat(text: str, what: str = "/proc/net/netstat",
                  wanted: dict[str, frozenset[str]] | None = None) -> dict[str, dict[str, int]]:
    """Parse /proc/net/netstat or /proc/net/snmp: pairs of lines, a header `Group: name ...`
    then `Group: value ...` with the same prefix (net/ipv4/proc.c netstat_seq_show,
    snmp_seq_show). Returns {group: {field: value}}; with `wanted` ({group: fields}) only
    those (a collector exporting 40 of the ~300 fields converts 40 numbers, not 300).

    >>> parse_netstat("Tcp: RtoMin MaxConn RetransSegs\\nTcp: 200 -1 6\\n")["Tcp"]
    {'RtoMin': 200, 'MaxConn': -1, 'RetransSegs': 6}
    >>> parse_netstat("Tcp: RtoMin MaxConn RetransSegs\\nTcp: 200 -1 6\\n",
    ...               wanted={"Tcp": frozenset({"RetransSegs"})})
    {'Tcp': {'RetransSegs': 6}}
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ParseError(f"{what}: empty")
    if len(lines) % 2:
        raise ParseError(f"{what}: odd number of lines (truncated?)")
    groups: dict[str, dict[str, int]] = {}
    for header, values in zip(lines[0::2], lines[1::2], strict=True):
        names = header.split()
        numbers = values.split()
        group = names[0]
        if not group.endswith(":") or len(group) < 2 or numbers[0] != group:
            raise ParseError(f"{what}: header and value lines do not pair at {header[:40]!r}")
        if len(names) != len(numbers):
            raise ParseError(f"{what}: {group} has {len(names) - 1} names and "
                             f"{len(numbers) - 1} values")
        if group[:-1] in groups:
            raise ParseError(f"{what}: {group} appears twice")
        keep = None if wanted is None else wanted.get(group[:-1])
        if wanted is not None and keep is None:
            groups[group[:-1]] = {}
            continue
        groups[group[:-1]] = {
            name: _parse_signed(number, f"{what} {group}{name[:40]}")
            for name, number in zip(names[1:], numbers[1:], strict=True)
            if keep is None or name in keep
        }
    return groups


class NetDevStats(NamedTuple):
    """One /proc/net/dev row: what the kernel's IP stack moved through the interface."""

    rx_bytes: int
    rx_packets: int
    rx_errors: int
    rx_dropped: int
    tx_bytes: int
    tx_packets: int
    tx_errors: int
    tx_dropped: int


def parse_net_dev(text: str) -> dict[str, NetDevStats]:
    """Parse /proc/net/dev (net/core/net-procfs.c dev_seq_printf_stats): two header lines,
    then `name: ` and 16 counters, 8 receive then 8 transmit. Netdev names cannot hold ':'
    (dev_valid_name), so the first ':' ends the name.

    >>> text = "Inter-|...\\n face |...\\n  eth0: 5 1 0 0 0 0 0 0 7 2 0 0 0 0 0 0\\n"
    >>> parse_net_dev(text)["eth0"][:6]
    (5, 1, 0, 0, 7, 2)
    """
    if not text.startswith("Inter-|"):
        raise ParseError("/proc/net/dev: no 'Inter-|' header")
    rows: dict[str, NetDevStats] = {}
    for line in text.splitlines()[2:]:
        if not line.strip():
            continue
        name, sep, rest = line.partition(":")
        name = name.strip()
        fields = rest.split()
        if not sep or not name or len(fields) < 16:
            raise ParseError(f"/proc/net/dev: malformed line {line[:40]!r}")
        v = [parse_int(f, f"/proc/net/dev {name[:16]}") for f in fields[:16]]
        rows[name] = NetDevStats(v[0], v[1], v[2], v[3], v[8], v[9], v[10], v[11])
    return rows


RTF_UP = 0x0001
RTF_REJECT = 0x0200


def _hex(token: str, what: str) -> int:
    if not token or not all(c in "0123456789abcdefABCDEF" for c in token):
        raise ParseError(f"{what}: expected hex digits, got {token[:40]!r}")
    return int(token, 16)


def parse_default_routes(text: str) -> set[str]:
    """Interfaces holding an IPv4 default route, from /proc/net/route (net/ipv4/fib_trie.c
    fib_route_seq_show: a header, then Iface Destination Gateway Flags RefCnt Use Metric Mask
    MTU Window IRTT, addresses and flags in hex).

    >>> parse_default_routes("Iface\\tDestination\\tGateway \\tFlags\\tRefCnt\\tUse\\tMetric\\t"
    ...     "Mask\\t\\tMTU\\tWindow\\tIRTT\\neth0\\t00000000\\t010200C0\\t0003\\t0\\t0\\t0\\t"
    ...     "00000000\\t0\\t0\\t0\\n")
    {'eth0'}
    """
    lines = text.splitlines()
    if not lines or not lines[0].startswith("Iface"):
        raise ParseError("/proc/net/route: no 'Iface' header")
    interfaces: set[str] = set()
    for line in lines[1:]:
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 8:
            raise ParseError(f"/proc/net/route: malformed line {line[:40]!r}")
        destination = _hex(fields[1], "/proc/net/route destination")
        flags = _hex(fields[3], "/proc/net/route flags")
        mask = _hex(fields[7], "/proc/net/route mask")
        if destination == 0 and mask == 0 and flags & RTF_UP and not flags & RTF_REJECT:
            interfaces.add(fields[0])
    return interfaces


def parse_ipv6_default_routes(text: str) -> set[str]:
    """Interfaces holding an IPv6 default route, from /proc/net/ipv6_route
    (net/ipv6/route.c ipv6_route_native_seq_show: dest, dest prefix length, source, source
    prefix length, next hop, metric, refcnt, use, flags, device). The kernel's own
    unreachable entries on `lo` carry RTF_REJECT and are skipped.

    >>> parse_ipv6_default_routes("00000000000000000000000000000000 00 "
    ...     "00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 "
    ...     "00000001 00000000 00000003 eth0\\n")
    {'eth0'}
    """
    interfaces: set[str] = set()
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 10:
            raise ParseError(f"/proc/net/ipv6_route: malformed line {line[:40]!r}")
        destination = _hex(fields[0], "/proc/net/ipv6_route destination")
        prefix = _hex(fields[1], "/proc/net/ipv6_route prefix length")
        flags = _hex(fields[8], "/proc/net/ipv6_route flags")
        if destination == 0 and prefix == 0 and flags & RTF_UP and not flags & RTF_REJECT:
            interfaces.add(fields[9])
    return interfaces


# drivers/infiniband/core/sysfs.c show_pma_counter() prints this when the device answers no
# performance-management MAD (no PMA); it is absence, not corruption.
NO_PMA = "N/A (no PMA)"


def parse_sysfs_counter(text: str, what: str = "sysfs counter") -> int | None:
    """One counter from a sysfs file ("%llu\\n"); None when the kernel says "N/A (no PMA)".

    >>> parse_sysfs_counter("18446\\n"), parse_sysfs_counter("N/A (no PMA)\\n")
    (18446, None)
    """
    value = text.strip()
    if value == NO_PMA:
        return None
    return parse_int(value, what)


def parse_ib_port_state(text: str) -> tuple[int, str]:
    """Parse ports/N/state or phys_state ("%d: %s\\n", e.g. "4: ACTIVE", "5: LinkUp").

    >>> parse_ib_port_state("4: ACTIVE\\n")
    (4, 'ACTIVE')
    """
    number, sep, name = text.strip().partition(": ")
    if not sep:
        raise ParseError(f"port state: expected '<n>: <name>', got {text[:40]!r}")
    return parse_int(number, "port state"), name.strip()
