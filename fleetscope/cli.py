"""The `fleetscope` command and its sub-commands (CONTRACT section 2).

Exit codes for commands other than diagnose: 0 success, 2 usage error, 3 input or runtime
error. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from fleetscope import __version__

EXIT_USAGE = 2
EXIT_INPUT = 3


def _fail(message: str) -> int:
    print(f"fleetscope: error: {message}", file=sys.stderr)
    return EXIT_INPUT


def _cmd_exporter(args: argparse.Namespace) -> int:
    # Imported here so `fleetscope --help` stays fast and the node side loads only what it runs.
    from fleetscope.collectors import COLLECTORS
    from fleetscope.config import ConfigError, load_config
    from fleetscope.exporter import parse_listen, serve
    from fleetscope.webconfig import WebConfig, load_web_config

    try:
        parse_listen(args.listen)
    except ValueError as err:
        print(f"fleetscope exporter: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = load_config(args.config, tuple(COLLECTORS))
        web = load_web_config(args.web_config) if args.web_config else WebConfig()
    except ConfigError as err:
        return _fail(str(err))
    # SIGTERM (systemd, kubelet) ends the server like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(args.listen, args.root, config, web)
    except KeyboardInterrupt:
        return 0
    except (NotADirectoryError, OSError) as err:
        return _fail(str(err))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetscope",
        description="Observability and diagnosis for CPU clusters running AI-agent workloads.",
    )
    parser.add_argument("--version", action="version", version=f"fleetscope {__version__}")
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
    exporter.add_argument("--config", metavar="FILE", help="node config YAML (pools, per_core...)")
    exporter.add_argument(
        "--web-config",
        metavar="FILE",
        help="TLS and basic-auth config, node_exporter's web-config format (default: plain HTTP)",
    )
    exporter.set_defaults(run=_cmd_exporter)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return args.run(args)
