"""Collector `nic`: the NIC driver's congestion counters from `ethtool -S`: per-priority PFC
pause frames and pause time, link-level pause, and a curated list of discard and drop
counters, for the netdevs that carry RDMA ports and those named in `ethtool_interfaces`.

    $ ethtool -S ens1f0np0                      $ ethtool -S enp189s0f0    (hns3)
    NIC statistics:                             NIC statistics:
         rx_prio3_pause: 41927                       mac_tx_pfc_pri3_pkt_num: 1290418
         tx_prio3_pause: 1290418                     mac_rx_pfc_pri3_pkt_num: 41927

Names differ per driver; both spellings map onto the same metrics:

    pfc_pause_frames{priority,direction}   mlx5 rx_prio<p>_pause, tx_prio<p>_pause
                                           hns3 mac_rx_pfc_pri<p>_pkt_num, mac_tx_pfc_pri<p>_pkt_num
    pfc_pause_seconds{priority,direction}  mlx5 rx_prio<p>_pause_duration (microseconds); hns3
                                           mac_*_pfc_pri<p>_xoff_time has no documented unit:
                                           kept raw in ethtool_stats
    pause_frames{direction} (802.3x)       mlx5 rx/tx_global_pause, hns3 mac_rx/tx_mac_pause_num
    port_bytes{direction} (RDMA included)  mlx5 rx/tx_bytes_phy, hns3 mac_rx/tx_total_oct_num

(mlx5: en_stats.c and Documentation/networking/device_drivers/ethernet/mellanox/mlx5/
counters.rst; hns3: hns3pf/hclge_main.c g_mac_stats_string and hns3_ethtool.c.)

mlx5 prints the per-priority pause counters only for priorities with PFC enabled, and the
global ones only when global pause is on: a missing series means "not enabled", not zero.
rx pause = the switch tells this host to stop (the network is congested); tx pause = this
host's receive path cannot keep up (PCIe, memory bandwidth, CPU).

Live (`scrape.evidence.live`: `--root /`, `/host` in a container): the evidence source runs
`ethtool -S IFACE` for each interface at once, no shell, each killed with its process group
at `command_timeout_seconds` and reported; an interface that timed out is not retried for a
while, so a hung driver does not stall every scrape. Recorded (a bundle sample, a fixture
tree): reads `cmd/ethtool-S-<iface>.txt`, as `fleetscope bundle record` writes it.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator

from fleetscope.core.exposition import Family, counter, labels

from .base import Collector, Evidence, NotAvailable, Scrape, Signal
from .parsers import ParseError
from .parsers.net import parse_ethtool_stats
from .rdma import NET_DIR, rdma_ports
from .source import KILL_GRACE_SECONDS, CommandTimeout, EvidenceSource

__all__ = ["KILL_GRACE_SECONDS", "NicCollector", "run_ethtool"]

CONFIG_KEY = "ethtool_interfaces"  # list of interface names or globs, e.g. ["ens1f*"]
CMD_DIR = "cmd"
REPLAY_PREFIX, REPLAY_SUFFIX = "ethtool-S-", ".txt"
# ethtool lives in sbin, which a non-root PATH may lack; standard FHS locations.
SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")
ETHTOOL_HINT = "install ethtool (Debian/Ubuntu package `ethtool`)"
RETRY_AFTER_TIMEOUT_SECONDS = 60.0  # at least; or 6 timeouts, whichever is longer

PFC_PAUSE = (re.compile(r"(rx|tx)_prio([0-7])_pause"),  # mlx5
             re.compile(r"mac_(rx|tx)_pfc_pri([0-7])_pkt_num"))  # hns3
PFC_PAUSE_DURATION_US = re.compile(r"(rx|tx)_prio([0-7])_pause_duration")  # mlx5
GLOBAL_PAUSE = {"rx_global_pause": "rx", "tx_global_pause": "tx",  # mlx5, global pause on
                "mac_rx_mac_pause_num": "rx", "mac_tx_mac_pause_num": "tx"}  # hns3
GLOBAL_PAUSE_DURATION_US = {"rx_global_pause_duration": "rx", "tx_global_pause_duration": "tx"}
PORT_BYTES = {"rx_bytes_phy": "rx", "tx_bytes_phy": "tx",  # mlx5
              "mac_rx_total_oct_num": "rx", "mac_tx_total_oct_num": "tx"}  # hns3

# Discards, drops and congestion marks worth a rule, exported under their driver names.
CURATED = frozenset({
    # mlx5 (Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst)
    "rx_discards_phy", "tx_discards_phy", "rx_out_of_buffer", "rx_buffer_passed_thres_phy",
    "tx_pause_storm_warning_events", "tx_pause_storm_error_events",
    "rx_pause_ctrl_phy", "tx_pause_ctrl_phy", "rx_crc_errors_phy", "rx_symbol_err_phy",
    "rx_pcs_symbol_err_phy", "link_down_events_phy", "tx_errors_phy",
    "outbound_pci_stalled_rd_events", "outbound_pci_stalled_wr_events",
    "outbound_pci_buffer_overflow", "tx_queue_dropped", "dev_internal_queue_oob",
    "rx_global_pause_transition",
    # hns3 (hclge_main.c g_mac_stats_string)
    "mac_rx_fcs_err_pkt_num", "mac_rx_bad_pkt_num", "mac_tx_bad_pkt_num",
    "mac_rx_send_app_bad_pkt_num", "mac_tx_err_all_pkt_num",
    "mac_tx_pause_xoff_time", "mac_rx_pause_xoff_time",
})
CURATED_PATTERNS = (
    re.compile(r"rx_prio[0-7]_(discards|buf_discard|cong_discard|marked|pause_transition)"),
    re.compile(r"mac_(rx|tx)_pfc_pri[0-7]_xoff_time"),  # hns3 stats v2; unit undocumented
)
# hns3 counts software drops per queue pair (txq<N>_dropped, rxq<N>_dropped, rxq<N>_errors);
# they are summed over the queues so the series count does not follow the queue count.
QUEUE_SUMS = re.compile(r"(txq|rxq)[0-9]+_(dropped|errors)")


def configured_interfaces(raw: dict) -> tuple[str, ...]:
    """The `ethtool_interfaces` config value: a list of interface names or shell globs."""
    value = raw.get(CONFIG_KEY, [])
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{CONFIG_KEY} must be a list of interface names or globs")
    return tuple(value)


def ethtool_binary() -> str | None:
    """Resolved at call time: PATH first (tests put a fake there), then the sbin dirs."""
    return shutil.which("ethtool") or shutil.which("ethtool", path=os.pathsep.join(SBIN_DIRS))


EthtoolTimeout = CommandTimeout


def run_ethtool(host: EvidenceSource, interfaces: list[str], timeout: float
                ) -> dict[str, str | NotAvailable]:
    """`ethtool -S` for each interface, run by the evidence source (a live host) in
    parallel, all within `timeout` seconds, each in its own process group (killed whole at
    the timeout: CommandTimeout)."""
    binary = ethtool_binary()
    if binary is None:
        return dict.fromkeys(interfaces, NotAvailable(f"ethtool is not installed: {ETHTOOL_HINT}"))
    env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C"}
    outputs = host.run_commands({iface: (f"ethtool -S {iface}", [binary, "-S", iface])
                                 for iface in interfaces}, timeout, env)
    return {iface: out if isinstance(out, NotAvailable) else out.decode("utf-8", "replace")
            for iface, out in outputs.items()}


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_nic_pfc_pause_frames_total", "PFC pause frames, by priority", "frames"),
)


class NicCollector(Collector):
    name = "nic"
    evidence = Evidence(signals=SIGNALS)
    missing_hints = (("fleetscope_nic_pfc", "no PFC counters: no ethtool -S output for a RoCE "
                                            "NIC"),)

    def __init__(self, config):
        super().__init__(config)
        self._config_error = ""
        try:
            self.patterns = configured_interfaces(config.raw)
        except ValueError as err:
            self.patterns, self._config_error = (), str(err)
        self._lock = threading.Lock()
        self._retry_at: dict[str, float] = {}  # interface -> monotonic time to try again

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        if self._config_error:
            with scrape.source(self.name, f"config {CONFIG_KEY}"):
                raise NotAvailable(self._config_error)
        texts: dict[str, str | NotAvailable] = {}
        with scrape.source(self.name, "ethtool"):
            texts = self._read_live(scrape) if scrape.evidence.live \
                else self._read_replay(scrape)
        if texts:
            yield from self._families(scrape, texts)

    def interfaces(self, scrape: Scrape) -> list[str]:
        """Netdevs of the RDMA ports, plus configured names/globs present in sys/class/net."""
        chosen: set[str] = set()
        try:
            chosen |= {p.netdev for p in rdma_ports(scrape) if p.netdev}
        except (NotAvailable, ParseError):
            pass
        if self.patterns:
            present = [n for n in scrape.listdir(NET_DIR) if n != "lo"]
            for pattern in self.patterns:
                chosen |= set(fnmatch.filter(present, pattern))
        return sorted(chosen)

    def _read_live(self, scrape: Scrape) -> dict[str, str | NotAvailable]:
        interfaces = self.interfaces(scrape)
        if not interfaces:
            raise NotAvailable(f"no interface to read: no RDMA netdev and no {CONFIG_KEY} "
                               "configured")
        now = time.monotonic()
        with self._lock:
            due = [i for i in interfaces if self._retry_at.get(i, 0.0) <= now]
        results: dict[str, str | NotAvailable] = {
            i: NotAvailable(f"ethtool -S {i} timed out recently; retried after "
                            f"{self._backoff():g} s")
            for i in interfaces if i not in due
        }
        timeout = self.config.command_timeout_seconds
        results.update(run_ethtool(scrape.evidence, due, timeout))
        with self._lock:
            for iface in due:
                if isinstance(results[iface], EthtoolTimeout):
                    self._retry_at[iface] = time.monotonic() + self._backoff()
                    scrape.errors.setdefault(self.name, str(results[iface]))
                else:
                    self._retry_at.pop(iface, None)
        return results

    def _backoff(self) -> float:
        return max(RETRY_AFTER_TIMEOUT_SECONDS, 6 * self.config.command_timeout_seconds)

    @staticmethod
    def _read_replay(scrape: Scrape) -> dict[str, str | NotAvailable]:
        files = [n for n in scrape.listdir(CMD_DIR)
                 if n.startswith(REPLAY_PREFIX) and n.endswith(REPLAY_SUFFIX)]
        if not files:
            raise NotAvailable(f"no /{CMD_DIR}/{REPLAY_PREFIX}<iface>{REPLAY_SUFFIX} in the root")
        results: dict[str, str | NotAvailable] = {}
        for name in sorted(files):
            iface = name[len(REPLAY_PREFIX):-len(REPLAY_SUFFIX)]
            try:
                results[iface] = scrape.read_text(f"{CMD_DIR}/{name}")
            except NotAvailable as err:
                results[iface] = err
        return results

    def _families(self, scrape: Scrape, texts: dict[str, str | NotAvailable]) -> Iterator[Family]:
        pfc = counter(
            "fleetscope_nic_pfc_pause_frames_total",
            "PFC pause frames per priority (ethtool -S: mlx5 rx/tx_prio<p>_pause, hns3 "
            "mac_rx/tx_pfc_pri<p>_pkt_num); rx: the network paused this host, tx: this host "
            "paused the network. Present only for priorities with PFC enabled (mlx5).",
        )
        pfc_seconds = counter(
            "fleetscope_nic_pfc_pause_seconds_total",
            "Time paused per priority (mlx5 rx/tx_prio<p>_pause_duration, microseconds).",
        )
        pause = counter(
            "fleetscope_nic_pause_frames_total",
            "IEEE 802.3x link-level pause frames (mlx5 rx/tx_global_pause when global pause "
            "is on, hns3 mac_rx/tx_mac_pause_num).",
        )
        pause_seconds = counter(
            "fleetscope_nic_pause_seconds_total",
            "Time under link-level pause (mlx5 rx/tx_global_pause_duration, microseconds).",
        )
        port_bytes = counter(
            "fleetscope_nic_port_bytes_total",
            "Bytes on the wire at the physical port, RDMA included (mlx5 rx/tx_bytes_phy, "
            "hns3 mac_rx/tx_total_oct_num).",
        )
        curated = counter(
            "fleetscope_nic_ethtool_stats_total",
            "Driver discard, drop, error and congestion counters under their ethtool names "
            "(a curated list; hns3 per-queue txq/rxq<N>_dropped and _errors summed over the "
            "queues as txq_dropped, rxq_dropped, ...).",
        )
        for iface, text in texts.items():
            # One source per interface: a hung or missing one costs its own series only.
            with scrape.source(self.name, f"ethtool -S {iface}"):
                if isinstance(text, NotAvailable):
                    raise text
                stats = parse_ethtool_stats(text)
                self._map(iface, stats, pfc, pfc_seconds, pause, pause_seconds, port_bytes,
                          curated)
        for family in (pfc, pfc_seconds, pause, pause_seconds, port_bytes, curated):
            if family.samples:
                yield family

    @staticmethod
    def _map(iface, stats, pfc, pfc_seconds, pause, pause_seconds, port_bytes, curated):
        sums: dict[str, int] = {}
        for name, value in stats.items():
            for pattern in PFC_PAUSE:
                m = pattern.fullmatch(name)
                if m:
                    pfc.add(value, labels(interface=iface, priority=m.group(2),
                                          direction=m.group(1)))
            m = PFC_PAUSE_DURATION_US.fullmatch(name)
            if m:
                pfc_seconds.add(value / 1e6, labels(interface=iface, priority=m.group(2),
                                                    direction=m.group(1)))
            if name in GLOBAL_PAUSE:
                pause.add(value, labels(interface=iface, direction=GLOBAL_PAUSE[name]))
            if name in GLOBAL_PAUSE_DURATION_US:
                pause_seconds.add(value / 1e6, labels(
                    interface=iface, direction=GLOBAL_PAUSE_DURATION_US[name]))
            if name in PORT_BYTES:
                port_bytes.add(value, labels(interface=iface, direction=PORT_BYTES[name]))
            if name in CURATED or any(p.fullmatch(name) for p in CURATED_PATTERNS):
                curated.add(value, labels(interface=iface, counter=name))
            m = QUEUE_SUMS.fullmatch(name)
            if m:
                key = f"{m.group(1)}_{m.group(2)}"
                sums[key] = sums.get(key, 0) + value
        for key in sorted(sums):
            curated.add(sums[key], labels(interface=iface, counter=key))
