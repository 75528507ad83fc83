"""The README run as a newcomer runs it: every command of its quick start, its demo and its
incident block, in order, in one bash shell (job control on, as in a terminal), in a fresh
venv under a fresh HOME. node_exporter's end-to-end test does the same for its output.

What differs from a newcomer's machine, and why:
- the venv also sees the system's site packages (what .ci/run installed): the README's own
  `pip install` lines install fleetscope from this checkout into it, nothing is downloaded;
- the README's fixed ports (9105, 9090) become free ones, `http://prometheus:9090` the
  Prometheus started here (a test talks to 127.0.0.1 only), and /tmp the test's folder;
- the node's files are written in an empty folder, not in the checkout;
- a server the README leaves in the foreground (the console, the demo) runs in the
  background until its page answers, then is stopped, as Ctrl-C would;
- before `diagnose --prometheus` the test waits until Prometheus holds the scrapes the README
  asks ("once it has scraped for a minute or two"); the incident block's Prometheus is the
  quick start's, started again on its data;
- a command that reads a server the line before started waits until it listens, as a
  person typing the next line would;
- the example agent worker runs, so `pgrep -f agent.worker` finds a worker to show.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import require_tool
from tests.test_agent_signals import free_port

pytestmark = [pytest.mark.live, pytest.mark.served]

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SECTIONS = ("## Quick start", "## The demo", "## During an incident")
STOP_PROSE = "`kill %1 %2`"  # the quick start's last command is in its prose
DIAGNOSE_CODES = {0, 1, 2}  # healthy, warning, critical: a verdict either way; 3 is none
SCRAPES_BEFORE_PROMETHEUS = 5  # 15 s apart: the README's "a minute or two"


def readme_blocks() -> list[tuple[str, str]]:
    """(section, code) of every shell block in SECTIONS, in the README's order: fenced
    ```sh blocks (indented inside list items too) and indented blocks."""
    text = README.read_text()
    blocks = []
    for title in SECTIONS:
        start = text.index(title)
        end = text.find("\n## ", start + 1)
        body = text[start:end if end >= 0 else None]
        fenced = re.finditer(r"^( *)```sh\n(.*?)^\1```", body, re.M | re.S)
        spans = [(m.start(), textwrap.dedent(m.group(2))) for m in fenced]
        indented = re.finditer(r"(?:^\n)((?: {4}\S.*\n)+)", body, re.M)
        spans += [(m.start(), textwrap.dedent(m.group(1))) for m in indented
                  if not body[:m.start()].rstrip().endswith("```")]
        blocks += [(title, code) for _, code in sorted(spans)]
    return blocks


def commands(code: str) -> list[str]:
    """The commands of a block: a line, with its `\\` continuations and its here-document."""
    lines, out, index = code.splitlines(), [], 0
    while index < len(lines):
        if not lines[index].strip():
            index += 1
            continue
        command = [lines[index]]
        while command[-1].rstrip().endswith("\\"):
            index += 1
            command.append(lines[index])
        heredoc = re.search(r"<<'?(\w+)'?", command[0])
        while heredoc and command[-1].strip() != heredoc.group(1):
            index += 1
            command.append(lines[index])
        out.append("\n".join(command))
        index += 1
    return out


