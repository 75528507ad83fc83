"""RDMA, NIC and TCP congestion evidence: parsers on real and driver-format samples, fuzzing,
the `rdma`, `nic` and `tcp` collectors on fixture roots (two snapshots -> rates), and on this
machine for real (real /proc/net, no RDMA, real and hung `ethtool`)."""

from __future__ import annotations

import doctest
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import strategies as st

from fleetscope.collectors import COLLECTORS, Scrape, evidence_source
from fleetscope.collectors import nic as nic_module
from fleetscope.collectors.nic import NicCollector
from fleetscope.collectors.parsers import ParseError, net
from fleetscope.collectors.parsers.net import (
    parse_default_routes,
    parse_ethtool_stats,
    parse_ib_port_state,
    parse_ipv6_default_routes,
    parse_net_dev,
    parse_netstat,
    parse_sysfs_counter,
)
from fleetscope.collectors.rdma import RdmaCollector
from fleetscope.collectors.tcp import TcpCollector
from fleetscope.core.config import Config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import FIXTURES, require_tool, samples
from tests.fuzzing import parser_fuzz_tests

ETHTOOL = FIXTURES / "ethtool"
RDMA = FIXTURES / "rdma"
MLX5_REAL = (ETHTOOL / "mlx5-real-bpf-list-6.5.txt").read_text()
MLX5 = [(ETHTOOL / f"mlx5-pfc-prio3.s{s}.txt").read_text() for s in (0, 1)]
HNS3 = [(ETHTOOL / f"hns3-pfc-prio3.s{s}.txt").read_text() for s in (0, 1)]
NETSTAT = [(ETHTOOL / f"proc-net-netstat.s{s}").read_text() for s in (0, 1)]
SNMP = [(ETHTOOL / f"proc-net-snmp.s{s}").read_text() for s in (0, 1)]
NET_DEV = (ETHTOOL / "proc-net-dev").read_text()
ROUTE = (ETHTOOL / "proc-net-route").read_text()
IPV6_ROUTE = (ETHTOOL / "proc-net-ipv6_route").read_text()
# The capture times of the real /proc/net samples (fixtures/ethtool/README.md).
TCP_T0, TCP_T1 = 1796209903.732782812, 1796209906.890445302
T0, DT = 1764660000.0, 15.0  # the constructed snapshots are 15 s apart

MLX5_IF, HNS3_IF, RDMA_IF = "ens1f0np0", "enp125s0f0", "ens1f0np0"
ROUTE_HEADER = ("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\t"
                "Window\tIRTT                                                       \n")


def _route(default_iface: str) -> str:
    """/proc/net/route in fib_route_seq_show()'s format with a default route via one iface."""
    return (ROUTE_HEADER
            + f"{default_iface}\t00000000\t0101000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
            + f"{RDMA_IF}\t0000A8C0\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n")


def _net_dev(rx: int, tx: int) -> str:
    head = NET_DEV.splitlines(True)[:2]
    return "".join(head) + f"{RDMA_IF}: {rx} 1000 0 0 0 0 0 0 {tx} 2000 0 0 0 0 0 0\n"


# --------------------------------------------------------------------------- parsers


def test_ethtool_real_mlx5_sample():
    stats = parse_ethtool_stats(MLX5_REAL)
    assert len(stats) == 108
    assert stats["tx_global_pause"] == 44414017
    assert stats["tx_global_pause_duration"] == 5961284324
    assert stats["rx_discards_phy"] == 441063206498
    assert stats["rx_out_of_buffer"] == 534918379
    assert stats["rx_buffer_passed_thres_phy"] == 1192226
    assert not any("prio0_pause" in name for name in stats)  # PFC off on that port


def test_ethtool_constructed_samples():
    mlx5 = parse_ethtool_stats(MLX5[0])
    assert (mlx5["rx_prio3_pause"], mlx5["tx_prio3_pause"]) == (41927, 1290418)
    assert mlx5["rx_prio3_pause_duration"] == 8134000
    assert "rx_prio0_pause" not in mlx5  # printed only for PFC-enabled priorities
    assert mlx5["rx_prio3_marked"] == 9147732
    hns3 = parse_ethtool_stats(HNS3[0])
    assert (hns3["mac_rx_pfc_pri3_pkt_num"], hns3["mac_tx_pfc_pri3_pkt_num"]) == (310000, 52000)
    assert hns3["rxq0_dropped"] == 12 and hns3["txq3_pktnum_rcd"] > 0
    assert not any(name.endswith("xoff_time") for name in hns3)  # device version V2


