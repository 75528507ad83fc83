"""Collector `rdma`: RDMA (RoCE / InfiniBand) port counters, the driver's congestion and
retransmission counters, and which netdev carries each RDMA port, so a rule can tell
whether storage (RDMA) and business (TCP) traffic share one network plane.

Inputs, per device and port (Documentation/ABI/stable/sysfs-class-infiniband):

    sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_wait        18446
    sys/class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent        1542
    sys/class/infiniband/mlx5_0/ports/1/{state,link_layer}             4: ACTIVE / Ethernet
    sys/class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/3              bond0.100
    sys/class/infiniband/mlx5_0/device/net/ens1f0np0/dev_port          0
    sys/class/net/ens1f0np0/upper_bond0                                (bond / VLAN on top)
    proc/net/route, proc/net/ipv6_route, proc/net/dev                  default routes, kernel bytes

`counters/` are the IB PMA counters (drivers/infiniband/core/sysfs.c): `port_xmit_data` and
`port_rcv_data` count octets divided by 4, every other file counts packets or events. A file
reading "N/A (no PMA)" is a counter the device does not have. `hw_counters/` are the
driver's (mlx5: drivers/infiniband/hw/mlx5/counters.c, e.g. np_ecn_marked_roce_packets,
np_cnp_sent, rp_cnp_handled, out_of_sequence, packet_seq_err, local_ack_timeout_err,
roce_adp_retrans); their set depends on the device's capabilities, so the directory is
listed, never a fixed list. `hw_counters/lifespan` is a refresh period (ms), not a counter.

RoCE traffic bypasses the kernel IP stack, so /proc/net/dev on a RoCE netdev counts only the
TCP/IP traffic (business traffic, or storage over TCP) that shares the port; a default route
through the netdev (directly, or through a bond or VLAN on it, or a netdev in the port's GID
table) says the node's business traffic leaves through the RoCE plane.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from fleetscope.core.exposition import Family, counter, gauge, labels

from .base import Collector, Evidence, NotAvailable, Scrape, Signal
from .parsers import ParseError
from .parsers.net import (
    parse_default_routes,
    parse_ib_port_state,
    parse_ipv6_default_routes,
    parse_net_dev,
    parse_sysfs_counter,
)

IB_DIR = "sys/class/infiniband"
NET_DIR = "sys/class/net"
IB_HINT = ("no RDMA device: no RDMA NIC, or its driver (mlx5_ib, hns_roce_hw_v2) and ib_core "
           "are not loaded")
# PMA data counters are in units of 4 octets ("divided by 4 (lanes)", sysfs-class-infiniband).
DATA_COUNTERS = {"port_xmit_data": "transmit", "port_rcv_data": "receive"}
NOT_COUNTERS = {"lifespan"}  # hw_counters/lifespan: the counters' refresh period in ms
UPPER_DEPTH = 2  # bond on the port, VLAN on the bond


@dataclass
class RdmaPort:
    device: str
    port: str
    netdev: str = ""  # the physical netdev (device/net/*), else the first GID netdev
    link_layer: str = ""
    state: int | None = None
    gid_netdevs: set[str] = field(default_factory=set)  # L3 netdevs of the port's GIDs
    upper_netdevs: set[str] = field(default_factory=set)  # bonds / VLANs over `netdev`

    @property
    def plane_netdevs(self) -> set[str]:
        """Every netdev whose traffic leaves through this port."""
        return ({self.netdev} if self.netdev else set()) | self.gid_netdevs | self.upper_netdevs


def _read_optional(scrape: Scrape, relative: str) -> str | None:
    try:
        return scrape.read_text(relative).strip()
    except NotAvailable:
        return None


def _physical_netdevs(scrape: Scrape, device: str, ports: list[str]) -> dict[str, str]:
    """port -> netdev of the same PCI function. A multi-port device (mlx4) has one netdev per
    port, told apart by dev_port (0-based); mlx5 and hns have one port per device."""
    base = f"{IB_DIR}/{device}/device/net"
    netdevs = scrape.listdir(base)
    if not netdevs:
        return {}
    if len(netdevs) == 1:
        return dict.fromkeys(ports, netdevs[0])
    by_port: dict[str, str] = {}
    for netdev in netdevs:
        dev_port = _read_optional(scrape, f"{base}/{netdev}/dev_port")
        if dev_port is not None and dev_port.isdigit():
            by_port.setdefault(str(int(dev_port) + 1), netdev)
    return by_port


def _gid_netdevs(scrape: Scrape, device: str, port: str) -> set[str]:
    """Netdevs in the port's GID table. Unused entries fail to read (EINVAL), so are skipped."""
    base = f"{IB_DIR}/{device}/ports/{port}/gid_attrs/ndevs"
    names = set()
    for entry in scrape.listdir(base):
        name = _read_optional(scrape, f"{base}/{entry}")
        if name:
            names.add(name)
    return names


