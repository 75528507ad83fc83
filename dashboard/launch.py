"""`fleetscope console` and `fleetscope demo`: check the source, then run Streamlit on the app.

    fleetscope console --source bundle:incident.tar.gz --port 8501
    -> python -m streamlit run dashboard/app.py --server.address 127.0.0.1 --server.port 8501
       --server.headless true ... with FLEETSCOPE_CONSOLE_SOURCE=bundle:incident.tar.gz

The source is checked before Streamlit starts, so a bad one costs one line and exit code 2
(not a source) or 3 (a bundle that does not open, a Prometheus that does not answer). So is
the port: without --port the console takes 8501 or the next free port; a --port that is
taken is one line and exit 3. The
process then becomes the Streamlit server (exec), so stopping it stops the console; the
demo simulates its fleet and runs the rules first, then serves from the same process, so its
first visitor waits for none of it.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path

from fleetscope.dashboard.data import SOURCE_ENV, SourceError, check_source, parse_source

APP = Path(__file__).resolve().parent / "app.py"
EXIT_USAGE = 2
EXIT_INPUT = 3


# `python -m streamlit` would put the working directory first on sys.path, where a folder
# named `fleetscope` (the one a clone sits in) shadows the installed package: start
# Streamlit's command line with that entry removed instead.
STREAMLIT_MAIN = ("import sys; sys.path = [p for p in sys.path if p not in ('', '.')]; "
                  "from streamlit.web.cli import main; main(prog_name='streamlit')")


def streamlit_args(host: str, port: int) -> list[str]:
    # logger.enableRich off: an exception in a page is logged through `logging` to stderr
    # (rich prints it to stdout), as well as shown on the page.
    return [sys.executable, "-c", STREAMLIT_MAIN, "run", str(APP),
            "--server.address", host, "--server.port", str(port),
            "--server.headless", "true", "--server.fileWatcherType", "none",
            "--server.runOnSave", "false", "--browser.gatherUsageStats", "false",
            "--global.developmentMode", "false", "--client.toolbarMode", "minimal",
            "--theme.base", "light", "--logger.enableRich", "false"]


DEFAULT_PORT = 8501


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now (what Streamlit will try next)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as tornado binds
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def choose_port(host: str, asked: int | None) -> int | None:
    """The port to listen on: the one asked for if free (None when taken); without --port
    8501, else the next free one up to 8599, else any free port the kernel gives."""
    if asked is not None:
        return asked if port_free(host, asked) else None
    for candidate in range(DEFAULT_PORT, DEFAULT_PORT + 99):
        if port_free(host, candidate):
            return candidate
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def run_console(source: str, host: str = "127.0.0.1", port: int | None = None,
                prog: str = "console") -> int:
    def fail(message: str, code: int) -> int:
        print(f"fleetscope {prog}: error: {message}", file=sys.stderr)
        return code

    if port is not None and not 0 < port < 65536:
        return fail(f"--port must be 1-65535, not {port}", EXIT_USAGE)
    try:
        parse_source(source)
    except SourceError as err:
        return fail(str(err), EXIT_USAGE)
    missing = [m for m in ("streamlit", "plotly", "pandas") if importlib.util.find_spec(m) is None]
    if missing:
        return fail(f"{', '.join(missing)} not installed: pip install 'fleetscope[console]'",
                    EXIT_INPUT)
    try:
        check_source(source)
    except SourceError as err:
        return fail(str(err), EXIT_INPUT)
    try:
        chosen = choose_port(host, port)
    except OSError as err:
        return fail(f"cannot listen on {host}: {err.strerror or err}", EXIT_INPUT)
    if chosen is None:
        return fail(f"port {port} on {host} is taken: stop what holds it, or leave out "
                    f"--port to get a free one", EXIT_INPUT)
    port = chosen
    if parse_source(source)[0] == "demo":
        return _serve_demo(source, host, port, prog)
    env = dict(os.environ, **{SOURCE_ENV: source})
    print(f"fleetscope {prog}: http://{host}:{port}/ (source {source})", flush=True)
    args = streamlit_args(host, port)
    os.execve(sys.executable, args, env)
    return 0  # not reached


def _serve_demo(source: str, host: str, port: int, prog: str) -> int:
    """The demo simulates its fleet and runs the rules over it first, then serves from this
    process: the first visitor's page draws what is already there instead of waiting for
    it (a Refresh simulates again, up to then)."""
    from fleetscope.dashboard import data

    print(f"fleetscope {prog}: simulating the fleet ({source})...", flush=True)
    data.preload(source)
    from fleetscope.dashboard import charts

    charts.warm_up()
    os.environ[SOURCE_ENV] = source
    # As `python -m streamlit` would run, without the working directory on sys.path (a
    # folder named `fleetscope` there would shadow the installed package).
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    from streamlit.web.cli import main

    print(f"fleetscope {prog}: http://{host}:{port}/ (source {source})", flush=True)
    main(args=streamlit_args(host, port)[3:], prog_name="streamlit")
    return 0