def test_ethtool_names_with_colons_and_repeats():
    text = "NIC statistics:\n     [0]: rx_bytes: 209487403324\n     x: 1\n     x: 2\n\n"
    assert parse_ethtool_stats(text) == {"[0]: rx_bytes": 209487403324, "x": 1}


@pytest.mark.parametrize("text", [
    "", "\n\n", "no stats available\n", "NIC statistics:\n     rx_bytes 5\n",
    "NIC statistics:\n     rx_bytes: -5\n", "NIC statistics:\n     rx_bytes: 1.5\n",
    "NIC statistics:\n     : 5\n", "NIC statistics:\n     rx_bytes: \n",
    "NIC statistics:\n     rx_bytes: ５\n",
])
def test_ethtool_rejects_malformed(text):
    with pytest.raises(ParseError):
        parse_ethtool_stats(text)


def test_netstat_and_snmp_real_samples():
    snmp = parse_netstat(SNMP[0], "/proc/net/snmp")
    assert snmp["Tcp"]["MaxConn"] == -1
    assert (snmp["Tcp"]["OutSegs"], snmp["Tcp"]["RetransSegs"]) == (135722, 7)
    assert set(snmp) >= {"Ip", "Icmp", "IcmpMsg", "Tcp", "Udp", "UdpLite"}
    netstat = parse_netstat(NETSTAT[1])
    assert {"TCPTimeouts", "TCPLossProbes", "ListenOverflows"} <= set(netstat["TcpExt"])
    assert netstat["IpExt"]["InNoECTPkts"] > 0 and "InCEPkts" in netstat["IpExt"]


def test_netstat_wanted_fields_are_the_full_parse_cut_down():
    """The tcp collector converts only the fields it exports: the same numbers as a full
    parse, the other groups empty, and pairing still checked."""
    from fleetscope.collectors.tcp import NETSTAT_WANTED, SNMP_WANTED

    for text, wanted, what in [(SNMP[0], SNMP_WANTED, "/proc/net/snmp"),
                               (NETSTAT[1], NETSTAT_WANTED, "/proc/net/netstat")]:
        full = parse_netstat(text, what)
        cut = parse_netstat(text, what, wanted)
        assert set(cut) == set(full)
        for group, fields in cut.items():
            keep = wanted.get(group, frozenset())
            assert fields == {k: v for k, v in full[group].items() if k in keep}
        assert cut["Tcp" if "Tcp" in wanted else "TcpExt"]
    with pytest.raises(ParseError):
        parse_netstat("Tcp: A B\nTcp: 1\n", wanted=SNMP_WANTED)


@pytest.mark.parametrize("text", [
    "", "Tcp: A B\n", "Tcp: A B\nTcp: 1\n", "Tcp: A B\nUdp: 1 2\n", "Tcp: A\nTcp: x\n",
    "Tcp: A\nTcp: 1\nTcp: A\nTcp: 2\n", "Tcp A\nTcp 1\n", ": A\n: 1\n", "Tcp: A\nTcp: --1\n",
])
def test_netstat_rejects_malformed(text):
    with pytest.raises(ParseError):
        parse_netstat(text)


def test_net_dev_and_routes_real_samples():
    rows = parse_net_dev(NET_DEV)
    assert {"lo", "eth0"} <= set(rows)
    assert rows["lo"].rx_bytes == rows["lo"].tx_bytes > 0  # loopback: every byte both ways
    assert parse_default_routes(ROUTE) == {"eth0"}
    assert parse_ipv6_default_routes(IPV6_ROUTE) == {"eth0"}  # not lo's reject route


