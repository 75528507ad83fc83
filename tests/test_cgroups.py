"""cgroup v1 and v2 alike: where a pool's cgroup files are, and what the pools collector
reads there, on the layouts real hosts have.

Origins of the texts below:
- THIS_MACHINE_*: read verbatim on the 6.18 test machine (v1 controllers one a mount, v2 at
  /sys/fs/cgroup/unified): /proc/self/mountinfo's cgroup lines, a test cgroup's /proc/<pid>/
  cgroup and its v1 cpu.stat with cpu.cfs_quota_us 10000.
- FEDORA_MOUNTINFO: a Fedora host's mountinfo as published in moby/moby's pkg/mount tests
  (cpu and cpuacct joined in one "cpu,cpuacct" mount, options in the order "cpuacct,cpu", as
  systemd mounts them on CentOS and openEuler).
- v2 files: the formats of Documentation/admin-guide/cgroup-v2.rst (cpu.max "$MAX $PERIOD",
  pids.max "max" or a number, pids.events flat-keyed "max N", cpu.stat flat-keyed usec).
- fork-rejected lines: dmesg, dmesg -T and journal lines from public troubleshooting notes,
  the kernel's pr_info "cgroup: fork rejected by pids controller in " plus the path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetscope.collectors.base import Scrape
from fleetscope.collectors.cgroups import cgroup_mounts, locate, parse_mountinfo_cgroups
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers.cgroup import parse_hierarchies, parse_pids
from fleetscope.collectors.parsers.pids_log import fork_rejections
from fleetscope.collectors.source import RecordedSample
from fleetscope.core.exposition import render
from tests.test_pools import LIMITS_REAL, STAT_REAL, STATUS_REAL, collect, pools_exporter

THIS_MACHINE_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
THIS_MACHINE_CGROUP = ("9:name=systemd:/\n8:pids:/fs-hcgroup-manual-5364\n7:blkio:/\n"
                       "6:freezer:/\n5:devices:/\n4:memory:/process_api/78c8104df14e92b7\n"
                       "3:cpuset:/\n2:cpuacct:/fs-hcgroup-manual-5364\n"
                       "1:cpu:/fs-hcgroup-manual-5364\n0::/\n")
THIS_MACHINE_V1_CPU_STAT = ("nr_periods 32\nnr_throttled 32\nthrottled_time 2798266225\n"
                            "nr_bursts 0\nburst_time 0\n")
FEDORA_MOUNTINFO = """\
23 16 0:18 / /sys/fs/cgroup rw,nosuid,nodev,noexec shared:9 - tmpfs tmpfs rw,seclabel,mode=755
24 23 0:19 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup \
rw,xattr,release_agent=/usr/lib/systemd/systemd-cgroups-agent,name=systemd
26 23 0:21 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup \
rw,cpuset,clone_children
27 23 0:22 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:12 - cgroup \
cgroup rw,cpuacct,cpu,clone_children
28 23 0:23 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup \
rw,memory,clone_children
"""
V2_ONLY_MOUNTINFO = ("35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - "
                     "cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n")
OPENEULER_CGROUP = ("11:pids:/kubepods/burstable/pod1234/c0ffee\n"
                    "4:cpu,cpuacct:/kubepods/burstable/pod1234/c0ffee\n"
                    "1:name=systemd:/kubepods/burstable/pod1234/c0ffee\n")


def test_this_machines_mounts_put_each_controller_where_it_is():
    mounts = parse_mountinfo_cgroups(THIS_MACHINE_MOUNTINFO)
    lines = parse_hierarchies(THIS_MACHINE_CGROUP)
    cpu = locate(mounts, lines, "cpu")
    assert cpu.directory == "sys/fs/cgroup/cpu/fs-hcgroup-manual-5364" and cpu.version == 1
    assert locate(mounts, lines, "cpuacct").directory == \
        "sys/fs/cgroup/cpuacct/fs-hcgroup-manual-5364"
    assert locate(mounts, lines, "pids").directory == "sys/fs/cgroup/pids/fs-hcgroup-manual-5364"
    # the hybrid host's v2 line names the unified hierarchy, which holds no controller here
    assert mounts.v2.point == "sys/fs/cgroup/unified"


def test_joined_cpu_cpuacct_mount_of_centos_and_openeuler():
    mounts = parse_mountinfo_cgroups(FEDORA_MOUNTINFO)
    lines = parse_hierarchies(OPENEULER_CGROUP)
    for controller in ("cpu", "cpuacct"):
        assert locate(mounts, lines, controller).directory == \
            "sys/fs/cgroup/cpu,cpuacct/kubepods/burstable/pod1234/c0ffee"
    assert locate(mounts, lines, "pids") is None  # no pids hierarchy mounted: not guessed
    assert mounts.v2 is None


def test_v2_only_host_reads_the_unified_directory():
    mounts = parse_mountinfo_cgroups(V2_ONLY_MOUNTINFO)
    lines = parse_hierarchies("0::/kubepods.slice/online/agent-chat\n")
    for controller in ("cpu", "pids"):
        where = locate(mounts, lines, controller)
        assert (where.directory, where.version) == (
            "sys/fs/cgroup/kubepods.slice/online/agent-chat", 2)


def test_a_mount_of_a_subtree_maps_paths_under_its_root_only():
    # a container's bind mount of its own cgroup (mount root = its path in the hierarchy)
    mounts = parse_mountinfo_cgroups(
        "43 35 0:37 /kubepods/pod1 /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n")
    inside = parse_hierarchies("4:cpu,cpuacct:/kubepods/pod1/c1\n")
    outside = parse_hierarchies("4:cpu,cpuacct:/system.slice/sshd.service\n")
    assert locate(mounts, inside, "cpu").directory == "sys/fs/cgroup/cpu,cpuacct/c1"
    assert locate(mounts, outside, "cpu") is None


@pytest.mark.parametrize("text", ["12:cpu\n", ""])
def test_malformed_proc_cgroup_is_a_parse_error(text):
    with pytest.raises(ParseError):
        parse_hierarchies(text)


def test_pids_files_in_the_kernels_format():
    assert parse_pids("40\n", "40\n", "max 161\n") == (40, 40, 161)
    assert parse_pids("7\n", "max\n", "max 0\n").limit is None
    with pytest.raises(ParseError):
        parse_pids("7\n", "unlimited\n", None)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _v1_tree(root: Path, mountinfo: str | None, cpu_dir: str, cpuacct_dir: str,
             cgroup_text: str) -> Path:
    """A worker process in v1 cpu/cpuacct/pids cgroups: this machine's files, verbatim."""
    pid = 4242
    _write(root / f"proc/{pid}/cmdline", "python3\0chat_worker.py\0")
    _write(root / f"proc/{pid}/stat", STAT_REAL.replace("30168 (sleep)", f"{pid} (python3)"))
    _write(root / f"proc/{pid}/status", STATUS_REAL)
    _write(root / f"proc/{pid}/limits", LIMITS_REAL)
    _write(root / f"proc/{pid}/cgroup", cgroup_text)
    (root / f"proc/{pid}/fd").mkdir(parents=True)
    _write(root / "proc/stat", "cpu  1 0 1 100 0 0 0 0 0 0\ncpu0 1 0 1 100 0 0 0 0 0 0\n")
    if mountinfo is not None:
        _write(root / "proc/self/mountinfo", mountinfo)
    _write(root / cpu_dir / "cpu.stat", THIS_MACHINE_V1_CPU_STAT)
    _write(root / cpu_dir / "cpu.cfs_quota_us", "10000\n")
    _write(root / cpu_dir / "cpu.cfs_period_us", "100000\n")
    _write(root / cpuacct_dir / "cpuacct.usage", "330361000\n")
    pids_dir = root / "sys/fs/cgroup/pids/fs-hcgroup-manual-5364"
    _write(pids_dir / "pids.current", "40\n")
    _write(pids_dir / "pids.max", "40\n")
    _write(pids_dir / "pids.events", "max 161\n")
    return root


