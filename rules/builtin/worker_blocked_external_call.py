"""worker-blocked-external-call: a worker is stuck in a tool or API call with no timeout.

Condition: the oldest in-flight task's heartbeat is older than 120 s (critical: the task
is requeued then); a warning tier as soon as a worker thread is parked in a network call
longer than the config's `blocked_call_seconds` (kernel side: syscall, fd, TCP peer).
Enrichment: those threads with their peer and wait, and on a live node the py-spy frame.
"""

from __future__ import annotations

from fleetscope.core import units

from ..fleet import Add, FleetFault, Set
from ..model import EXPLAINS_POOL, NODE, WINDOW, Evidence, Panel, Proof, Rule, Tier
from ..promql import Max, Rate, Selector, Sum

RANK = 1
HEARTBEAT_AGE = 120.0  # seconds: "a task whose heartbeat is older than 120 s is requeued"
MAX_SUBJECTS = 5
# The config's blocked_call_seconds when it sets none (enrichment puts the node's own).
DEFAULT_BLOCKED_CALL_SECONDS = 30.0
LONGEST_WAIT_SIGNAL = "longest network wait of a worker thread"

_POOL = (*NODE, "pool")
_HEARTBEAT = Max(Selector("agent_task_heartbeat_age_seconds"), by=_POOL)
_TIMEOUTS = Sum(Rate(Selector("agent_tool_calls_total", {"outcome": "timeout"}), WINDOW),
                by=_POOL)
_BLOCKED = Max(Selector("fleetscope_pool_blocked_network_threads"), by=_POOL)
_LONGEST_WAIT = Max(Selector("fleetscope_pool_network_wait_longest_seconds"), by=_POOL)


def enrich(ctx, finding) -> None:
    """The threads parked in a network call (kernel side: syscall, fd, TCP peer, and for
    how long, tracked as the pools collector tracks them), with the py-spy frame each
    waits in on a live node."""
    pool = finding.labels.get("pool")
    waits = ctx.network_waits(pool)
    stacks: dict[tuple[int, int], object] = {}
    if ctx.live:
        pids = sorted({wait.pid for wait, _ in waits}) or [
            p.pid for p in ctx.pool_members(ctx.last, pool)]
        blocked = []
        for pid in pids[:MAX_SUBJECTS * 4]:  # py-spy costs a ptrace stop per process
            threads, error = ctx.stacks(pid)
            if error:
                finding.evidence.append({"signal": f"stacks of pid {pid}: {error}",
                                         "value": 0, "threshold": 0, "unit": "threads"})
                continue
            stacks.update({(pid, t.native_id): t for t in threads})
            waiting = [t for t in threads if t.state == "network"]
            if waiting:
                blocked.append(pid)
                finding.evidence.append({
                    "signal": f"pid {pid} threads waiting on the network "
                              f"(e.g. {waiting[0].blocking_call or waiting[0].frames[0]})",
                    "value": len(waiting), "threshold": 0, "unit": "threads"})
        if not waits:
            finding.subjects["pids"] = blocked[:MAX_SUBJECTS]
    threshold = ctx.config.blocked_call_seconds
    for row in finding.evidence:  # the node's own limit, not the rule's default
        if row["signal"] == LONGEST_WAIT_SIGNAL:
            row["threshold"] = threshold
    described = []
    for wait, seconds in waits[:MAX_SUBJECTS]:
        if wait.pid not in finding.subjects["pids"]:
            finding.subjects["pids"].append(wait.pid)
        stack = stacks.get((wait.pid, wait.tid))
        frame = ""
        if stack is not None:  # "s.recv(4096) in tool_call (worker.py:5)"
            parts = [stack.blocking_call.split("  [")[0]] + stack.frames[:1]
            frame = " in ".join(part for part in parts if part)
        peer = wait.peer or "an unconnected TCP socket"
        text = (f"{ctx.who(wait.pid)} thread {wait.tid} in {wait.call}() on {peer} "
                f"for {units.duration(seconds)}" + (f" at {frame}" if frame else ""))
        described.append(text)
        finding.evidence.append({
            "signal": f"{text} (fd {wait.fd}, kernel wait {wait.wchan or '?'})",
            "value": round(seconds, 1), "threshold": threshold, "unit": "seconds"})
    if described:
        more = len(waits) - 1
        finding.extra_summary = described[0] + (
            f" (+{more} more thread{'s' if more > 1 else ''})" if more > 0 else "")


