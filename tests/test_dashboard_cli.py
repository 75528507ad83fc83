"""`fleetscope console` and `fleetscope demo`: a bad source is one line and exit 2 or 3."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from fleetscope.dashboard.launch import DEFAULT_PORT, choose_port, port_free, streamlit_args


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetscope", *args], capture_output=True,
                          text=True, timeout=60)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("args, code, words", [
    (("console", "--source", "nonsense"), 2, "unknown source"),
    (("console", "--source", "prometheus:ftp://x"), 2, "unknown source"),
    (("demo", "--nodes", "3"), 2, "demo size"),
    (("console", "--source", "bundle:/nonexistent/bundle"), 3, "no such bundle"),
    (("console", "--port", "0"), 2, "--port"),
])
def test_bad_sources_cost_one_line(args, code, words):
    result = run(*args)
    assert result.returncode == code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.stderr


def test_unreachable_prometheus_is_exit_3():
    result = run("console", "--source", f"prometheus:http://127.0.0.1:{closed_port()}")
    assert result.returncode == 3
    assert "unreachable" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_unreadable_bundle_is_exit_3(tmp_path):
    (tmp_path / "meta.json").write_text("{not json")
    result = run("console", "--source", f"bundle:{tmp_path}")
    assert result.returncode == 3 and "meta.json" in result.stderr


def test_the_server_listens_on_loopback_headless_without_usage_stats():
    args = streamlit_args("127.0.0.1", 8600)
    assert args[args.index("--server.address") + 1] == "127.0.0.1"
    assert args[args.index("--server.headless") + 1] == "true"
    assert args[args.index("--browser.gatherUsageStats") + 1] == "false"


def test_help_names_the_sources():
    result = run("console", "--help")
    assert result.returncode == 0 and "bundle:PATH" in result.stdout
    assert run("demo", "--help").returncode == 0


def test_a_taken_port_is_one_line_and_exit_3():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run("demo", "--nodes", "16", "--port", str(port))
    assert result.returncode == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port}" in lines[0] and "taken" in lines[0]
    assert "http://" not in result.stdout  # no URL of whatever holds the port


def test_without_port_the_console_takes_the_next_free_one():
    with socket.socket() as holder:
        try:
            holder.bind(("127.0.0.1", DEFAULT_PORT))
            holder.listen()
        except OSError:
            pass  # already held by something else: the same case
        chosen = choose_port("127.0.0.1", None)
        assert chosen != DEFAULT_PORT and port_free("127.0.0.1", chosen)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert choose_port("127.0.0.1", port) == port