def _upper_netdevs(scrape: Scrape, netdev: str) -> set[str]:
    """Bonds, VLANs, macvlans stacked on a netdev: sysfs links `upper_<name>` in its dir."""
    found: set[str] = set()
    frontier = {netdev}
    for _ in range(UPPER_DEPTH):
        nxt = set()
        for name in frontier:
            try:
                entries = scrape.listdir(f"{NET_DIR}/{name}")
            except NotAvailable:
                continue
            nxt |= {e[len("upper_"):] for e in entries if e.startswith("upper_")}
        nxt -= found | {netdev}
        if not nxt:
            break
        found |= nxt
        frontier = nxt
    return found


def _read_rdma_ports(scrape: Scrape) -> list[RdmaPort]:
    devices = scrape.listdir(IB_DIR)
    if not devices:
        raise NotAvailable(f"/{IB_DIR} has no devices")
    result = []
    for device in devices:
        ports = [p for p in scrape.listdir(f"{IB_DIR}/{device}/ports") if p.isdigit()]
        ports.sort(key=int)
        physical = _physical_netdevs(scrape, device, ports)
        for port in ports:
            base = f"{IB_DIR}/{device}/ports/{port}"
            entry = RdmaPort(device, port, physical.get(port, ""))
            entry.link_layer = _read_optional(scrape, f"{base}/link_layer") or ""
            state = _read_optional(scrape, f"{base}/state")
            if state is not None:
                try:
                    entry.state = parse_ib_port_state(state)[0]
                except ParseError:
                    entry.state = None
            entry.gid_netdevs = _gid_netdevs(scrape, device, port)
            if not entry.netdev and entry.gid_netdevs:
                entry.netdev = sorted(entry.gid_netdevs)[0]
            if entry.netdev:
                entry.upper_netdevs = _upper_netdevs(scrape, entry.netdev)
            result.append(entry)
    return result


def rdma_ports(scrape: Scrape) -> list[RdmaPort]:
    """Every RDMA port with its netdevs, read once per scrape (the `nic` collector runs
    ethtool on these netdevs). NotAvailable when the node has no RDMA device."""
    return scrape.memo(IB_DIR, lambda: _read_rdma_ports(scrape))


def _read_counter_dir(scrape: Scrape, directory: str, skip=frozenset()) -> dict[str, int]:
    """Every counter file in a directory. A file that cannot be read (EINVAL while the port
    resets) or says "N/A (no PMA)" is left out; a corrupt one fails the source after the
    others are read."""
    values: dict[str, int] = {}
    corrupt: ParseError | None = None
    for name in scrape.listdir(directory):
        if name in skip:
            continue
        try:
            value = parse_sysfs_counter(scrape.read_text(f"{directory}/{name}"),
                                        f"/{directory}/{name}")
        except NotAvailable:
            continue
        except ParseError as err:
            corrupt = corrupt or err
            continue
        if value is not None:
            values[name] = value
    if corrupt is not None:
        raise _PartialRead(values, corrupt)
    return values


class _PartialRead(Exception):
    def __init__(self, values: dict[str, int], error: ParseError):
        super().__init__(str(error))
        self.values = values
        self.error = error


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_rdma_hw_stats_total", "RDMA port driver counters (ECN, CNP)", ""),
)


