"""What a new user's first mistakes print: one line on stderr that says what was wrong and
what to do, each reproduced as it was met (a wrong flag, a taken port, a config typo, a URL
that is not Prometheus, a node Prometheus does not know...)."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from fleetscope import cli
from tests.conftest import BUNDLES
from tests.test_threads import _config as parked_config
from tests.test_threads import parked_worker  # noqa: F401 (a fixture)


def run(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetscope", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def one_error_line(result: subprocess.CompletedProcess, prog: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    assert "Traceback" not in result.stderr
    return lines[0]


def test_a_mistyped_flag_names_the_flag_meant(capsys):
    assert cli.main(["diagnose", "--secs", "5"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("fleetscope diagnose: error: ") and "\n" not in line
    assert "--secs" in line and "did you mean --seconds?" in line
    assert cli.main(["bundle", "record", "--intervall", "1", "-o", "x"]) == 2
    assert "did you mean --interval?" in capsys.readouterr().err


def test_seconds_zero_says_the_real_bounds(capsys):
    assert cli.main(["diagnose", "--bundle", "x", "--seconds", "0"]) == 2
    line = capsys.readouterr().err.strip()
    assert "more than 0 and at most 86400" in line and "not 0" in line
    assert "between 0 and" not in line


def test_a_config_typo_names_the_file_its_origin_and_the_near_key(tmp_path):
    config = tmp_path / "node.yaml"
    config.write_text("pool:\n  - {name: chat, class: online, match: {cmdline: chat}}\n")
    env = dict(os.environ, FLEETSCOPE_CONFIG=str(config))
    result = run("bundle", "record", "--seconds", "0", "-o", str(tmp_path / "b"), env=env)
    line = one_error_line(result, "fleetscope bundle record")
    assert result.returncode == 3
    assert str(config) in line and "$FLEETSCOPE_CONFIG" in line
    assert "pool (did you mean pools?)" in line
    # Given with --config, the same file is named without the variable.
    del env["FLEETSCOPE_CONFIG"]
    result = run("bundle", "record", "--seconds", "0", "--config", str(config), "-o",
                 str(tmp_path / "b"), env=env)
    line = one_error_line(result, "fleetscope bundle record")
    assert str(config) in line and "FLEETSCOPE_CONFIG" not in line


def test_every_command_prefixes_its_errors_with_its_own_name(tmp_path):
    missing = str(tmp_path / "nowhere")
    for args, prog in ((("bundle", "show", missing), "fleetscope bundle show"),
                       (("diagnose", "--bundle", missing), "fleetscope diagnose"),
                       (("rules", "export", "-o", f"{missing}/x.yml"), "fleetscope rules export"),
                       (("exporter", "--root", missing, "--listen", "127.0.0.1:0"),
                        "fleetscope exporter")):
        result = run(*args)
        one_error_line(result, prog)
        assert result.returncode == 3, args


def test_an_existing_output_directory_says_what_to_do(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine\n")
    result = run("bundle", "record", "--seconds", "0", "-o", str(tmp_path / "out"))
    line = one_error_line(result, "fleetscope bundle record")
    assert "not empty" in line and "--force" in line and ".tar.gz" in line
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine\n"


def test_the_exporter_on_a_taken_port_says_so_first_naming_the_address_and_its_holder():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run("exporter", "--listen", f"127.0.0.1:{port}", "--root",
                     str(BUNDLES / "kunpeng-128" / "samples" / "s0001"))
    line = one_error_line(result, "fleetscope exporter")  # no collector warnings before it
    assert result.returncode == 3
    assert f"127.0.0.1:{port}" in line and "Address already in use" in line
    assert "--listen" in line and "[Errno" not in line
    # the port is held by this test's own process: named by its pid, not guessed at
    assert f"(pid {os.getpid()}) listens there" in line and "another exporter" not in line


class _NotPrometheus(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("evaluate", ["engine", "local"])
def test_a_404_from_a_server_that_is_not_prometheus_hints_at_the_base_url(evaluate):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotPrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/grafana"
        result = run("diagnose", "--prometheus", url, "--node", "n1", "--evaluate", evaluate,
                     "--timeout", "20")
    finally:
        server.shutdown()
        server.server_close()
    line = one_error_line(result, "fleetscope diagnose")
    assert result.returncode == 3
    assert "HTTP 404" in line and "Prometheus base URL" in line


def test_no_pools_configured_is_the_reason_given_not_ptrace_rights(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    result = run("diagnose", "--bundle", str(BUNDLES / "kunpeng-128"), "--config", str(empty),
                 "--json")
    reasons = {r["rule"]: r["reason"] for r in json.loads(result.stdout)["not_evaluated"]}
    reason = reasons["worker-blocked-external-call"]
    assert "no workload pools in the config" in reason
    assert "CAP_SYS_PTRACE" not in reason


def test_bundle_show_says_perf_counted_nothing_when_every_event_was_not_supported(tmp_path):
    """A real recording here: this machine has no hardware perf counters, so perf writes
    `<not supported>` for every event."""
    output = tmp_path / "b"
    assert run("bundle", "record", "--seconds", "1", "--interval", "1", "-o",
               str(output)).returncode == 0
    perf = [p.read_text() for p in output.glob("samples/*/cmd/perf-stat.csv")]
    if not perf or any(any(ch.isdigit() for ch in line.split(",")[2]) for text in perf
                       for line in text.splitlines() if line.count(",") > 3):
        pytest.skip("perf missing here, or it counts events: not the case reproduced")
    shown = run("bundle", "show", str(output)).stdout
    row = next(line for line in shown.splitlines() if line.startswith("perf memory"))
    assert "yes" not in row.split("L3", 1)[1] and "counted no event" in row


@pytest.mark.live
@pytest.mark.skipif(os.geteuid() != 0, reason="syscall files of a process need root here")
def test_the_blocked_call_threshold_comes_from_the_config_in_every_row(parked_worker,  # noqa: F811
                                                                       tmp_path):
    _, _, marker, _ = parked_worker
    config_path = tmp_path / "config.yaml"
    config_path.write_text(json.dumps(parked_config(marker)))  # blocked_call_seconds: 2
    output = tmp_path / "parked"
    assert run("bundle", "record", "--seconds", "4", "--interval", "1", "--config",
               str(config_path), "-o", str(output)).returncode == 0
    result = run("diagnose", "--bundle", str(output), "--json")
    finding = next(f for f in json.loads(result.stdout)["findings"]
                   if f["rule"] == "worker-blocked-external-call")
    waits = [e for e in finding["evidence"] if e["unit"] in ("s", "seconds")
             and "wait" in e["signal"] or "thread" in e["signal"] and e["unit"] == "seconds"]
    assert len(waits) >= 2
    assert {e["threshold"] for e in waits} == {2}


@pytest.mark.parametrize("argv,prog,wrong,meant", [
    (["diagnos"], "fleetscope", "diagnos", "diagnose"),
    (["bundle", "shwo", "x.tar.gz"], "fleetscope bundle", "shwo", "show"),
    (["rules", "exprt"], "fleetscope rules", "exprt", "export"),
    (["isa", "fleeet"], "fleetscope isa", "fleeet", "fleet"),
])
def test_a_mistyped_command_names_the_command_meant(argv, prog, wrong, meant):
    result = run(*argv)
    line = one_error_line(result, prog)
    assert result.returncode == 2
    assert f"no command '{wrong}' (did you mean {meant}?)" in line, line
    assert f"{prog} --help" in line and "choose from" not in line


def test_a_command_name_from_nowhere_is_quoted_and_nothing_guessed():
    result = run("\x1b[31mzz'z")
    line = one_error_line(result, "fleetscope")
    assert result.returncode == 2
    assert "\x1b" not in line and "\\x1b[31mzz'z" in line and "did you mean" not in line


def test_a_port_alone_for_listen_is_answered_with_the_address_meant():
    result = run("exporter", "--listen", "9105")
    line = one_error_line(result, "fleetscope exporter")
    assert result.returncode == 2
    assert "(did you mean :9105, every interface, or 127.0.0.1:9105?)" in line


@pytest.mark.parametrize("kind", ["text file", "directory"])
def test_what_is_not_a_bundle_is_told_what_a_bundle_is(tmp_path, kind):
    if kind == "text file":
        target = tmp_path / "node17.log"
        target.write_text("Dec  7 02:14:01 node17 kernel: [1.0] hello\n" * 100)
    else:
        target = tmp_path / "logs"
        target.mkdir()
        (target / "dmesg.txt").write_text("hello\n")
    for argv, prog in ((["diagnose", "--bundle", str(target)], "fleetscope diagnose"),
                       (["bundle", "show", str(target)], "fleetscope bundle show")):
        result = run(*argv)
        line = one_error_line(result, prog)
        assert result.returncode == 3
        assert ("not a readable bundle: no archive of any kind" in line
                or "no meta.json, so not a fleetscope bundle" in line), line
        assert "`fleetscope bundle record -o PATH` writes" in line
        assert "could not be opened successfully" not in line and "damaged" not in line


def test_a_bundle_no_rule_can_read_exits_3_with_the_reason_on_stderr(tmp_path):
    """Every sample and the kernel log emptied, no pools: the verdict is unknown (never
    healthy), the report still on stdout, and the contract's one line on stderr says why."""
    import shutil

    bundle = tmp_path / "empty"
    shutil.copytree(BUNDLES / "kunpeng-128", bundle)
    for sample in (bundle / "samples").iterdir():
        shutil.rmtree(sample)
        sample.mkdir()
    for static in (bundle / "static").iterdir():
        shutil.rmtree(static) if static.is_dir() else static.unlink()
    no_pools = tmp_path / "node.yaml"
    no_pools.write_text("pools: []\n")
    result = run("diagnose", "--bundle", str(bundle), "--config", str(no_pools))
    line = one_error_line(result, "fleetscope diagnose")
    assert result.returncode == 3
    assert f"no rule could be evaluated: bundle {bundle} has none of the signals" in line
    assert "--verbose" in line
    assert "UNKNOWN" in result.stdout.upper()