POOL = 'class="online",pool="chat-online"'
CONFIG = {"pools": [{"name": "chat-online", "class": "online",
                     "match": {"cmdline": "chat_worker"}}]}


def _pool_metrics(root: Path) -> dict[str, float]:
    got = collect(pools_exporter(root, pools=CONFIG["pools"]), 1000.0)
    return {k.split("{")[0].removeprefix("fleetscope_pool_"): v for k, v in got.items()
            if POOL in k and ("cgroup" in k or "nproc" in k)}


V1_EXPECTED = {
    "cgroups": 1, "cgroup_cpu_quota_cpus": 0.1, "cgroup_cpu_periods_total": 32,
    "cgroup_cpu_throttled_periods_total": 32, "cgroup_cpu_throttled_seconds_total": 2.798266,
    "cgroup_cpu_usage_seconds_total": 0.330361, "cgroup_pids_usage_ratio": 1.0,
    "cgroup_pids_current": 40, "cgroup_pids_limit": 40, "cgroup_pids_limit_hits_total": 161,
    "nproc_limit": 96363,
}


@pytest.mark.parametrize("mountinfo", [THIS_MACHINE_MOUNTINFO, None],
                         ids=["mountinfo", "listing-without-mountinfo"])
def test_v1_pool_signals_on_this_machines_layout(tmp_path, mountinfo):
    """The v1 names and units (throttled_time ns, cpuacct.usage ns, cfs quota/period) come
    out under the same metrics, with the same meaning, as v2's."""
    cgroup = "fs-hcgroup-manual-5364"
    root = _v1_tree(tmp_path, mountinfo, f"sys/fs/cgroup/cpu/{cgroup}",
                    f"sys/fs/cgroup/cpuacct/{cgroup}", THIS_MACHINE_CGROUP)
    assert _pool_metrics(root) == pytest.approx(V1_EXPECTED)


