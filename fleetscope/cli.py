"""The `fleetscope` command and its sub-commands (README.md, Command reference).

Exit codes for commands other than diagnose: 0 success, 2 usage error, 3 input or runtime
error. Errors are one line on stderr, never a traceback: every command runs under one
last-resort handler that turns an unexpected error into exit 3 and one line (`--debug`, or
FLEETSCOPE_DEBUG=1, prints the traceback too). SIGTERM ends a command like Ctrl-C does, so
its temporary directories are removed.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import signal
import sys
import time
import traceback

from fleetscope import __version__

EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


# Every error line starts with the command that failed, `fleetscope bundle record: error:`,
# as argparse's own usage errors do (set by main()).
_prog_of_this_run = "fleetscope"


def _fail(message: str) -> int:
    print(f"{_prog_of_this_run}: error: {message}", file=sys.stderr)
    return EXIT_INPUT


def _cmd_exporter(args: argparse.Namespace) -> int:
    # Imported here so `fleetscope --help` stays fast and the node side loads only what it runs.
    from fleetscope.collectors import COLLECTORS
    from fleetscope.core.config import ConfigError, default_config_path, load_config
    from fleetscope.exporter import parse_listen, serve
    from fleetscope.webconfig import WebConfig, load_web_config

    try:
        parse_listen(args.listen)
    except ValueError as err:
        print(f"fleetscope exporter: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = load_config(args.config or default_config_path(), tuple(COLLECTORS))
        web = load_web_config(args.web_config) if args.web_config else WebConfig()
    except ConfigError as err:
        return _fail(str(err))
    # SIGTERM (systemd, kubelet) ends the server like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(args.listen, args.root, config, web, args.evidence,
              _flight_recorder(args.state_dir, config) if args.state_dir else None)
    except KeyboardInterrupt:
        return 0
    except (NotADirectoryError, OSError) as err:
        return _fail(str(err))
    return 0


def _flight_recorder(state_dir: str, config):
    """The exporter's `beside`: the flight recorder on its evidence source, or nothing (one
    warning) where the directory cannot hold the ring."""
    def beside(source):
        from fleetscope.bundle.ring import start

        return start(state_dir, config, source)
    return beside


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from fleetscope.diagnose.command import run

    return run(args)


def _cmd_rules_list(args: argparse.Namespace) -> int:
    from fleetscope.rules.catalog import CATALOG

    if args.format == "markdown":
        from fleetscope.rules.export import markdown_table

        sys.stdout.write(markdown_table())
        return 0
    for rule in CATALOG:
        print(f"{rule.id:<30} {rule.severity:<8} {rule.symptom}")
    return 0


def _cmd_rules_export(args: argparse.Namespace) -> int:
    from fleetscope.rules.export import (
        DEFAULT_RUNBOOK_BASE,
        export_alertmanager,
        export_prometheus_rule,
        export_yaml,
        parse_duration,
    )

    try:
        hold = parse_duration(args.hold_for) if args.hold_for else None
    except ValueError as err:
        print(f"fleetscope rules export: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.console_url and not args.console_url.startswith(("http://", "https://")):
        print("fleetscope rules export: error: --console-url must be an http(s) URL",
              file=sys.stderr)
        return EXIT_USAGE
    formats = {"rules": export_yaml, "prometheusrule": export_prometheus_rule,
               "alertmanager": export_alertmanager}
    text = formats[args.format](args.runbook_url_base or DEFAULT_RUNBOOK_BASE, hold,
                                args.console_url, args.runbook_url_base is None)
    if args.output in (None, "-"):
        sys.stdout.write(text)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as err:
        return _fail(f"cannot write {args.output}: {err.strerror or err}")
    return 0


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


def _unexpected(prog: str, err: BaseException, debug: bool) -> int:
    """The last-resort handler: one line (and the traceback with --debug), exit 3."""
    if isinstance(err, RecursionError):
        message = "input nested too deeply to read (corrupt or hostile file?)"
    elif isinstance(err, MemoryError):
        message = "out of memory while reading the input"
    else:
        detail = _one_line(str(err))
        message = f"unexpected {type(err).__name__}" + (f": {detail}" if detail else "")
    if debug:
        traceback.print_exception(err, file=sys.stderr)
    hint = "" if debug else " (run with --debug for the traceback)"
    print(f"{prog}: error: {message}{hint}", file=sys.stderr)
    return EXIT_INPUT


def _terminate(signum, frame) -> None:
    # SystemExit unwinds through every finally and context manager: scratch dirs go.
    raise SystemExit(128 + signum)


class _RecordProgressLines:
    """`bundle record`'s progress where stderr is no terminal (a log, ssh without a tty, a
    pipe): a line after the first sample, then at most one every LINE_EVERY_S, and one at
    the last; a one-sample recording says nothing. Reproduced: a 60 s recording printed
    nothing for 136 s."""

    LINE_EVERY_S = 10.0

    def __init__(self, interval: float):
        self.interval = interval
        self.began = time.monotonic()
        self.said_at: float | None = None

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if total < 2 or (1 < done < total and self.said_at is not None
                         and now - self.said_at < self.LINE_EVERY_S):
            return
        self.said_at = now
        if done == total:
            after = "; the kernel log and the binaries' checks next"
        else:
            after = f", about {(total - done) * self.interval:.0f} s left"
        print(f"fleetscope bundle record: sample {done} of {total} taken "
              f"({now - self.began:.0f} s in{after})", file=sys.stderr, flush=True)


def _cmd_bundle_record(args: argparse.Namespace) -> int:
    from fleetscope.bundle.read import MAX_SAMPLES
    from fleetscope.bundle.record import RecordError, record, sample_count
    from fleetscope.collectors.source import evidence_source
    from fleetscope.core.config import ConfigError, default_config_path, load_config

    if not (0 < args.interval <= 3600 and 0 <= args.seconds <= 86400):
        print("fleetscope bundle record: error: --interval must be in (0, 3600] and "
              "--seconds in [0, 86400]", file=sys.stderr)
        return EXIT_USAGE
    if sample_count(args.seconds, args.interval) > MAX_SAMPLES:  # a bundle nothing could read
        print(f"fleetscope bundle record: error: --seconds {args.seconds:g} at --interval "
              f"{args.interval:g} makes {sample_count(args.seconds, args.interval)} samples, "
              f"over the {MAX_SAMPLES} a bundle may hold: lengthen --interval",
              file=sys.stderr)
        return EXIT_USAGE
    if not os.path.isdir(args.root):  # a typo'd root would record an empty bundle
        return _fail(f"--root {args.root} is not a directory")
    try:
        config = load_config(args.config or default_config_path())
    except ConfigError as err:
        return _fail(str(err))
    from rich.progress import Progress

    terminal = sys.stderr.isatty()
    lines = _RecordProgressLines(args.interval)
    with Progress(transient=True, disable=not terminal) as bar:
        task = bar.add_task("recording", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
            if not terminal:
                lines(done, total)

        try:
            # The evidence kind is chosen once, here (collectors/source.py evidence_source).
            path = record(args.output, args.seconds, args.interval, config,
                          evidence_source(args.root, args.evidence), progress=progress,
                          force=args.force)
        except RecordError as err:
            return _fail(str(err))
    print(f"bundle written to {path}")
    return 0


def _cmd_bundle_show(args: argparse.Namespace) -> int:
    from fleetscope.bundle.read import BundleError, open_bundle
    from fleetscope.bundle.show import describe

    try:
        with open_bundle(args.path) as bundle:
            rows = describe(bundle)
    except BundleError as err:
        return _fail(str(err))
    width = max(len(what) for what, _ in rows)
    for what, value in rows:
        print(f"{what:<{width}}  {value}")
    return 0


def _cmd_console(args: argparse.Namespace) -> int:
    from fleetscope.dashboard.launch import run_console

    source = args.source if args.command == "console" else \
        ("demo" if args.nodes is None else f"demo:{args.nodes}")
    return run_console(source, args.host, args.port, prog=args.command)


def _cmd_runbook(args: argparse.Namespace) -> int:
    from fleetscope.core.runbooks import runbook_dir, runbook_path
    from fleetscope.rules.catalog import RULE_IDS

    if args.rule is None:  # the list: id and file
        for rule_id in RULE_IDS:
            print(f"{rule_id:<30} {runbook_path(rule_id) or '(not installed)'}")
        return 0
    path = runbook_path(args.rule)
    if path is None:
        near = difflib.get_close_matches(args.rule, list(RULE_IDS), n=1)
        hint = f" (did you mean {near[0]}?)" if near else \
            "; fleetscope runbook (no argument) lists them"
        if args.rule in RULE_IDS:
            return _fail(f"the runbook of {args.rule} is not installed in {runbook_dir()}")
        print(f"fleetscope runbook: error: no rule {args.rule!r}{hint}", file=sys.stderr)
        return EXIT_USAGE
    if args.path:
        print(path)
        return 0
    sys.stdout.write(path.read_text(encoding="utf-8"))
    return 0


def _cmd_stacks(args: argparse.Namespace) -> int:
    from fleetscope.tools.stacks import run_stacks

    return run_stacks(args.pids, args.json)


def _isa_fleet(argv: list[str], check: bool) -> int:
    from fleetscope.diagnose.isa_fleet import run

    return run(argv, check)


def _cmd_isa_check(args: argparse.Namespace) -> int:
    from fleetscope.tools.isa import run_isa_check

    return run_isa_check(args.arguments)


class _CommandParser(argparse.ArgumentParser):
    """argparse's parser, with a mistyped sub-command answered in one line that names the
    command meant (`fleetscope diagnos`: did you mean diagnose?), not a usage dump and the
    whole list of choices. Sub-command parsers are of the same class."""

    def error(self, message: str):  # noqa: D102 (argparse's hook)
        wrong = re.search(r"invalid choice: (.+?) \(choose from", message)  # its repr()
        commands = next((a for a in self._actions
                         if isinstance(a, argparse._SubParsersAction)), None)
        if wrong is None or commands is None or not message.startswith(
                f"argument {commands.metavar}:"):
            super().error(message)
        hint = _did_you_mean(wrong.group(1).strip("'\""), commands.choices, cutoff=0.5)
        self.exit(EXIT_USAGE, f"{self.prog}: error: no command {wrong.group(1)}{hint}; "
                  f"{self.prog} --help lists its commands\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _CommandParser(
        prog="fleetscope",
        description="Observability and diagnosis for CPU clusters running AI-agent workloads.",
    )
    parser.add_argument("--version", action="version", version=f"fleetscope {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="on an unexpected error, print the traceback (any position)")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity on stderr (default: info)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    exporter = commands.add_parser(
        "exporter",
        help="serve this node's metrics for Prometheus",
        description="Prometheus exporter for this node: GET /metrics.",
    )
    exporter.add_argument(
        "--listen",
        default=":9105",
        metavar="HOST:PORT",
        help="address to listen on (default :9105, every interface)",
    )
    exporter.add_argument(
        "--root",
        default="/",
        metavar="DIR",
        help="prefix for every /proc and /sys read: a host mount (/host), a fixture tree or a "
        "bundle sample directory (default /)",
    )
    exporter.add_argument(
        "--evidence",
        choices=("auto", "live", "recorded"),
        default="auto",
        help="what the root is: live (this host: run perf and ethtool, ask the agent "
        "endpoint and Redis), recorded (a bundle sample or fixture tree: read its recorded "
        "command outputs, run nothing), or auto (default): recorded when the root holds "
        "recorded evidence (a bundle sample, cmd/ or agent.prom) or no kernel /proc, else live",
    )
    exporter.add_argument("--config", metavar="FILE", help="node config YAML (pools, per_core...; "
                          "default $FLEETSCOPE_CONFIG or /etc/fleetscope/config.yaml if present)")
    exporter.add_argument(
        "--web-config",
        metavar="FILE",
        help="TLS and basic-auth config, node_exporter's web-config format (default: plain HTTP)",
    )
    exporter.add_argument(
        "--state-dir",
        metavar="DIR",
        help="keep the flight recorder's ring here (DIR/ring, a bundle: a sample every "
        "ring_interval_seconds, the last ring_span_seconds, at most ring_max_bytes; read it "
        "with `diagnose --bundle DIR/ring`); default: no ring",
    )
    exporter.set_defaults(run=_cmd_exporter)

    diagnose = commands.add_parser(
        "diagnose", help="diagnose the live node, a bundle or Prometheus",
        description="Diagnosis with evidence and runbooks. Exit 0 ok, 1 warning, "
        "2 critical, 3 could not diagnose.",
    )
    from fleetscope.core.diagnose_options import add_arguments

    add_arguments(diagnose)
    diagnose.set_defaults(run=_cmd_diagnose)

    bundle = commands.add_parser("bundle", help="record or show an evidence bundle")
    bundle_commands = bundle.add_subparsers(dest="bundle_command", metavar="COMMAND",
                                            required=True)
    record = bundle_commands.add_parser("record", help="capture this node's raw evidence")
    record.add_argument("--seconds", type=float, default=30.0, metavar="N",
                        help="how long to record (default 30)")
    record.add_argument("--interval", type=float, default=5.0, metavar="S",
                        help="seconds between samples (default 5)")
    record.add_argument("-o", "--output", required=True, metavar="PATH",
                        help="bundle directory, or a .tar.gz file")
    record.add_argument("--force", action="store_true",
                        help="replace an existing .tar.gz at PATH (never through a symlink)")
    record.add_argument("--config", metavar="FILE", help="node config YAML (pools...; default "
                        "$FLEETSCOPE_CONFIG or /etc/fleetscope/config.yaml if present)")
    record.add_argument("--root", default="/", metavar="DIR", help=argparse.SUPPRESS)
    record.add_argument("--evidence", choices=("auto", "live", "recorded"), default="auto",
                        help=argparse.SUPPRESS)
    record.set_defaults(run=_cmd_bundle_record)
    show = bundle_commands.add_parser("show", help="summarise a bundle")
    show.add_argument("path", metavar="PATH")
    show.set_defaults(run=_cmd_bundle_show)

    runbook = commands.add_parser(
        "runbook", help="print a rule's runbook (installed with fleetscope)",
        description="Print the runbook a finding names (its `runbook` field, "
        "runbooks/<rule id>.md), from the files installed with fleetscope. Without RULE: "
        "every rule and its runbook file.")
    runbook.add_argument("rule", nargs="?", metavar="RULE", help="a rule id, e.g. isa-mismatch")
    runbook.add_argument("--path", action="store_true",
                         help="print the file's path instead of its text")
    runbook.set_defaults(run=_cmd_runbook)

    stacks = commands.add_parser(
        "stacks", help="py-spy stacks of agent workers, classified",
        description="Dump every Python thread of the given processes with py-spy and say "
        "whether each waits on the network, on a lock, runs on CPU or is idle.",
    )
    stacks.add_argument("pids", nargs="+", type=int, metavar="PID")
    stacks.add_argument("--json", action="store_true", help="print JSON")
    stacks.set_defaults(run=_cmd_stacks)

    isa = commands.add_parser("isa", help="instruction-set checks of binaries")
    isa_commands = isa.add_subparsers(dest="isa_command", metavar="COMMAND", required=True)
    check = isa_commands.add_parser(
        "check", add_help=False,
        help="extensions an ELF binary uses and which a CPU lacks: "
        "isa check BINARY [--features-from CPUINFO] [--json]")
    check.add_argument("arguments", nargs=argparse.REMAINDER)
    check.set_defaults(run=_cmd_isa_check)
    fleet = isa_commands.add_parser(
        "fleet", add_help=False,
        help="the fleet's CPU feature sets, their baseline and the -march every node runs: "
        "isa fleet --prometheus URL [--json] (isa check BINARY --prometheus URL: which "
        "node groups lack what the binary uses)")
    fleet.add_argument("arguments", nargs=argparse.REMAINDER)
    fleet.set_defaults(run=lambda args: _isa_fleet(args.arguments, check=False))

    console = commands.add_parser(
        "console", help="the ops console (Streamlit) on a source",
        description="Run the Streamlit ops console on 127.0.0.1 (headless). Sources: demo "
        "(the simulated fleet), bundle:PATH (a recorded bundle), prometheus:URL (a fleet "
        "Prometheus). Exit 2 for a bad source, 3 when it cannot be read.",
    )
    console.add_argument("--source", default="demo", metavar="SOURCE",
                         help="demo | bundle:PATH | prometheus:URL (default demo)")
    demo = commands.add_parser(
        "demo", help="the ops console on a simulated 4,096-node fleet",
        description="The console on the built-in simulated fleet, every rule's fault "
        "injected: no setup needed.",
    )
    demo.add_argument("--nodes", type=int, metavar="N",
                      help="simulated nodes (default 4096, 16-16384)")
    for sub in (console, demo):
        sub.add_argument("--port", type=int, default=None, metavar="N",
                         help="port to listen on (default 8501, or the next free one); "
                              "a taken --port exits 3")
        sub.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                         help="address to listen on (default 127.0.0.1)")
        sub.set_defaults(run=_cmd_console, nodes=None)
    demo.set_defaults(source="demo")

    rules = commands.add_parser("rules", help="the rule catalog and its Prometheus rules")
    rule_commands = rules.add_subparsers(dest="rules_command", metavar="COMMAND", required=True)
    listing = rule_commands.add_parser("list", help="list the rules")
    listing.add_argument("--format", choices=("text", "markdown"), default="text",
                         help="text: id, severity, symptom a line (default); markdown: the "
                              "table of runbooks/README.md, each id linked to its runbook")
    listing.set_defaults(run=_cmd_rules_list)
    export = rule_commands.add_parser("export", help="write the Prometheus rule file")
    export.add_argument("-o", "--output", metavar="FILE", help="file to write (default stdout)")
    export.add_argument("--runbook-url-base", default=None, metavar="URL",
                        help="where the runbooks are served: every alert's runbook_url is "
                        "URL/<rule id>.md (e.g. your repository's web view of runbooks/). "
                        "Default: the console's runbook page with --console-url, else "
                        "runbooks/ (relative: `fleetscope runbook RULE` prints one)")
    export.add_argument("--for", dest="hold_for", metavar="DURATION",
                        help="one `for:` for every alert, e.g. 5m (default: each rule's own)")
    export.add_argument("--format", choices=("rules", "prometheusrule", "alertmanager"),
                        default="rules",
                        help="rules: a Prometheus rule file (default); prometheusrule: the same "
                             "groups as a prometheus-operator PrometheusRule resource; "
                             "alertmanager: the inhibit rules for alertmanager.yml (a cause "
                             "inhibits the unexplained-harm alert of its own pool)")
    export.add_argument("--console-url", metavar="URL",
                        help="the ops console's address: every alert gets a console_url "
                             "annotation linking to its finding")
    export.set_defaults(run=_cmd_rules_export)
    return parser


def _prog(argv: list[str]) -> str:
    """'fleetscope diagnose', 'fleetscope bundle record'...: the prefix of error lines."""
    words: list[str] = []
    arguments = iter(argv)
    for arg in arguments:
        if arg == "--log-level":
            next(arguments, None)
        elif not arg.startswith("-"):
            words.append(arg)
            if len(words) == 2 or words[0] not in ("bundle", "rules", "isa"):
                break
    return " ".join(["fleetscope", *words])


LIVE_DIAGNOSE_NICE = -20


def _raise_priority() -> None:
    """A live diagnosis runs on a node whose CPUs are taken: 400 busy threads at nice 0
    leave a nice-0 process well under 1 % of a CPU, and its 20-second window took minutes.
    As root it runs at nice -20 for that short while (best effort; a user keeps its own)."""
    try:
        if os.geteuid() == 0:
            os.setpriority(os.PRIO_PROCESS, 0, LIVE_DIAGNOSE_NICE)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # --debug is accepted anywhere on the line, so it can be added to the failing command.
    debug = "--debug" in argv or os.environ.get("FLEETSCOPE_DEBUG") == "1"
    argv = [arg for arg in argv if arg != "--debug"]
    prog = _prog(argv)
    global _prog_of_this_run
    _prog_of_this_run = prog
    if argv[:1] == ["diagnose"] and not any(a.startswith(("--bundle", "--prometheus", "-h",
                                                          "--help")) for a in argv):
        _raise_priority()  # before the imports: they too run on the starved node
    try:
        signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread (tests calling main())
        pass
    try:
        return _main(argv, debug)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (SystemExit, BrokenPipeError):
        raise
    except Exception as err:
        return _unexpected(prog, err, debug)


def _command_parser(parser: argparse.ArgumentParser,
                    args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the sub-command the line named (`bundle record`'s, not the top one)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                return _command_parser(chosen, args)
    return parser


def _did_you_mean(word: str, known, cutoff: float = 0.6) -> str:
    """' (did you mean X?)' for the nearest of `known` to a mistyped word, or ''."""
    near = difflib.get_close_matches(word, list(known), n=1, cutoff=cutoff)
    return f" (did you mean {near[0]}?)" if near else ""


def _unrecognized(parser: argparse.ArgumentParser, unknown: list[str]) -> int:
    """One line for an argument the command does not take, with the option meant if one
    is close (`--secs`: did you mean --seconds?)."""
    first = unknown[0]
    hint = (_did_you_mean(first.split("=")[0], parser._option_string_actions)
            if first.startswith("-") else "")
    print(f"{parser.prog}: error: unrecognized argument {first}{hint}; "
          f"{parser.prog} --help lists what it takes", file=sys.stderr)
    return EXIT_USAGE


def _main(argv: list[str], debug: bool) -> int:
    if argv[:2] == ["isa", "check"] and any(a == "--prometheus" or a.startswith(
            "--prometheus=") for a in argv[2:]):  # against the fleet (diagnose/isa_fleet.py)
        return _isa_fleet(argv[2:], check=True)
    if argv[:2] == ["isa", "fleet"]:  # its own parser too
        return _isa_fleet(argv[2:], check=False)
    if argv[:2] == ["isa", "check"]:  # its own parser: options may come first (--help)
        from fleetscope.tools.isa import run_isa_check

        return run_isa_check(argv[2:])
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        return _unrecognized(_command_parser(parser, args), unknown)
    args.debug = debug
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return args.run(args)
    except BrokenPipeError:  # `fleetscope diagnose --json | head`: the reader left
        sys.stderr.close()
        return 0