def test_a_recording_without_a_terminal_says_its_progress_in_a_few_lines(tmp_path):
    """Reproduced: `bundle record --seconds 60 --interval 5` into a log printed nothing for
    136 s. Without a terminal a recording says the first sample, then at most a line every
    10 s, then the last; 51 samples are not 51 lines. One sample says nothing."""
    root = str(BUNDLES / "kunpeng-128" / "samples" / "s0001")
    began = time.monotonic()
    result = run("bundle", "record", "--root", root, "--seconds", "0.05", "--interval",
                 "0.001", "-o", str(tmp_path / "many"))
    wall = time.monotonic() - began
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if " taken (" in line]
    assert said[0].startswith("fleetscope bundle record: sample 1 of 51 taken (0 s in, about ")
    assert said[-1].startswith("fleetscope bundle record: sample 51 of 51 taken (")
    assert said[-1].endswith("; the kernel log and the binaries' checks next)"), said[-1]
    assert len(said) <= 2 + wall / 10, said
    single = run("bundle", "record", "--root", root, "--seconds", "0", "-o",
                 str(tmp_path / "one"))
    assert single.returncode == 0 and " taken (" not in single.stderr, single.stderr


def test_a_sample_that_overruns_its_interval_is_said_at_once_and_shown_as_late(tmp_path):
    """Reproduced: `bundle record --interval 5` printed nothing while one sample took 75 s,
    and `bundle show` then said "every 5 s". Here every sample takes longer than a 1 ms
    interval."""
    bundle = tmp_path / "late"
    result = run("bundle", "record", "--root", str(BUNDLES / "kunpeng-128" / "samples" /
                                                   "s0001"),
                 "--seconds", "0.002", "--interval", "0.001", "-o", str(bundle))
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "longer than the" in line]
    assert len(warned) == 2, result.stderr  # the last sample delays nothing
    assert "sample 1 of 3 took" in warned[0] and "0.001 s interval" in warned[0]
    shown = run("bundle", "show", str(bundle))
    assert shown.returncode == 0, shown.stderr
    samples = next(line for line in shown.stdout.splitlines() if line.startswith("samples"))
    assert "3, one every 0.001 s asked; gaps " in samples
    assert "2 of 2 late" in samples, samples
    on_time = run("bundle", "show", str(BUNDLES / "kunpeng-128")).stdout
    assert "2, one every 15 s asked; gaps 15.0 to 15.0 s, 15.0 s in all" in on_time
    assert "late" not in on_time
