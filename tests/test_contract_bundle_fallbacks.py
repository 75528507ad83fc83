"""Bundles as a recorder other than `bundle record` writes them (the bundle format's own list
of files: no proc/<pid>/task/ directories, and here no proc/schedstat either, as on a kernel
without CONFIG_SCHEDSTATS), built with the scenario kit (tests/fixtures/make_scenarios.py:
every file in the kernel's format) around a known injected cause, then diagnosed through the
CLI as a user would.

- thread-oversubscription: three workers of 560 threads each on 8 physical cores, their
  main threads asleep (each waits on its workers) while the workers fill the CPUs. The main
  threads' states alone read as 0 runnable threads; the bundle still holds the threads per
  core (status `Threads:`), the node's runnable tasks (procs_running) and CPU pressure.
- core-imbalance without /proc/schedstat: four workers pinned to 4 of 64 CPUs, the other 60
  idle, CPU pressure at 16 %.
Beside each, the same kind of node without the fault must not get that finding.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from tests import fixture_trees

KIT = fixture_trees.load_generator("scenarios", "make_scenarios_contract_fallbacks")
PSI_HIGH = [3.0, 78.0, 79.0, 77.0, 78.0, 80.0, 78.0, 79.0]
# Four NUMA nodes of 16 CPUs: the 64-CPU node of the field report.
KUNPENG_64 = dataclasses.replace(
    KIT.KUNPENG, ncpu=64, node_cpus={n: list(range(16 * n, 16 * n + 16)) for n in range(4)})
HOT_CPUS = [16, 17, 18, 19]


def _contract_bundle(tmp_path, scenario) -> str:
    """The scenario's bundle, without what the bundle format does not list."""
    root = KIT.write_bundle(tmp_path, scenario)
    for sample in (root / "samples").iterdir():
        (sample / "proc/schedstat").unlink(missing_ok=True)
        assert not list(sample.glob("proc/*/task"))
    return str(root)


def _findings(bundle: str) -> tuple[list[dict], dict]:
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle", bundle,
                             "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1, 2), result.stderr
    document = json.loads(result.stdout)
    return [f for f in document["findings"] if f["severity"] in ("warning", "critical")], document


def _oversubscribed_node(name: str, threads: int, worker_cpus: float, psi, runnable: float,
                         batch: bool = False):
    """Three online workers of `threads` threads whose main threads sleep, using
    `worker_cpus` CPUs each; with `batch`, an ETL job takes the rest of the node."""
    workers = KIT.workers(KIT.X86, KIT.ONLINE_X86, worker_cpus,
                          threads=(threads,) * 4, state="S", lead_run=0.01, lead_wait=0.004,
                          vcs=3.0, ivcs=0.2)[:3]
    extra = [KIT.etl(KIT.X86, range(16), 13.5)] if batch else []
    return KIT.x86_scenario(
        name, "agent-x86-21", "three workers of many threads", "main threads asleep",
        uptime_days=5.5, procs=KIT.daemons(KIT.X86) + workers + extra,
        background=KIT.background(KIT.X86, 0.6, 0.02), slices=6000.0, wait_ratio=0.6,
        extra_runnable=runnable,
        profile={"system": 0.32, "nice": 0.0, "irq": 0.008, "softirq": 0.03},
        psi={"cpu": psi, "memory": 0.05, "io": 0.3},
        cgroups={KIT.ONLINE_CG: {"pressure": 1.5}})


def test_thread_oversubscription_from_a_bundle_without_task_directories(tmp_path):
    # the truth: 1,680 threads on 8 physical cores, nearly all runnable, the CPUs full
    bundle = _contract_bundle(tmp_path, _oversubscribed_node(
        "oversubscribed", 560, 4.6, PSI_HIGH, 150.0))
    serious, _ = _findings(bundle)
    assert serious and serious[0]["rule"] == "thread-oversubscription", serious
    finding = serious[0]
    assert "chat-online" in finding["summary"]
    assert len(finding["subjects"]["pids"]) == 3
    signals = {e["signal"] for e in finding["evidence"]}
    assert any("main threads only" in s for s in signals), signals
    # a main thread's sleeping state is not shown as the pool's runnable threads
    assert "runnable threads per physical core" not in signals


def test_many_sleeping_threads_on_a_node_a_batch_job_fills_are_not_oversubscription(tmp_path):
    # the same 1,680 threads, asleep (the pool uses 0.1 CPU), while an ETL job keeps the
    # node's CPUs and run queues full: saturation, not the pool's threads
    bundle = _contract_bundle(tmp_path, _oversubscribed_node(
        "sleeping-pools", 560, 0.03, PSI_HIGH, 40.0, batch=True))
    serious, _ = _findings(bundle)
    assert "thread-oversubscription" not in {f["rule"] for f in serious}, serious


def _pinned_node(name: str, psi: float, workers_cpu: float, hot=HOT_CPUS, count: int = 4,
                 lead_wait: float = 0.42):
    """`count` workers pinned to `hot` of 64 CPUs, their memory local to those CPUs."""
    return KIT.Scenario(
        name, KUNPENG_64, "agent-kp-64", "four workers pinned to four CPUs of 64",
        "four CPUs saturated, sixty idle",
        uptime_days=5.1, procs=KIT.daemons(KUNPENG_64) + KIT.workers(
            KUNPENG_64, hot, workers_cpu, threads=(6, 6, 6, 6),
            anon_nodes={1: 0.97, 0: 0.03}, file_nodes={1: 1.0}, lead_run=0.45,
            lead_wait=lead_wait, ivcs=80.0)[:count],
        background=KIT.background(KUNPENG_64, 0.03, 0.02), wait_ratio=0.6,
        irqs=KIT.kp_irqs(), perf={"bandwidth": 0.1, "llc_miss": 0.12, "ipc": 1.05},
        psi={"cpu": [2.0] + [psi] * 7, "memory": 0.05, "io": 0.3},
        agent=KIT.AgentPlan(sessions=7.0, session_median=0.8, queue_wait_median=0.9,
                            queue=[14, 17, 19, 22, 24, 27, 29, 32],
                            heartbeat=[1.3, 2.2, 1.7, 2.9, 2.4, 1.9, 3.1, 2.6]),
        cgroups={KIT.ONLINE_CG: {"pressure": 1.2}}, nic_gbps=3.0)


def test_core_imbalance_without_schedstat_counts_waiting_beside_idle_cores(tmp_path):
    bundle = _contract_bundle(tmp_path, _pinned_node("pinned-64", 16.0, 1.0))
    serious, _ = _findings(bundle)
    assert serious and serious[0]["rule"] == "core-imbalance", serious
    assert serious[0]["subjects"]["cpus"] == HOT_CPUS
    assert "pinned" in serious[0]["summary"]


@pytest.mark.parametrize("name", ["healthy-idle", "healthy-busy"])
def test_healthy_bundles_without_schedstat_stay_silent(tmp_path, name):
    scenario = {"healthy-idle": KIT.healthy_idle, "healthy-busy": KIT.healthy_busy}[name]()
    serious, document = _findings(_contract_bundle(tmp_path, scenario))
    assert not serious and document["status"] == "ok", serious


def test_one_busy_thread_on_an_idle_node_without_schedstat_is_no_imbalance(tmp_path):
    # uneven (one core full, 63 idle) but nobody waits: PSI near zero
    bundle = _contract_bundle(tmp_path, _pinned_node("one-busy-core", 1.2, 0.98, hot=[16],
                                                     count=1, lead_wait=0.002))
    serious, _ = _findings(bundle)
    assert "core-imbalance" not in {f["rule"] for f in serious}, serious
