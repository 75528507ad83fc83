"""roce-congestion: congestion on a shared RoCE network plane.

Condition: ECN-marked packets, CNPs and sequence errors on an RDMA port (hw_counters) above
100/s, or PFC pause frames on an interface (ethtool -S) above 100/s.
"""

from __future__ import annotations

from ..fleet import Add, FleetFault, Noisy, Set
from ..model import EXPLAINS_NODE, NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Rate, Selector, Sum

RANK = 6
ROCE_EVENTS = 100.0  # ECN-marked packets, CNPs, out-of-sequence per second on a port
PFC_PAUSES = 100.0  # PFC pause frames per second on an interface

_RDMA_EVENTS = {"counter": "~np_ecn_marked_roce_packets|np_cnp_sent|rp_cnp_handled|"
                           "out_of_sequence|packet_seq_err"}
_ROCE = Sum(Rate(Selector("fleetscope_rdma_hw_stats_total", _RDMA_EVENTS), WINDOW),
            by=(*NODE, "device"))
_PFC = Sum(Rate(Selector("fleetscope_nic_pfc_pause_frames_total"), WINDOW),
           by=(*NODE, "interface"))


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "roce-congestion", "agent-x86-03",
        "a storage rebuild replicates over RoCE on the same 25GE port as the business traffic "
        "(no separate storage plane) and the switch's ECN/PFC thresholds are low: the port is "
        "congested",
        "mlx5_0 hw_counters: ECN-marked RoCE packets 2600/s, CNPs sent 2450/s and handled "
        "1900/s, out-of-sequence 42/s, sequence errors 17/s; ethtool rx_prio3_pause 420/s; "
        "Redis (state_io) latency x10",
        uptime_days=6.1, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 1.4)
        + [k.etl(k.X86, range(16), 3.2)],
        background=k.background(k.X86, 0.55, 0.03), nic_gbps=18.0,
        rdma={"np_ecn_marked_roce_packets": 2600.0, "np_cnp_sent": 2450.0,
              "rp_cnp_handled": 1900.0, "out_of_sequence": 42.0, "packet_seq_err": 17.0,
              "implied_nak_seq_err": 9.0, "duplicate_request": 6.0,
              "local_ack_timeout_err": 0.8, "roce_adp_retrans": 25.0,
              "port_xmit_wait": 4.5e6},
        pfc={"rx": 420.0, "tx": 35.0},
        agent=k.AgentPlan(sessions=20.0, session_median=0.36, state_io_median=0.045,
                        tool_median=0.2, queue=[6, 8, 7, 9, 8, 7, 9, 8],
                        heartbeat=[1.2, 0.8, 1.9, 1.1, 2.3, 0.9, 1.6, 1.2]))


RULE = Rule(
    id="roce-congestion",
    severity="warning",
    explains=EXPLAINS_NODE,  # the node's network plane
    symptom="Redis / storage latency high, cross-node bandwidth low, jitter",
    cause="congestion on a shared network plane: ECN marks and CNPs, PFC pauses; storage and "
          "business traffic mixed, or PFC watermarks misconfigured",
    action="separate storage and business planes; check PFC watermarks and ECN (DCQCN) on "
           "NICs and switches; RoCEv2 packet loss must be zero",
    summary="RoCE congestion signals at {value:g}/s",
    condition=(_ROCE > ROCE_EVENTS) | (_PFC > PFC_PAUSES),
    evidence=(
        Evidence("ECN marks, CNPs and sequence errors on the RDMA port", _ROCE, ROCE_EVENTS,
                 "1/s"),
        Evidence("PFC pause frames", _PFC, PFC_PAUSES, "1/s"),
    ),
    confidence=0.7,
    subject_labels={"devices": "device", "interfaces": "interface"},
    views=(
        Panel("PFC pause frames per interface", _PFC, "frames/s", PFC_PAUSES, narrow=False),
        Panel("ECN marks, CNPs and sequence errors per RDMA device", _ROCE, "1/s", ROCE_EVENTS,
              narrow=False),
        Panel("Each RDMA congestion counter",
              Sum(Rate(Selector("fleetscope_rdma_hw_stats_total", _RDMA_EVENTS), WINDOW),
                  by=(*NODE, "device", "counter")), "1/s", narrow=False),
    ),
    fleet=FleetFault(("chat",), "rack", 40, effects=(
        Set("roce_ecn_rate", Noisy(1500, 800, stream=24)),
        Set("pfc_pause_rate", Noisy(900, 600, stream=26)),
        Add("state_io_stretch", 7),
        Add("session_tail", 0.25),
    )),
    proof=Proof(scenario, summary=r"RoCE congestion signals at \d+(\.\d+)?/s",
                subjects=("devices", ["mlx5_0"]),
                also_shown=("slow-dependency",)),  # the scenario's Redis latency x10
)
