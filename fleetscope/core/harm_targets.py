"""Harm targets: the node config's `harm_targets`, where the workloads start to hurt.

    harm_targets:
      online_session_p99_seconds: 1.0   # online sessions' P99 (normally ~200 ms), and the
                                        # longest an online session may stay in flight
      online_session_error_ratio: 0.05  # online sessions that failed or timed out
      tool_error_ratio: 0.05            # tool calls whose outcome is not ok
      online_run_delay_ratio: 0.05      # s/s an online process waits for a CPU
      pool_throttled_ratio: 0.25        # CFS periods of a pool's cgroup that were throttled
      queue_depth_tasks: 50             # tasks waiting in a queue that keeps growing
      online_process_starts_per_minute: 2   # new processes in an online pool (replaced ones)
      pool_connections_waiting: 1       # connections waiting to be accepted or read, mean
      pool_connections_retransmitting: 1    # connections whose packets go unanswered, mean

The exporter publishes them as `fleetscope_harm_target{signal="<key>"}`, a pool's own as
`fleetscope_harm_target{signal="<key>",pool="<pool>"}` (collector `harm`),
so the exported alerts, a bundle's replay and the live engine compare against the node's own
targets. Defaults: the field notes' online P99 of ~200 ms normal and 1 s bad; kube-prometheus's
CPUThrottlingHigh (25 % of periods throttled); the run delay offline-preemption judges by;
online workers replaced faster than one every 30 s (processes dying).
Standard library only: the node side reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    key: str
    default: float  # bad: harm above this
    normal: float  # what a healthy node shows, to rank how far a signal moved
    high: float  # the largest value the config accepts
    unit: str
    what: str


TARGETS = (
    Target("online_session_p99_seconds", 1.0, 0.2, 3600.0, "s", "online sessions' P99"),
    Target("online_session_error_ratio", 0.05, 0.005, 1.0, "ratio",
           "online sessions failed or timed out"),
    Target("tool_error_ratio", 0.05, 0.01, 1.0, "ratio", "tool calls not ok"),
    Target("online_run_delay_ratio", 0.05, 0.005, 64.0, "s/s",
           "online processes' wait for a CPU"),
    Target("pool_throttled_ratio", 0.25, 0.01, 1.0, "ratio", "pool CFS periods throttled"),
    Target("queue_depth_tasks", 50.0, 5.0, 1e9, "tasks", "tasks waiting in a growing queue"),
    # A pool of long-lived workers starts none once up; one every 30 s, held over the
    # window, is a supervisor replacing dying workers. A pool that runs a process per
    # request sets its own (harm_targets.pools).
    Target("online_process_starts_per_minute", 2.0, 0.2, 1e6, "1/min",
           "online pool processes started per minute"),
    # A connection waiting for a whole window on average: requests queue in front of the
    # pool (its accept queue, or bytes it does not read), not a moment's burst.
    Target("pool_connections_waiting", 1.0, 0.1, 1e6, "connections",
           "connections waiting to be accepted or read"),
    # One connection retransmitting all window long: a peer (or a SYN) going unanswered.
    Target("pool_connections_retransmitting", 1.0, 0.05, 1e6, "connections",
           "connections retransmitting"),
)
BY_KEY = {target.key: target for target in TARGETS}


class HarmTargetError(ValueError):
    """One line: which key is wrong and what it must be."""


@dataclass(frozen=True)
class HarmTargets:
    node: dict[str, float]  # every target: the config's, else the default
    pools: dict[str, dict[str, float]]  # pool -> the targets it sets for itself


def _values(raw: Any, where: str, defaults: bool) -> dict[str, float]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise HarmTargetError(f"{where} must be a mapping of target name to number "
                              f"(known: {', '.join(BY_KEY)})")
    unknown = set(raw) - set(BY_KEY)
    if unknown:
        raise HarmTargetError(f"{where} has unknown keys: "
                              f"{', '.join(sorted(map(str, unknown)))} "
                              f"(known: {', '.join(BY_KEY)})")
    out = {}
    for target in TARGETS:
        if target.key not in raw and not defaults:
            continue
        value = raw.get(target.key, target.default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 < value <= target.high:
            raise HarmTargetError(f"{where}.{target.key} must be a number above 0 and at "
                                  f"most {target.high:g} ({target.unit}), got {value!r}")
        out[target.key] = float(value)
    return out


def parse_harm_targets(raw: Any) -> HarmTargets:
    """Every node target (the defaults where the config sets none) and the pools' own,
    validated."""
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise HarmTargetError("harm_targets must be a mapping of target name to number "
                              f"(known: {', '.join(BY_KEY)}, pools)")
    pools_raw = raw.get("pools") or {}
    if not isinstance(pools_raw, dict) or not all(isinstance(k, str) and k for k in pools_raw):
        raise HarmTargetError("harm_targets.pools must map pool names to their targets")
    node = _values({k: v for k, v in raw.items() if k != "pools"}, "harm_targets", True)
    pools = {name: _values(values, f"harm_targets.pools.{name}", False)
             for name, values in pools_raw.items()}
    return HarmTargets(node, pools)