@pytest.mark.parametrize("parser, text", [
    (parse_net_dev, "eth0: 1 2 3\n"), (parse_net_dev, NET_DEV.replace(":", " ", 3)),
    (parse_net_dev, NET_DEV + "  bad: 1 2\n"), (parse_default_routes, "eth0 0 0 3\n"),
    (parse_default_routes, ROUTE_HEADER + "eth0\tzz\t0\t0003\t0\t0\t0\t00000000\n"),
    (parse_ipv6_default_routes, "00 00 eth0\n"),
])
def test_net_dev_and_routes_reject_malformed(parser, text):
    with pytest.raises(ParseError):
        parser(text)


def test_sysfs_counter_files():
    assert parse_sysfs_counter("18446744073709551615\n") == 2**64 - 1
    assert parse_sysfs_counter("N/A (no PMA)\n") is None
    assert parse_ib_port_state("4: ACTIVE\n") == (4, "ACTIVE")
    assert parse_ib_port_state("5: LinkUp\n") == (5, "LinkUp")
    for bad in ("", "-1\n", "0x10\n", "1 2\n"):
        with pytest.raises(ParseError):
            parse_sysfs_counter(bad)
    with pytest.raises(ParseError):
        parse_ib_port_state("ACTIVE\n")


# --------------------------------------------------------------------------- fuzzing

PARSERS = {
    "ethtool_mlx5": (parse_ethtool_stats, MLX5[0][:3000]),
    "ethtool_hns3": (parse_ethtool_stats, HNS3[0][:3000]),
    "ethtool_real": (parse_ethtool_stats, MLX5_REAL[:3000]),
    "netstat": (parse_netstat, NETSTAT[0]),
    "snmp": (parse_netstat, SNMP[0]),
    "net_dev": (parse_net_dev, NET_DEV),
    "route": (parse_default_routes, ROUTE),
    "ipv6_route": (parse_ipv6_default_routes, IPV6_ROUTE),
    "sysfs_counter": (parse_sysfs_counter, "18446\n"),
    "sysfs_no_pma": (parse_sysfs_counter, "N/A (no PMA)\n"),
    "ib_port_state": (parse_ib_port_state, "4: ACTIVE\n"),
}
netish = st.text(alphabet=st.sampled_from(list("0123456789abcdefABCDEF :-_\n\t|/.NICstaio()"
                                               "TcpExRrx\x00\u00e9\u0665")), max_size=400)



test_fuzz_garbage, test_fuzz_cut_and_corrupted = parser_fuzz_tests(PARSERS, netish)


def test_docstring_examples():
    failures, tried = doctest.testmod(net)
    assert tried > 0 and failures == 0


# --------------------------------------------------------------------------- helpers


def _config(**raw) -> Config:
    timeout = raw.pop("command_timeout_seconds", 10.0)
    return Config(command_timeout_seconds=timeout, raw=raw)


def _collect(collector, root, now=None) -> tuple[dict[str, float], Scrape]:
    scrape = Scrape(evidence_source(str(root)), now)  # "/" is live, a fixture tree recorded
    families = list(collector.collect(scrape))
    return samples(render(families)), scrape


def _rate(before: dict, after: dict, key: str, seconds: float = DT) -> float:
    return (after[key] - before[key]) / seconds


def _key(name: str, **label_pairs) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(label_pairs.items()))
    return f"{name}{{{inner}}}"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _rdma_root(tmp_path: Path, snapshot: int, name: str = "root") -> Path:
    root = tmp_path / f"{name}{snapshot}"
    shutil.copytree(RDMA / f"s{snapshot}", root)
    return root


# --------------------------------------------------------------------------- rdma


def _hw(counter):
    return _key("fleetscope_rdma_hw_stats_total", device="mlx5_0", port="1", counter=counter)


def _pc(counter):
    return _key("fleetscope_rdma_port_stats_total", device="mlx5_0", port="1", counter=counter)