def scenario(k):
    """The scenario bundle that proves the rule, built with the scenario kit `k`
    (tests/fixtures/make_scenarios.py)."""
    procs = k.daemons(k.X86) + k.workers(k.X86, k.ONLINE_X86, (1.7, 1.7, 0.01, 1.7)) \
        + [k.etl(k.X86, range(16), 3.5)]
    blocked = procs[7]  # worker2: parked in a socket read of the CRM API (no timeout)
    blocked.lead_run = k.per_interval([0.5, 0.001, 0.001, 0.001, 0.0008, 0.001, 0.0009, 0.001])
    blocked.cores = k.per_interval([1.4, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01])
    blocked.vcs = k.per_interval([600.0, 0.3, 0.2, 0.2, 0.3, 0.2, 0.2, 0.3])
    blocked.ivcs = k.per_interval([5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    blocked.state = ["S"] * k.NSAMPLES
    return k.x86_scenario(
        "worker-blocked-external-call", "agent-x86-04",
        "a worker called the CRM lookup tool without a timeout and the API stopped answering: "
        "its main thread has been parked in a socket read for two minutes",
        "agent_task_heartbeat_age_seconds 112 -> 182 s (over the 120 s requeue limit); tool "
        "calls timing out on the other workers; the stuck worker uses no CPU and does not "
        "switch context",
        uptime_days=4.8, procs=procs, background=k.background(k.X86, 0.45, 0.02),
        agent=k.AgentPlan(sessions=17.0, timeouts=0.03, tool_median=0.35,
                        queue=[7, 8, 9, 9, 10, 11, 12, 13],
                        heartbeat=[112.4, 122.4, 132.5, 142.4, 152.4, 162.5, 172.4, 182.4]))


RULE = Rule(
    id="worker-blocked-external-call",
    severity="critical",
    explains=EXPLAINS_POOL,  # its worker threads, parked in the call
    symptom="agent task times out, no log lines",
    cause="a worker is blocked in an external API or tool call (no timeout, exhausted "
          "connection pool)",
    action="give every tool call its own timeout and a circuit breaker; check the connection "
           "pool size; fleetscope stacks PID shows the blocking call",
    summary="pool {pool}: oldest in-flight task silent for {value:duration}",
    condition=_HEARTBEAT > HEARTBEAT_AGE,
    # Earlier, from the kernel: a worker thread parked in a network call longer than the
    # node config's blocked_call_seconds (default 30 s) - before the heartbeat goes stale.
    tiers=(Tier("warning", _BLOCKED > 0,
                "pool {pool}: {value:.0f} worker thread(s) parked in a network call"),),
    evidence=(
        Evidence("oldest in-flight task heartbeat age", _HEARTBEAT, HEARTBEAT_AGE, "s"),
        Evidence("worker threads parked in a network call", _BLOCKED, 0, "threads"),
        Evidence(LONGEST_WAIT_SIGNAL, _LONGEST_WAIT, DEFAULT_BLOCKED_CALL_SECONDS, "s"),
        Evidence("tool calls timing out", _TIMEOUTS, 0, "1/s"),
    ),
    confidence=0.8,
    enrich=enrich,
    views=(
        Panel("Oldest in-flight task's heartbeat age per pool", _HEARTBEAT, "s",
              HEARTBEAT_AGE),
        Panel("Tool calls timing out per pool", _TIMEOUTS, "1/s"),
    ),
    fleet=FleetFault(("chat",), 10, 20, effects=(
        # a worker parked in a call with no timeout: its heartbeat ages from 125 s on
        Set("heartbeat_age", lambda site: 125 + site.since),
        Set("tool_timeout_share", 0.25),
        Add("tool_call_stretch", 3),
    )),
    proof=Proof(scenario, summary=r"pool chat-online: .* silent for 18\d s"),
)
