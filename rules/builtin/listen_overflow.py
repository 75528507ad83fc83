"""listen-overflow: a server's accept loop does not keep up; the kernel drops the handshakes
its full accept queue has no room for, and clients wait out SYN retransmissions (1 s, 3 s,
7 s ...) or fail to connect.

Condition: TcpExt ListenOverflows (the kernel's own count of handshakes dropped at a full
accept queue, /proc/net/netstat) above 1/s over the window, with a listening socket whose
accept queue is at its backlog (sock_diag: sk_ack_backlog against sk_max_ack_backlog). A
source without the listener table (a bundle from another recorder) judges from the counter
alone. Enrichment: the full listener's address and the processes holding it, and the
kernel's own words where its log has them: `TCP: request_sock_TCP: Possible SYN flooding on
port N. Sending cookies.` (collectors/syn_flood.py) names the port whose queue overflowed.
That notice is evidence only, never the condition: the kernel prints it once per listener at
the first overflow of its SYN queue, and SYN cookies on an otherwise idle server are no harm.
"""

from __future__ import annotations

import time

from fleetscope.collectors.shared import PROC_STAT

from ..fleet import FleetFault, Noisy, Set
from ..model import EXPLAINS_NODE, NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Max, Rate, Selector, Sum

RANK = 4.5
LISTEN_OVERFLOWS = 1.0  # per second: handshakes dropped at a full accept queue
QUEUE_FULL = 1.0  # accept queue over backlog: at (or past) it, new handshakes are dropped
MAX_SUBJECTS = 5


def _tcp_ext(counter: str, by=NODE):
    return Sum(Rate(Selector("fleetscope_tcp_stats_total",
                             {"counter": counter, "group": "TcpExt"}), WINDOW), by=by)


_OVERFLOWS = _tcp_ext("ListenOverflows")
_DROPS = _tcp_ext("ListenDrops")
_BACKLOG = Selector("fleetscope_tcp_listen_backlog_connections")
_QUEUE = Selector("fleetscope_tcp_listen_queue_connections")
_FULLEST = Max(_QUEUE / _BACKLOG, by=NODE)
_SOMAXCONN = Max(Selector("fleetscope_sysctl", {"name": "net.core.somaxconn"}), by=NODE)
_SYN_FLOODS = Selector("fleetscope_tcp_syn_flood_notices_total")
MAX_PORTS_SHOWN = 5


def enrich(ctx, finding) -> None:
    """The full listeners (address, queue, backlog) and the processes holding them."""
    full = ctx.full_listeners()
    finding.subjects["pids"] = sorted({pid for item in full for pid in item.pids})[
        :MAX_SUBJECTS]
    described = []
    for item in full[:3]:
        owner = "; ".join(ctx.describe(pid) for pid in item.pids[:2]) or "owner unknown"
        backlog = "?" if item.backlog is None else item.backlog
        described.append(f"{item.address} accept queue {item.queue} of backlog {backlog} "
                         f"({owner})")
    if described:
        finding.extra_summary = "full listener: " + ", ".join(described)
    ports = _syn_flood_ports(ctx, finding)
    if ports:
        said = "the kernel logged 'Possible SYN flooding' on port " + ", ".join(ports)
        finding.extra_summary = "; ".join(filter(None, (finding.extra_summary, said)))


def _syn_flood_ports(ctx, finding) -> list[str]:
    """The kernel log's SYN-flood notices, per port (latest first): an evidence row each, and
    the ports for the summary."""
    from fleetscope.collectors.parsers.kmsg import boot_time, log_clock
    from fleetscope.collectors.parsers.syn_flood import syn_floods

    text = ctx.kernel_log()
    if text is None or "Possible SYN flooding" not in text:
        return []
    boot = ctx.read(ctx.last, PROC_STAT, boot_time)
    by_port: dict[int, list] = {}
    for notice in syn_floods(text, log_clock(boot, ctx.last.time)):
        by_port.setdefault(notice.port, []).append(notice)

    def when(notice) -> float | None:
        return None if boot is None or notice.seconds is None else boot + notice.seconds

    ordered = sorted(by_port.items(), key=lambda item: -(when(item[1][-1]) or 0.0))
    for port, notices in ordered[:MAX_PORTS_SHOWN]:
        last = notices[-1]
        at = when(last)
        where = f"{last.address}:{port}" if last.address else f"port {port}"
        action = "sending cookies" if last.cookies else "dropping requests"
        stamp = f", the last at {_utc(at)}" if at is not None else ""
        finding.evidence.append({
            "signal": f"kernel: Possible SYN flooding on {where} ({last.protocol}, "
                      f"{action}){stamp}",
            "value": len(notices), "threshold": 0, "unit": "lines"})
    return [str(port) for port, _ in ordered[:MAX_PORTS_SHOWN]]