def test_rdma_counters_and_rates_from_two_snapshots(tmp_path):
    collector = RdmaCollector(_config())
    before, scrape0 = _collect(collector, _rdma_root(tmp_path, 0), T0)
    after, _ = _collect(collector, _rdma_root(tmp_path, 1), T0 + DT)
    assert scrape0.sources[("rdma", "sys/class/infiniband")] == (True, "")
    assert before[_pc("port_xmit_wait")] == 123456789
    assert before[_hw("np_cnp_sent")] == 1100000
    assert _hw("lifespan") not in before  # a refresh period, not a counter
    expected = {  # per second, fixtures/rdma/README.md
        _pc("port_xmit_data"): 312500000, _pc("port_rcv_data"): 156250000,
        _pc("port_xmit_packets"): 300000, _pc("port_rcv_packets"): 150000,
        _pc("port_xmit_wait"): 2000000, _pc("port_xmit_discards"): 0,
        _hw("np_ecn_marked_roce_packets"): 4000, _hw("np_cnp_sent"): 3500,
        _hw("rp_cnp_handled"): 2000, _hw("rp_cnp_ignored"): 0, _hw("out_of_sequence"): 10,
        _hw("packet_seq_err"): 6, _hw("local_ack_timeout_err"): 0.2, _hw("roce_adp_retrans"): 2,
        _hw("rx_write_requests"): 100000, _hw("out_of_buffer"): 0,
    }
    for key, per_second in expected.items():
        assert _rate(before, after, key) == pytest.approx(per_second), key
    data = "fleetscope_rdma_port_data_bytes_total"
    tx = _key(data, device="mlx5_0", port="1", direction="transmit")
    rx = _key(data, device="mlx5_0", port="1", direction="receive")
    assert _rate(before, after, tx) == pytest.approx(1.25e9)  # 10 Gbit/s
    assert _rate(before, after, rx) == pytest.approx(625e6)
    info = _key("fleetscope_rdma_device_info", device="mlx5_0", port="1", netdev=RDMA_IF,
                link_layer="Ethernet")
    assert before[info] == 1
    assert before[_key("fleetscope_rdma_port_state", device="mlx5_0", port="1")] == 4


def test_rdma_shared_plane_evidence(tmp_path):
    """Storage on RoCE, and the default route (business traffic) on a bond over the same
    port: the rule sees default_route 1 and the kernel-stack bytes on the RoCE netdev."""
    collector = RdmaCollector(_config())
    labels_ = {"device": "mlx5_0", "port": "1", "netdev": RDMA_IF}
    route = "fleetscope_rdma_netdev_default_route"
    kernel = "fleetscope_rdma_netdev_kernel_bytes_total"

    separate = _rdma_root(tmp_path, 0, "separate")
    _write(separate / "proc/net/route", _route("eth0"))
    _write(separate / "proc/net/dev", _net_dev(1000, 2000))
    got, _ = _collect(collector, separate, T0)
    assert got[_key(route, **labels_)] == 0

    shared = [_rdma_root(tmp_path, s, "shared") for s in (0, 1)]
    for snapshot, root in enumerate(shared):
        (root / "sys/class/net" / RDMA_IF / "upper_bond0").mkdir(parents=True)
        _write(root / "proc/net/route", _route("bond0"))
        _write(root / "proc/net/dev", _net_dev(10**9 + snapshot * 15 * 10**8, 5 * 10**8))
    before, _ = _collect(collector, shared[0], T0)
    after, _ = _collect(collector, shared[1], T0 + DT)
    assert before[_key(route, **labels_)] == 1
    rx = _key(kernel, direction="receive", **labels_)
    assert _rate(before, after, rx) == pytest.approx(1e8)  # 100 MB/s of TCP on the RoCE port

    # The IPv6 default route counts too, when IPv4 has none on the plane.
    v6 = _rdma_root(tmp_path, 0, "v6")
    _write(v6 / "proc/net/route", _route("eth0"))
    _write(v6 / "proc/net/ipv6_route", IPV6_ROUTE.replace("    eth0", RDMA_IF.rjust(8)))
    got, _ = _collect(collector, v6, T0)
    assert got[_key(route, **labels_)] == 1


