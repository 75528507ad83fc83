"""cgroup v1 faults produced for real on this machine, each diagnosed three ways.

- cpu-throttling: an online burst worker (a 20 ms request every 50 ms: ~0.4 CPU of demand)
  in a v1 cpu cgroup with a 0.1-CPU CFS quota (cpu.cfs_quota_us 10000, period 100000).
- pid-exhaustion: a worker starting a thread per request and never joining it, in a v1
  pids cgroup with pids.max 40: thread creation fails (EAGAIN), pids.events max rises.
- busy-under-quota: the same burst worker under a 2-CPU quota: busy, never throttled, and
  no warning.

Each named by `fleetscope diagnose` live (the bench's scenarios: FLEETSCOPE_ACCURACY_LOG),
from a bundle recorded there, and by the exported alert rules on a real Prometheus scraping
the exporter (and `diagnose --prometheus` reading them back). The ground truth is the
kernel's own counters read here (cpu.stat nr_throttled, pids.events max), never the
product's answer. The cgroups carry this test's pid in their names and are removed at the
end; every process is ended by its pid. v2 files are covered in tests/test_cgroups.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fleetscope.core.harm_targets import BY_KEY
from tests.conftest import Recording, require_tool
from tests.test_live_accuracy import (
    FOREIGN_CPU_LIMIT,
    NOISE,
    ForeignLoad,
    Lab,
    Scenario,
    _diagnose,
    _kernel_sigills,
    _record,
    _wait_line,
    assert_healthy_verdict,
    earlier_events,
)
from tests.test_prometheus_scrape import _free_port, _query, _wait_for

pytestmark = pytest.mark.live

LIFETIME_S = 300  # every child ends by itself after this
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Arguments: lifetime in seconds, then the cgroup.procs files to join before any work.
JOIN = """
import os, sys, time
for procs in sys.argv[2:]:
    with open(procs, "w") as handle:
        handle.write(str(os.getpid()))
end = time.time() + float(sys.argv[1])
print("ready", flush=True)
"""
BURST_WORKER = JOIN + """
while time.time() < end:          # an online worker: a 20 ms request every 50 ms
    began = time.process_time()
    while time.process_time() - began < 0.02:
        pass
    time.sleep(0.03)
"""
THREAD_LEAK = JOIN + """
import threading
def handle_request():             # a request thread nobody joins: it waits out the worker
    time.sleep(max(0.0, end - time.time()))
while time.time() < end:
    try:
        threading.Thread(target=handle_request, daemon=True).start()
    except RuntimeError:          # can't start new thread: EAGAIN at pids.max
        pass
    time.sleep(0.05)
