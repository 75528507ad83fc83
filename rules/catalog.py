"""The rule catalog: every rule registered once, in rank order.

Each rule is one module of rules/builtin/ (its condition, evidence, enrichment, console views,
simulated fault and proving scenario; see rules/builtin/__init__.py); this module imports
them all and registers each module's RULE at its RANK. What reads the catalog (the engine,
`rules list`, `rules export`, the diagnosis schema, the console, the scenario generator, the
simulated fleet) sees every registered rule, one registered later by a test included.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from . import builtin
from .model import (  # noqa: F401  (re-exported: the catalog is where rules are looked up)
    NODE,
    NODE_LABELS,
    WINDOW,
    Case,
    Evidence,
    FleetFault,
    Panel,
    Proof,
    Rule,
    Tier,
    required_metrics,
)


class Registry(Sequence):
    """The catalog: every registered rule, in rank order (ties between equally severe, equally
    confident findings go to the rule ranked first: causes first). A live sequence: what
    imports it (the engine, `rules list`, `rules export`, the console) sees a rule registered
    later, e.g. a throwaway rule in a test."""

    def __init__(self) -> None:
        self._rules: dict[str, tuple[float, int, Rule]] = {}

    def register(self, rule: Rule, rank: float | None = None) -> Rule:
        if rule.id in self._rules:
            raise ValueError(f"rule {rule.id} is registered already")
        rank = float(len(self._rules)) if rank is None else rank
        self._rules[rule.id] = (rank, len(self._rules), rule)
        return rule

    def unregister(self, rule_id: str) -> None:
        del self._rules[rule_id]

    @contextmanager
    def registered(self, rule: Rule, rank: float | None = None) -> Iterator[Rule]:
        """Register a rule for the length of a block (tests)."""
        self.register(rule, rank)
        try:
            yield rule
        finally:
            self.unregister(rule.id)

    def _ordered(self) -> list[Rule]:
        return [rule for _, _, rule in sorted(self._rules.values(), key=lambda e: e[:2])]

    def __getitem__(self, index):
        return self._ordered()[index]

    def __len__(self) -> int:
        return len(self._rules)

    def __iter__(self) -> Iterator[Rule]:
        return iter(self._ordered())

    def ids(self) -> tuple[str, ...]:
        return tuple(rule.id for rule in self)


class _Ids(Sequence):
    """RULE_IDS: the registered rule ids, derived from the registry (never hand-listed)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def __getitem__(self, index):
        return self._registry.ids()[index]

    def __len__(self) -> int:
        return len(self._registry)

    def __repr__(self) -> str:
        return repr(self._registry.ids())


def builtin_modules() -> list:
    """Every module of rules/builtin/, imported, in name order."""
    return [importlib.import_module(f"{builtin.__name__}.{info.name}")
            for info in sorted(pkgutil.iter_modules(builtin.__path__), key=lambda i: i.name)
            if not info.name.startswith("_")]


CATALOG = Registry()
register = CATALOG.register
for _module in builtin_modules():
    register(_module.RULE, _module.RANK)

RULE_IDS = _Ids(CATALOG)
# The ids every release keeps (docs/metrics-and-rules.md, Rules): the catalog holds at least
# these (it may hold more, e.g. cpu-saturation).
KEPT_RULE_IDS = (
    "worker-blocked-external-call", "numa-remote-access", "memory-bandwidth-saturation",
    "isa-mismatch", "offline-preemption", "roce-congestion", "queue-backlog",
    "thread-oversubscription", "fd-exhaustion", "core-imbalance", "irq-core-overlap",
    "session-affinity-loss", "quantization-tool-errors", "cold-start",
)


def by_id(rule_id: str) -> Rule:
    for rule in CATALOG:
        if rule.id == rule_id:
            return rule
    raise KeyError(rule_id)


def evidence_picks(rule_id: str) -> dict[str, str]:
    """Evidence signal -> "max" or "min" (whether the value must be above or below its
    threshold) for a rule; a diagnosis document carries only the contract's four fields."""
    try:
        return {item.signal: item.pick for item in by_id(rule_id).evidence}
    except KeyError:  # a document from another version's catalog
        return {}