def test_rdma_no_pma_and_corrupt_counter_files(tmp_path):
    root = _rdma_root(tmp_path, 0)
    counters = root / "sys/class/infiniband/mlx5_0/ports/1"
    (counters / "counters/port_xmit_wait").write_text("N/A (no PMA)\n")
    (counters / "hw_counters/np_cnp_sent").write_text("garbage\n")
    got, scrape = _collect(RdmaCollector(_config()), root, T0)
    assert _pc("port_xmit_wait") not in got and _pc("port_xmit_packets") in got
    base = "sys/class/infiniband/mlx5_0/ports/1"
    assert scrape.sources[("rdma", f"{base}/counters")] == (True, "")
    ok, reason = scrape.sources[("rdma", f"{base}/hw_counters")]
    assert not ok and "np_cnp_sent" in reason
    assert _hw("rp_cnp_handled") in got  # the other driver counters are still there
    assert "rdma" in scrape.errors  # corruption is an error, absence is not


def test_rdma_bundle_sample_without_topology(tmp_path):
    """A bundle sample carries only ports/<n>/{counters,hw_counters}: still collected, with
    an empty netdev, and no plane metrics."""
    root = tmp_path / "sample"
    src = RDMA / "s0/sys/class/infiniband/mlx5_0/ports/1"
    for sub in ("counters", "hw_counters"):
        shutil.copytree(src / sub, root / f"sys/class/infiniband/mlx5_0/ports/1/{sub}")
    got, scrape = _collect(RdmaCollector(_config()), root, T0)
    assert got[_key("fleetscope_rdma_device_info", device="mlx5_0", port="1", netdev="",
                    link_layer="")] == 1
    assert got[_hw("np_ecn_marked_roce_packets")] == 1234567
    assert not any(k.startswith("fleetscope_rdma_netdev_") for k in got)
    assert not scrape.errors


def test_rdma_absent_is_not_available_not_an_error(tmp_path):
    (tmp_path / "empty/sys/class").mkdir(parents=True)
    got, scrape = _collect(RdmaCollector(_config()), tmp_path / "empty")
    assert got == {}
    ok, reason = scrape.sources[("rdma", "sys/class/infiniband")]
    assert not ok and "no RDMA device" in reason
    assert not scrape.errors


# --------------------------------------------------------------------------- nic (replay)


def _nic_root(tmp_path: Path, snapshot: int, files: dict[str, str]) -> Path:
    root = tmp_path / f"nic{snapshot}"
    for iface, text in files.items():
        _write(root / f"cmd/ethtool-S-{iface}.txt", text)
    return root


def _pfc(iface, priority, direction):
    return _key("fleetscope_nic_pfc_pause_frames_total", interface=iface, priority=priority,
                direction=direction)


def test_nic_replay_pfc_rates_for_mlx5_and_hns3(tmp_path):
    collector = NicCollector(_config())
    roots = [_nic_root(tmp_path, s, {MLX5_IF: MLX5[s], HNS3_IF: HNS3[s]}) for s in (0, 1)]
    before, scrape = _collect(collector, roots[0], T0)
    after, _ = _collect(collector, roots[1], T0 + DT)
    assert scrape.sources[("nic", f"ethtool -S {MLX5_IF}")] == (True, "")
    assert scrape.sources[("nic", f"ethtool -S {HNS3_IF}")] == (True, "")
    assert before[_pfc(MLX5_IF, "3", "rx")] == 41927
    assert _rate(before, after, _pfc(MLX5_IF, "3", "rx")) == 200
    assert _rate(before, after, _pfc(MLX5_IF, "3", "tx")) == 1000
    assert _rate(before, after, _pfc(HNS3_IF, "3", "rx")) == 400
    assert _rate(before, after, _pfc(HNS3_IF, "3", "tx")) == 80
    assert _pfc(MLX5_IF, "0", "rx") not in before  # PFC off on priority 0: no series
    assert before[_pfc(HNS3_IF, "0", "rx")] == 0  # hns3 prints all eight priorities
    paused = _key("fleetscope_nic_pfc_pause_seconds_total", interface=MLX5_IF, priority="3",
                  direction="rx")
    assert before[paused] == pytest.approx(8.134)
    assert _rate(before, after, paused) == pytest.approx(0.03)  # paused 3 % of the time
    curated = "fleetscope_nic_ethtool_stats_total"
    for counter, per_second in (("rx_discards_phy", 2), ("rx_prio3_marked", 4000),
                                ("rx_buffer_passed_thres_phy", 5), ("rx_out_of_buffer", 0),
                                ("tx_pause_storm_error_events", 0)):
        key = _key(curated, interface=MLX5_IF, counter=counter)
        assert _rate(before, after, key) == pytest.approx(per_second), counter
    dropped = _key(curated, interface=HNS3_IF, counter="rxq_dropped")
    assert (before[dropped], after[dropped]) == (15, 17)  # summed over the queues
    assert _key(curated, interface=HNS3_IF, counter="rxq0_dropped") not in before
    assert _key(curated, interface=MLX5_IF, counter="rx_packets") not in before  # not curated
    wire = _key("fleetscope_nic_port_bytes_total", interface=MLX5_IF, direction="rx")
    assert _rate(before, after, wire) == pytest.approx(625e6)
    assert any(k.startswith("fleetscope_nic_port_bytes_total{direction=\"tx\","
                            f"interface=\"{HNS3_IF}\"") for k in before)