def test_v1_pool_signals_on_a_joined_cpu_cpuacct_mount(tmp_path):
    directory = "sys/fs/cgroup/cpu,cpuacct/kubepods/burstable/pod1234/c0ffee"
    cgroup_text = OPENEULER_CGROUP.replace(
        "11:pids:/kubepods/burstable/pod1234/c0ffee", "11:pids:/fs-hcgroup-manual-5364")
    mounts = FEDORA_MOUNTINFO + ("39 23 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup "
                                 "rw,pids\n")
    root = _v1_tree(tmp_path, mounts, directory, directory, cgroup_text)
    assert _pool_metrics(root) == pytest.approx(V1_EXPECTED)


def test_v2_pool_signals_in_the_kernels_format(tmp_path):
    """v2 files as cgroup-v2.rst prints them: a 0.1-CPU cpu.max, a pool at its pids.max."""
    cgroup = "kubepods.slice/online/agent-chat"
    root = _v1_tree(tmp_path, V2_ONLY_MOUNTINFO, "unused-v1", "unused-v1",
                    f"0::/{cgroup}\n")
    directory = tmp_path / "sys/fs/cgroup" / cgroup
    _write(directory / "cpu.stat", "usage_usec 330361\nuser_usec 300000\nsystem_usec 30361\n"
           "nr_periods 32\nnr_throttled 32\nthrottled_usec 2798266\n")
    _write(directory / "cpu.max", "10000 100000\n")
    _write(directory / "cpu.pressure", "some avg10=40.00 avg60=20.00 avg300=5.00 total=2500000\n"
           "full avg10=30.00 avg60=10.00 avg300=2.00 total=2000000\n")
    for name, text in (("pids.current", "40\n"), ("pids.max", "40\n"),
                       ("pids.events", "max 161\n")):
        _write(directory / name, text)
    got = _pool_metrics(root)
    stall = got.pop("cgroup_cpu_pressure_stall_seconds_total")
    assert stall in (2.5, 2.0)  # one series per stall kind: the dict kept one
    assert got == pytest.approx(V1_EXPECTED)


