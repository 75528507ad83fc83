"""What a rule is, as data: the types every module of rules/builtin/ fills in.

    RULE = Rule(id="fd-exhaustion", severity="critical", symptom=..., cause=..., action=...,
                summary="pool {pool}: a process uses {value:.0%} of its open-file limit",
                condition=_FD_RATIO > FD_RATIO,
                evidence=(Evidence("open fds over RLIMIT_NOFILE", _FD_RATIO, 0.9, "ratio"),),
                enrich=enrich, views=(Panel(...),), fleet=FleetFault(("codegen",), 6, 35),
                proof=Proof(scenario, summary=r"pool chat-online: a process uses 99%"))

A rule holds the symptom, cause and action its runbook gives (runbooks/README.md tables them); a
condition that is at once its Prometheus alert expression and what the Python engine
evaluates (rules/promql.py); the evidence shown with a finding; how a finding names its
subjects (enrich); the console's charts (views); where the simulated fleet injects it and
how it moves the fleet's metrics (fleet, rules/fleet.py); and the scenario bundle that
proves it (proof). Nothing here does I/O.

Conditions aggregate `by (instance)` so an exported alert fires per node; replayed bundles
have no `instance` label and fall into one group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from fleetscope.core import units

from .fleet import FleetFault
from .promql import Delta, Expr, Rate, SetOp

NODE_LABELS = ("instance",)  # which label names the node in a fleet Prometheus
NODE = NODE_LABELS
WINDOW = 60  # seconds: rate windows (short bundles are rated over their own span)

# What a finding is about, and so whose harm it can explain (rules/harm.py; docs/
# how-verdicts-are-reached.md, Harm first). Each rule module says which.
EXPLAINS_POOL = "pool"  # the pool its labels name: its processes, cgroups, queues, limits
EXPLAINS_NODE = "node"  # every pool of the node: its CPUs, memory, bandwidth, NICs, modules
EXPLAINS_NOTHING = "nothing"  # harm itself, not a cause of it
EXPLAINS = (EXPLAINS_POOL, EXPLAINS_NODE, EXPLAINS_NOTHING)
# Whether a finding still acts: an event that ended (a kill whose cgroup is gone, a crash
# loop that stopped) is said as such and explains no harm of now.
ONGOING, ENDED = "ongoing", "ended"


@dataclass(frozen=True)
class Evidence:
    signal: str  # what the value is, for a person
    expr: Expr
    threshold: float
    unit: str
    pick: str = "max"  # several samples match a finding: report the max (or min)
    # (subject kind, label): the finding's subjects are this label's values in the samples
    # that match it, e.g. ("binaries", "binary"), in every mode (in-process or from an engine).
    names: tuple[str, str] | None = None


def required_metrics(expr: Expr) -> set[str]:
    """Metrics an expression cannot be judged without: what `unless` excludes may be absent
    (`a unless b` is `a` where no b exists)."""
    if isinstance(expr, SetOp) and expr.op == "unless":
        return required_metrics(expr.left)
    if isinstance(expr, SetOp):
        return required_metrics(expr.left) | required_metrics(expr.right)
    return expr.metrics()


def _or_sides(expr: Expr) -> list[Expr]:
    """The sides of `a or b or c` (of `(a or b) unless x` too: what `unless` excludes may be
    absent); any one side with its signals makes the condition evaluable."""
    if isinstance(expr, SetOp) and expr.op == "unless":
        return _or_sides(expr.left)
    if isinstance(expr, SetOp) and expr.op == "or":
        return _or_sides(expr.left) + _or_sides(expr.right)
    return [expr]


@dataclass(frozen=True)
class Tier:
    """A lesser severity of a rule, for nodes where the rule's own condition does not hold:
    e.g. a worker parked in a network call (warning) before its heartbeat goes stale
    (critical), or SIGILL crashes older than the look-back (info)."""

    severity: str
    condition: Expr
    summary: str
    phase: str = ONGOING


class Level(NamedTuple):
    """One severity level of a rule: its own condition or a tier's, as evaluated and
    exported (one alert each)."""

    severity: str
    condition: Expr
    summary: str
    phase: str


@dataclass(frozen=True)
class Panel:
    """One chart of the console's evidence view of a rule: an expression evaluated over the
    finding's node history at every sample, with the threshold the rule fires on."""

    title: str  # words, no unit (the chart adds it)
    expr: Expr
    unit: str
    threshold: float | None = None
    pick: str = "max"  # "min": the rule fires below the threshold
    narrow: bool = True  # keep only the finding's own pool / binary / device ...
    role: str = ""  # victim | antagonist | ... : said in the title