def test_nic_replay_real_mlx5_global_pause(tmp_path):
    got, _ = _collect(NicCollector(_config()), _nic_root(tmp_path, 0, {"ens3f0": MLX5_REAL}))
    assert got[_key("fleetscope_nic_pause_frames_total", interface="ens3f0",
                    direction="tx")] == 44414017
    assert got[_key("fleetscope_nic_pause_seconds_total", interface="ens3f0",
                    direction="tx")] == pytest.approx(5961.284324)
    assert not any(k.startswith("fleetscope_nic_pfc_") for k in got)
    curated = "fleetscope_nic_ethtool_stats_total"
    assert got[_key(curated, interface="ens3f0", counter="rx_discards_phy")] == 441063206498
    assert got[_key(curated, interface="ens3f0", counter="tx_pause_ctrl_phy")] == 44414017


def test_nic_replay_corrupt_and_missing(tmp_path):
    root = _nic_root(tmp_path, 0, {MLX5_IF: MLX5[0], "eth9": "NIC statistics:\n     x: y\n"})
    got, scrape = _collect(NicCollector(_config()), root)
    assert got[_pfc(MLX5_IF, "3", "tx")] == 1290418
    assert scrape.sources[("nic", "ethtool -S eth9")][0] is False
    assert "nic" in scrape.errors
    got, scrape = _collect(NicCollector(_config()), tmp_path / "nothing")
    assert got == {}
    assert scrape.sources[("nic", "ethtool")][0] is False and not scrape.errors


def test_nic_bad_config_value_is_reported_not_raised(tmp_path):
    collector = NicCollector(_config(ethtool_interfaces="ens*"))
    _, scrape = _collect(collector, _nic_root(tmp_path, 0, {MLX5_IF: MLX5[0]}))
    ok, reason = scrape.sources[("nic", "config ethtool_interfaces")]
    assert not ok and "list" in reason
    assert scrape.sources[("nic", f"ethtool -S {MLX5_IF}")] == (True, "")


# --------------------------------------------------------------------------- tcp


def test_tcp_counters_and_rates_from_real_snapshots(tmp_path):
    roots = []
    for s in (0, 1):
        root = tmp_path / f"tcp{s}"
        _write(root / "proc/net/netstat", NETSTAT[s])
        _write(root / "proc/net/snmp", SNMP[s])
        roots.append(root)
    collector = TcpCollector(_config())
    before, scrape = _collect(collector, roots[0], TCP_T0)
    after, _ = _collect(collector, roots[1], TCP_T1)
    assert scrape.sources[("tcp", "proc/net/snmp")] == (True, "")
    assert scrape.sources[("tcp", "proc/net/netstat")] == (True, "")

    def tcp(group, counter):
        return _key("fleetscope_tcp_stats_total", group=group, counter=counter)

    seconds = TCP_T1 - TCP_T0
    assert before[tcp("Tcp", "OutSegs")] == 135722
    assert _rate(before, after, tcp("Tcp", "OutSegs"), seconds) == pytest.approx(1621 / seconds)
    assert _rate(before, after, tcp("Tcp", "RetransSegs"), seconds) == 0
    assert _rate(before, after, tcp("Tcp", "ActiveOpens"), seconds) == pytest.approx(22 / seconds)
    timeouts = parse_netstat(NETSTAT[0])["TcpExt"]["TCPTimeouts"]
    assert before[tcp("TcpExt", "TCPTimeouts")] == timeouts
    assert tcp("TcpExt", "TCPLossProbes") in before and tcp("TcpExt", "ListenDrops") in before
    assert tcp("Tcp", "RtoMin") not in before  # a setting, not a counter
    assert before["fleetscope_tcp_established_connections"] == 0
    ecn = parse_netstat(NETSTAT[0])["IpExt"]
    got = before[_key("fleetscope_ip_ecn_received_packets_total", codepoint="not_ect")]
    assert got == ecn["InNoECTPkts"]
    assert _key("fleetscope_ip_ecn_received_packets_total", codepoint="ce") in before


