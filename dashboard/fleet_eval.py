"""The simulated fleet evaluated as a query engine would: where the data is, a rack at a time.

    answer = evaluate_fleet(Fleet(nodes=4096, cores=128, end_s=demo_end()))
    answer.findings        # docs/diagnosis-json.md findings (+ labels), ranked as the engine ranks
    answer.aggregates      # recording name -> vector: the per-node numbers the pages draw
    answer.tables          # fleetscope_cpu_info and node_uname_info: the node table

The console's demo source is built here. Every rule and every recording rule
(rules/recording.py) aggregates `by (instance)`, so a rack's series evaluated alone give
exactly what the whole fleet evaluated at once gives; what comes back is what a Prometheus
source answers (the findings, the node table, the recorded series), never the 380k raw
series of a 4,096-node fleet.

The racks are split between this process and worker processes on the other CPUs
(`python -m fleetscope.dashboard.fleet_eval`, JSON on stdout: no pickle). A worker that
fails, times out or runs another rule catalog costs time, never racks: its part is then
evaluated here. No pandas or streamlit here, so a worker starts light.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from fleetscope.diagnose import engine
from fleetscope.rules.catalog import CATALOG
from fleetscope.rules.promql import Labels, Series
from fleetscope.rules.recording import RECORDINGS

from .fleet_sim import Fleet

TABLE_METRICS = ("fleetscope_cpu_info", "node_uname_info")  # the node table's series
PARALLEL_FROM_NODES = 1024  # smaller fleets evaluate in well under a second in one process
MAX_WORKERS = 4
# The part this process evaluates, relative to a worker's: a worker first pays an interpreter
# start and its imports (about 0.4 s here), so this process takes a larger share.
OWN_PART_WEIGHT = 1.25
WORKER_TIMEOUT_S = 300.0


def metrics() -> set[str]:
    """Every metric the rules, the recordings and the node table read."""
    names = set(TABLE_METRICS)
    for rule in CATALOG:
        names |= rule.requires()
    for recording in RECORDINGS:
        names |= recording.expr.metrics()
    return names


def evaluate_sharded(shards: list[Series], hostname: str = "?") -> tuple[list, list[dict]]:
    """The rule engine over a fleet, a shard of nodes at a time.

    Every rule condition aggregates `by (instance)`, so evaluating shards of whole nodes finds
    exactly what one evaluation of the whole fleet finds; the evidence of each finding is then
    looked up among 32 nodes instead of 4,096. A rule is not evaluated only where no shard
    had its signals."""
    found, missing, _harm = _evaluate_shards(shards, hostname)
    # the engine's own ranking (tier severity, causes before symptoms), so a sharded fleet
    # lists its findings exactly as one evaluation of the whole fleet would
    found.sort(key=engine.rank_key())
    return found, _not_evaluated(missing)


def _still_missing(missing: dict[str, dict] | None, here: dict[str, dict] | None
                   ) -> dict[str, dict] | None:
    """Rules not evaluated anywhere so far: a rule one part evaluated is evaluated."""
    if here is None:
        return missing
    return here if missing is None else {k: v for k, v in missing.items() if k in here}


def _not_evaluated(missing: dict[str, dict] | None) -> list[dict]:
    if missing is None:  # no part had a sample
        return [{"rule": r.id, "reason": "no samples"} for r in CATALOG]
    return [missing[r.id] for r in CATALOG if r.id in missing]


def _evaluate_shards(shards: list[Series], hostname: str = "?",
                     then: Callable[[Series], None] | None = None
                     ) -> tuple[list, dict[str, dict] | None, list]:
    """(findings unranked, the rules no shard could evaluate by id (None: no shard had
    data), the pools that hurt with the findings explaining them). `then(shard)` runs after
    the rules in the same pass (recordings share their signals). Harm and what explains it
    are a node's own, so a shard of whole nodes judges them as the whole fleet would."""
    findings: list = []
    harm: list = []
    missing: dict[str, dict] | None = None
    for shard in shards:
        with shard.memoized():
            if shard.by_name:
                verdict = engine.assess(shard, hostname)
                findings += verdict.findings
                harm += verdict.harm
                missing = _still_missing(missing, {item["rule"]: item
                                                   for item in verdict.not_evaluated})
            if then is not None:
                then(shard)
    return findings, missing, harm


@contextmanager
def _without_cycle_collection():
    """The evaluation makes about a million small acyclic objects (label tuples, sample
    lists); the cyclic collector would rescan the growing heap dozens of times (15-25 % of
    the evaluation here). Paused while it runs, back on after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def evaluate_part(fleet: Fleet, racks: range) -> dict:
    """One part of the fleet (whole racks): its findings with their rank keys, the rules it
    could not evaluate, its node-table series and recorded vectors, all JSON-able."""
    with _without_cycle_collection():
        return _evaluate_part(fleet, racks)


def _evaluate_part(fleet: Fleet, racks: range) -> dict:
    aggregates: dict[str, list] = {r.record: [] for r in RECORDINGS}
    tables: dict[str, list] = {name: [] for name in TABLE_METRICS}

    def record(shard: Series) -> None:
        """The recordings at the shard's last sample, as the pages would, and its table."""
        for recording in RECORDINGS:
            at_ms = shard.last_sample_ms(recording.expr.metrics())
            if at_ms is not None:
                aggregates[recording.record] += [
                    [list(labels), value]
                    for labels, value in recording.expr.evaluate(shard, at_ms).items()]
        for name in TABLE_METRICS:
            tables[name] += [[list(labels), points]
                             for labels, points in shard.by_name.get(name, {}).items()]

    shards = fleet.shards(metrics(), racks=racks)
    found, missing, harm = _evaluate_shards(shards, then=record)
    rank = engine.rank_key()
    return {
        "rules": [rule.id for rule in CATALOG],
        "series": sum(len(family) for shard in shards for family in shard.by_name.values()),
        "findings": [[list(rank(f)), {**f.to_json(), "labels": dict(f.labels)}]
                     for f in found],
        "harm": [item.to_json() for item in harm],
        "missing": missing,
        "aggregates": aggregates,
        "tables": tables,
    }