class Shell:
    """One bash, fed command by command; each command's output goes to its own file."""

    def __init__(self, cwd: Path, env: dict, logs: Path):
        self.logs, self.count = logs, 0
        self.process = subprocess.Popen(["bash", "--noprofile", "--norc"], cwd=cwd, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.run("set -m")  # job control: a job is its own process group, as in a terminal

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def run(self, command: str, timeout: float = 300) -> tuple[int, str]:
        self.count += 1
        output = self.logs / f"step-{self.count:02d}.out"
        (self.logs / f"step-{self.count:02d}.sh").write_text(command + "\n")
        self.process.stdin.write(f"{{ {command}\n}} >{output} 2>&1 </dev/null\n"
                                 "echo __rc__ $?\n")
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{command!r} still running after {timeout:g} s: "
                                     f"{output.read_text()[-2000:]}") from None
            if line.startswith("__rc__ "):
                return int(line.split()[1]), output.read_text()

    def close(self) -> None:
        with_jobs = "for job in $(jobs -p); do kill -- -$job; done"
        try:
            self.run(with_jobs, timeout=30)
            self.process.stdin.close()
            self.process.wait(timeout=30)
        except (AssertionError, OSError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _page_answers(output: Path, seconds: float) -> str:
    """The URL a console prints, once it answers 200 (the first text of its page)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = re.search(r"http://127\.0\.0\.1:\d+\S*", output.read_text())
        if found:
            try:
                with urllib.request.urlopen(found.group(0), timeout=10) as response:
                    if response.status == 200:
                        return found.group(0)
            except OSError:
                pass
        time.sleep(0.5)
    raise AssertionError(f"no page answered in {seconds:g} s: {output.read_text()[-2000:]}")


def _scrapes(prometheus: str) -> int:
    query = urllib.parse.urlencode({"query": "count_over_time(up[10m])"})
    try:
        with urllib.request.urlopen(f"{prometheus}/api/v1/query?{query}", timeout=10) as r:
            result = json.load(r)["data"]["result"]
    except OSError:
        return 0
    return int(float(result[0]["value"][1])) if result else 0


def test_the_readme_runs_in_order_on_a_fresh_venv(tmp_path):
    for tool in ("prometheus", "curl", "pgrep"):
        require_tool(tool)
    exporter_port, prometheus_port = free_port(), free_port()
    prometheus = f"http://127.0.0.1:{prometheus_port}"
    home, folder = tmp_path / "home", tmp_path / "folder"
    logs = tmp_path / "logs"
    for made in (home, folder, logs):
        made.mkdir()
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "LANG": "C.UTF-8",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "TMPDIR": str(tmp_path)}

    def local(command: str) -> str:
        command = command.replace("127.0.0.1:9105", f"127.0.0.1:{exporter_port}")
        command = command.replace("127.0.0.1:9090", f"127.0.0.1:{prometheus_port}")
        command = command.replace("http://prometheus:9090", prometheus)
        command = command.replace("/tmp/", f"{tmp_path}/")
        return command.replace("python3 -m venv ", "python3 -m venv --system-site-packages ")

    blocks = readme_blocks()
    assert [title for title, _ in blocks].count(SECTIONS[0]) >= 4, blocks
    assert STOP_PROSE in README.read_text()
    worker = subprocess.Popen([sys.executable, str(REPO / "examples" / "agent_worker.py"),
                               "--listen", "127.0.0.1:0", "--pool", "agents"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shell = Shell(REPO, env, logs)
    ran = []
    try:
        for title, block in blocks:
            if title == "## The demo":  # "pip install '.[console]'": in the checkout
                assert shell.run(f"cd {REPO}")[0] == 0
            if title == SECTIONS[2]:
                assert shell.run(f"cd {folder}")[0] == 0
            for command in map(local, commands(block)):
                server = re.match(r"(?:.*&& )?fleetscope (console|demo)\b", command)
                if command.startswith("fleetscope diagnose --prometheus") and \
                        title == SECTIONS[2]:
                    _start_prometheus_again(shell, prometheus_port)
                if command.startswith("fleetscope diagnose --prometheus"):
                    _wait_scrapes(prometheus)
                if command.startswith("curl"):  # as a person typing the next line would
                    _wait_listening(exporter_port)
                if server:
                    assert shell.run(f"{{ {command}\n}} &")[0] == 0
                    url = _page_answers(logs / f"step-{shell.count:02d}.out", 240)
                    ran.append((command, url))
                    assert shell.run("kill -INT -- -$(jobs -p %+)")[0] == 0
                    continue
                rc, output = shell.run(command)
                ran.append((command, rc))
                wanted = DIAGNOSE_CODES if re.match(r"fleetscope diagnose\b", command) \
                    else {0, 3} if command.startswith("fleetscope stacks") else {0}
                assert rc in wanted, (command, rc, output[-3000:])
                _check_output(command, output, worker.pid)
            if block.startswith("python3 -m venv"):  # installed: on to the empty folder
                assert shell.run(f"cd {folder}")[0] == 0
            if title == SECTIONS[0] and "fleetscope console" in block:
                rc, output = shell.run(STOP_PROSE.strip("`"))
                ran.append((STOP_PROSE, rc))
                assert rc == 0, output
    finally:
        shell.close()
        worker.kill()
        worker.wait()
    said = [command for command, _ in ran]
    assert any(c.startswith("fleetscope bundle record") for c in said), said
    assert any(c.startswith("fleetscope stacks") for c in said), said
    assert any("fleetscope demo" in c for c in said), said


def _start_prometheus_again(shell: Shell, port: int) -> None:
    code, output = shell.run("prometheus --config.file=prometheus.yml "
                             "--storage.tsdb.path=./data "
                             f"--web.listen-address=127.0.0.1:{port} &")
    assert code == 0, output


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on 127.0.0.1:{port}"
            time.sleep(0.2)


def _wait_scrapes(prometheus: str) -> None:
    deadline = time.monotonic() + 240
    while _scrapes(prometheus) < SCRAPES_BEFORE_PROMETHEUS:
        assert time.monotonic() < deadline, "Prometheus did not scrape the exporter"
        time.sleep(1)


def _check_output(command: str, output: str, worker_pid: int) -> None:
    """What the README says each command prints."""
    if "grep -c '^fleetscope_'" in command:  # "100-1,000 series"
        assert 100 <= int(output.split()[-1]) <= 1000, output
    if command.startswith("fleetscope diagnose") and "--json" not in command:
        assert output.startswith("fleetscope diagnosis of "), output[:500]
    if "--json" in command:
        assert json.loads(output)["status"] in ("ok", "warning", "critical"), output[:500]
    if command.startswith("fleetscope runbook"):
        assert "isa-mismatch" in output.lower(), output[:500]
    if command.startswith("fleetscope stacks"):
        assert f"pid {worker_pid} thread " in output, output[:2000]
        # Other tests' example workers match `pgrep -f agent.worker` too; one that ended
        # between pgrep and py-spy is the only error allowed (exit 3), never ours.
        errors = [line for line in output.splitlines() if line.startswith("fleetscope stacks:")]
        for line in errors:
            named = re.match(r"fleetscope stacks: error: .*?(?:process: |pid )(\d+)", line)
            assert named and int(named.group(1)) != worker_pid, errors
            assert not os.path.exists(f"/proc/{named.group(1)}"), errors
    if command.startswith("fleetscope bundle record"):
        assert "bundle written to" in output, output[-2000:]
