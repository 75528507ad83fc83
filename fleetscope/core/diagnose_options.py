"""`fleetscope diagnose`'s options, apart from the engine: the command line parser is built
for every command, and defining these must not import what diagnosing needs (the rules,
the engine, rich), so `fleetscope exporter` starts without them. They live in core, not in
the diagnose package: importing any module of that package loads the package itself.

    fleetscope diagnose [--bundle PATH | --prometheus URL [--node NAME | --fleet] |
                         --state-dir DIR [--since 30m]]
                        [--seconds N] [--json] [--verbose] [--config FILE]
"""

from __future__ import annotations

import argparse

LIVE_SECONDS = 20.0  # 16 steps with a 5 s rate window behind each (engine.rate_window_ms)
PROMETHEUS_SECONDS = 300.0  # 20 scrapes at 15 s, the rules' 1-minute rates behind most
# All the answers one `diagnose --prometheus` holds (diagnose/prometheus.py AnswerBudget):
# what they parse into stays to the verdict, at about 9 to 14 times their size.
MAX_ANSWERS_MIB = 32.0


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'90s', '30m', '2h', '1d' (or plain seconds) -> seconds; ValueError otherwise."""
    text = text.strip()
    number, unit = (text[:-1], text[-1]) if text[-1:] in DURATION_UNITS else (text, "s")
    try:
        seconds = float(number) * DURATION_UNITS[unit]
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= 7 * 86400:  # NaN too
        raise ValueError(f"a duration from 1s to 7d, like 30m, not {text[:40]!r}")
    return seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--bundle", metavar="PATH", help="diagnose a recorded bundle "
                        "(directory or .tar.gz); never contacts the network")
    source.add_argument("--prometheus", metavar="URL", help="diagnose from a Prometheus server")
    source.add_argument("--state-dir", metavar="DIR", help="diagnose the flight recorder's ring "
                        "the exporter keeps there (`exporter --state-dir DIR`): the node's "
                        "own recent past, no network needed")
    parser.add_argument("--since", metavar="AGO", help="with --state-dir: only the ring's "
                        "samples of the last AGO (90s, 30m, 2h; default: all it keeps)")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--node", metavar="NAME", help="with --prometheus: the node's "
                       "`instance` label, the exporter's host:port as Prometheus scrapes it "
                       "(e.g. 10.0.0.7:9105)")
    scope.add_argument("--fleet", action="store_true", help="with --prometheus: every node")
    parser.add_argument("--seconds", type=float, default=None, metavar="N",
                        help=f"live: how long to sample, once a second (default "
                        f"{LIVE_SECONDS:g}: a condition must hold across most of the window); "
                        f"Prometheus: how far back (default {PROMETHEUS_SECONDS:g})")
    parser.add_argument("--evaluate", choices=("engine", "local"), default="engine",
                        help="with --prometheus: engine (default) sends each rule to the query "
                        "engine and fetches evidence for the firing nodes only; local fetches "
                        "every series the rules read and evaluates here (a small fleet, or an "
                        "engine without the query API features the rules use)")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="with --prometheus: one deadline for all its queries together "
                        "(default 30)")
    parser.add_argument("--max-answers-mib", type=float, default=MAX_ANSWERS_MIB,
                        metavar="MIB",
                        help="with --prometheus: the most answer bytes the command holds, "
                        "all its queries together (default "
                        f"{MAX_ANSWERS_MIB:g}; what they parse into takes about 9 to 14 times "
                        "as much memory)")
    parser.add_argument("--json", action="store_true", help="print the diagnosis JSON")
    parser.add_argument("--verbose", action="store_true", help="the report names each rule "
                        "not evaluated and the signals it lacks (the JSON always holds them)")
    parser.add_argument("--config", metavar="FILE", help="node config YAML (for a bundle it "
                        "overrides the recorded one; live default: $FLEETSCOPE_CONFIG or "
                        "/etc/fleetscope/config.yaml if present)")
