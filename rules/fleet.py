"""Where the console's simulated fleet injects a rule's fault, and how the fault moves the
fleet's metrics, as data in the rule's own module:

    fleet=FleetFault(("chat",), "rack", 40, effects=(
        Set("roce_ecn_rate", Noisy(1500, 800, stream=24)),  # a gauge or rate takes a value
        Add("state_io_stretch", 7),                          # a share or stretch grows
    ))

The simulator (dashboard/fleet_sim.py) computes every node's healthy signals, then, on the
nodes and minutes where a fault is active, applies the fault's effects: `Set` replaces a
signal's value, `Add` adds to it, `Events` adds series of events that began at the fault's
onset (crashes, kills). The signal names are the simulator's vocabulary (fleet_sim.SIGNALS
says what each one is); it holds no rule id. Nothing here imports numpy: a value is a number,
`Noisy`, or a function of the simulator's `Site` (the active rows: `since`, `processes`,
`cores`, `noise(stream)`), evaluated only by the simulator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Noisy:
    """`base + spread * u`, u uniform in [0, 1) from the simulator's noise stream `stream`,
    drawn per node and minute (or once per node: `per_minute=False`). A stream number names
    the noise, so the same fleet draws the same values on every run."""

    base: float
    spread: float
    stream: int
    per_minute: bool = True

    def __call__(self, site):
        return self.base + self.spread * site.noise(self.stream, self.per_minute)


Value = float | str | Noisy | Callable


@dataclass(frozen=True)
class Set:
    """Where and while the fault is active, `signal` takes `value`. For a workload pool's
    signal, `pools` says which pools of the node it hits: "first" (the node's main pool),
    "online" or "offline" (every pool of that class on the node)."""

    signal: str
    value: Value
    pools: str = "first"
    add = False


@dataclass(frozen=True)
class Add(Set):
    """Where and while the fault is active, `value` is added to `signal` (a load, a stretch
    of a stage's time, a tail's width)."""

    add = True


@dataclass(frozen=True)
class Events:
    """Events that began at the fault's onset and recur every `every_s` seconds, on the nodes
    where the fault is active at the last scrape, as series with `labels`: `counter` counts
    them (one at the onset), `last_seen` is the time of the latest, `ago` seconds before the
    scrape (never before the onset). Either metric may be None.

    `pools`: the events are a workload pool's (its processes run the crashing binary, its
    cgroup counted the kill), so the series are the node's pools' as the exporter writes
    them, labelled `pool` and `class`: "first", "online" or "offline" as in `Set.pools`;
    None, the node's."""

    counter: str | None
    last_seen: str | None
    labels: dict[str, str] = field(default_factory=dict)
    every_s: float = 60.0
    ago: Value = 0.0
    pools: str | None = None


@dataclass(frozen=True)
class FleetFault:
    """Where the console's simulated fleet injects the rule's fault: the node pools it lands
    on, how many nodes of a 4,096-node fleet ("rack": one whole rack), how many minutes before
    the last scrape it started, and its `effects` on the simulated metrics.

    `cpu_models`: only nodes of these CPU models (the simulator's keys) can have it.
    `staggered`: each node's onset falls somewhere in the minute after the start (False: all
    at once). `also`: further placements of the same fault with their own effects, placed
    after every rule's first placement (so adding one moves no other rule's nodes)."""

    pools: tuple[str, ...]
    nodes: int | str
    minutes: int
    effects: tuple[Set | Events, ...] = ()
    cpu_models: tuple[str, ...] = ()
    staggered: bool = True
    also: tuple[FleetFault, ...] = ()