def test_tcp_missing_sources(tmp_path):
    root = tmp_path / "r"
    _write(root / "proc/net/snmp", SNMP[0])
    got, scrape = _collect(TcpCollector(_config()), root)
    assert scrape.sources[("tcp", "proc/net/netstat")][0] is False
    assert any(k.startswith("fleetscope_tcp_stats_total") for k in got)
    assert not scrape.errors


# --------------------------------------------------------------------------- the exporter


def test_registered_and_valid_exposition(tmp_path):
    """Through the exporter: the three collectors are registered, a node without their
    sources still scrapes with success 1, and the output passes promtool."""
    assert {"rdma", "nic", "tcp"} <= set(COLLECTORS)
    root = _rdma_root(tmp_path, 0)
    _write(root / f"cmd/ethtool-S-{MLX5_IF}.txt", MLX5[0])
    _write(root / f"cmd/ethtool-S-{HNS3_IF}.txt", HNS3[0])
    _write(root / "proc/net/netstat", NETSTAT[0])
    _write(root / "proc/net/snmp", SNMP[0])
    _write(root / "proc/net/route", _route("bond0"))
    _write(root / "proc/net/dev", _net_dev(5, 7))
    config = Config(collectors=("rdma", "nic", "tcp"))
    text = Exporter(str(root), config).render().decode()
    got = samples(text)
    for name in ("rdma", "nic", "tcp"):
        assert got[_key("fleetscope_scrape_collector_success", collector=name)] == 1
    assert got[_pfc(HNS3_IF, "3", "rx")] == 310000
    promtool = require_tool("promtool")
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    got = samples(Exporter(str(empty), config).render().decode())
    for name in ("rdma", "nic", "tcp"):
        assert got[_key("fleetscope_scrape_collector_success", collector=name)] == 1
    assert got[_key("fleetscope_scrape_source_available", collector="rdma",
                    source="sys/class/infiniband")] == 0


# --------------------------------------------------------------------------- this machine


def test_tcp_reads_this_machines_proc_net():
    collector = TcpCollector(_config())
    first, scrape = _collect(collector, "/")
    assert scrape.sources[("tcp", "proc/net/snmp")] == (True, "")
    assert scrape.sources[("tcp", "proc/net/netstat")] == (True, "")
    out = _key("fleetscope_tcp_stats_total", group="Tcp", counter="OutSegs")
    assert first[out] > 0
    second, _ = _collect(collector, "/")
    assert second[out] >= first[out]


def test_rdma_on_this_machine_without_rdma():
    if Path("/sys/class/infiniband").is_dir() and os.listdir("/sys/class/infiniband"):
        pytest.skip("this machine has RDMA devices")
    got, scrape = _collect(RdmaCollector(_config()), "/")
    assert got == {}
    assert scrape.sources[("rdma", "sys/class/infiniband")][0] is False
    assert not scrape.errors


def _real_interfaces() -> list[str]:
    return sorted(n for n in os.listdir("/sys/class/net") if n != "lo")


def test_nic_live_without_rdma_or_config_reads_nothing():
    if Path("/sys/class/infiniband").is_dir() and os.listdir("/sys/class/infiniband"):
        pytest.skip("this machine has RDMA devices")
    got, scrape = _collect(NicCollector(_config()), "/")
    assert got == {}
    ok, reason = scrape.sources[("nic", "ethtool")]
    assert not ok and "ethtool_interfaces" in reason and not scrape.errors