def test_the_mounts_are_read_once_per_scrape(tmp_path):
    _write(tmp_path / "proc/self/mountinfo", THIS_MACHINE_MOUNTINFO)
    scrape = Scrape(RecordedSample(str(tmp_path)))
    first = cgroup_mounts(scrape)
    (tmp_path / "proc/self/mountinfo").write_text(V2_ONLY_MOUNTINFO)
    assert cgroup_mounts(scrape) is first
    assert cgroup_mounts(Scrape(RecordedSample(str(tmp_path)))).v1 == {}


def test_fork_rejected_lines_as_the_kernel_and_the_tools_print_them():
    text = (
        "[13964.753718] cgroup: fork rejected by pids controller in "
        "/user.slice/user-1000.slice/session-7.scope\n"
        "Jun 15 20:02:45 vagrant kernel: cgroup: fork rejected by pids controller in "
        "/user.slice/user-1000.slice/session-6.scope\n"
        "[Fri Nov 26 18:35:56 2021] cgroup: fork rejected by pids controller in "
        "/user.slice/user-1000.slice/session-1.scope\n"
        "6,1841,5667545996,-;cgroup: fork rejected by pids controller in /fs-hcgroup-pids-1\n"
        "[ 5667.6] some other line\n")
    assert fork_rejections(text) == [
        ("/user.slice/user-1000.slice/session-7.scope", 13964.753718),
        ("/user.slice/user-1000.slice/session-6.scope", None),
        ("/user.slice/user-1000.slice/session-1.scope", None),
        ("/fs-hcgroup-pids-1", 5667.545996),
    ]


def test_fork_rejected_lines_become_per_cgroup_counts_and_times(tmp_path):
    from fleetscope.core.config import parse_config
    from fleetscope.exporter import Exporter
    from tests.conftest import samples

    _write(tmp_path / "proc/stat", "cpu  1 0 1 100 0 0 0 0 0 0\nbtime 1764880000\n")
    _write(tmp_path / "dmesg.txt",
           "[  100.250000] cgroup: fork rejected by pids controller in /kubepods/pod-a\n"
           "[  812.500000] cgroup: fork rejected by pids controller in /kubepods/pod-b\n"
           "[  900.000000] cgroup: fork rejected by pids controller in /kubepods/pod-a\n")
    config = parse_config({"collectors": ["fork_limits"]}, ("fork_limits",))
    got = samples(render(Exporter(str(tmp_path), config).collect(now=1764881000.0)))
    assert got['fleetscope_pids_fork_rejected_total{cgroup="/kubepods/pod-a"}'] == 2
    assert got['fleetscope_pids_fork_rejected_last_timestamp_seconds'
               '{cgroup="/kubepods/pod-a"}'] == 1764880900.0
    assert got['fleetscope_pids_fork_rejected_last_timestamp_seconds'
               '{cgroup="/kubepods/pod-b"}'] == 1764880812.5


def test_a_pool_matched_by_cgroup_on_a_hybrid_host_uses_the_v1_path():
    """This machine's own /proc/<pid>/cgroup: the v2 line is the root ("0::/", the unified
    hierarchy holds no controller), the workload's cgroup is in the v1 lines."""
    from fleetscope.collectors.parsers.process import parse_cgroup

    assert parse_cgroup(THIS_MACHINE_CGROUP) == "/fs-hcgroup-manual-5364"
    assert parse_cgroup("1:cpu:/batch\n0::/system.slice/agent.service\n") == \
        "/system.slice/agent.service"  # a v2 path of its own is the process's cgroup
    assert parse_cgroup("0::/\n") == "/"
    # the live pid-exhaustion worker: in a pids cgroup only, cpu at the root
    assert parse_cgroup("9:name=systemd:/user.slice\n8:pids:/fs-hcgroup-pids-1\n1:cpu:/\n"
                        "0::/\n") == "/fs-hcgroup-pids-1"
