"""Crash loops and lock contention, produced for real on this machine and diagnosed three ways:
live (`fleetscope diagnose` with a pool matching the workers), from a bundle recorded here
(`bundle record`, then `diagnose --bundle`), and through the exported rules on a real
Prometheus scraping the exporter. Beside them, the healthy look-alikes that must stay silent:
an idle thread pool waiting in futex for work, and workers that take the same flock only
around a short write.

- crash loop: a gcc-built worker `agent_worker_<unique>` that writes through a NULL pointer
  right after it starts, restarted every second by a bounded supervisor loop; the kernel logs
  `agent_worker_...[pid]: segfault at 0 ip ... error 6 in agent_worker_...[...]` per crash.
  Other programs' segfaults (other tests, earlier runs) are in the same log: the finding must
  name this binary and pids the supervisor started.
- lock contention: four online workers that take one flock() and do their compute under it;
  /proc/locks shows the holder and three '->' waiters.

`bench/live_accuracy.py` runs the scenarios of SCENARIOS here beside the catalog's (one JSON
line each through FLEETSCOPE_ACCURACY_LOG). Every child ends by itself (a lifetime argument)
and is killed by pid at the end of its test; servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleetscope.collectors.parsers.kmsg import scan_kernel_log
from fleetscope.collectors.parsers.locks import parse_proc_locks
from tests.conftest import Recording, require_tool
from tests.test_isa_fault import _kernel_log
from tests.test_live_accuracy import (
    NOISE,
    ForeignLoad,
    Lab,
    Scenario,
    _diagnose,
    _record,
    earlier_events,
)
from tests.test_prometheus_scrape import _free_port, _query

pytestmark = pytest.mark.live

LIFETIME_S = 150  # every child ends by itself after this
SEGFAULT_C = "int main(void) { volatile int *config = 0; *config = 1; return 0; }\n"
SUPERVISOR = """
import resource, subprocess, sys, time
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
end = time.time() + float(sys.argv[1])
while time.time() < end:          # a supervisor restarting a worker that dies at once
    child = subprocess.Popen([sys.argv[2]], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    with open(sys.argv[3], "a") as started:
        started.write(f"{child.pid}\\n")
    child.wait()
    time.sleep(1.0)
"""
LOCKED_WORKER = """
import fcntl, random, sys, time
end = time.time() + float(sys.argv[2])
hold = float(sys.argv[3])
while time.time() < end:          # refresh a shared cache: the compute runs under the lock
    with open(sys.argv[1], "a") as cache:
        fcntl.flock(cache, fcntl.LOCK_EX)
        busy = time.time() + hold
        while time.time() < busy:
            sum(i * i for i in range(2000))
        cache.write("x")
        fcntl.flock(cache, fcntl.LOCK_UN)
    if hold < 0.01:               # the healthy variant: compute outside, lock only to write;
        busy = time.time() + 0.1  # four workers keep ~0.8 of the two CPUs busy, not more
        while time.time() < busy:
            sum(i * i for i in range(2000))
        # requests arrive apart: started together on one fixed period, the four ran in
        # step, two waiting for a CPU while two ran (~50 ms/s each), a real harm
        time.sleep(random.uniform(0.3, 0.5))
"""
IDLE_POOL = """
import concurrent.futures, sys, time
pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)
list(pool.map(lambda x: x * x, range(64)))   # threads started, then idle on the work queue
end = time.time() + float(sys.argv[1])
while time.time() < end:          # an agent worker between requests
    pool.submit(sum, range(20_000)).result()
    time.sleep(0.5)
"""

SCENARIOS = [
    Scenario("crash-loop", "crash-loop"),
    Scenario("lock-contention", "lock-contention", explains={"cpu-saturation"}),
    Scenario("idle-thread-pool", None, needs_spare_cpu=True),
    Scenario("brief-file-lock", None, needs_spare_cpu=True),
]


def _unique() -> str:
    return f"{os.getpid() % 10**5}{time.monotonic_ns() % 10**4}"


def _segfault_worker(tmp: Path) -> Path:
    trace = Path("/proc/sys/debug/exception-trace")
    if trace.exists() and trace.read_text().strip() == "0":
        pytest.skip("debug.exception-trace is 0: the kernel logs no segfault")
    gcc = require_tool("gcc")
    source = tmp / "worker.c"
    source.write_text(SEGFAULT_C)
    binary = tmp / f"agent_worker_{_unique()}"
    subprocess.run([gcc, "-O0", "-o", str(binary), str(source)], check=True,
                   capture_output=True, timeout=120)
    return binary


class CrashLoop:
    """The worker binary and its supervisor's child pids (read as it prints them)."""

    def __init__(self, lab: Lab):
        self.binary = _segfault_worker(lab.tmp)
        self.pid_file = lab.tmp / f"{self.binary.name}.pids"
        lab.script(f"{self.binary.name}_supervisor.py", SUPERVISOR, LIFETIME_S, self.binary,
                   self.pid_file)
        lab.pool("tool-runners", "online", re.escape(self.binary.name))

    def started(self) -> set[int]:
        """Every pid the supervisor started the worker as."""
        return {int(line) for line in self.pid_file.read_text().split()}

    def logged(self) -> list:
        """The kernel's reports of this binary's crashes (ground truth)."""
        return [f for f in scan_kernel_log(_kernel_log()).faults
                if f.binary == self.binary.name]


