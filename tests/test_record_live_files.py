"""A live recording carries the files the exporter reads live, /proc/sys included.

Reproduced: every live bundle lacked proc/sys/* (somaxconn, threads-max, pid_max, ...): one
16 MiB read of a /proc/sys file fails with ENOMEM (the handler allocates what is asked), and
the copy took the error for an absent file, so a bundle's tuning and fork-limit rules read
less than the live node's.
"""

from __future__ import annotations

import os

from tests.hostile_corpus import run

TUNABLES = ("proc/sys/net/core/somaxconn", "proc/sys/kernel/threads-max",
            "proc/sys/kernel/pid_max")


def test_a_live_bundle_holds_the_proc_sys_files_as_the_kernel_prints_them(tmp_path):
    present = [name for name in TUNABLES if os.path.exists(f"/{name}")]
    assert present, "no /proc/sys tunable on this machine"
    bundle = tmp_path / "bundle"
    recorded = run(["bundle", "record", "--seconds", "1", "--interval", "1", "-o",
                    str(bundle)], timeout=300)
    assert recorded.returncode == 0, recorded.stderr
    sample = bundle / "samples" / "s0000"
    for name in present:
        with open(f"/{name}", "rb") as live:
            expected = live.read(4096)  # a page: what /proc/sys serves in one read
        assert (sample / name).read_bytes() == expected, name


def test_an_oom_killed_cgroup_keeps_each_samples_own_kill_count(tmp_path):
    """Reproduced: the marker of a killed cgroup's existence, copied into every sample when
    the recording ends, overwrote the memory.oom_control each sample had read at its time
    (a pool's cgroup), so its kill counter read flat and the replay counted no pool kill."""
    from fleetscope.bundle.record import capture_event_cgroups
    from fleetscope.collectors.source import RecordedSample

    memcg = "/kubepods/burstable/pod-tools/worker"
    control = f"sys/fs/cgroup/memory{memcg}/memory.oom_control"
    node = tmp_path / "node"
    (node / control).parent.mkdir(parents=True)
    (node / control).write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    dmesg = (f"[ 100.000402] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=worker,"
             f"mems_allowed=0,oom_memcg={memcg},task_memcg={memcg},task=python3,pid=4242,"
             "uid=0\n[ 100.000431] Memory cgroup out of memory: Killed process 4242 (python3) "
             "total-vm:400000kB, anon-rss:65000kB, file-rss:2000kB, shmem-rss:0kB, UID:0 "
             "pgtables:400kB oom_score_adj:0\n")
    samples = [tmp_path / "s0000", tmp_path / "s0001"]
    (samples[0] / control).parent.mkdir(parents=True)
    (samples[0] / control).write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    capture_event_cgroups(RecordedSample(str(node)).reader(), dmesg, [str(s) for s in samples])
    assert "oom_kill 5" in (samples[0] / control).read_text()  # as read at its time
    assert "oom_kill 7" in (samples[1] / control).read_text()  # it exists: the end's copy
