"""Collector `tcp`: the kernel's TCP retransmission, timeout, loss and drop counters, and the
ECN codepoints of received IP packets: the TCP side of network-congestion evidence (Redis,
storage over TCP, tool calls).

Inputs (pairs of header and value lines, Documentation/networking/snmp_counter.rst):

    proc/net/snmp     Tcp: RtoAlgorithm RtoMin ... CurrEstab InSegs OutSegs RetransSegs ...
                      Tcp: 1 200 ... 0 132929 132887 6 ...
    proc/net/netstat  TcpExt: SyncookiesSent ... TCPTimeouts ... TCPLossProbes ...
                      IpExt: InNoRoutes ... InNoECTPkts InECT1Pkts InECT0Pkts InCEPkts ...

Retransmission rate = rate(RetransSegs) / rate(OutSegs). TCPTimeouts counts RTO expiries
(each stalls a flow for at least RtoMin, 200 ms by default); TCPRetransFail counts
retransmissions the qdisc or driver refused; ListenOverflows/ListenDrops count accept-queue
overflows on this host. Fields a kernel does not print are left out.
"""

from __future__ import annotations

from collections.abc import Iterator

from fleetscope.core.exposition import Family, counter, gauge, labels

from .base import Collector, Evidence, Scrape, Signal
from .parsers.net import parse_netstat

SNMP_TCP = ("ActiveOpens", "PassiveOpens", "AttemptFails", "EstabResets", "InSegs", "OutSegs",
            "RetransSegs", "InErrs", "OutRsts", "InCsumErrors")
NETSTAT_TCPEXT = (
    "TCPTimeouts", "TCPLossProbes", "TCPLossProbeRecovery", "TCPRetransFail", "TCPSynRetrans",
    "TCPFastRetrans", "TCPSlowStartRetrans", "TCPLostRetransmit", "TCPSpuriousRTOs",
    "TCPAbortOnTimeout", "ListenOverflows", "ListenDrops", "TCPBacklogDrop", "TCPRcvQDrop",
    "TCPOFODrop", "TCPZeroWindowDrop", "TCPReqQFullDrop", "PruneCalled", "RcvPruned",
    "OfoPruned", "TCPAbortOnMemory", "TCPMemoryPressures", "TCPDelivered", "TCPDeliveredCE",
)
# IpExt In*Pkts: received packets per ECN codepoint (RFC 3168), counted per real frame.
ECN_CODEPOINTS = (("InNoECTPkts", "not_ect"), ("InECT1Pkts", "ect1"), ("InECT0Pkts", "ect0"),
                  ("InCEPkts", "ce"))
# Only these fields are converted: the files hold some 300.
SNMP_WANTED = {"Tcp": frozenset((*SNMP_TCP, "CurrEstab"))}
NETSTAT_WANTED = {"TcpExt": frozenset(NETSTAT_TCPEXT),
                  "IpExt": frozenset(name for name, _ in ECN_CODEPOINTS)}


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_tcp_stats_total", "TCP counters, by kernel name", ""),
)


class TcpCollector(Collector):
    name = "tcp"
    evidence = Evidence(signals=SIGNALS,
                        sampled=("proc/net/netstat", "proc/net/snmp"),
                        described=(("proc/net/netstat", "TCP counters"),))

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        tcp = counter(
            "fleetscope_tcp_stats_total",
            "TCP counters under their kernel names (group Tcp: /proc/net/snmp; TcpExt: "
            "/proc/net/netstat): segments, retransmissions, timeouts, drops.",
        )
        with scrape.source(self.name, "proc/net/snmp"):
            snmp = parse_netstat(scrape.read_text("proc/net/snmp"), "/proc/net/snmp",
                                 SNMP_WANTED)
            fields = snmp.get("Tcp", {})
            for name in SNMP_TCP:
                if name in fields:
                    tcp.add(fields[name], labels(group="Tcp", counter=name))
            if "CurrEstab" in fields:
                yield gauge("fleetscope_tcp_established_connections",
                            "TCP connections in ESTABLISHED or CLOSE-WAIT (Tcp CurrEstab)."
                            ).add(fields["CurrEstab"])
        ecn = counter(
            "fleetscope_ip_ecn_received_packets_total",
            "Received IP packets by ECN codepoint (IpExt In*Pkts); a rising `ce` share means "
            "switches on the inbound path are marking congestion.",
        )
        with scrape.source(self.name, "proc/net/netstat"):
            netstat = parse_netstat(scrape.read_text("proc/net/netstat"), wanted=NETSTAT_WANTED)
            fields = netstat.get("TcpExt", {})
            for name in NETSTAT_TCPEXT:
                if name in fields:
                    tcp.add(fields[name], labels(group="TcpExt", counter=name))
            ip_ext = netstat.get("IpExt", {})
            for name, codepoint in ECN_CODEPOINTS:
                if name in ip_ext:
                    ecn.add(ip_ext[name], labels(codepoint=codepoint))
        for family in (tcp, ecn):
            if family.samples:
                yield family