class LockedWorkers:
    def __init__(self, lab: Lab, hold: float = 0.3, workers: int = 4):
        self.name = f"fs_lock_worker_{_unique()}"
        self.cache = lab.tmp / f"{self.name}.cache"
        self.cache.touch()
        self.inode = self.cache.stat().st_ino
        self.children = [lab.script(f"{self.name}.py", LOCKED_WORKER, self.cache, LIFETIME_S,
                                    hold)
                         for _ in range(workers)]
        self.pids = {child.pid for child in self.children}
        lab.pool("chat-online", "online", re.escape(self.name))

    def waits(self, reads: int = 20) -> list:
        """(waiter, holder) pids of /proc/locks rows on our file (ground truth), over a few
        reads: at the instant the holder lets go no one waits."""
        found: set[tuple[int, int | None]] = set()
        for _ in range(reads):
            rows = parse_proc_locks(Path("/proc/locks").read_text())
            found |= {(r.pid, r.holder) for r in rows if r.waiting and r.inode == self.inode}
            time.sleep(0.05)
        return sorted(found)


def _produce(name: str, lab: Lab):
    if name == "crash-loop":
        return CrashLoop(lab)
    if name == "lock-contention":
        return LockedWorkers(lab)
    if name == "brief-file-lock":
        return LockedWorkers(lab, hold=0.001)
    if name == "idle-thread-pool":
        lab.script(f"fs_idle_pool_{_unique()}.py", IDLE_POOL, LIFETIME_S)
        lab.pool("chat-online", "online", "fs_idle_pool_")
        return None
    raise ValueError(name)