def test_nic_live_runs_the_real_ethtool():
    ethtool = require_tool("ethtool")
    readable = [i for i in _real_interfaces()
                if subprocess.run([ethtool, "-S", i], capture_output=True, timeout=10,
                                  check=False).returncode == 0]
    if not readable:
        pytest.skip("no interface here has ethtool statistics")
    iface = readable[0]
    _, scrape = _collect(NicCollector(_config(ethtool_interfaces=[iface])), "/")
    assert scrape.sources[("nic", f"ethtool -S {iface}")] == (True, "")
    assert not scrape.errors


def _fake_ethtool(tmp_path: Path, body: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / "ethtool"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return bindir


def test_hung_ethtool_is_killed_at_its_timeout_and_reported(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    pids.mkdir()
    # The script's child sleeps: killing only the script would leave it (and the pipes) open.
    bindir = _fake_ethtool(tmp_path, f'sleep 30 & echo $! > "{pids}/$2"\nwait\n')
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    interfaces = _real_interfaces()
    collector = NicCollector(_config(ethtool_interfaces=["*"], command_timeout_seconds=0.5))
    start = time.monotonic()
    got, scrape = _collect(collector, "/")
    elapsed = time.monotonic() - start
    assert elapsed < 0.5 + nic_module.KILL_GRACE_SECONDS + 2.0
    assert got == {}
    for iface in interfaces:
        ok, reason = scrape.sources[("nic", f"ethtool -S {iface}")]
        assert not ok and "did not finish within 0.5 s" in reason and "killed" in reason
    assert "did not finish" in scrape.errors["nic"]
    for pid_file in pids.iterdir():
        pid = int(pid_file.read_text())
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _running(pid):
            time.sleep(0.05)
        assert not _running(pid), f"the hung ethtool's child {pid} survived"
    # The next scrape does not wait on the same hung interfaces again.
    start = time.monotonic()
    _, scrape = _collect(collector, "/")
    assert time.monotonic() - start < 0.4
    ok, reason = scrape.sources[("nic", f"ethtool -S {interfaces[0]}")]
    assert not ok and "timed out recently" in reason


def test_one_hung_interface_costs_only_its_own_series(tmp_path, monkeypatch):
    interfaces = _real_interfaces()
    if len(interfaces) < 2:
        pytest.skip("needs two network interfaces")
    hung, fast = interfaces[0], interfaces[1]
    # The fast one prints more than a pipe holds (64 KiB), so it needs draining while the
    # hung one is waited for.
    big = "".join(f"     rxq{q}_dropped: {q}\\n" for q in range(6000))
    bindir = _fake_ethtool(tmp_path, f'if [ "$2" = "{hung}" ]; then exec sleep 30; fi\n'
                                     f'printf "NIC statistics:\\n{big}"\n')
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    collector = NicCollector(_config(ethtool_interfaces=[hung, fast],
                                     command_timeout_seconds=1.0))
    got, scrape = _collect(collector, "/")
    assert scrape.sources[("nic", f"ethtool -S {fast}")] == (True, "")
    assert scrape.sources[("nic", f"ethtool -S {hung}")][0] is False
    key = _key("fleetscope_nic_ethtool_stats_total", interface=fast, counter="rxq_dropped")
    assert got[key] == sum(range(6000))


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_failing_and_missing_ethtool_are_reported(tmp_path, monkeypatch):
    bindir = _fake_ethtool(tmp_path, 'echo "no stats available" >&2\nexit 94\n')
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    iface = _real_interfaces()[0]
    _, scrape = _collect(NicCollector(_config(ethtool_interfaces=[iface])), "/")
    ok, reason = scrape.sources[("nic", f"ethtool -S {iface}")]
    assert not ok and "exited 94: no stats available" in reason

    empty = tmp_path / "nobin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(nic_module, "SBIN_DIRS", ())
    _, scrape = _collect(NicCollector(_config(ethtool_interfaces=[iface])), "/")
    ok, reason = scrape.sources[("nic", f"ethtool -S {iface}")]
    assert not ok and "ethtool is not installed" in reason
