"""session-affinity-loss: the scheduler moves sessions to other nodes, which re-sync their
context half-way.

Condition: session migrations into a pool above 0.05/s (3 a minute).
"""

from __future__ import annotations

from ..fleet import Add, FleetFault, Set
from ..model import EXPLAINS_POOL, NODE, WINDOW, Evidence, Panel, Proof, Rule
from ..promql import Rate, Selector, Sum

RANK = 11
MIGRATIONS = 0.05  # session migrations per second in a pool (3 a minute)

_MIGRATIONS = Sum(Rate(Selector("agent_session_migrations_total"), WINDOW), by=(*NODE, "pool"))


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    return k.x86_scenario(
        "session-affinity-loss", "agent-x86-07",
        "a flapping health check on a neighbouring node makes the gateway re-route that "
        "node's sessions here half-way through; each arrives without its context",
        "agent_session_migrations_total +0.42/s, state_io (context re-sync from Redis) 8x "
        "slower, a tail of slow sessions",
        uptime_days=10.4, procs=k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, 1.6)
        + [k.etl(k.X86, range(16), 3.5)],
        background=k.background(k.X86, 0.45, 0.02),
        agent=k.AgentPlan(sessions=24.0, session_median=0.3, state_io_median=0.032,
                        migrations=[0.004, 0.4, 0.5, 0.4, 0.4, 0.5, 0.4, 0.4],
                        queue=[4, 3, 5, 4, 4, 5, 3, 4],
                        slow_sessions={k: [2.7, 3.4, 4.1] for k in k.INTERVALS}))


RULE = Rule(
    id="session-affinity-loss",
    severity="warning",
    explains=EXPLAINS_POOL,  # its sessions, arriving from elsewhere
    symptom="a session gets slow half-way",
    cause="the scheduler moves sessions to other nodes, which then re-sync their context",
    action="route by session id (consistent hashing), stick-and-redirect failover, longer "
           "stickiness; check health-check flapping",
    summary="pool {pool}: {value:.2f} session migrations per second",
    condition=_MIGRATIONS > MIGRATIONS,
    evidence=(Evidence("session migrations", _MIGRATIONS, MIGRATIONS, "1/s"),),
    confidence=0.65,
    views=(Panel("Session migrations per pool", _MIGRATIONS, "1/s", MIGRATIONS),),
    fleet=FleetFault(("chat",), 12, 45, effects=(
        Set("session_migration_rate", 0.22),
        Add("state_io_stretch", 0.4),
        Add("session_tail", 0.2),
    )),
    proof=Proof(scenario, summary=r"pool chat-online: 0\.4\d session migrations per second"),
)
