"""`bundle record` with secrets around and hostile output paths.

The secret test records a real bundle on this machine beside a real process started with
`--api-key=...` (and a password option, a credential KEY=VALUE, a secret in its environment)
and a config with URL credentials, then greps every file of the bundle, `bundle show`, the
report and the JSON for each secret. The clobber tests point `-o` at existing files and at
symlinks.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from fleetscope.bundle.redact import MARK, Redactor
from fleetscope.collectors.processes import PoolProcess
from fleetscope.core.config import parse_config
from fleetscope.rules.builtin.offline_preemption import antagonist_names
from tests.hostile_corpus import run

SECRETS = {
    "api_key": "sk-live-4f9a8b7c6d5e4f3a2b1c",
    "password": "hunter2-PW-91",
    "aws": "AKIAW9SECRETW9KEY",
    "url_password": "redispw-7731",
    "configured": "tenant-884211",
    "environ": "ENVIRON-ONLY-SECRET-55",
}


@pytest.fixture
def secret_process():
    """A real process whose argv and environment carry secrets (it ends by itself)."""
    argv = [sys.executable, "-c", "import time; time.sleep(90)", "fleetscope-secret-agent",
            f"--api-key={SECRETS['api_key']}", "--password", SECRETS["password"],
            f"AWS_SECRET_ACCESS_KEY={SECRETS['aws']}", f"--tenant={SECRETS['configured']}",
            f"--upstream=redis://worker:{SECRETS['url_password']}@127.0.0.1:6379/0"]
    proc = subprocess.Popen(argv, env={**os.environ, "AGENT_TOKEN": SECRETS["environ"]})
    yield proc
    proc.kill()
    proc.wait()


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "pools": [{"name": "agents", "class": "offline",
                   "match": {"cmdline": "fleetscope-secret-agent"}}],
        "redis_url": f"redis://:{SECRETS['url_password']}@127.0.0.1:1/0",
        "redact": [r"tenant-[0-9]+"],
    }))
    return path


def _leaks(text: str) -> list[str]:
    return [name for name, secret in SECRETS.items() if secret in text]


def test_recorded_bundle_report_and_json_carry_no_secret(tmp_path, secret_process):
    output = tmp_path / "node.tar.gz"
    recorded = run(["bundle", "record", "--seconds", "1", "--interval", "1", "-o", str(output),
                    "--config", str(_config(tmp_path))], timeout=300)
    assert recorded.returncode == 0, recorded.stderr
    assert stat.S_IMODE(os.stat(output).st_mode) == 0o600
    found_process = False
    with tarfile.open(output) as archive:
        for member in archive:
            mode = stat.S_IMODE(member.mode)
            assert mode == (0o700 if member.isdir() else 0o600), (member.name, oct(mode))
            assert not member.name.endswith("/environ"), member.name
            if not member.isfile():
                continue
            data = archive.extractfile(member).read().decode("utf-8", "replace")
            assert not _leaks(data), (member.name, _leaks(data))
            if member.name.endswith(f"/{secret_process.pid}/cmdline"):
                found_process = True
                assert "--api-key=" + MARK in data and "fleetscope-secret-agent" in data
            if member.name.endswith("meta.json"):
                meta = json.loads(data)
                assert meta["config"]["redis_url"] == f"redis://{MARK}@127.0.0.1:1/0"
                assert meta["redacted"]["cmdline_args"] >= 5
                assert meta["redacted"]["config_values"] >= 1
    assert found_process, "the pool process was not recorded"
    shown = run(["bundle", "show", str(output)])
    assert shown.returncode == 0 and not _leaks(shown.stdout)
    assert "cmdline args" in shown.stdout and "config values" in shown.stdout
    for extra in ([], ["--json"]):
        diagnosed = run(["diagnose", "--bundle", str(output), *extra], timeout=300)
        assert diagnosed.returncode in (0, 1, 2, 3), diagnosed.stderr
        assert not _leaks(diagnosed.stdout + diagnosed.stderr)


def test_antagonist_summary_redacts_command_lines():
    config = parse_config({"redact": ["tenant-[0-9]+"]})
    process = PoolProcess(4242, config.pools[0] if config.pools else None,
                          f"etl --token={SECRETS['api_key']} {SECRETS['configured']}", "")
    names = antagonist_names([(100, process, 0)])
    assert not _leaks(names)
    assert names == "etl (pid 4242)"  # the program, never its arguments


@pytest.mark.parametrize(("argv", "expected"), [
    (["agent", "--api-key=abc"], ["agent", f"--api-key={MARK}"]),
    (["agent", "--password", "p", "--threads", "4"],
     ["agent", "--password", MARK, "--threads", "4"]),
    (["env", "DB_PASSWORD=x", "LANG=C"], ["env", f"DB_PASSWORD={MARK}", "LANG=C"]),
    (["curl", "https://u:p@h/x"], ["curl", f"https://{MARK}@h/x"]),
    (["curl", "-H", "Authorization: Bearer abcdefghijkl"],
     ["curl", "-H", f"Authorization: Bearer {MARK}"]),
    (["python", "serve.py", "--port=8080"], ["python", "serve.py", "--port=8080"]),
])
def test_redaction_rules(argv, expected):
    assert Redactor().argv(argv) == expected


def _record(output: Path, *extra: str, seconds: str = "0"):
    return run(["bundle", "record", "--seconds", seconds, "--interval", "1", "-o", str(output),
                *extra], timeout=300)


def _one_line_refusal(result, says: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 3, result.stderr
    assert len(lines) == 1 and says in lines[0], lines
    assert "Traceback" not in result.stderr


def test_existing_archive_is_kept_unless_force(tmp_path):
    output = tmp_path / "node.tar.gz"
    output.write_text("precious")
    _one_line_refusal(_record(output), "already exists")
    assert output.read_text() == "precious"
    assert _record(output, "--force").returncode == 0
    assert tarfile.is_tarfile(output)
    assert sorted(os.listdir(tmp_path)) == ["node.tar.gz"]  # no partial file left


def test_symlink_at_output_is_never_followed(tmp_path):
    target = tmp_path / "victim"
    target.write_text("root's file")
    output = tmp_path / "node.tar.gz"
    output.symlink_to(target)
    _one_line_refusal(_record(output), "already exists")
    assert _record(output, "--force").returncode == 0
    assert target.read_text() == "root's file"
    assert not output.is_symlink() and tarfile.is_tarfile(output)


def test_existing_file_as_directory_output(tmp_path):
    output = tmp_path / "notes.txt"
    output.write_text("keep me")
    _one_line_refusal(_record(output), "not a directory")
    assert output.read_text() == "keep me"
    link = tmp_path / "dir-link"
    (tmp_path / "real").mkdir()
    link.symlink_to(tmp_path / "real")
    _one_line_refusal(_record(link), "symlink")
    assert os.listdir(tmp_path / "real") == []


def test_unwritable_output_fails_before_recording(tmp_path):
    """Checked before the window: --seconds 3600 must not be spent first."""
    _one_line_refusal(_record(tmp_path / "missing" / "node.tar.gz", seconds="3600"),
                      "cannot write")
    _one_line_refusal(_record(Path("/proc/fleetscope-bundle"), seconds="3600"), "cannot write")


def test_directory_bundle_is_private(tmp_path):
    output = tmp_path / "bundle"
    assert _record(output).returncode == 0
    assert stat.S_IMODE(os.stat(output).st_mode) == 0o700
    for base, dirs, files in os.walk(output):
        for name in dirs:
            assert stat.S_IMODE(os.stat(os.path.join(base, name)).st_mode) == 0o700
        for name in files:
            assert stat.S_IMODE(os.stat(os.path.join(base, name)).st_mode) == 0o600, name


def test_record_sigterm_leaves_no_work_directory(tmp_path):
    work = tmp_path / "tmp"
    work.mkdir()
    output = tmp_path / "node.tar.gz"
    proc = subprocess.Popen([sys.executable, "-m", "fleetscope", "bundle", "record",
                             "--seconds", "600", "--interval", "1", "-o", str(output)],
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(work)})
    for _ in range(3000):  # until the first sample is being written (bounded: 30 s)
        if any(files for _, _, files in os.walk(work)) or proc.poll() is not None:
            break
        subprocess.run(["sleep", "0.01"], check=False)
    proc.terminate()
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr
    assert [n for n in os.listdir(work) if n.startswith("fleetscope-")] == []
    assert os.listdir(tmp_path) == ["tmp"]  # neither the archive nor its partial file


# -- the last-resort handler (fleetscope/cli.py) --------------------------------------------
@pytest.mark.parametrize(("error", "says"), [
    (ZeroDivisionError("division by zero"), "unexpected ZeroDivisionError: division by zero"),
    (RecursionError("maximum recursion depth exceeded"), "nested too deeply"),
    (OSError("multi\nline"), "unexpected OSError: multi line"),
])
def test_unexpected_errors_are_one_line_exit_3(monkeypatch, capsys, error, says):
    from fleetscope import cli

    def broken(args):
        raise error

    monkeypatch.setattr(cli, "_cmd_rules_list", broken)
    monkeypatch.setattr(cli.signal, "signal", lambda *_: None)  # keep pytest's handlers
    assert cli.main(["rules", "list"]) == 3
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleetscope rules list: error: ")
    assert says in lines[0] and "--debug" in lines[0]
    assert cli.main(["rules", "list", "--debug"]) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in broken" in err


def test_ctrl_c_is_one_line_exit_130(monkeypatch, capsys):
    from fleetscope import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_rules_list", interrupted)
    monkeypatch.setattr(cli.signal, "signal", lambda *_: None)
    assert cli.main(["rules", "list"]) == 130
    assert capsys.readouterr().err.strip() == "fleetscope rules list: interrupted"


def test_archive_members_carry_no_pax_headers_times_or_owner_names(tmp_path):
    """Whole-second mtimes and no owners: no member needs a PAX header (each had one for its
    float mtime, and the reader parsed every header twice), the recording user's name stays
    behind, and the archive still opens as a bundle."""
    output = tmp_path / "node.tar.gz"
    assert _record(output).returncode == 0
    with tarfile.open(output) as archive:
        members = archive.getmembers()
    assert members and all(not m.pax_headers for m in members)
    assert all(m.mtime == int(m.mtime) and m.uid == m.gid == 0 and m.uname == m.gname == ""
               for m in members)
    assert any(m.name.endswith("meta.json") for m in members)
    shown = run(["bundle", "show", str(output)])
    assert shown.returncode == 0, shown.stderr


def test_a_root_that_is_not_a_directory_is_refused_before_recording(tmp_path):
    # Reproduced: a mistyped --root recorded an empty bundle and said it was written.
    output = tmp_path / "node.tar.gz"
    _one_line_refusal(_record(output, "--root", str(tmp_path / "no-such-root")),
                      "is not a directory")
    assert not output.exists()
