"""The memory collector and its parsers: OOM kills from the kernel log (real lines), pool
memory cgroups v1 and v2, per-pool counters that survive killed workers and recreated
cgroups.

Origins of the inputs:
- KILL_6_18: read from this machine's kernel (6.18) after a real kill in a 64 MiB v1 memory
  cgroup (tests/test_live_fault_oom.py produces the same live).
- SYSLOG_5X: a 5.x kernel's global OOM kills as syslog wrote them, quoted in
  github.com/docker/for-linux issue 1001.
- JOURNAL_4X: a 4.x kernel's two-line report (`Kill process ... or sacrifice child`, then
  `Killed process ...`), quoted in github.com/genular/pandora issue 49.
- cgroup v2 files as Documentation/admin-guide/cgroup-v2.rst describes them and
  mm/memcontrol.c prints them (memory_events_show(): `low`, `high`, `max`, `oom`,
  `oom_kill`, `oom_group_kill`, one `%s %lu` line each; memory.max `max` or bytes).
- cgroup v1 files as Documentation/admin-guide/cgroup-v1/memory.rst describes them and this
  machine's kernel printed them (memory.oom_control `oom_kill_disable 0` / `under_oom 0` /
  `oom_kill 1`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetscope.collectors.base import Scrape
from fleetscope.collectors.memory import MemoryCollector
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers.oom import memory_cgroup_path, scan_oom_kills
from fleetscope.collectors.source import RecordedSample
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render

KILL_6_18 = (
    "[  461.742966] python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, "
    "oom_score_adj=0\n"
    "[  461.746414] memory: usage 65536kB, limit 65536kB, failcnt 201\n"
    "[  461.746435] memory+swap: usage 65536kB, limit 9007199254740988kB, failcnt 0\n"
    "[  461.746438] Memory cgroup stats for /h-oom-probe-5399:\n"
    "[  461.746573] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
    "mems_allowed=0,oom_memcg=/h-oom-probe-5399,task_memcg=/h-oom-probe-5399,task=python3,"
    "pid=8953,uid=0\n"
    "[  461.746599] Memory cgroup out of memory: Killed process 8953 (python3) "
    "total-vm:78092kB, anon-rss:65152kB, file-rss:6640kB, shmem-rss:0kB, UID:0 pgtables:200kB "
    "oom_score_adj:0\n")
KMSG_6_18 = (
    "6,371,461746414,-;memory: usage 65536kB, limit 65536kB, failcnt 201\n"
    "6,420,461746573,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
    "mems_allowed=0,oom_memcg=/h-oom-probe-5399,task_memcg=/h-oom-probe-5399,task=python3,"
    "pid=8953,uid=0\n"
    "3,421,461746599,-;Memory cgroup out of memory: Killed process 8953 (python3) "
    "total-vm:78092kB, anon-rss:65152kB, file-rss:6640kB, shmem-rss:0kB, UID:0 pgtables:200kB "
    "oom_score_adj:0\n")
SYSLOG_5X = (
    "May 15 23:09:30 ubuntu-s-1vcpu-2gb-ams3-01 kernel: [  518.050606] Out of memory: Killed "
    "process 15784 (python3) total-vm:11964kB, anon-rss:4288kB, file-rss:3028kB, "
    "shmem-rss:0kB\n"
    "May 15 23:09:30 ubuntu-s-1vcpu-2gb-ams3-01 kernel: [  518.053407] oom_reaper: reaped "
    "process 15784 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB\n"
    "May 15 23:09:30 ubuntu-s-1vcpu-2gb-ams3-01 kernel: [  518.061172] Out of memory: Killed "
    "process 15925 ((resolved)) total-vm:168424kB, anon-rss:4064kB, file-rss:3584kB, "
    "shmem-rss:0kB\n")
JOURNAL_4X = (
    "May 07 21:43:54 doom kernel: Out of memory: Kill process 27438 (R) score 31 or sacrifice "
    "child\n"
    "May 07 21:43:54 doom kernel: Killed process 27438 (R) total-vm:38349780kB, "
    "anon-rss:1041924kB, file-rss:4kB, shmem-rss:0kB\n")


def test_a_memcg_kill_names_the_process_its_cgroup_limit_and_usage():
    for text in (KILL_6_18, KMSG_6_18):
        (kill,) = scan_oom_kills(text)
        assert (kill.pid, kill.comm, kill.constraint) == (8953, "python3", "memcg")
        assert kill.memcg == kill.oom_memcg == "/h-oom-probe-5399"
        assert (kill.usage_kb, kill.limit_kb, kill.failcnt) == (65536, 65536, 201)
        assert kill.anon_rss_kb == 65152 and kill.seconds == pytest.approx(461.746599)


def test_global_kills_from_syslog_and_the_older_two_line_report():
    kills = scan_oom_kills(SYSLOG_5X)
    assert [(k.pid, k.comm, k.constraint) for k in kills] == [
        (15784, "python3", "global"), (15925, "(resolved)", "global")]
    assert kills[0].seconds == pytest.approx(518.050606) and kills[0].limit_kb is None
    (old,) = scan_oom_kills(JOURNAL_4X)
    assert (old.pid, old.comm, old.constraint, old.anon_rss_kb) == (27438, "R", "global",
                                                                    1041924)


def test_the_memory_line_of_proc_pid_cgroup():
    assert memory_cgroup_path("9:name=systemd:/\n4:memory:/w/x\n0::/\n") == ("v1", "/w/x")
    assert memory_cgroup_path("12:cpu,cpuacct:/a\n10:memory,hugetlb:/b\n") == ("v1", "/b")
    assert memory_cgroup_path("0::/kubepods.slice/pod1\n") == ("v2", "/kubepods.slice/pod1")
    assert memory_cgroup_path("5:cpu:/only\n") is None


def test_nul_bytes_are_not_a_kernel_log():
    with pytest.raises(ParseError):
        scan_oom_kills("Killed process \x00")


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _events(oom_kill: int, limit_hits: int, high: int = 0) -> str:
    return (f"low 0\nhigh {high}\nmax {limit_hits}\noom {oom_kill}\noom_kill {oom_kill}\n"
            "oom_group_kill 0\n")


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


CONFIG = parse_config({"pools": [{"name": "tools", "class": "online",
                                  "match": {"cmdline": "agent.tool"}}]})
POOL = '{pool="tools",class="online"}'
V2_DIR = "sys/fs/cgroup/kubepods.slice/pod-a/tool"


def _v2_node(root: Path, oom_kill: int, limit_hits: int, worker: bool = True) -> None:
    files = {
        "proc/stat": "cpu  1 0 1 100 0 0 0 0 0 0\ncpu0 1 0 1 100 0 0 0 0 0 0\nbtime 1764662000\n",
        "proc/vmstat": "nr_free_pages 100\nallocstall_normal 7\nallocstall_movable 2\n"
                       "pgscan_kswapd 500\npgscan_direct 40\npgsteal_kswapd 450\n"
                       "pgsteal_direct 30\noom_kill 5\n",
        "dmesg.txt": KILL_6_18,
        f"{V2_DIR}/memory.events": _events(oom_kill, limit_hits, high=5),
        f"{V2_DIR}/memory.current": "2147483648\n",
        f"{V2_DIR}/memory.max": "2147483648\n",
        f"{V2_DIR}/memory.pressure": "some avg10=12.50 avg60=8.00 avg300=2.10 total=4000000\n"
                                     "full avg10=6.00 avg60=3.00 avg300=1.00 total=1500000\n",
    }
    if worker:
        files["proc/4242/cmdline"] = "python3\0-m\0agent.tool\0"
        files["proc/4242/cgroup"] = "0::/kubepods.slice/pod-a/tool\n"
    _write(root, files)
    if not worker:
        for name in ("cmdline", "cgroup"):
            (root / f"proc/4242/{name}").unlink(missing_ok=True)


def test_cgroup_v2_memory_events_per_pool_and_node_counters(tmp_path):
    _v2_node(tmp_path, oom_kill=2, limit_hits=17)
    collector = MemoryCollector(CONFIG)
    got = _samples(render(collector.collect(Scrape(RecordedSample(str(tmp_path)), 1764662500.0))))
    assert got[f"fleetscope_pool_memory_oom_kills_total{POOL}"] == 2
    assert got[f"fleetscope_pool_memory_limit_hits_total{POOL}"] == 17
    assert got[f"fleetscope_pool_memory_high_events_total{POOL}"] == 5
    assert got[f"fleetscope_pool_memory_usage_ratio{POOL}"] == 1.0
    assert got[f"fleetscope_pool_memory_limit_bytes{POOL}"] == 2147483648
    assert got['fleetscope_pool_memory_stall_seconds_total{pool="tools",class="online",'
               'stall="some"}'] == 4.0
    assert got["fleetscope_vmstat_oom_kills_total"] == 5
    assert got["fleetscope_memory_allocation_stalls_total"] == 9
    assert got['fleetscope_memory_reclaim_scanned_pages_total{mode="direct"}'] == 40
    # The kernel log (dmesg.txt of a bundle): one memcg kill, at btime + 461.7 s.
    assert got['fleetscope_oom_kills_logged_total{constraint="memcg"}'] == 1
    assert got['fleetscope_oom_kills_logged_total{constraint="global"}'] == 0
    assert got['fleetscope_oom_kill_last_timestamp_seconds{constraint="memcg"}'] == \
        pytest.approx(1764662000 + 461.747, abs=0.01)


def test_pool_kills_survive_a_killed_worker_and_a_recreated_cgroup(tmp_path):
    collector = MemoryCollector(CONFIG)
    metric = f"fleetscope_pool_memory_oom_kills_total{POOL}"

    def scrape(at: float) -> float:
        text = render(collector.collect(Scrape(RecordedSample(str(tmp_path)), at)))
        return _samples(text)[metric]

    _v2_node(tmp_path, oom_kill=2, limit_hits=17)
    assert scrape(1000.0) == 2
    # The worker was killed again and is not restarted yet: the cgroup is still read.
    _v2_node(tmp_path, oom_kill=3, limit_hits=20, worker=False)
    assert scrape(1010.0) == 3
    # The supervisor recreated the cgroup (counters from zero) and the worker was killed in it.
    _v2_node(tmp_path, oom_kill=1, limit_hits=4)
    assert scrape(1020.0) == 4


def test_cgroup_v1_memory_files_from_the_memory_hierarchy_line(tmp_path):
    _write(tmp_path, {
        "proc/77/cmdline": "python3\0/srv/agent.tool.py\0",
        "proc/77/cgroup": "9:name=systemd:/\n4:memory:/fs-acc-w\n1:cpu:/\n0::/\n",
        "sys/fs/cgroup/memory/fs-acc-w/memory.oom_control":
            "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
        "sys/fs/cgroup/memory/fs-acc-w/memory.failcnt": "379\n",
        "sys/fs/cgroup/memory/fs-acc-w/memory.limit_in_bytes": "67108864\n",
        "sys/fs/cgroup/memory/fs-acc-w/memory.usage_in_bytes": "48050176\n",
        # the v2 hierarchy beside it holds the process at its root: not the pool's cgroup
        "sys/fs/cgroup/unified/memory.events": _events(99, 99),
    })
    scrape = Scrape(RecordedSample(str(tmp_path)), 1.0)
    got = _samples(render(MemoryCollector(CONFIG).collect(scrape)))
    assert got[f"fleetscope_pool_memory_oom_kills_total{POOL}"] == 4
    assert got[f"fleetscope_pool_memory_limit_hits_total{POOL}"] == 379
    assert got[f"fleetscope_pool_memory_limit_bytes{POOL}"] == 67108864
    assert got[f"fleetscope_pool_memory_usage_ratio{POOL}"] == pytest.approx(0.716, abs=0.001)
    assert f"fleetscope_pool_memory_high_events_total{POOL}" not in got  # v1 has no high


def test_a_node_without_kills_or_pools_in_cgroups(tmp_path):
    _write(tmp_path, {"proc/vmstat": "oom_kill 0\npgscan_kswapd 10\n",
                      "dmesg.txt": "[    0.000000] Linux version 6.18.0\n",
                      "proc/9/cmdline": "python3\0-m\0agent.tool\0", "proc/9/cgroup": "0::/\n"})
    collector = MemoryCollector(CONFIG)
    scrape = Scrape(RecordedSample(str(tmp_path)), 1.0)
    got = _samples(render(collector.collect(scrape)))
    assert got['fleetscope_oom_kills_logged_total{constraint="memcg"}'] == 0
    assert not any(name.startswith("fleetscope_pool_memory") for name in got)
    assert scrape.sources[("memory", "sys/fs/cgroup/<memory cgroup>")][0] is False


def test_mount_points_from_mountinfo():
    """This machine's /proc/self/mountinfo lines (v1 controllers under /sys/fs/cgroup/<ctrl>,
    the v2 hierarchy at /sys/fs/cgroup/unified), and a cgroup-namespaced subtree mount."""
    from fleetscope.collectors.memory import _mounts_from_mountinfo

    text = (
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
        "52 40 0:32 /kubepods /host/memory rw - cgroup cgroup rw,memory\n")
    assert _mounts_from_mountinfo(text) == (("sys/fs/cgroup/memory",),
                                            ("sys/fs/cgroup/unified",))
    joined = "36 31 0:33 / /sys/fs/cgroup/cpu,memory rw shared:9 - cgroup cgroup rw,cpu,memory\n"
    assert _mounts_from_mountinfo(joined) == (("sys/fs/cgroup/cpu,memory",), ())
