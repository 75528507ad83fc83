"""Faults in sequence on one node, as they come in an incident, diagnosed live each time.

First a tool worker is OOM-killed four times in a 64 MiB memory cgroup, which is then removed
(the job deleted). Then, inside the 15-minute look-back of that kill, one fault after another
hurts the online pool chat-online (the example agent worker, its users stamping
X-Request-Start):

    slow-dependency   its tool answers after 1.2 s
    lock-contention   four workers append their state to one file under an exclusive flock,
                      each holding it 250 ms: the workers take turns
    cpu-throttling    the worker runs in a v1 cpu cgroup with a 0.1-CPU CFS quota

Each diagnosis must lead with the live fault, explaining chat-online's harm (the harm
section names the pool and the rule); the OOM kill, whose cgroup is gone, is listed after it
as an event that ended (a warning of phase "ended"), never first and never explaining the
harm. Ground truth: the kernel's own count of kills in the removed cgroup, the faults started
here. `bench/live_accuracy.py` repeats this module and prints the runs.

Every process is started here, ends by itself and is killed by pid; the cgroups carry this
test's pid in their names and are removed here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from tests.live_agents import POOL, settle, start_tool, start_users, start_workers
from tests.test_live_accuracy import LIFETIME_S, NOISE, Lab, _diagnose, _record
from tests.test_live_fault_cgroup import V1Cgroups
from tests.test_live_fault_oom import LEAK, LIMIT_BYTES, SUPERVISOR, _wait_kills, memory_cgroup

pytestmark = pytest.mark.live

KILLS = 4
SLOW_TOOL_S = 1.2


def _slow_tool(lab: Lab) -> None:
    tool = start_tool(lab, SLOW_TOOL_S)
    base = start_workers(lab, 1, "--tool-url", tool, "--tool-timeout", "5")[0]
    start_users(lab, base, 4)


def _file_lock(lab: Lab) -> None:
    state = lab.tmp / "sessions.jsonl"
    for base in start_workers(lab, 4, "--state-file", state, "--state-file-ms", "250"):
        start_users(lab, base, 2)


def _throttled(lab: Lab, cgroups: list) -> None:
    quota = V1Cgroups("fs-seq-throttle", ("cpu",))
    cgroups.append(quota)
    quota.write("cpu", "cpu.cfs_period_us", "100000")
    quota.write("cpu", "cpu.cfs_quota_us", "10000")
    base = start_workers(lab, 1, "--inference-ms", "40", join=tuple(quota.procs()))[0]
    start_users(lab, base, 4)


FAULTS = {"slow-dependency": _slow_tool, "lock-contention": _file_lock,
          "cpu-throttling": _throttled}


def _oom_kills_then_remove(lab: Lab) -> tuple[int, float]:
    """A tool worker killed KILLS times in its memory cgroup; its supervisor stopped and the
    cgroup removed. (kills the kernel counted there, when the last one was seen)"""
    leak = lab.tmp / "fs_seq_oom_leak.py"
    leak.write_text(LEAK)
    with memory_cgroup("seq", LIMIT_BYTES) as cgroup:
        supervisor = lab.script("fs_seq_oom_supervisor.py", SUPERVISOR, cgroup, leak,
                                LIFETIME_S, KILLS)
        try:
            killed = _wait_kills(cgroup, KILLS, 120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisor.pid, signal.SIGKILL)
            supervisor.wait()
    return killed, time.time()


def _check(fault: str, document: dict, code: int, kill_age: float) -> None:
    findings = document["findings"]
    summary = [(f["rule"], f["severity"], f.get("phase"), f["summary"][:90]) for f in findings]
    first = findings[0] if findings else {}
    assert first.get("rule") == fault, summary
    assert POOL in first["explains"], summary
    harm = [h for h in document["harm"] if h["pool"] == POOL]
    assert harm and all(fault in h["explained_by"] for h in harm), document["harm"]
    assert code >= 1
    kills = [f for f in findings if f["rule"] == "oom-kill"]
    if kill_age < 14 * 60:  # inside the look-back: said, as ended
        assert kills, summary
        assert kills[0]["phase"] == "ended" and kills[0]["severity"] == "warning", kills[0]
        assert kills[0]["explains"] == []
        assert findings.index(kills[0]) > findings.index(first)


def test_a_live_fault_leads_and_an_earlier_kill_in_a_removed_cgroup_is_history(tmp_path):
    # Slow (~85 s) by design: the OOM kills, then three faults each diagnosed over a 20 s
    # window, all inside one look-back.
    lab = Lab(tmp_path)
    cgroups: list = []
    results = []
    try:
        killed, killed_at = _oom_kills_then_remove(lab)
        assert killed >= KILLS  # the kernel's own count, in the cgroup since removed
        lab.stop()
        for fault, start in FAULTS.items():
            lab = Lab(tmp_path / fault)
            lab.tmp.mkdir()
            lab.script("fs_acc_noise.py", NOISE, lab.tmp, LIFETIME_S)
            try:
                start(lab, cgroups) if fault == "cpu-throttling" else start(lab)
                settle()
                document, code, wall = _diagnose(lab)
            finally:
                lab.stop()
                for cgroup in cgroups:
                    cgroup.remove()
                cgroups.clear()
            findings = document["findings"]
            first = findings[0]["rule"] if findings else None
            _record({"scenario": f"after-oom:{fault}", "expected": fault, "primary": first,
                     "correct": first == fault, "wall_seconds": round(wall, 2),
                     "status": document["status"],
                     "findings": [(f["rule"], f["severity"], f.get("phase")) for f in findings],
                     "kill_age_seconds": round(time.time() - killed_at)})
            results.append((fault, document, code, time.time() - killed_at))
    finally:
        lab.stop()
        for cgroup in cgroups:
            cgroup.remove()
    for fault, document, code, kill_age in results:
        _check(fault, document, code, kill_age)
