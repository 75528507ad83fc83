#!/usr/bin/env python3
"""Live diagnosis accuracy, repeated: runs the live scenario modules (tests/test_live_accuracy.py
and every tests/test_live_fault_*.py and tests/test_live_harm_*.py beside it) N times (default 5)
and prints, per scenario, how often the primary finding was right, how many false alarms
(warning-or-worse findings the scenario does not explain) were raised, and the diagnosis
wall time (median and max).

    python bench/live_accuracy.py            # 5 repetitions, about 6 minutes each
    python bench/live_accuracy.py -n 2 -k "healthy or preemption"

Each repetition produces every fault for real on this machine (CPU hogs, hundreds of
threads, a silent socket, a real Redis backlog, real SIGILLs), with background noise beside
it; see the test module's docstring. The target: every primary correct and zero false
alarms in every repetition. "slipped" counts runs whose samples fell off the clock; "start
delay" is how long after the command started its window began (the node starving the
interpreter before the tool could raise its priority).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def live_modules() -> list[str]:
    """The scenario modules: the catalog's faults and each later family of faults, one module
    each, all logging through FLEETSCOPE_ACCURACY_LOG."""
    extra = sorted(str(path.relative_to(ROOT)) for pattern in ("test_live_fault_*.py",
                                                                "test_live_harm_*.py")
                   for path in (ROOT / "tests").glob(pattern))
    return ["tests/test_live_accuracy.py", *extra]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--repetitions", type=int, default=5)
    parser.add_argument("-k", metavar="EXPR", help="pytest -k: a subset of the scenarios")
    args = parser.parse_args()
    errored: dict[str, list[str]] = {}  # scenario tests that ended in an error
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "accuracy.jsonl"
        for repetition in range(1, args.repetitions + 1):
            junit = Path(scratch) / f"junit-{repetition}.xml"
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                       f"--junitxml={junit}", *live_modules()] + (
                           ["-k", args.k] if args.k else [])
            result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                    env={**__import__("os").environ,
                                         "FLEETSCOPE_ACCURACY_LOG": str(log)})
            last = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
            print(f"repetition {repetition}/{args.repetitions}: {last}", flush=True)
            for name, message in errored_tests(junit):
                errored.setdefault(name, []).append(message)
        entries = [json.loads(line) for line in log.read_text().splitlines()] \
            if log.exists() else []
    if not entries and not errored:
        print("no scenario ran", file=sys.stderr)
        return 1
    return 0 if print_table(entries, errored) else 1


def print_table(entries: list[dict], errored: dict[str, list[str]]) -> bool:
    """The per-scenario table of the logged runs; whether every run was right. A record
    without `false_alarms` (a scenario that judges only its own rule) counts none."""
    by_scenario: dict[str, list[dict]] = {}
    skipped: dict[str, list[str]] = {}
    for entry in entries:
        if "skipped" in entry:
            skipped.setdefault(entry["scenario"], []).append(entry["skipped"])
            continue
        by_scenario.setdefault(entry["scenario"], []).append(entry)
    print()
    print(f"{'scenario':<26} {'expected primary':<30} {'correct':>8} {'false alarms':>13} "
          f"{'wall median':>12} {'wall max':>9}  slipped  {'start delay max':>15}")
    all_right = True
    for name, runs in by_scenario.items():
        correct = sum(1 for r in runs if r["correct"])
        alarms = sum(len(r.get("false_alarms", ())) for r in runs)
        walls = [r["wall_seconds"] for r in runs]
        slipped = sum(1 for r in runs if r.get("slipped"))
        delays = [r.get("delayed_seconds") or 0.0 for r in runs]
        all_right &= correct == len(runs) and alarms == 0
        print(f"{name:<26} {runs[0]['expected'] or '(none: healthy)':<30} "
              f"{correct:>4}/{len(runs):<3} {alarms:>13} {statistics.median(walls):>11.1f}s "
              f"{max(walls):>8.1f}s  {slipped:>7}  {max(delays):>14.1f}s")
        for run in runs:
            if not run["correct"] or run.get("false_alarms"):
                print(f"    wrong: primary {run.get('primary')}, false alarms "
                      f"{run.get('false_alarms', [])}, findings {run.get('findings')}")
    for name, reasons in skipped.items():
        print(f"{name:<26} skipped {len(reasons)}x: {reasons[0]} (needs the CPUs free)")
        all_right = False
    # A scenario that errors counts as a wrong run: it never reaches the log, and leaving it
    # out of the table would make the ratio look better than the runs were.
    for name, messages in errored.items():
        print(f"{name:<26} ERRORED {len(messages)}x: {messages[0]}")
        all_right = False
    counted = sum(len(runs) for runs in by_scenario.values()) + sum(
        len(m) for m in errored.values())
    correct_runs = sum(1 for runs in by_scenario.values() for r in runs
                       if r["correct"] and not r.get("false_alarms"))
    print(f"\nruns right: {correct_runs}/{counted} (errored runs counted as wrong, "
          f"skips not counted: {sum(len(r) for r in skipped.values())})")
    print()
    print("every primary correct, no false alarm" if all_right
          else "NOT all correct: see the rows marked wrong")
    return all_right


def errored_tests(junit: Path) -> list[tuple[str, str]]:
    """(test name, first line of the error) of each test in a pytest JUnit XML report that
    ended in an error: a fixture error, or an exception other than a failed assertion."""
    import xml.etree.ElementTree as ElementTree  # a local pytest report, not input

    try:
        tree = ElementTree.parse(junit)
    except (OSError, ElementTree.ParseError):
        return [("(pytest run)", "no report: the run itself failed")]
    out = []
    for case in tree.iter("testcase"):
        for kind in ("error", "failure"):
            problem = case.find(kind)
            if problem is None:
                continue
            where = ((problem.text or "").strip().splitlines() or [""])[-1]
            if kind == "failure" and where.endswith(": AssertionError"):
                continue  # a wrong answer: logged by the scenario itself
            message = (problem.get("message") or kind).splitlines() or [kind]
            out.append((case.get("name", "?"), message[0][:120]))
    return out


if __name__ == "__main__":
    sys.exit(main())