@dataclass
class FleetAnswer:
    """The simulated fleet as the console's pages read a query engine's answers."""

    findings: list[dict]  # ranked, docs/diagnosis-json.md plus `labels`
    not_evaluated: list[dict]
    tables: Series  # the node table's series
    aggregates: dict[str, dict[Labels, float]]
    series_evaluated: int = 0
    processes: int = 1
    notes: list[str] = field(default_factory=list)
    harm: list[dict] = field(default_factory=list)  # docs/diagnosis-json.md harm items


def _parts(racks: int, processes: int) -> list[range]:
    """Whole racks per process, this process's part (the first) weighted OWN_PART_WEIGHT."""
    weights = [OWN_PART_WEIGHT] + [1.0] * (processes - 1)
    bounds, done = [0], 0.0
    for weight in weights:
        done += weight
        bounds.append(round(racks * done / sum(weights)))
    return [range(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def default_processes(nodes: int) -> int:
    """This process plus a worker per other CPU it may run on, for a large fleet."""
    if nodes < PARALLEL_FROM_NODES:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    return max(1, min(MAX_WORKERS, cpus))


def _worker(fleet: Fleet, racks: range) -> subprocess.Popen:
    command = [sys.executable, "-m", "fleetscope.dashboard.fleet_eval", "--nodes",
               str(fleet.size), "--cores", str(fleet.cores), "--seed", str(fleet.seed),
               "--end", str(fleet.end_s), "--racks", f"{racks.start}:{racks.stop}"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)


def _collect(worker: subprocess.Popen) -> tuple[dict | None, str]:
    """The worker's answer, or None and why not (the worker is ended if it overstays)."""
    try:
        out, err = worker.communicate(timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.communicate()
        return None, f"timed out after {WORKER_TIMEOUT_S:g} s"
    if worker.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        return None, f"exit {worker.returncode}: {lines[-1] if lines else 'no message'}"
    try:
        answer = json.loads(out)
    except ValueError as error:
        return None, f"unreadable answer ({error})"
    if answer.get("rules") != [rule.id for rule in CATALOG]:
        return None, "it runs another rule catalog"
    return answer, ""


def evaluate_fleet(fleet: Fleet, processes: int | None = None) -> FleetAnswer:
    """Every rule and recording over the simulated fleet, rack by rack, on `processes`
    processes (default: one per CPU for a large fleet); a worker rebuilds the same fleet
    from its size, seed and clock."""
    racks = int(fleet.rack[-1]) + 1
    processes = default_processes(fleet.size) if processes is None else max(1, processes)
    parts = _parts(racks, min(processes, racks))
    workers = [(part, _worker(fleet, part)) for part in parts[1:]]
    try:
        with _without_cycle_collection():  # the workers' answers are as many small objects
            answers = [evaluate_part(fleet, parts[0])]
            notes = []
            for part, worker in workers:
                answer, why = _collect(worker)
                if answer is None:  # its racks are evaluated here: slower, never incomplete
                    notes.append(f"a worker for racks {part.start}-{part.stop - 1} failed "
                                 f"({why}); evaluated in the console's process")
                    answer = evaluate_part(fleet, part)
                answers.append(answer)
            return _merge(answers, len(parts), notes)
    finally:
        for _, worker in workers:  # an error (or Ctrl-C) here leaves no worker behind
            if worker.poll() is None:
                worker.kill()
                worker.communicate()


def _merge(answers: list[dict], processes: int, notes: list[str]) -> FleetAnswer:
    ranked = sorted((item for answer in answers for item in answer["findings"]),
                    key=lambda item: tuple(item[0]))
    missing: dict[str, dict] | None = None
    for answer in answers:
        missing = _still_missing(missing, answer["missing"])
    tables = Series()
    aggregates: dict[str, dict[Labels, float]] = {r.record: {} for r in RECORDINGS}
    for answer in answers:
        for name, rows in answer["tables"].items():
            family = tables.by_name.setdefault(name, {})
            for labels, points in rows:
                family[tuple(map(tuple, labels))] = [tuple(p) for p in points]
        for record, rows in answer["aggregates"].items():
            aggregates[record].update((tuple(map(tuple, labels)), value)
                                      for labels, value in rows)
    return FleetAnswer([finding for _, finding in ranked], _not_evaluated(missing), tables,
                       aggregates,
                       sum(answer["series"] for answer in answers), processes, notes,
                       [item for answer in answers for item in answer["harm"]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Evaluate racks of the simulated fleet "
                                     "(a worker of the console's demo source): JSON on stdout")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--cores", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--end", type=int, required=True)
    parser.add_argument("--racks", required=True, help="FIRST:STOP, as a Python range")
    args = parser.parse_args(argv)
    first, stop = (int(x) for x in args.racks.split(":"))
    fleet = Fleet(nodes=args.nodes, cores=args.cores, seed=args.seed, end_s=args.end)
    answer = evaluate_part(fleet, range(first, stop))
    # NaN stays NaN (a ratio with nothing under it): Python's json reads what it writes
    sys.stdout.write(json.dumps(answer, allow_nan=True, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
