"""Collector `syn_flood`: the kernel's SYN-flood notices (parsers/syn_flood.py), evidence
beside the counters of the `listen-overflow` rule, in the kernel's own words and naming the
port:

    [31617.809376] TCP: request_sock_TCP: Possible SYN flooding on port 5000. Sending
        cookies.  Check SNMP counters.

    fleetscope_tcp_syn_flood_notices_total{port="5000"}
    fleetscope_tcp_syn_flood_last_timestamp_seconds{port="5000"}

The kernel prints it once per listening socket (and rate limited), so the count is of
listeners whose SYN queue overflowed, not of SYNs: TcpExt TCPReqQFullDoCookies and
TCPReqQFullDrop (fleetscope_tcp_stats_total) count those. SYN cookies on an idle server are
no harm: this is evidence, never a finding by itself. The kernel log is read as
collectors/log_events.py says; at most MAX_PORTS ports have their own series, the latest
seen, the older folded into port="other".
"""

from __future__ import annotations

from collections.abc import Iterator

from fleetscope.core.exposition import Family, counter, gauge, labels

from .base import Evidence, Signal
from .log_events import LogEventCollector, LogTally
from .parsers.syn_flood import syn_floods

MAX_PORTS = 20
PREFIX = "fleetscope_tcp_syn_flood_"


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_tcp_syn_flood_notices_total",
           "SYN flood notices in the kernel log", "notices"),
)


class SynFloodCollector(LogEventCollector):
    name = "syn_flood"
    evidence = Evidence(signals=SIGNALS)
    missing_hints = ((PREFIX, "no 'Possible SYN flooding' line in the kernel log (or the "
                              "kernel log is not readable)"),)

    def tally(self) -> LogTally:
        return LogTally("Possible SYN flooding", syn_floods, lambda f: str(f.port), MAX_PORTS,
                        "other")

    def families(self, counts: dict, last: dict) -> Iterator[Family]:
        notices = counter(PREFIX + "notices_total",
                          "'TCP: request_sock_TCP: Possible SYN flooding on port N. Sending "
                          "cookies.' (or 'Dropping request') kernel-log lines, per port: "
                          "printed once per listening socket whose SYN queue overflowed.")
        for port in sorted(counts, key=_port_order):
            notices.add(counts[port], labels(port=port))
        latest = gauge(PREFIX + "last_timestamp_seconds",
                       "Unix time of the latest SYN-flooding line of each port (boot time plus "
                       "the log's seconds since boot, or the line's wall-clock stamp).")
        for port in sorted(last, key=_port_order):
            latest.add(round(last[port], 3), labels(port=port))
        yield notices
        yield latest


def _port_order(port: str) -> tuple[int, str]:
    return (int(port), "") if port.isdigit() else (1 << 17, port)
