"""The rule catalog: one entry per rule id of CONTRACT section 7, as data.

Each rule holds the symptom, cause and action of shared/reference/troubleshooting.md, a
condition that is at once its Prometheus alert expression and what the Python engine
evaluates (rules/promql.py), the evidence shown with a finding (signal, threshold, unit),
a severity and a base confidence. Thresholds are gathered at the top, commented, so they
can be tuned in one place. `runbooks/<id>.md` explains each rule.

Conditions aggregate `by (instance)` so an exported alert fires per node; replayed bundles
have no `instance` label and fall into one group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .promql import Expr, Max, Rate, Selector, Sum

NODE_LABELS = ("instance",)  # which label names the node in a fleet Prometheus
NODE = NODE_LABELS
WINDOW = 60  # seconds: rate windows (short bundles are rated over their own span)

# Thresholds (fraction 0-1 unless a unit says otherwise).
CORE_IMBALANCE_SPREAD = 0.5  # busiest core minus the median core
NUMA_REMOTE_RATIO = 0.3  # share of a pool's resident memory on nodes its CPUs are not on


@dataclass(frozen=True)
class Evidence:
    signal: str  # what the value is, for a person
    expr: Expr
    threshold: float
    unit: str
    pick: str = "max"  # several samples match a finding: report the max (or min)


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str  # critical | warning | info
    symptom: str
    cause: str
    action: str
    summary: str  # str.format template over the finding's labels and {value}
    condition: Expr
    evidence: tuple[Evidence, ...]
    confidence: float = 0.7
    for_seconds: int = 120  # Prometheus `for:`; the engine reports on the evidence it has
    subject_labels: dict[str, str] = field(default_factory=dict)  # subject kind -> label
    extra_requires: tuple[str, ...] = ()

    def requires(self) -> set[str]:
        return self.condition.metrics() | set(self.extra_requires)

    @property
    def needs_rates(self) -> bool:
        text = self.condition.promql()
        return any(f"{fn}(" in text for fn in ("rate", "increase", "delta"))

    @property
    def alert_name(self) -> str:
        return "Fleetscope" + "".join(part.capitalize() for part in self.id.split("-"))

    def render_summary(self, labels: dict[str, str], value: float) -> str:
        class _Default(dict):
            def __missing__(self, key):
                return "?"

        try:
            return self.summary.format_map(_Default(labels, value=value))
        except (ValueError, TypeError):
            return self.summary


def busy_ratio(stat: str) -> Expr:
    return Max(Selector("fleetscope_cpu_core_busy_ratio", {"stat": stat}), by=NODE)


CORE_IMBALANCE = Rule(
    id="core-imbalance",
    severity="warning",
    symptom="some cores saturated while others idle",
    cause="CPU affinity or NUMA binding wrong, or scheduling uneven: work piles onto a few "
          "cores",
    action="check binding and CPU affinity (mpstat -P ALL 1; taskset -cp PID); spread "
           "workers or fix the cpuset",
    summary="busiest core {value:.0%} busier than the median core",
    condition=((busy_ratio("max") - busy_ratio("p50") > CORE_IMBALANCE_SPREAD)
               .and_on(Max(Selector("fleetscope_cpu_saturated_cores"), by=NODE) >= 1, NODE)),
    evidence=(
        Evidence("busiest core minus median core busy", busy_ratio("max") - busy_ratio("p50"),
                 CORE_IMBALANCE_SPREAD, "ratio"),
        Evidence("busiest core busy", busy_ratio("max"), 0.9, "ratio"),
        Evidence("median core busy", busy_ratio("p50"), 0.5, "ratio"),
        Evidence("saturated cores", Max(Selector("fleetscope_cpu_saturated_cores"), by=NODE),
                 1, "cores"),
    ),
    # A symptom more often than a cause: preemption, IRQ overlap and the like rank first.
    confidence=0.5,
)

_REMOTE_RATIO = Max(Selector("fleetscope_pool_numa_remote_memory_ratio"),
                    by=(*NODE, "pool", "class"))
_OTHER_NODE_PAGES = Sum(Rate(Selector("fleetscope_numastat_pages_total",
                                      {"field": "other_node"}), WINDOW), by=NODE)

NUMA_REMOTE_ACCESS = Rule(
    id="numa-remote-access",
    severity="warning",
    symptom="node CPU not high but throughput will not rise",
    cause="cross-NUMA memory access: a pool's processes run on one NUMA node while their "
          "memory sits on another",
    action="bind CPU and memory together (numactl --cpunodebind=N --membind=N, or the "
           "cpuset/topology manager); split model and state per NUMA domain",
    summary="pool {pool}: {value:.0%} of resident memory on remote NUMA nodes",
    condition=_REMOTE_RATIO > NUMA_REMOTE_RATIO,
    evidence=(
        Evidence("share of the pool's memory on remote nodes", _REMOTE_RATIO,
                 NUMA_REMOTE_RATIO, "ratio"),
        Evidence("pages allocated off-node per second (numastat other_node)",
                 _OTHER_NODE_PAGES, 0, "pages/s"),
    ),
    confidence=0.75,
)

CATALOG: tuple[Rule, ...] = (
    NUMA_REMOTE_ACCESS,
    CORE_IMBALANCE,
)

RULE_IDS = (
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
