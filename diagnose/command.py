"""`fleetscope diagnose`: the live node (default), a bundle, or Prometheus.

Exit codes (docs/exit-codes.md): 0 no finding of warning or worse, 1 worst is warning,
2 worst is critical, 3 could not diagnose (bad input, unreadable bundle, Prometheus
unreachable) with one clear line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time

from fleetscope.bundle.read import Bundle, BundleError, one_line, open_bundle
from fleetscope.collectors.source import LiveHost
from fleetscope.core.config import Config, ConfigError, default_config_path, load_config
from fleetscope.core.diagnose_options import (
    LIVE_SECONDS,
    MAX_ANSWERS_MIB,
    PROMETHEUS_SECONDS,
    parse_duration,
)
from fleetscope.rules.catalog import CATALOG

from . import engine
from .bundle_diagnosis import diagnose_bundle
from .enrich import Enricher
from .evidence import SamplingHealth, live_series

EXIT_UNKNOWN = 3


class _Progress:
    """A progress bar on stderr when it is a terminal; silent otherwise (and with --json)."""

    def __init__(self, enabled: bool, label: str):
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.progress import Progress

            self.bar = Progress(transient=True)
            self.task = self.bar.add_task(label, total=None)
            self.bar.start()

    def __call__(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def flight_recording(state_dir: str, since: float | None) -> Bundle:
    """The flight recorder's ring in `state_dir` as a bundle, its samples of the last
    `since` seconds only when asked; BundleError says what is missing."""
    import os

    from fleetscope.bundle.ring import RING

    ring = os.path.join(state_dir, RING)
    if not os.path.isdir(ring):
        raise BundleError(f"{state_dir} holds no flight recorder ring ({RING}/): is an "
                          "exporter running with --state-dir there?")
    bundle = open_bundle(ring)
    if since is not None:
        newest = bundle.samples[-1].time
        kept = [s for s in bundle.samples if s.time >= time.time() - since]
        if len(kept) < 2:
            bundle.close()
            raise BundleError(f"the ring in {state_dir} holds {len(kept)} sample(s) of the "
                              f"last {since:g} s (its newest is {time.time() - newest:.0f} s "
                              "old): a verdict needs two; ask for a longer --since")
        bundle.samples = kept
    return bundle


def _held_bytes(args: argparse.Namespace) -> int:
    return int(args.max_answers_mib * 2**20)


def _fail(message: str) -> int:
    print(f"fleetscope diagnose: error: {message}", file=sys.stderr)
    return EXIT_UNKNOWN


def run(args: argparse.Namespace) -> int:
    if (args.node or args.fleet) and not args.prometheus:
        print("fleetscope diagnose: error: --node and --fleet go with --prometheus",
              file=sys.stderr)
        return 2
    since = getattr(args, "since", None)
    if since is not None and not getattr(args, "state_dir", None):
        print("fleetscope diagnose: error: --since goes with --state-dir", file=sys.stderr)
        return 2
    if since is not None:
        try:
            args.since = parse_duration(since)
        except ValueError as err:
            print(f"fleetscope diagnose: error: --since: {err}", file=sys.stderr)
            return 2
    if args.seconds is None:
        args.seconds = PROMETHEUS_SECONDS if args.prometheus else LIVE_SECONDS
    if not 0 < args.seconds <= 3600 * 24:
        print(f"fleetscope diagnose: error: --seconds must be more than 0 and at most 86400 "
              f"(24 h), not {args.seconds:g}", file=sys.stderr)
        return 2
    args.timeout = getattr(args, "timeout", 30.0)
    if not 0 < args.timeout <= 3600:
        print(f"fleetscope diagnose: error: --timeout must be more than 0 and at most 3600, "
              f"not {args.timeout:g}", file=sys.stderr)
        return 2
    args.max_answers_mib = getattr(args, "max_answers_mib", MAX_ANSWERS_MIB)
    if not 1 <= args.max_answers_mib <= 1024 * 1024:
        print(f"fleetscope diagnose: error: --max-answers-mib must be in [1, 1048576], "
              f"not {args.max_answers_mib:g}", file=sys.stderr)
        return 2
    # The bundle's scratch copy is removed on every path out: errors, crashes, Ctrl-C and
    # SIGTERM (the CLI turns it into SystemExit).
    with contextlib.ExitStack() as stack:
        return _run(args, stack)


def _run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    # Sources a node lacks are reported as not_evaluated, not as log lines mid-report.
    logging.getLogger("fleetscope.exporter").setLevel(logging.ERROR)
    try:
        config: Config | None = load_config(args.config) if args.config else None
        # The live node without --config: the node's own config file, if it has one. (A
        # bundle keeps the config it was recorded with.)
        live_default = default_config_path() if not (args.config or args.bundle or
                                                       args.prometheus) else None
        if live_default:
            config = load_config(live_default)
    except ConfigError as err:
        return _fail(str(err))
    # A bundle is read, not sampled: its bar says so.
    progress = _Progress(not args.json, "reading the bundle" if args.bundle else "sampling")
    health: SamplingHealth | None = None
    answered = None  # a query engine's own evaluation (--prometheus)
    modules: list[dict] = []  # the fleet's inference modules (--fleet --evaluate local)
    warned: dict[str, list[str]] = {}  # metric -> warnings of its answers (partial data)
    try:
        enricher = None
        diagnosed = None  # a bundle's findings (diagnose/bundle_diagnosis.py)
        state_dir = getattr(args, "state_dir", None)
        if args.bundle or state_dir:
            try:
                bundle = open_bundle(args.bundle) if args.bundle else \
                    flight_recording(state_dir, getattr(args, "since", None))
            except BundleError as err:
                return _fail(str(err))
            stack.callback(bundle.close)
            try:
                bundle_config = bundle.config(config)
            except BundleError as err:
                return _fail(str(err))
            try:
                diagnosed = diagnose_bundle(bundle, bundle_config, progress)
            except BundleError as err:  # over a limit of the whole (bundle.read)
                return _fail(f"{args.bundle}: {err}")
            series = diagnosed.series
            nodes = [bundle.hostname]
            window = (bundle.samples[0].time, bundle.samples[-1].time)
            source = "bundle"  # the contract's kind: the ring is a bundle
        elif args.prometheus and args.evaluate == "local":
            # Every series the rules read fetched, the rules evaluated here.
            from .prometheus import PrometheusError, prometheus_series

            # What the conditions read, and the evidence (its values, the subjects it names).
            # and which sources the collectors could not read (the reasons of rules that
            # cannot be evaluated).
            metrics = set().union(*(rule.requires() for rule in CATALOG),
                                  *(item.expr.metrics() for rule in CATALOG
                                    for item in rule.evidence), {engine.SOURCE_AVAILABLE})
            try:
                series, nodes = prometheus_series(args.prometheus, metrics, args.seconds,
                                                  None if args.fleet else args.node,
                                                  timeout=args.timeout, warnings=warned,
                                                  max_held_bytes=_held_bytes(args))
            except PrometheusError as err:
                return _fail(str(err))
            end = time.time()
            window = (end - args.seconds, end)
            source = "prometheus"
            if args.fleet:
                from . import remote
                from .accelerator_fleet import accelerator_groups

                try:
                    modules = accelerator_groups(
                        remote.QueryClient(args.prometheus, args.timeout,
                                           max_held_bytes=_held_bytes(args)), end)
                except remote.RemoteError as err:
                    return _fail(str(err))
        elif args.prometheus:
            # The query engine evaluates the rules and returns the firing nodes alone
            # (diagnose/remote.py).
            from . import remote

            try:
                answered = remote.diagnose_remote(
                    args.prometheus, args.seconds, None if args.fleet else args.node,
                    deadline_seconds=args.timeout, max_held_bytes=_held_bytes(args))
            except remote.RemoteError as err:
                return _fail(str(err))
            series, nodes, window = None, answered.nodes, answered.window
            source = "prometheus"
        else:
            import socket

            node = LiveHost("/")
            enricher = Enricher(config or Config(), node, node)
            enricher.snapshot()
            health = SamplingHealth(0, args.seconds)
            series = live_series(config or Config(), args.seconds, 1.0, node, progress=progress,
                                 health=health)
            enricher.series = series
            nodes = [socket.gethostname()]
            stamps = series.timestamps()
            window = (stamps[0] / 1000, stamps[-1] / 1000)
            source = "live"
    finally:
        progress.close()
    partial: list[str] = []
    harm: list[engine.PoolHarm] = []
    if answered is not None:
        findings, not_evaluated = answered.findings, answered.not_evaluated
        harm, partial = answered.harm, answered.partial
    elif diagnosed is not None:
        findings, not_evaluated = diagnosed.findings, diagnosed.not_evaluated
        harm = diagnosed.harm
    else:
        verdict = engine.assess(series, nodes[0] if len(nodes) == 1 else "?", enrich=enricher)
        harm = verdict.harm
        findings, not_evaluated, partial = _without_partial(verdict.findings,
                                                            verdict.not_evaluated, warned)
    stack.close()
    document = engine.diagnosis(source, nodes, window, findings, not_evaluated, len(CATALOG),
                                harm)
    if getattr(args, "state_dir", None):  # beside the contract's fields: which ring, what span
        document["flight_recorder"] = {"state_dir": args.state_dir,
                                       "since_seconds": getattr(args, "since", None)}
    if answered is not None:
        document["fleet_findings"] = answered.fleet_findings
        document["query_engine"] = answered.stats.to_json()
    if args.fleet:  # beside the contract's fields: the modules by model and driver/firmware
        document["accelerator_groups"] = (answered.accelerator_groups if answered is not None
                                          else modules)
    if partial:  # beside the contract's fields: the engine's data was partial
        document["partial"] = True
        document["partial_reasons"] = partial
        if document["status"] == "ok":
            document["status"] = "unknown"  # nothing fired in part of the data only
    if health is not None:
        health.mark_end()
        document["sampling"] = health.to_json()
        if health.slipped:
            print(f"fleetscope diagnose: warning: {health.describe()}", file=sys.stderr)
        if health.delayed:
            print(f"fleetscope diagnose: warning: {health.describe_delay()}", file=sys.stderr)
    from .report import print_json, print_report  # rich, only when a report is printed

    if args.json:
        print_json(document)
    else:
        print_report(document, verbose=getattr(args, "verbose", False))
    if document["status"] == "unknown":  # exit 3: the contract's one line on stderr says why
        print(f"fleetscope diagnose: error: {_why_unknown(document, args)}", file=sys.stderr)
    return engine.exit_code(document)


def _why_unknown(document: dict, args: argparse.Namespace) -> str:
    """Why nothing could be said of the node(s), with where to look."""
    if document.get("partial"):
        return ("nothing fired, but the query engine answered in part only ("
                + "; ".join(document.get("partial_reasons", []))[:300] + ")")
    where = ("this node" if document["source"] == "live" else
             f"bundle {one_line(args.bundle, 300)}" if args.bundle else
             f"the ring in {one_line(args.state_dir, 300)}" if getattr(args, "state_dir", None)
             else
             f"node {one_line(args.node, 300)}" if args.node else "the fleet")
    hint = ("; is the fleetscope exporter scraped for it?" if args.prometheus else
            "; `--verbose` lists what each rule lacks")
    return (f"no rule could be evaluated: {where} has none of the signals the "
            f"{len(document['not_evaluated'])} rules read{hint}")


def _without_partial(findings: list, not_evaluated: list[dict],
                     warned: dict[str, list[str]]) -> tuple[list, list[dict], list[str]]:
    """Rules reading a metric whose answer came with warnings (a store down) are not judged
    on the part that answered: not evaluated, with the warning as the reason."""
    if not warned:
        return findings, not_evaluated, []
    skipped = {item["rule"] for item in not_evaluated}
    partial_rules = {}
    for rule in CATALOG:
        hit = sorted(set(rule.requires()) & set(warned))
        if hit and rule.id not in skipped:
            said = "; ".join(dict.fromkeys(w for name in hit for w in warned[name]))
            partial_rules[rule.id] = f"partial answer from Prometheus for {hit[0]}: {said}"[:300]
    findings = [f for f in findings if f.rule.id not in partial_rules]
    not_evaluated = not_evaluated + [{"rule": rule_id, "reason": reason}
                                     for rule_id, reason in sorted(partial_rules.items())]
    reasons = [f"{name}: {'; '.join(dict.fromkeys(w))}"[:300] for name, w in sorted(warned.items())]
    return findings, not_evaluated, reasons