def _foreign_crashes(began: float, ours: str | None) -> dict[str, list[str]]:
    """Rule -> binaries other than ours that died since `began` (CLOCK_MONOTONIC, the kernel
    log's clock), of SIGILL (isa-mismatch) or another fatal trap (crash-loop): another
    program's crash loop is a real finding of this node, not the scenario's."""
    scan = scan_kernel_log(_kernel_log())
    return {rule: sorted({c.binary for c in crashes if c.seconds is not None
                          and c.seconds >= began and c.binary != ours})
            for rule, crashes in (("isa-mismatch", scan.crashes), ("crash-loop", scan.faults))}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_live_diagnosis_names_the_fault_and_nothing_else(scenario, tmp_path):
    from tests.test_live_accuracy import FOREIGN_CPU_LIMIT, _foreign_busy_cpus

    if scenario.needs_spare_cpu:
        foreign = _foreign_busy_cpus()
        if foreign > FOREIGN_CPU_LIMIT:
            _record({"scenario": scenario.name, "expected": scenario.expect,
                     "skipped": f"{foreign:.1f} CPUs busy with other work"})
            pytest.skip(f"{foreign:.1f} CPUs already busy with other programs")
    lab = Lab(tmp_path)
    with ForeignLoad() as load:
        lab.script("fs_acc_noise.py", NOISE, tmp_path, LIFETIME_S)
        try:
            fault = _produce(scenario.name, lab)
            time.sleep(3)  # let the fault settle before the window opens
            document, code, wall = _diagnose(lab)
            truth = fault.logged() if isinstance(fault, CrashLoop) else \
                fault.waits() if isinstance(fault, LockedWorkers) else None
        finally:
            lab.stop()
    findings = document["findings"]
    ours = fault.binary.name if isinstance(fault, CrashLoop) else None
    foreign_crashes = _foreign_crashes(load.began, ours)
    # Another program crash-looping beside the scenario is this node's truth, not ours.
    set_aside = [f for f in findings if foreign_crashes.get(f["rule"])
                 and scenario.expect != f["rule"]]
    set_aside += [f for f in earlier_events(findings, {scenario.expect}) if f not in set_aside]
    serious = [f for f in findings if f["severity"] in ("warning", "critical")
               and f not in set_aside]
    primary = serious[0]["rule"] if serious else None
    allowed = {scenario.expect, *scenario.explains} - {None}
    if load.saturated:
        allowed.add("cpu-saturation")
    false_alarms = sorted({f["rule"] for f in serious} - allowed)
    summary = [(f["rule"], f["severity"], f["summary"]) for f in findings]
    wrong = primary != scenario.expect or false_alarms
    if wrong and scenario.needs_spare_cpu and load.cpus > FOREIGN_CPU_LIMIT:
        _record({"scenario": scenario.name, "expected": scenario.expect,
                 "skipped": f"{load.cpus:.1f} CPUs busy with other work in the window"})
        pytest.skip(f"{load.cpus:.1f} CPUs busy with other programs ({summary})")
    _record({"scenario": scenario.name, "expected": scenario.expect, "primary": primary,
             "correct": primary == scenario.expect, "false_alarms": false_alarms,
             "wall_seconds": round(wall, 2), "status": document["status"],
             "findings": [(f["rule"], f["severity"]) for f in findings],
             "foreign_cpus": round(load.cpus, 2), "foreign_crashes": foreign_crashes})
    assert primary == scenario.expect, summary
    assert not false_alarms, (false_alarms, summary)
    if scenario.expect == "crash-loop":
        finding = serious[0]
        assert fault.binary.name in finding["subjects"]["binaries"], summary
        assert truth, "the kernel logged no segfault of the worker"
        assert {c.pid for c in truth} <= fault.started()
        assert set(finding["subjects"]["pids"]) & {c.pid for c in truth}, summary
        assert fault.binary.name in finding["summary"] and "segfault at 0" in \
            finding["summary"]
    if scenario.expect == "lock-contention":
        finding = serious[0]
        assert finding["summary"].startswith("pool chat-online:"), summary
        assert truth and {w for w, _ in truth} <= fault.pids, truth
        assert {h for _, h in truth} <= fault.pids, truth
        assert set(finding["subjects"]["pids"]) <= fault.pids, summary
        assert "held by pid" in finding["summary"], summary
    if scenario.expect is None:  # the look-alikes: neither rule says a word above info
        assert not [f for f in findings if f["rule"] in ("lock-contention", "crash-loop")
                    and f["severity"] != "info" and f not in set_aside], summary


# --- the same faults from a bundle recorded here, and through Prometheus ------------------


def _run_diagnose(*args: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", *args, "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1, 2), result.stderr
    return json.loads(result.stdout)


def _config(lab: Lab) -> Path:
    import yaml

    path = lab.tmp / "node.yaml"
    path.write_text(yaml.safe_dump({"pools": lab.pools}))
    return path