"""

SCENARIOS = [
    Scenario("cpu-throttling-v1", "cpu-throttling"),
    Scenario("pid-exhaustion-v1", "pid-exhaustion"),
    Scenario("busy-under-quota-v1", None),
]


def _v1_mount(controller: str) -> Path | None:
    """The v1 mount holding `controller` (cpu may share one with cpuacct)."""
    from fleetscope.collectors.cgroups import parse_mountinfo_cgroups

    with open("/proc/self/mountinfo") as handle:
        mount = parse_mountinfo_cgroups(handle.read()).v1.get(controller)
    return Path("/") / mount.point if mount else None


class V1Cgroups:
    """One cgroup of this test in each v1 hierarchy asked for, removed by `remove()`."""

    def __init__(self, name: str, controllers: tuple[str, ...]):
        if os.geteuid() != 0:
            pytest.skip("creating cgroups needs root")
        self.dirs: dict[str, Path] = {}
        for controller in controllers:
            mount = _v1_mount(controller)
            if mount is None:
                self.remove()
                pytest.skip(f"no cgroup v1 {controller} hierarchy on this machine")
            directory = mount / f"{name}-{os.getpid()}"
            if directory not in self.dirs.values():
                directory.mkdir()
            self.dirs[controller] = directory

    def write(self, controller: str, file_name: str, value: str) -> None:
        (self.dirs[controller] / file_name).write_text(value)

    def read(self, controller: str, file_name: str) -> str:
        return (self.dirs[controller] / file_name).read_text()

    def procs(self) -> list[str]:
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    def remove(self) -> None:
        """rmdir each (a killed task leaves its cgroup a moment after its parent reaped it)."""
        for directory in set(self.dirs.values()):
            for _ in range(50):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            assert not directory.exists(), f"{directory} left behind"


# s/s: where an online process's wait for a CPU is harm (the node config's default)
ONLINE_RUN_DELAY_TARGET = BY_KEY["online_run_delay_ratio"].default


def _run_delay(pid: int, since: tuple[float, float] | None = None):
    """The kernel's count of the time `pid` waited for a CPU (/proc/PID/schedstat, ns):
    (waited, at) now, or with `since` the seconds waited per second since then."""
    with open(f"/proc/{pid}/schedstat") as stat:
        waited = int(stat.read().split()[1]) / 1e9
    now = time.monotonic()
    if since is None:
        return waited, now
    return (waited - since[0]) / max(now - since[1], 1e-9)


def skip_unless_the_worker_was_fine(scenario, foreign_load, waited: float, summary) -> None:
    """"Busy but fine" holds while the pool's worker gets a CPU when it wants one. Where the
    kernel's own count says it waited past the harm target (other programs, or the diagnosis
    itself on a 2-CPU machine, took the CPUs), its users felt that: no verdict is owed, and
    the run is recorded as a skip."""
    if foreign_load.cpus <= FOREIGN_CPU_LIMIT and waited <= ONLINE_RUN_DELAY_TARGET:
        return
    why = (f"{foreign_load.cpus:.1f} CPUs busy with other work, the worker waited "
           f"{waited * 1000:.0f} ms/s for a CPU (schedstat) in the window")
    _record({"scenario": scenario.name, "expected": scenario.expect, "skipped": why})
    pytest.skip(f"{why}: busy-but-fine needs a worker that is fine (it found {summary})")


def _kernel_counters(text: str) -> dict[str, int]:
    return {key: int(value) for key, value in (line.split() for line in text.splitlines())}


def _produce(name: str, lab: Lab) -> V1Cgroups:
    """Start the scenario's fault in fresh cgroups; the pool matches the worker's script."""
    if name == "pid-exhaustion-v1":
        cgroups = V1Cgroups("fs-hcgroup-pids", ("pids",))
        cgroups.write("pids", "pids.max", "40")
        code, script = THREAD_LEAK, "fs_cg_leaky_worker.py"
    else:
        cgroups = V1Cgroups("fs-hcgroup-cpu", ("cpu", "cpuacct"))
        quota = "10000" if name == "cpu-throttling-v1" else "200000"
        cgroups.write("cpu", "cpu.cfs_period_us", "100000")
        cgroups.write("cpu", "cpu.cfs_quota_us", quota)
        code, script = BURST_WORKER, "fs_cg_burst_worker.py"
    try:
        worker = lab.script(script, code, LIFETIME_S, *cgroups.procs(), stdout=subprocess.PIPE)
        assert _wait_line(worker) == "ready"
    except BaseException:
        lab.stop()
        cgroups.remove()
        raise
    if name == "pid-exhaustion-v1":  # matched by its v1 cgroup path, as a pod's cgroup is
        lab.pools.append({"name": "chat-online", "class": "online",
                          "match": {"cgroup": "*/fs-hcgroup-pids-*"}})
    else:
        lab.pool("chat-online", "online", script.removesuffix(".py"))
    time.sleep(3)  # the leak reaches its limit, the throttling settles
    return cgroups


def _ground_truth(name: str, cgroups: V1Cgroups, before: dict[str, int]) -> dict[str, int]:
    """What the kernel counted while the scenario ran."""
    if name == "pid-exhaustion-v1":
        events = _kernel_counters(cgroups.read("pids", "pids.events"))
        return {"pids.current": int(cgroups.read("pids", "pids.current")),
                "refused": events["max"] - before.get("refused", 0)}
    stat = _kernel_counters(cgroups.read("cpu", "cpu.stat"))
    return {"periods": stat["nr_periods"] - before.get("periods", 0),
            "throttled": stat["nr_throttled"] - before.get("throttled", 0)}


def _assert_fault_is_real(name: str, truth: dict[str, int]) -> None:
    if name == "pid-exhaustion-v1":
        assert truth["pids.current"] == 40 and truth["refused"] > 0, truth
    elif name == "cpu-throttling-v1":
        assert truth["throttled"] > 0.5 * truth["periods"] > 0, truth
    else:
        assert truth["throttled"] <= 0.05 * max(truth["periods"], 1), truth


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_cgroup_fault_diagnosed_live(scenario, tmp_path):
    lab = Lab(tmp_path)
    with ForeignLoad() as foreign_load:
        lab.script("fs_cg_noise.py", NOISE, tmp_path, LIFETIME_S)
        cgroups = _produce(scenario.name, lab)
        worker = lab.children[-1].pid  # the pool's one process, started last
        try:
            before = _ground_truth(scenario.name, cgroups, {})
            waited = _run_delay(worker)
            document, code, wall = _diagnose(lab)
            truth = _ground_truth(scenario.name, cgroups, before)
            waited = _run_delay(worker, waited)
        finally:
            lab.stop()
            cgroups.remove()
    _assert_fault_is_real(scenario.name, truth)
    findings = document["findings"]
    # Another program's SIGILL inside the window is this node's isa-mismatch, not ours.
    foreign_sigill = any(c.seconds is not None and c.seconds >= foreign_load.began
                         for c in _kernel_sigills())
    earlier = earlier_events(findings, {scenario.expect})
    serious = [f for f in findings if f["severity"] in ("warning", "critical")
               and not (foreign_sigill and f["rule"] == "isa-mismatch") and f not in earlier]
    # Other programs filling the CPUs beside the fault make a saturated node the truth:
    # set aside, neither the scenario's answer nor a false alarm.
    busy_machine = {"cpu-saturation"} if foreign_load.saturated else set()
    judged = [f for f in serious if f["rule"] not in busy_machine - {scenario.expect}]
    primary = judged[0]["rule"] if judged else None
    false_alarms = sorted({f["rule"] for f in judged} - {scenario.expect})
    _record({"scenario": scenario.name, "expected": scenario.expect, "primary": primary,
             "correct": primary == scenario.expect, "false_alarms": false_alarms,
             "wall_seconds": round(wall, 2), "status": document["status"],
             "findings": [(f["rule"], f["severity"]) for f in findings],
             "foreign_cpus": round(foreign_load.cpus, 2), "kernel": truth})
    summary = [(f["rule"], f["severity"], f["summary"]) for f in findings] + [
        {"harm": document.get("harm"), "foreign_cpus": round(foreign_load.cpus, 2)}]
    if scenario.expect is None and (primary or false_alarms):
        skip_unless_the_worker_was_fine(scenario, foreign_load, waited, summary)
    assert primary == scenario.expect, summary
    assert not false_alarms, (false_alarms, summary)
    if scenario.expect is None:
        assert_healthy_verdict(document, code, [f for f in findings if f not in judged])
        return
    finding = judged[0]
    # The finding names the pool and the test's own cgroup (its path as the process sees it).
    cgroup_name = next(iter(cgroups.dirs.values())).name
    assert "pool chat-online" in finding["summary"], finding["summary"]
    assert any(cgroup_name in c for c in finding["subjects"]["cgroups"]), finding
    assert cgroup_name in finding["summary"], finding["summary"]
    if scenario.expect == "cpu-throttling":
        assert "quota 0.10 CPUs" in finding["summary"], finding["summary"]
    else:
        assert "pids.current 40 of pids.max 40" in finding["summary"], finding["summary"]


def _start(argv: list[str], processes: list) -> subprocess.Popen:
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    processes.append(process)
    return process


@pytest.mark.parametrize("name,rule", [("cpu-throttling-v1", "cpu-throttling"),
                                       ("pid-exhaustion-v1", "pid-exhaustion")])
def test_cgroup_fault_from_bundle_and_prometheus(name, rule, tmp_path, exporter_factory):
    """The same fault recorded as a bundle and diagnosed from it (the bundle carries the v1
    files at their host paths), and alerted by the exported rules on a real Prometheus."""
    prometheus = require_tool("prometheus")
    lab = Lab(tmp_path)
    cgroups = _produce(name, lab)
    processes: list[subprocess.Popen] = []
    recording = None
    try:
        config = tmp_path / "node.yaml"
        config.write_text(yaml.safe_dump({"pools": lab.pools}))
        bundle = tmp_path / "bundle"
        # recorded while Prometheus below watches the same fault
        recording = Recording(["--seconds", "12", "--interval", "2", "-o", str(bundle),
                               "--config", str(config)])

        exporter = exporter_factory("/", {"pools": lab.pools})
        target = exporter.url.removeprefix("http://").removesuffix("/metrics")
        rules = tmp_path / "fleetscope.rules.yml"
        exported = subprocess.run([sys.executable, "-m", "fleetscope", "rules", "export",
                                   "--for", "0s", "-o", str(rules)], capture_output=True,
                                  text=True, timeout=60)
        assert exported.returncode == 0, exported.stderr
        port = _free_port()
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{rules}']\n"
            f"scrape_configs: [{{job_name: node, static_configs: [{{targets: ['{target}']}}]}}]\n")
        _start([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}"], processes)
        base = f"http://127.0.0.1:{port}"
        firing = f'ALERTS{{fleetscope_rule="{rule}",alertstate="firing"}}'
        alerts = _wait_for(base, firing, seconds=120)
        # Why this test takes ~47 s: diagnose --prometheus asks the condition to hold at its
        # three 15 s steps, most of its window
        _wait_for(base, f"count_over_time({firing}[1m]) >= 35", seconds=120)
        from_prometheus = subprocess.run(
            [sys.executable, "-m", "fleetscope", "diagnose", "--prometheus", base, "--node",
             target, "--seconds", "30", "--json"], capture_output=True, text=True, timeout=120)
        # no other pool of the node is named (a kernel-log tier names a cgroup, not a pool)
        healthy_pools = _query(base, f'ALERTS{{fleetscope_rule="{rule}",pool=~".+",'
                                     'pool!="chat-online"}')
        recorded = recording.wait()
        assert recorded.returncode == 0, recorded.stderr
        cgroup_dir = next(iter(cgroups.dirs.values())).relative_to("/")
        kept = {p.name for p in (bundle / "samples" / "s0000" / cgroup_dir).iterdir()}
        assert kept >= ({"pids.current", "pids.max", "pids.events"} if rule == "pid-exhaustion"
                        else {"cpu.stat", "cpu.cfs_quota_us", "cpu.cfs_period_us"}), kept
    finally:
        if recording is not None:
            recording.stop()
        for process in processes:
            process.terminate()
            process.wait(timeout=20)
        lab.stop()
        cgroups.remove()
    assert alerts[0]["metric"]["pool"] == "chat-online", alerts
    assert not healthy_pools, healthy_pools
    document = json.loads(from_prometheus.stdout)
    assert rule in [f["rule"] for f in document["findings"]], document["findings"]

    diagnosed = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                                str(bundle), "--json"], capture_output=True, text=True,
                               timeout=300)
    assert diagnosed.returncode in (1, 2), diagnosed.stderr
    findings = json.loads(diagnosed.stdout)["findings"]
    named = [f for f in findings if f["rule"] == rule]
    assert named and "pool chat-online" in named[0]["summary"], findings
    assert any(cgroup_dir.name in c for c in named[0]["subjects"]["cgroups"]), named[0]
    with contextlib.suppress(StopIteration):  # the bundle's first serious finding is ours,
        first = next(f for f in findings  # but for kernel-log events still in the look-back
                     if f["severity"] in ("warning", "critical")
                     and f not in earlier_events(findings, {rule}))
        assert first["rule"] in (rule, "cpu-saturation"), findings