class RdmaCollector(Collector):
    name = "rdma"
    evidence = Evidence(signals=SIGNALS,

        sampled=("proc/net/dev", f"{IB_DIR}/*/ports/*/counters/*",
                 f"{IB_DIR}/*/ports/*/hw_counters/*",
                 # the RDMA-to-netdev mapping and the routes that tell the planes apart
                 f"{IB_DIR}/*/device/net/*/dev_port", f"{IB_DIR}/*/ports/*/state",
                 f"{IB_DIR}/*/ports/*/link_layer", f"{IB_DIR}/*/ports/*/gid_attrs/ndevs/*",
                 f"{NET_DIR}/*/upper_*", "proc/net/route", "proc/net/ipv6_route"),
        described=((IB_DIR, "RDMA counters"),))
    missing_hints = (("fleetscope_rdma_", "no RDMA device"),)

    @classmethod
    def why_missing(cls, prefix: str, present: set[str],
                    unavailable: frozenset[str] = frozenset()) -> str:
        if present & {"fleetscope_rdma_device_info", "fleetscope_rdma_port_state"}:
            # Ports without hw_counters (the ECN/CNP counters) are not "no RDMA device".
            return ("RDMA devices present, but their ports have no hw_counters directory "
                    "(the ECN/CNP counters: mlx5_ib or hns_roce_hw_v2 with a kernel that "
                    "exposes them)")
        return super().why_missing(prefix, present, unavailable)

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        ports: list[RdmaPort] = []
        with scrape.source(self.name, IB_DIR, IB_HINT):
            ports = rdma_ports(scrape)
        if not ports:
            return
        yield self._info(ports)
        state = gauge("fleetscope_rdma_port_state",
                      "RDMA port state (ports/N/state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE).")
        for p in ports:
            if p.state is not None:
                state.add(p.state, labels(device=p.device, port=p.port))
        if state.samples:
            yield state
        yield from self._counters(scrape, ports)
        yield from self._plane(scrape, ports)

    def _info(self, ports: list[RdmaPort]) -> Family:
        info = gauge(
            "fleetscope_rdma_device_info",
            "RDMA port and the netdev carrying it (device/net, else the GID table); always 1. "
            "Join on netdev to the nic metrics (interface) and the plane metrics below.",
        )
        for p in ports:
            info.add(1, labels(device=p.device, port=p.port, netdev=p.netdev,
                               link_layer=p.link_layer))
        return info

    def _counters(self, scrape: Scrape, ports: list[RdmaPort]) -> Iterator[Family]:
        port_counters = counter(
            "fleetscope_rdma_port_stats_total",
            "IB port counters as the kernel reports them (ports/N/counters/<counter>): "
            "packets or events; port_xmit_data/port_rcv_data in units of 4 octets.",
        )
        data_bytes = counter(
            "fleetscope_rdma_port_data_bytes_total",
            "Bytes the RDMA port sent or received (port_xmit_data/port_rcv_data x 4).",
        )
        hw_counters = counter(
            "fleetscope_rdma_hw_stats_total",
            "Driver counters of the RDMA port (ports/N/hw_counters/<counter>; mlx5: "
            "np_ecn_marked_roce_packets, np_cnp_sent, rp_cnp_handled, out_of_sequence, "
            "packet_seq_err, local_ack_timeout_err, ...), packets or events.",
        )
        for p in ports:
            base = f"{IB_DIR}/{p.device}/ports/{p.port}"
            with scrape.source(self.name, f"{base}/counters"):
                values = self._read(scrape, f"{base}/counters", (), port_counters, p)
                for name, direction in DATA_COUNTERS.items():
                    if name in values:
                        data_bytes.add(values[name] * 4, labels(
                            device=p.device, port=p.port, direction=direction))
            with scrape.source(self.name, f"{base}/hw_counters"):
                self._read(scrape, f"{base}/hw_counters", NOT_COUNTERS, hw_counters, p)
        for family in (port_counters, data_bytes, hw_counters):
            if family.samples:
                yield family

    @staticmethod
    def _read(scrape: Scrape, directory: str, skip, family: Family, p: RdmaPort) -> dict:
        if not scrape.listdir(directory):
            raise NotAvailable(f"/{directory} does not exist or is empty")
        try:
            values = _read_counter_dir(scrape, directory, frozenset(skip))
            error = None
        except _PartialRead as partial:
            values, error = partial.values, partial.error
        for name in sorted(values):
            family.add(values[name], labels(device=p.device, port=p.port, counter=name))
        if error is not None:
            raise error
        return values

    def _plane(self, scrape: Scrape, ports: list[RdmaPort]) -> Iterator[Family]:
        """Evidence that other traffic shares the RoCE ports: the default route, and bytes
        through the kernel IP stack, on the port's netdevs."""
        with_netdev = [p for p in ports if p.netdev]
        if not with_netdev:
            return
        defaults: set[str] = set()
        any_routes = False
        for source, parser in (("proc/net/route", parse_default_routes),
                               ("proc/net/ipv6_route", parse_ipv6_default_routes)):
            with scrape.source(self.name, source):
                defaults |= parser(scrape.read_text(source))
                any_routes = True
        if any_routes:
            route = gauge(
                "fleetscope_rdma_netdev_default_route",
                "1 when the node's default route leaves through the RDMA port's netdev (or a "
                "bond/VLAN on it, or a netdev of its GID table): business traffic shares the "
                "RDMA plane.",
            )
            for p in with_netdev:
                route.add(1 if p.plane_netdevs & defaults else 0,
                          labels(device=p.device, port=p.port, netdev=p.netdev))
            yield route
        with scrape.source(self.name, "proc/net/dev"):
            rows = parse_net_dev(scrape.read_text("proc/net/dev"))
            kernel = counter(
                "fleetscope_rdma_netdev_kernel_bytes_total",
                "Bytes the kernel IP stack moved through the RDMA port's netdev "
                "(/proc/net/dev). RoCE bypasses the kernel, so this is the TCP/IP traffic "
                "sharing the port.",
            )
            for p in with_netdev:
                row = rows.get(p.netdev)
                if row is None:
                    continue
                for direction, value in (("receive", row.rx_bytes), ("transmit", row.tx_bytes)):
                    kernel.add(value, labels(device=p.device, port=p.port, netdev=p.netdev,
                                             direction=direction))
            if kernel.samples:
                yield kernel
