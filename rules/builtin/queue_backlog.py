"""queue-backlog: tasks arrive faster than the workers dispatch them.

Condition: a queue (agent_queue_depth) holds more than 50 tasks and grew over the window.
"""

from __future__ import annotations

from ..fleet import Add, FleetFault, Set
from ..model import EXPLAINS_POOL, NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Delta, Max, Selector
from ..signals import SATURATED_CORE, busy_ratio

RANK = 7
QUEUE_DEPTH = 50.0  # tasks waiting in a queue

_BY_QUEUE = (*NODE, "pool", "queue")
_DEPTH = Max(Selector("agent_queue_depth"), by=_BY_QUEUE)
_GROWTH = Max(Delta(Selector("agent_queue_depth"), WINDOW), by=_BY_QUEUE)


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "queue-backlog", "agent-x86-05",
        "a traffic peak: tasks arrive at ~28/s, the four workers dispatch ~26/s with every "
        "core busy (the ETL job is not scheduled here at peak), so the Redis queue grows",
        "agent_queue_depth 64 -> 198 and growing, queue_wait stage up to seconds, every "
        "online core 97 % busy, CPU PSI 25 %",
        uptime_days=7.3, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 3.3,
                                                     threads=(4, 4, 4, 3), lead_wait=0.03,
                                                     ivcs=9.0),
        background=k.background(k.X86, 0.55, 0.03), wait_ratio=0.08, extra_runnable=2.0,
        psi={"cpu": [3.0, 24.0, 25.0, 26.0, 25.0, 24.0, 26.0, 25.0], "memory": 0.05,
             "io": 0.4},
        cgroups={k.ONLINE_CG: {"pressure": [1.5, 21.0, 22.0, 23.0, 22.0, 21.0, 23.0, 22.0]}},
        agent=k.AgentPlan(sessions=26.0, session_median=2.1, queue_wait_median=3.8,
                        queue=[64, 83, 101, 122, 140, 161, 179, 198],
                        heartbeat=[0.7, 1.2, 0.9, 1.4, 0.8, 1.1, 1.5, 0.9]))


RULE = Rule(
    id="queue-backlog",
    severity="warning",
    explains=EXPLAINS_POOL,  # its queue
    symptom="end-to-end latency rises, queue keeps growing",
    cause="the orchestration layer is saturated: tasks arrive faster than workers dispatch "
          "them (serial scheduling, lock contention, too few CPU workers)",
    action="scale out CPU workers for the pool; look for lock waits in the framework "
           "(fleetscope stacks PID); apply backpressure at the gateway (token bucket, 429)",
    summary="queue {queue} of pool {pool} holds {value:g} tasks and grows",
    condition=(_DEPTH > QUEUE_DEPTH).and_on(_GROWTH > 0, _BY_QUEUE),
    evidence=(
        Evidence("tasks waiting", _DEPTH, QUEUE_DEPTH, "tasks"),
        Evidence("growth over the window", _GROWTH, 0, "tasks"),
        Evidence("busiest core busy", busy_ratio("max"), SATURATED_CORE, "ratio"),
    ),
    confidence=0.7,
    views=(
        Panel("Tasks waiting per queue", _DEPTH, "tasks", QUEUE_DEPTH),
        Panel("Busiest core", busy_ratio("max"), "ratio", SATURATED_CORE),
    ),
    fleet=FleetFault(("codegen",), 16, 30, effects=(
        # the queue grows by 3 tasks a minute since the backlog began
        Set("queue_depth", lambda site: 20 + 3 * site.since / 60),
        Add("queue_wait_stretch", 14),
    )),
    proof=Proof(scenario, summary=r"queue tasks:chat of pool chat-online holds 198 tasks and "
                                  r"grows"),
)