def _alerts_on_prometheus(lab: Lab, config: Path, rule: str, exporter_factory,
                          seconds: float = 150) -> tuple[dict, str]:
    """A real Prometheus scraping the live exporter with the exported rules loaded (`for:`
    0s): the firing alert of `rule`, and the Prometheus URL."""
    prometheus = require_tool("prometheus")
    exporter = exporter_factory("/", json.loads(json.dumps(
        __import__("yaml").safe_load(config.read_text()))))
    target = exporter.url.removeprefix("http://").removesuffix("/metrics")
    rules = lab.tmp / "fleetscope.rules.yml"
    exported = subprocess.run([sys.executable, "-m", "fleetscope", "rules", "export", "--for",
                               "0s", "-o", str(rules)], capture_output=True, text=True,
                              timeout=60)
    assert exported.returncode == 0, exported.stderr
    port = _free_port()
    (lab.tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{rules}']\n"
        f"scrape_configs: [{{job_name: node, static_configs: [{{targets: ['{target}']}}]}}]\n")
    server = subprocess.Popen([prometheus, f"--config.file={lab.tmp / 'prometheus.yml'}",
                               f"--storage.tsdb.path={lab.tmp / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lab.children.append(server)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            firing = _query(base, f'ALERTS{{fleetscope_rule="{rule}", alertstate="firing"}}')
        except OSError:
            firing = []
        if firing:
            return firing[0]["metric"], base
        time.sleep(1)
    raise AssertionError(f"no {rule} alert fired on Prometheus; exporter log: "
                         f"{exporter.stderr()[-2000:]}")


def _recorded_and_alerted(lab: Lab, rule: str, exporter_factory) -> tuple[Path, dict, str]:
    """With the fault running: a bundle recorded here and, meanwhile, the rule's alert on
    Prometheus."""
    time.sleep(3)  # let the fault settle before the window opens
    config = _config(lab)
    bundle = lab.tmp / "node.tar.gz"
    recording = Recording(["--seconds", "12", "--interval", "1", "--config", str(config),
                           "-o", str(bundle)])
    try:
        alert, base = _alerts_on_prometheus(lab, config, rule, exporter_factory)
        record = recording.wait()
    finally:
        recording.stop()
    assert record.returncode == 0, record.stderr
    return bundle, alert, base


def test_a_real_crash_loop_is_named_from_a_bundle_and_by_prometheus(tmp_path,
                                                                    exporter_factory):
    lab = Lab(tmp_path)
    try:
        loop = CrashLoop(lab)
        bundle, alert, base = _recorded_and_alerted(lab, "crash-loop", exporter_factory)
        logged = loop.logged()
        selector = f'{{binary="{loop.binary.name}"}}'
        series = _query(base, f"fleetscope_fatal_trap_crashes_total{selector}")
        # the alert's own expression, held by this binary's crashes alone
        recent = _query(base, f"time() - fleetscope_fatal_trap_last_crash_timestamp_seconds"
                              f"{selector} < 900")
    finally:
        lab.stop()
    assert logged and {c.pid for c in logged} <= loop.started()
    assert all(c.address == "0" and c.description.startswith("segfault") for c in logged)
    # Prometheus: the exported alert fires for this node, and the series names the binary.
    assert alert["alertname"] == "FleetscopeCrashLoop" and alert["severity"] == "critical"
    assert series and float(series[0]["value"][1]) >= 1 and recent
    # The bundle, diagnosed with the binary gone: the same binary, pids the kernel logged.
    loop.binary.unlink()
    document = _run_diagnose("--bundle", str(bundle))
    finding = next(f for f in document["findings"] if f["rule"] == "crash-loop")
    assert finding["severity"] == "critical"
    assert loop.binary.name in finding["subjects"]["binaries"]
    assert set(finding["subjects"]["pids"]) & {c.pid for c in logged}
    assert "segfault at 0" in finding["summary"]


def test_real_flock_contention_is_named_from_a_bundle_and_by_prometheus(tmp_path,
                                                                        exporter_factory):
    lab = Lab(tmp_path)
    try:
        workers = LockedWorkers(lab)
        bundle, alert, base = _recorded_and_alerted(lab, "lock-contention", exporter_factory)
        truth = workers.waits()
        waiters = _query(base, 'fleetscope_pool_file_lock_waiters{pool="chat-online"}')
    finally:
        lab.stop()
    assert len(truth) >= 2 and {w for w, _ in truth} <= workers.pids
    assert alert["alertname"] == "FleetscopeLockContention" and alert["pool"] == "chat-online"
    assert waiters and float(waiters[0]["value"][1]) >= 1
    document = _run_diagnose("--bundle", str(bundle))
    finding = next(f for f in document["findings"] if f["rule"] == "lock-contention")
    assert finding["severity"] == "warning"
    assert finding["summary"].startswith("pool chat-online:")
    assert set(finding["subjects"]["pids"]) <= workers.pids and finding["subjects"]["pids"]
    assert "held by pid" in finding["summary"] and "waiting for the FLOCK lock" in \
        finding["summary"]


FUTEX = {"x86_64": 202, "aarch64": 98}  # syscall numbers (syscall_64.tbl, asm-generic)


def test_an_idle_thread_pool_and_a_brief_flock_raise_no_lock_contention(tmp_path):
    """The look-alikes, whatever else the machine runs: threads parked in futex waiting for
    work (no holder, nothing blocked on a file lock), and workers that take the same kind of
    flock only around a short write."""
    lab = Lab(tmp_path)
    try:
        idle = lab.script(f"fs_idle_pool_{_unique()}.py", IDLE_POOL, LIFETIME_S)
        brief = LockedWorkers(lab, hold=0.001)
        lab.pool("idle-pool", "online", "fs_idle_pool_")
        time.sleep(3)
        futex = FUTEX.get(os.uname().machine)
        parked = 0
        for task in Path(f"/proc/{idle.pid}/task").iterdir():
            with open(task / "syscall") as handle:
                parked += handle.read().split()[0] == str(futex)
        document = _run_diagnose("--seconds", "10", "--config", str(_config(lab)))
    finally:
        lab.stop()
    assert futex is None or parked >= 8, parked  # the pool's 8 threads wait in futex
    assert brief.cache.stat().st_size >= 8  # each write was made holding the flock
    summary = [(f["rule"], f["severity"], f["summary"]) for f in document["findings"]]
    assert "lock-contention" not in {f["rule"] for f in document["findings"]}, summary