def _utc(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "listen-overflow", "agent-x86-09",
        "the agent gateway's accept loop blocks on a synchronous auth call per connection and "
        "listens with the framework's backlog of 128: its accept queue stays full and the "
        "kernel drops the handshakes beyond it",
        "TcpExt ListenOverflows and ListenDrops +40/s each, the gateway's listener "
        "0.0.0.0:8443 at 129 of its backlog of 128 in every sample, net.core.somaxconn 4096, "
        "sessions slow (clients retransmit SYNs), CPUs mostly idle",
        uptime_days=6.3, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 0.3),
        background=k.background(k.X86, 0.12, 0.02),
        listen={"listener": "0.0.0.0:8443", "backlog": 128, "queue": [129] * 8,
                "overflows": [0.2] + [40.0] * 7, "owner": 0},
        agent=k.AgentPlan(sessions=9.0, session_median=1.4, queue=[2, 3, 2, 3, 2, 3, 2, 3],
                          heartbeat=[0.6, 0.9, 0.5, 0.8, 0.7, 0.9, 0.6, 0.8]))


RULE = Rule(
    id="listen-overflow",
    severity="warning",
    explains=EXPLAINS_NODE,  # a listener of the node: fleetscope does not tell whose
    symptom="clients time out connecting, or connect after 1 s, 3 s, 7 s (SYN retries)",
    cause="a listening socket's accept queue is full: its process does not accept() "
          "connections as fast as they arrive, and the kernel drops the handshakes beyond "
          "the backlog (TcpExt ListenOverflows)",
    action="find what blocks the accept loop of the process holding the listener (py-spy "
           "dump, fleetscope stacks PID; ss -lnt shows Recv-Q at Send-Q); add acceptor "
           "workers; raise the backlog (listen() argument, capped by net.core.somaxconn) "
           "only to absorb bursts",
    summary="connections dropped at a full accept queue: {value:.0f}/s",
    condition=((_OVERFLOWS > LISTEN_OVERFLOWS).and_on(_FULLEST >= QUEUE_FULL, NODE)
               | (_OVERFLOWS > LISTEN_OVERFLOWS).unless(Max(_BACKLOG, by=NODE), NODE)),
    evidence=(
        Evidence("handshakes dropped at a full accept queue (TcpExt ListenOverflows)",
                 _OVERFLOWS, LISTEN_OVERFLOWS, "1/s"),
        Evidence("SYNs and handshakes dropped by listeners (TcpExt ListenDrops)", _DROPS,
                 LISTEN_OVERFLOWS, "1/s"),
        Evidence("fullest listener: accept queue over its backlog", _FULLEST, QUEUE_FULL,
                 "ratio"),
        Evidence("longest accept queue", Max(_QUEUE, by=NODE), 0, "connections"),
        Evidence("net.core.somaxconn (caps every backlog)", _SOMAXCONN, 0, "connections"),
        # the kernel's notice, once per listener whose SYN queue overflowed (not a condition)
        Evidence("'Possible SYN flooding on port N' kernel-log lines",
                 Sum(Max(_SYN_FLOODS, by=(*NODE, "port")), by=NODE), 0, "lines"),
    ),
    confidence=0.85,
    enrich=enrich,
    views=(
        Panel("Handshakes dropped at a full accept queue (ListenOverflows)",
              _OVERFLOWS, "1/s", LISTEN_OVERFLOWS),
        Panel("Accept queue over backlog, per listener",
              Max(_QUEUE / _BACKLOG, by=(*NODE, "listener")), "ratio", QUEUE_FULL),
        Panel("SYN-flooding notices in the kernel log, per port",
              Max(_SYN_FLOODS, by=(*NODE, "port")), "lines", narrow=False),
    ),
    fleet=FleetFault(("chat",), 5, 25, effects=(
        # the gateway's listener (backlog 511) held full, handshakes dropped
        Set("listen_overflow_rate", Noisy(35, 20, stream=91)),
        Set("listen_queue", 512.0),
    )),
    proof=Proof(scenario, summary=r"connections dropped at a full accept queue: \d+/s",
                subjects=("pids", None)),
)