@dataclass(frozen=True)
class Proof:
    """The scenario bundle that proves the rule (tests/test_scenarios.py): `scenario(kit)`
    builds it with the scenario kit (tests/fixtures/make_scenarios.py), and its diagnosis
    must lead with this rule, with a summary matching `summary` and, where given, the
    subjects `subjects` = (kind, expected list or None for "not empty"). `also_shown`: the
    rules the fault's symptoms raise besides this one (never a second fault), which a fleet
    of such nodes may also show. `lookalikes`: scenarios of healthy nodes that show part of
    the picture (the harm without the cause, or the cause's signal at a normal level), named
    `healthy-*`, built the same way: the rule, and every other, stays silent on them.
    `cases`: further scenarios with the exact verdict each must give (Case)."""

    scenario: Callable
    summary: str
    subjects: tuple[str, list | None] | None = None
    also_shown: tuple[str, ...] = ()
    lookalikes: tuple[Callable, ...] = ()
    cases: tuple[Case, ...] = ()


@dataclass(frozen=True)
class Case:
    """A further scenario bundle of a rule (Proof.cases), for what its own scenario cannot
    show: the rule in company (a pool's harm beside a cause about another pool), in another
    phase (an event that ended beside a live cause), or a healthy node on which it says only
    information (named `healthy-*`: status ok). Built like the rule's scenario, named
    `name`; its diagnosis holds exactly `findings`, most important first, each (rule id,
    severity, phase, pool: "" for a finding about the whole node), and `harm`: each hurting
    pool with the rules that explain it."""

    name: str
    scenario: Callable
    findings: tuple[tuple[str, str, str, str], ...]
    harm: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def rules(self) -> set[str]:
        """The rules its diagnosis shows."""
        return {rule for rule, *_ in self.findings}


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
    # Metrics whose presence alone shows the source was read (a counter family with no
    # series yet, e.g. no SIGILL ever): the rule is then evaluated, and found nothing.
    present_if: tuple[str, ...] = ()
    tiers: tuple[Tier, ...] = ()  # lesser severities, most severe first
    # "cause" rules name why; "symptom" rules (a saturated node, uneven cores) say what, and
    # rank after any cause of the same severity, which usually explains them.
    kind: str = "cause"
    # Whose harm a finding of this rule explains: EXPLAINS_POOL (its `pool` label),
    # EXPLAINS_NODE (every pool of the node) or EXPLAINS_NOTHING. Every built-in rule says.
    explains: str = ""
    # enrich(context, finding): names the finding's subjects from the raw evidence (the
    # context is diagnose/enrich.py's Enricher: reads go through it, never to the host).
    enrich: Callable | None = field(default=None, compare=False)
    views: tuple[Panel, ...] = ()  # the console's evidence charts (else one per evidence)
    fleet: FleetFault | None = None  # where the simulated fleet injects it
    proof: Proof | None = field(default=None, compare=False)

    def levels(self) -> list[Level]:
        """Its own condition, then each tier, most severe first. A lesser tier's condition
        excludes the nodes where a more severe one holds, so a node gets one finding (and
        one alert) per rule."""
        out = [Level(self.severity, self.condition, self.summary, ONGOING)]
        higher = self.condition
        for tier in self.tiers:
            out.append(Level(tier.severity, tier.condition.unless(higher, NODE), tier.summary,
                             tier.phase))
            higher = higher | tier.condition
        return out

    def severities(self) -> list[tuple[str, Expr, str]]:
        """(severity, condition, summary) per level (levels(), without the phase)."""
        return [level[:3] for level in self.levels()]

    def alert_labels(self, level: Level) -> dict[str, str]:
        """The labels an alert of this level carries beside its condition's own: what
        Alertmanager routes and inhibits on, and what rules reading ALERTS match."""
        return {"severity": level.severity, "fleetscope_rule": self.id,
                "fleetscope_phase": level.phase}

    def requires(self) -> set[str]:
        metrics = self.condition.metrics()
        for tier in self.tiers:
            metrics |= tier.condition.metrics()
        return metrics | set(self.extra_requires)

    def alternatives(self) -> list[set[str]]:
        """Metric sets any one of which lets the rule be evaluated: a condition of the form
        `a or b` is evaluable when either side's signals exist."""
        sides = []
        for condition in (self.condition, *(tier.condition for tier in self.tiers)):
            sides += [required_metrics(side) for side in _or_sides(condition)]
        return [side | set(self.extra_requires) for side in sides]

    @property
    def needs_rates(self) -> bool:
        """Whether a condition takes a rate, an increase or a delta (no answer from one
        sample)."""
        return any(isinstance(node, (Rate, Delta)) for _, condition, _ in self.severities()
                   for node in condition.walk())

    @property
    def alert_name(self) -> str:
        return "Fleetscope" + "".join(part.capitalize() for part in self.id.split("-"))

    def render_summary(self, labels: dict[str, str], value: float,
                       template: str | None = None) -> str:
        """The summary template filled in: label names and `value`, which takes Python's
        format specs and `{value:duration}` (seconds as a person reads them: 400 ms, 42 s,
        22.5 min), as the evidence tables show the same number."""
        class _Default(dict):
            def __missing__(self, key):
                return "?"

        template = self.summary if template is None else template
        try:
            return template.format_map(_Default(labels, value=_SummaryValue(value)))
        except (ValueError, TypeError):
            return template


class _SummaryValue(float):
    def __format__(self, spec: str) -> str:
        if spec == "duration":
            return units.duration(float(self))
        return float(self).__format__(spec)
