"""The command line: usage errors exit 2, bad input exits 3 with one line, never a traceback;
the node side never loads the central side's heavy libraries."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import BUNDLES

ROOT = BUNDLES / "x86-256" / "samples" / "s0000"


def _run(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "fleetscope", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "args", [(), ("no-such-command",), ("exporter", "--listen", "nowhere"),
             ("exporter", "--listen", "127.0.0.1:99999"), ("exporter", "--bogus")],
)
def test_usage_errors_exit_2(args):
    result = _run(*args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "config, message",
    [
        ("per_core: everything\n", "per_core must be 'summary' or 'full'"),
        ("pools: [{name: a, class: sometimes, match: {cgroup: '*'}}]\n", "class must be"),
        ("pools: [{name: a, class: online, match: {cmdline: '(['}}]\n", "not a valid regex"),
        ("per_core: [unclosed\n", "not valid YAML"),
        ("- just\n- a list\n", "must be a YAML mapping"),
        ("colectors: [cpu]\n", "unknown config keys: colectors"),
        ("collectors: [cpu, gpu]\n", "unknown collectors: gpu"),
        ("!!python/object/apply:os.system ['true']\n", "not valid YAML"),  # safe_load refuses
    ],
)
def test_bad_config_exits_3_with_one_line(tmp_path, config, message):
    path = tmp_path / "node.yaml"
    path.write_text(config)
    result = _run("exporter", "--listen", "127.0.0.1:0", "--root", str(ROOT),
                  "--config", str(path))
    assert result.returncode == 3
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_missing_config_and_root_exit_3(tmp_path):
    result = _run("exporter", "--listen", "127.0.0.1:0", "--config", str(tmp_path / "nope.yaml"))
    assert result.returncode == 3 and "cannot read config" in result.stderr
    result = _run("exporter", "--listen", "127.0.0.1:0", "--root", str(tmp_path / "nothing"))
    assert result.returncode == 3 and "is not a directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_busy_port_exits_3(exporter_factory):
    running = exporter_factory(ROOT)
    port = running.url.rsplit(":", 1)[1].split("/")[0]
    result = _run("exporter", "--listen", f"127.0.0.1:{port}", "--root", str(ROOT))
    assert result.returncode == 3
    assert "Address already in use" in result.stderr


def test_node_side_does_not_import_central_libraries():
    probe = (
        "import sys\n"
        "from fleetscope.exporter import Exporter\n"
        "from fleetscope.core.config import parse_config\n"
        f"Exporter({str(ROOT)!r}, parse_config({{}})).render()\n"
        "heavy = sorted(m for m in ('pandas', 'streamlit', 'plotly') if m in sys.modules)\n"
        "print(','.join(heavy) or 'none')\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"


def test_config_from_the_environment_when_no_flag(tmp_path, exporter_factory, monkeypatch):
    config = tmp_path / "node.yaml"
    config.write_text("per_core: full\n")
    monkeypatch.setenv("FLEETSCOPE_CONFIG", str(config))
    text = exporter_factory(ROOT).text()  # started without --config
    assert 'fleetscope_cpu_seconds_total{cpu="0",mode="user"}' in text
    monkeypatch.setenv("FLEETSCOPE_CONFIG", str(tmp_path / "missing.yaml"))
    result = _run("diagnose", "--seconds", "1")
    assert result.returncode == 3 and "cannot read config" in result.stderr
