"""Collector `pools`: cgroup parsers on real samples, the collector on fixture trees in the
kernel's formats, and on this machine's /proc (an fd-hungry process, an online worker beside a
CPU hog on its core)."""

from __future__ import annotations

import doctest
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import strategies as st

from fleetscope.collectors import pools as pools_module
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers import cgroup as cgroup_parsers
from fleetscope.collectors.parsers.cgroup import CpuMax, parse_cpu_max, parse_cpu_stat
from fleetscope.collectors.parsers.process import status_values
from fleetscope.collectors.pools import MonotonicSums, nofile_soft_limit
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import BUNDLES, require_tool, samples
from tests.fuzzing import parser_fuzz_tests

# ---- real samples -----------------------------------------------------------------------

# Linux 6.18 x86_64 VM (this project's CI machine), cgroup v2 root (/sys/fs/cgroup/unified on
# its hybrid hierarchy): no cpu controller, so no nr_periods/throttled lines.
CPU_STAT_V2_ROOT_REAL = ("usage_usec 438984194\nuser_usec 371799518\nsystem_usec 67184676\n"
                         "nice_usec 0\n")
# Same machine, cgroup v1 cpu controller (/sys/fs/cgroup/cpu/cpu.stat): other names and
# nanoseconds (throttled_time). The collector only reads v2 paths; the parser passes keys on.
CPU_STAT_V1_REAL = ("nr_periods 0\nnr_throttled 0\nthrottled_time 0\nnr_bursts 0\n"
                    "burst_time 0\n")
# A v2 cgroup with the cpu controller: the line set kernel/sched/core.c cpu_extra_stat_show()
# prints after the rstat lines (6.x with CONFIG_SCHED_CORE adds core_sched.force_idle_usec).
# Shape from the kernel source; the values are illustrative, not captured.
CPU_STAT_V2_LIMITED = ("usage_usec 8123456789\nuser_usec 7000000000\nsystem_usec 1123456789\n"
                       "nice_usec 0\ncore_sched.force_idle_usec 0\nnr_periods 123456\n"
                       "nr_throttled 4567\nthrottled_usec 89234567\nnr_bursts 0\nburst_usec 0\n")
CPU_PRESSURE_REAL = ("some avg10=0.60 avg60=0.88 avg300=1.17 total=28426897\n"
                     "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")  # 6.18 v2 root

# /proc/<pid>/{stat,status,limits} of a `sleep` on the same 6.18 machine, verbatim.
STAT_REAL = (
    "30168 (sleep) S 30166 30166 13235 0 -1 4194304 136 0 0 0 0 0 0 0 20 0 1 0 291211 "
    "2990080 392 18446744073709551615 94922534375424 94922534393353 140727097390368 0 0 0 0 "
    "6 0 1 0 0 17 0 0 0 0 0 0 94922534407440 94922534408704 94923259076608 140727097395945 "
    "140727097395954 140727097395954 140727097397225 0\n"
)
STATUS_REAL = (
    "Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t30168\nNgid:\t0\nPid:\t30168\n"
    "PPid:\t30166\nTracerPid:\t0\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nFDSize:\t256\n"
    "Groups:\t \nNStgid:\t30168\nNSpid:\t30168\nNSpgid:\t30166\nNSsid:\t13235\nKthread:\t0\n"
    "VmPeak:\t    2920 kB\nVmSize:\t    2920 kB\nVmLck:\t       0 kB\nVmPin:\t       0 kB\n"
    "VmHWM:\t    1744 kB\nVmRSS:\t    1744 kB\nRssAnon:\t     112 kB\nRssFile:\t    1632 kB\n"
    "RssShmem:\t       0 kB\nVmData:\t     224 kB\nVmStk:\t     132 kB\nVmExe:\t      20 kB\n"
    "VmLib:\t    1528 kB\nVmPTE:\t      48 kB\nVmSwap:\t       0 kB\n"
    "HugetlbPages:\t       0 kB\nCoreDumping:\t0\nTHP_enabled:\t1\n"
    "untag_mask:\t0xffffffffffffffff\nThreads:\t1\nSigQ:\t0/96363\n"
    "SigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\nSigBlk:\t0000000000000000\n"
    "SigIgn:\t0000000000000006\nSigCgt:\t0000000000000000\nCapInh:\t0000000000000000\n"
    "CapPrm:\t000001fffeffffff\nCapEff:\t000001fffeffffff\nCapBnd:\t000001fffeffffff\n"
    "CapAmb:\t0000000000000000\nNoNewPrivs:\t0\nSeccomp:\t0\nSeccomp_filters:\t0\n"
    "Speculation_Store_Bypass:\tvulnerable\nSpeculationIndirectBranch:\talways enabled\n"
    "Cpus_allowed:\t3\nCpus_allowed_list:\t0-1\n"
    "Mems_allowed:\t" + ",".join(["00000000"] * 31 + ["00000001"]) + "\n"
    "Mems_allowed_list:\t0\nvoluntary_ctxt_switches:\t1\nnonvoluntary_ctxt_switches:\t0\n"
)
# /proc/<pid>/syscall of a `sleep` on the same machine: clock_nanosleep (230), not a network call
SYSCALL_SLEEP_REAL = ("230 0x1 0x1 0x7ffcfa48cb10 0x0 0x0 0x7f91ac14e6e8 0x7ffcfa48cad0 "
                      "0x7f91abaed545\n")
LIMITS_REAL = (
    "Limit                     Soft Limit           Hard Limit           Units     \n"
    "Max cpu time              unlimited            unlimited            seconds   \n"
    "Max file size             unlimited            unlimited            bytes     \n"
    "Max data size             unlimited            unlimited            bytes     \n"
    "Max stack size            8388608              unlimited            bytes     \n"
    "Max core file size        0                    unlimited            bytes     \n"
    "Max resident set          unlimited            unlimited            bytes     \n"
    "Max processes             96363                96363                processes \n"
    "Max open files            20000                20000                files     \n"
    "Max locked memory         8388608              8388608              bytes     \n"
    "Max address space         unlimited            unlimited            bytes     \n"
    "Max file locks            unlimited            unlimited            locks     \n"
    "Max pending signals       96363                96363                signals   \n"
    "Max msgqueue size         819200               819200               bytes     \n"
    "Max nice priority         0                    0                    \n"
    "Max realtime priority     0                    0                    \n"
    "Max realtime timeout      unlimited            unlimited            us        \n"
)


# ---- parsers ----------------------------------------------------------------------------

def test_cpu_stat_real_samples():
    assert parse_cpu_stat(CPU_STAT_V2_ROOT_REAL) == {
        "usage_usec": 438984194, "user_usec": 371799518, "system_usec": 67184676,
        "nice_usec": 0}
    assert parse_cpu_stat(CPU_STAT_V1_REAL)["throttled_time"] == 0
    limited = parse_cpu_stat(CPU_STAT_V2_LIMITED)
    assert limited["nr_throttled"] == 4567 and limited["throttled_usec"] == 89234567
    assert limited["core_sched.force_idle_usec"] == 0


@pytest.mark.parametrize("text, expected", [
    ("max 100000\n", CpuMax(None, 100000)),  # the kernel's default, as 6.18 prints it
    ("200000 100000\n", CpuMax(200000, 100000)),  # cgroup-v2.rst's example: 2 CPUs
    ("50000 100000\n", CpuMax(50000, 100000)),
])
def test_cpu_max(text, expected):
    parsed = parse_cpu_max(text)
    assert parsed == expected
    assert parsed.cpus == (math.inf if expected.quota_us is None else
                           expected.quota_us / expected.period_us)


@pytest.mark.parametrize("parser, text", [
    (parse_cpu_stat, ""), (parse_cpu_stat, "usage_usec\n"), (parse_cpu_stat, "usage_usec -1\n"),
    (parse_cpu_stat, "usage_usec 1 2\n"), (parse_cpu_stat, "usage_usec 1e9\n"),
    (parse_cpu_max, ""), (parse_cpu_max, "max\n"), (parse_cpu_max, "max 0\n"),
    (parse_cpu_max, "-1 100000\n"), (parse_cpu_max, "max max\n"),
    (parse_cpu_max, "100000 100000 1\n"),
    (status_values, "Threads:\t4\n"), (status_values, ""),
    (nofile_soft_limit, LIMITS_REAL.replace("Max open files", "Max open filez")),
    (nofile_soft_limit, "Max open files            20000                20000      files\n"),
    (nofile_soft_limit, LIMITS_REAL.replace("20000                20000", "20k    20000")),
])
def test_parsers_reject_malformed(parser, text):
    with pytest.raises(ParseError):
        parser(text)


def test_status_and_limits_real_samples():
    assert status_values(STATUS_REAL) == {
        "State": "S (sleeping)", "voluntary_ctxt_switches": "1", "nonvoluntary_ctxt_switches": "0",
        "Cpus_allowed_list": "0-1"}
    assert nofile_soft_limit(LIMITS_REAL) == 20000
    unlimited = LIMITS_REAL.replace("Max open files            20000     ",
                                    "Max open files            unlimited ")
    assert nofile_soft_limit(unlimited) is None


NEW_PARSERS = {
    "cpu_stat": (parse_cpu_stat, CPU_STAT_V2_LIMITED),
    "cpu_max": (parse_cpu_max, "200000 100000\n"),
    "status_values": (status_values, STATUS_REAL),
    "nofile_soft_limit": (nofile_soft_limit, LIMITS_REAL),
    "topology_id": (lambda text: pools_module._topology_id(text, "core_id"), "-1\n"),
}


cgroupish = st.text(alphabet=st.sampled_from(list("0123456789 \n\t-:._maxusecnr_periodsName"
                                                  "Max open files")), max_size=300)
test_fuzz_garbage, test_fuzz_cut_and_corrupted = parser_fuzz_tests(NEW_PARSERS, cgroupish)


@pytest.mark.parametrize("module", [cgroup_parsers])
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0


# ---- the monotonic pool totals ----------------------------------------------------------

def test_pool_totals_never_fall_when_processes_exit_reappear_or_move():
    sums = MonotonicSums(new_on_decrease=False)
    assert sums.update({"a": ("p", 10), "b": ("p", 5)}, 0.0) == {"p": 15}
    assert sums.update({"a": ("p", 12)}, 15.0) == {"p": 17}  # b exited: its 5 stay
    # b was only missed by a racing listing: it takes its total back, no double count
    assert sums.update({"a": ("p", 13), "b": ("p", 6)}, 30.0) == {"p": 19}
    # a moves to pool q: p keeps a's 13, q starts with a's whole counter
    assert sums.update({"a": ("q", 14), "b": ("p", 6)}, 45.0) == {"p": 19, "q": 14}
    # a per-process counter that falls is held at its highest reading
    assert sums.update({"a": ("q", 2), "b": ("p", 6)}, 60.0) == {"p": 19, "q": 14}


def test_cgroup_totals_count_a_recreated_cgroup_as_new():
    sums = MonotonicSums(new_on_decrease=True)
    assert sums.update({"/x": ("p", 1000)}, 0.0) == {"p": 1000}
    assert sums.update({"/x": ("p", 40)}, 15.0) == {"p": 1040}
    assert sums.update({}, 30.0) == {"p": 1040}


# ---- the collector on fixture trees -----------------------------------------------------

# /proc/net/tcp of the same machine, lines verbatim (each padded to 149 characters, as
# tcp4_seq_show() pads them): a listener with 3 connections nobody accepted, a connection
# holding 1,000 bytes its process did not read, a connect() whose SYN went unanswered 3 times
# (the listener it calls has a full accept queue, the next listener below), a connection
# whose 500 bytes the peer never acknowledged (3 timeouts: the peer's socket filter drops
# everything), a CLOSE_WAIT connection (its peer's FIN counts 1 in rx_queue), a listener with
# a full accept queue, and a TIME_WAIT line.
NET_TCP_WAITING_REAL = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
    "timeout inode                                                     \n"
    "   2: 0100007F:B1D1 00000000:0000 0A 00000000:00000003 00:00000000 00000000     0        "
    "0 73410 4 00000000ec033339 100 0 0 10 0                     \n"
    "  13: 0100007F:D955 0100007F:CA0E 01 00000000:000003E8 00:00000000 00000000     0        "
    "0 73416 1 000000006d19b16b 20 4 32 10 -1                    \n"
    "   6: 0100007F:BAC6 0100007F:C707 02 00000001:00000000 01:00000036 00000003     0        "
    "0 73417 2 00000000259be316 100 0 0 1 -1                     \n"
    "   3: 0100007F:E49C 0100007F:A631 01 000001F4:00000000 01:00000051 00000003     0        "
    "0 74343 2 00000000b827bf33 163 0 0 1 -1                     \n"
    "  13: 0100007F:A95F 0100007F:84F4 08 00000000:00000001 00:00000000 00000000     0        "
    "0 232834 1 00000000ebdb147b 20 4 0 10 -1                    \n"
    "   1: 0100007F:C707 00000000:0000 0A 00000000:00000001 00:00000000 00000000     0        "
    "0 73408 2 0000000011484739 100 0 0 10 0                     \n"
    "   8: 0100007F:A489 0100007F:C766 06 00000000:00000000 03:00001547 00000000     0        "
    "0 0 3 00000000ca9c5908                                      \n"
)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def limits_text(soft: int | None, hard: int | None) -> str:
    def cell(value):
        return "unlimited" if value is None else str(value)
    # fs/proc/base.c proc_pid_limits(): "%-25s %-20s %-20s %-10s\n"
    row = f"{'Max open files':<25s} {cell(soft):<20s} {cell(hard):<20s} {'files':<10s}\n"
    return re.sub(r"Max open files .*\n", row, LIMITS_REAL)


def write_process(root: Path, pid: int, cmdline: str, cgroup: str = "0::/\n", *,
                  utime: int = 0, stime: int = 0, threads: int = 1, starttime: int = 1000,
                  voluntary: int = 0, nonvoluntary: int = 0, run_delay_ns: int = 0,
                  nofile: int | None = 1024, fds: int = 3, cpus: str = "0-3",
                  files=("cmdline", "cgroup", "stat", "status", "schedstat", "limits",
                         "fd_count", "syscall", "wchan")) -> None:
    """A process directory as a bundle sample holds it (docs/bundle-format.md), every file in
    the kernel's format (the real samples above with this process's values put in)."""
    base = root / "proc" / str(pid)
    comm = cmdline.split("\0")[0].rsplit("/", 1)[-1][:15]
    fields = STAT_REAL.rsplit(")", 1)[1].split()
    fields[11], fields[12], fields[17], fields[19] = map(str, (utime, stime, threads, starttime))
    status = STATUS_REAL.replace("Name:\tsleep", f"Name:\t{comm}")
    status = re.sub(r"(Tgid|Pid):\t30168", rf"\1:\t{pid}", status)
    status = status.replace("Threads:\t1\n", f"Threads:\t{threads}\n")
    status = status.replace("Cpus_allowed_list:\t0-1", f"Cpus_allowed_list:\t{cpus}")
    status = status.replace("voluntary_ctxt_switches:\t1\nnonvoluntary_ctxt_switches:\t0",
                            f"voluntary_ctxt_switches:\t{voluntary}\n"
                            f"nonvoluntary_ctxt_switches:\t{nonvoluntary}")
    contents = {
        "cmdline": cmdline,
        "cgroup": cgroup,
        "stat": f"{pid} ({comm}) " + " ".join(fields) + "\n",
        "status": status,
        "schedstat": f"{utime * 10_000_000 + stime * 10_000_000} {run_delay_ns} 42\n",
        "limits": limits_text(nofile, nofile),
        "fd_count": f"{fds}\n",
        "syscall": SYSCALL_SLEEP_REAL,
        "wchan": "hrtimer_nanosleep",
    }
    for name in files:
        write(base / name, contents[name])


def write_topology(root: Path, cores: list[tuple[int, int, int]]) -> None:
    """cores[cpu] = (physical_package_id, die_id, core_id), as drivers/base/topology.c."""
    for cpu, (package, die, core) in enumerate(cores):
        topology = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
        write(topology / "physical_package_id", f"{package}\n")
        write(topology / "die_id", f"{die}\n")
        write(topology / "core_id", f"{core}\n")


def write_cgroup(root: Path, path: str, stat: str, cpu_max: str, pressure: str,
                 pids: tuple[str, str, str] = ("3\n", "max\n", "max 0\n")) -> None:
    directory = root / "sys/fs/cgroup" / path.lstrip("/")
    write(directory / "cpu.stat", stat)
    write(directory / "cpu.max", cpu_max)
    write(directory / "cpu.pressure", pressure)
    for name, text in zip(("pids.current", "pids.max", "pids.events"), pids, strict=True):
        write(directory / name, text)


POOLS = [{"name": "chat-online", "class": "online", "match": {"cgroup": "*/online/*"}},
         {"name": "batch", "class": "offline", "match": {"cmdline": "etl|train"}}]
CHAT = 'class="online",pool="chat-online"'
BATCH = 'class="offline",pool="batch"'


def pool_tree(tmp_path: Path) -> Path:
    """4 CPUs = 2 SMT cores. Two chat workers (the second in a child cgroup of the first's),
    a batch job, a batch process that exited after its stat was read, one that exited
    between the listing and the reads, and sshd (no pool)."""
    root = tmp_path / "root"
    write_topology(root, [(0, 0, 0), (0, 0, 1), (0, 0, 0), (0, 0, 1)])
    write_process(root, 100, "python3\0-m\0agent.worker\0", "0::/k8s/online/chat\n",
                  utime=150, stime=50, threads=8, voluntary=1000, nonvoluntary=20,
                  run_delay_ns=2_500_000_000, nofile=1024, fds=1000, cpus="0-1")
    write_process(root, 101, "python3\0-m\0agent.worker\0", "0::/k8s/online/chat/sub\n",
                  utime=10, stime=5, threads=4, voluntary=10, nonvoluntary=2,
                  run_delay_ns=500_000_000, nofile=65536, fds=10, cpus="0-1")
    write_process(root, 200, "python3\0etl_job.py\0", "0::/k8s/offline/etl\n",
                  utime=9000, stime=1000, threads=64, voluntary=5, nonvoluntary=7000,
                  run_delay_ns=1_000_000_000, nofile=4096, fds=100)
    write_process(root, 201, "python3\0etl_job.py\0", "0::/k8s/offline/etl\n",
                  utime=100, threads=2, files=("cmdline", "cgroup", "stat"))
    write_process(root, 202, "python3\0etl_job.py\0", "0::/k8s/offline/etl\n",
                  files=("cmdline", "cgroup"))
    write_process(root, 300, "/usr/sbin/sshd\0-D\0", "0::/system.slice/ssh.service\n",
                  utime=5, nofile=1024, fds=1020)
    write_cgroup(root, "/k8s/online/chat", CPU_STAT_V2_LIMITED, "200000 100000\n",
                 "some avg10=1.00 avg60=0.50 avg300=0.20 total=3000000\n"
                 "full avg10=0.50 avg60=0.20 avg300=0.10 total=1000000\n",
                 ("38\n", "40\n", "max 161\n"))
    write_cgroup(root, "/k8s/online/chat/sub", CPU_STAT_V2_LIMITED, "100000 100000\n",
                 CPU_PRESSURE_REAL)
    write_cgroup(root, "/k8s/offline/etl", CPU_STAT_V2_LIMITED.replace("8123456789",
                                                                       "2000000000"),
                 "max 100000\n", CPU_PRESSURE_REAL)
    # Sockets (fd_sockets, as `bundle record` writes them): both chat workers hold the
    # listener (a pre-fork server), the first also the unread connection and the CLOSE_WAIT
    # one; the batch job holds the unanswered connect() and the unacknowledged connection;
    # sshd the full listener.
    write(root / "proc/net/tcp", NET_TCP_WAITING_REAL)
    write(root / "proc/100/fd_sockets", "3 73410\n7 73416\n9 232834\n")
    write(root / "proc/101/fd_sockets", "3 73410\n")
    write(root / "proc/200/fd_sockets", "5 73417 3460\n6 74343\n")
    write(root / "proc/300/fd_sockets", "3 73408\n")
    return root


def collect(exporter: Exporter, now: float) -> dict[str, float]:
    return samples(render(exporter.collect(now=now)))


def pools_exporter(root: Path, **extra) -> Exporter:
    config = parse_config({"pools": POOLS, "collectors": ["pools"], **extra}, ("pools",))
    return Exporter(str(root), config)


def test_pool_metrics_on_a_fixture_tree(tmp_path):
    root = pool_tree(tmp_path)
    got = collect(pools_exporter(root), 1000.0)
    assert got['fleetscope_scrape_collector_success{collector="pools"}'] == 1
    assert not [k for k in got if "sshd" in k or "pid=" in k]
    assert got[f"fleetscope_pool_processes{{{CHAT}}}"] == 2
    assert got[f"fleetscope_pool_processes{{{BATCH}}}"] == 2  # 202 exited before its stat
    assert got[f"fleetscope_pool_threads{{{CHAT}}}"] == 12
    assert got[f"fleetscope_pool_threads_per_core{{{BATCH}}}"] == 33.0  # 66 threads, 2 cores
    assert got[f"fleetscope_pool_cpu_seconds_total{{{CHAT}}}"] == pytest.approx(2.15)
    assert got[f"fleetscope_pool_cpu_seconds_total{{{BATCH}}}"] == pytest.approx(101.0)
    assert got[f"fleetscope_pool_run_delay_seconds_total{{{CHAT}}}"] == pytest.approx(3.0)
    switches = 'fleetscope_pool_context_switches_total{{class="{}",kind="{}",pool="{}"}}'
    assert got[switches.format("online", "voluntary", "chat-online")] == 1010
    assert got[switches.format("offline", "nonvoluntary", "batch")] == 7000
    # fds: the worst process of the pool, with its own numbers
    assert got[f"fleetscope_pool_fd_usage_ratio{{{CHAT}}}"] == pytest.approx(1000 / 1024,
                                                                             abs=1e-6)
    assert got[f"fleetscope_pool_fd_usage_open_fds{{{CHAT}}}"] == 1000
    assert got[f"fleetscope_pool_fd_usage_limit_fds{{{CHAT}}}"] == 1024
    assert got[f"fleetscope_pool_nofile_limit{{{CHAT}}}"] == 1024
    assert got[f"fleetscope_pool_nofile_limit{{{BATCH}}}"] == 4096
    # cgroups: chat/sub is inside chat, whose files already include it
    assert got[f"fleetscope_pool_cgroups{{{CHAT}}}"] == 1
    assert got[f"fleetscope_pool_cgroup_cpu_quota_cpus{{{CHAT}}}"] == 2.0
    assert got[f"fleetscope_pool_cgroup_cpu_quota_cpus{{{BATCH}}}"] == math.inf
    assert got[f"fleetscope_pool_cgroup_cpu_usage_seconds_total{{{CHAT}}}"] == 8123.456789
    assert got[f"fleetscope_pool_cgroup_cpu_usage_seconds_total{{{BATCH}}}"] == 2000.0
    assert got[f"fleetscope_pool_cgroup_cpu_periods_total{{{CHAT}}}"] == 123456
    assert got[f"fleetscope_pool_cgroup_cpu_throttled_periods_total{{{CHAT}}}"] == 4567
    assert got[f"fleetscope_pool_cgroup_cpu_throttled_seconds_total{{{CHAT}}}"] == 89.234567
    stall = ('fleetscope_pool_cgroup_cpu_pressure_stall_seconds_total'
             '{{class="online",pool="chat-online",stall="{}"}}')
    assert got[stall.format("some")] == 3.0
    assert got[stall.format("full")] == 1.0
    # pids: the pool's outermost cgroup, against its own pids.max
    def pids_of(pool: str) -> dict[str, float]:
        return {key.split("{")[0].removeprefix("fleetscope_pool_cgroup_pids_"): value
                for key, value in got.items() if "_pids_" in key and pool in key}
    assert pids_of(CHAT) == {"usage_ratio": 0.95, "current": 38, "limit": 40,
                             "limit_hits_total": 161}
    assert pids_of(BATCH) == {"usage_ratio": 0, "current": 3, "limit": math.inf,
                              "limit_hits_total": 0}
    # connections: the listener's 3 once (two workers share it), the 1,000 unread bytes'
    # connection (not the CLOSE_WAIT one, nor sshd's full listener)
    waiting = 'fleetscope_pool_connections_waiting{{class="{}",pool="{}",queue="{}"}}'
    assert got[waiting.format("online", "chat-online", "accept")] == 3
    assert got[waiting.format("online", "chat-online", "unread")] == 1
    assert got[waiting.format("offline", "batch", "accept")] == 0
    assert got[waiting.format("offline", "batch", "unread")] == 0
    retransmitting = 'fleetscope_pool_connections_retransmitting{{class="{}",pool="{}",state="{}"}}'
    assert got[retransmitting.format("offline", "batch", "syn_sent")] == 1
    assert got[retransmitting.format("offline", "batch", "established")] == 1
    assert got[retransmitting.format("online", "chat-online", "syn_sent")] == 0
    sources = {k: v for k, v in got.items() if k.startswith("fleetscope_scrape_source")}
    assert sources and all(v == 1 for v in sources.values()), sources


def test_promtool_accepts_the_pool_metrics(tmp_path):
    promtool = require_tool("promtool")
    text = render(pools_exporter(pool_tree(tmp_path)).collect(now=1000.0))
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_exited_process_keeps_its_time_in_the_pool_counters(tmp_path):
    root = pool_tree(tmp_path)
    exporter = pools_exporter(root)
    first = collect(exporter, 1000.0)
    shutil.rmtree(root / "proc/101")  # a chat worker exits
    write_process(root, 100, "python3\0-m\0agent.worker\0", "0::/k8s/online/chat\n",
                  utime=160, stime=50, threads=8, voluntary=1100, nonvoluntary=20,
                  run_delay_ns=2_600_000_000, nofile=1024, fds=900, cpus="0-1")
    second = collect(exporter, 1015.0)
    assert second[f"fleetscope_pool_processes{{{CHAT}}}"] == 1
    for metric in ("fleetscope_pool_cpu_seconds_total", "fleetscope_pool_run_delay_seconds_total"):
        key = f"{metric}{{{CHAT}}}"
        assert second[key] >= first[key]
    # +10 ticks from 100, and 101's 15 ticks stay in the total
    assert second[f"fleetscope_pool_cpu_seconds_total{{{CHAT}}}"] == pytest.approx(2.25)
    assert second[f"fleetscope_pool_run_delay_seconds_total{{{CHAT}}}"] == pytest.approx(3.1)
    assert second[f"fleetscope_pool_fd_usage_open_fds{{{CHAT}}}"] == 900


def test_live_layout_fd_directory_and_no_topology(tmp_path):
    """A tree laid out like a live /proc (fd/ directory, no fd_count) on a machine whose
    sysfs has no topology: the CPU count from /proc/stat stands in for cores."""
    root = tmp_path / "root"
    write_process(root, 100, "etl\0", threads=6, nofile=64,
                  files=("cmdline", "cgroup", "stat", "status", "schedstat", "limits"))
    for fd in range(5):
        (root / "proc/100/fd").mkdir(parents=True, exist_ok=True)
        (root / f"proc/100/fd/{fd}").write_text("")
    write(root / "proc/stat", "cpu  1 0 1 1 0 0 0 0 0 0\ncpu0 1 0 1 1 0 0 0 0 0 0\n"
                              "cpu1 0 0 0 0 0 0 0 0 0 0\nctxt 1\n")
    got = collect(pools_exporter(root), 1000.0)
    assert got[f"fleetscope_pool_fd_usage_open_fds{{{BATCH}}}"] == 5
    assert got[f"fleetscope_pool_fd_usage_ratio{{{BATCH}}}"] == 5 / 64
    assert got[f"fleetscope_pool_threads_per_core{{{BATCH}}}"] == 3.0
    topology = ('fleetscope_scrape_source_available{collector="pools",'
                'source="sys/devices/system/cpu/cpu*/topology"}')
    assert got[topology] == 0
    assert got['fleetscope_scrape_collector_success{collector="pools"}'] == 1
    # no cgroup directory for the pool: no cgroup series beyond the count
    assert got[f"fleetscope_pool_cgroups{{{BATCH}}}"] == 0
    assert not [k for k in got if k.startswith("fleetscope_pool_cgroup_cpu")]


def test_topology_is_reread_when_the_online_cpus_change(tmp_path):
    root = pool_tree(tmp_path)
    write(root / "sys/devices/system/cpu/online", "0-3\n")
    exporter = pools_exporter(root)
    assert collect(exporter, 1000.0)[f"fleetscope_pool_threads_per_core{{{CHAT}}}"] == 6.0
    # CPUs 2-3 go offline (their topology directories go with them); 0 and 1 are one core
    shutil.rmtree(root / "sys/devices/system/cpu/cpu2")
    shutil.rmtree(root / "sys/devices/system/cpu/cpu3")
    write(root / "sys/devices/system/cpu/cpu1/topology/core_id", "0\n")
    assert collect(exporter, 1015.0)[f"fleetscope_pool_threads_per_core{{{CHAT}}}"] == 6.0
    write(root / "sys/devices/system/cpu/online", "0-1\n")
    assert collect(exporter, 1030.0)[f"fleetscope_pool_threads_per_core{{{CHAT}}}"] == 12.0


def test_cgroups_outside_the_exporters_namespace_and_the_root_are_not_summed(tmp_path):
    root = pool_tree(tmp_path)
    shutil.rmtree(root / "proc/101")
    # seen from inside a cgroup namespace, and a process in the root cgroup
    write(root / "proc/100/cgroup", "0::/../../k8s/online/chat\n")
    got = collect(pools_exporter(root), 1000.0)
    assert got[f"fleetscope_pool_cgroups{{{CHAT}}}"] == 0
    assert f"fleetscope_pool_cgroup_cpu_usage_seconds_total{{{CHAT}}}" not in got
    assert got[f"fleetscope_pool_processes{{{CHAT}}}"] == 1


def test_pools_without_processes_and_without_config(tmp_path):
    (tmp_path / "proc").mkdir()
    got = collect(pools_exporter(tmp_path), 1000.0)
    assert got[f"fleetscope_pool_processes{{{CHAT}}}"] == 0
    assert got[f"fleetscope_pool_cpu_seconds_total{{{CHAT}}}"] == 0
    assert got['fleetscope_scrape_collector_success{collector="pools"}'] == 1
    bare = Exporter(str(tmp_path), parse_config({"collectors": ["pools"]}, ("pools",)))
    got = collect(bare, 1000.0)
    assert not [k for k in got if k.startswith("fleetscope_pool")]
    assert got['fleetscope_scrape_collector_success{collector="pools"}'] == 1


def test_corrupt_process_file_is_skipped_not_fatal(tmp_path):
    root = pool_tree(tmp_path)
    write(root / "proc/200/schedstat", "garbage\n")
    got = collect(pools_exporter(root), 1000.0)
    # the other processes still count; one corrupt file does not make the source unavailable
    assert got[f"fleetscope_pool_run_delay_seconds_total{{{CHAT}}}"] == pytest.approx(3.0)
    assert got['fleetscope_scrape_collector_success{collector="pools"}'] == 1


# ---- the fixture bundles ----------------------------------------------------------------

def bundle_with_pools(bundle: str) -> tuple[Path, dict]:
    meta = json.loads((BUNDLES / bundle / "meta.json").read_text())
    config = meta.get("config") or {}
    sample = BUNDLES / bundle / meta["samples"][0]["dir"]
    pids = [p for p in (sample / "proc").iterdir() if p.name.isdigit()] if (
        sample / "proc").is_dir() else []
    if not config.get("pools") or not pids:
        pytest.skip(f"fixture bundle {bundle} has no pools config or pool processes yet")
    return BUNDLES / bundle, config


@pytest.mark.parametrize("bundle", ["x86-256", "kunpeng-128"])
def test_fixture_bundles(exporter_factory, tmp_path, bundle):
    path, config = bundle_with_pools(bundle)
    copy = tmp_path / bundle
    shutil.copytree(path, copy)
    live = copy / "samples" / "live"
    live.symlink_to("s0000")
    exporter = exporter_factory(live, {**config, "collectors": ["pools"]})
    first = samples(exporter.text())
    live.unlink()
    live.symlink_to("s0001")
    second = samples(exporter.text())
    assert second['fleetscope_scrape_collector_success{collector="pools"}'] == 1
    names = {pool["name"] for pool in config["pools"]}
    counted = {k for k in second if k.startswith("fleetscope_pool_processes{")}
    assert {re.search(r'pool="([^"]+)"', k).group(1) for k in counted} == names
    assert sum(second[k] for k in counted) > 0
    for key, value in second.items():
        if key.startswith("fleetscope_pool_") and "_total{" in key and key in first:
            assert value >= first[key], key


# ---- this machine -----------------------------------------------------------------------

FD_HOG = """
import resource, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
files = [open(sys.executable, "rb") for _ in range(60)]
print("ready", flush=True)
time.sleep(30)
"""


@pytest.mark.live
def test_process_near_its_fd_limit_shows(exporter_factory, tmp_path):
    marker = f"fleetscope-fd-test-{os.getpid()}"
    child = subprocess.Popen([sys.executable, "-c", FD_HOG, marker], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        config = {"pools": [{"name": "fd-hungry", "class": "offline",
                             "match": {"cmdline": marker}}], "collectors": ["pools"]}
        got = samples(exporter_factory("/", config).text())
        labels = 'class="offline",pool="fd-hungry"'
        assert got[f"fleetscope_pool_processes{{{labels}}}"] == 1
        assert got[f"fleetscope_pool_fd_usage_ratio{{{labels}}}"] >= 0.9
        assert got[f"fleetscope_pool_fd_usage_open_fds{{{labels}}}"] >= 60
        assert got[f"fleetscope_pool_fd_usage_limit_fds{{{labels}}}"] == 64
        assert got[f"fleetscope_pool_nofile_limit{{{labels}}}"] == 64
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


# An agent-like worker: short sleeps and some work (about 5 ms of CPU a round), pinned to
# one CPU; bounded to 40 s. Worker and hog both run at nice -10 when allowed (root): against
# each other they are equals, and the rest of a busy shared test machine (other test runs)
# weighs a tenth as much on that CPU, so it cannot drown the difference the hog makes.
WORKER = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
try:
    os.nice(-10)
except PermissionError:
    pass
end = time.time() + 40
while time.time() < end:
    time.sleep(0.005)
    work = time.thread_time() + 0.005
    while time.thread_time() < work:
        pass
"""
# A batch job: a busy loop on the same CPU, bounded to 20 s.
HOG = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
try:
    os.nice(-10)
except PermissionError:
    pass
end = time.time() + 20
while time.time() < end:
    pass
"""


@pytest.mark.live
def test_offline_hog_raises_the_online_pools_run_delay(exporter_factory):
    """Two rounds of a quiet phase then a phase with the hog on the worker's CPU, 2 s each:
    other work on this small shared machine can add run delay to any phase, the hog adds its
    share to the hog phases only."""
    cpu = max(os.sched_getaffinity(0))
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    online, offline = f"fleetscope-online-{tag}", f"fleetscope-offline-{tag}"
    config = {"collectors": ["pools"], "pools": [
        {"name": "agents", "class": "online", "match": {"cmdline": online}},
        {"name": "batch", "class": "offline", "match": {"cmdline": offline}}]}
    delay = 'fleetscope_pool_run_delay_seconds_total{class="online",pool="agents"}'
    batch_cpu = 'fleetscope_pool_cpu_seconds_total{class="offline",pool="batch"}'
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(cpu), online])
    children = [worker]
    try:
        exporter = exporter_factory("/", config)
        time.sleep(0.5)

        def rate(seconds: float) -> tuple[float, dict]:
            before = samples(exporter.text())
            start = time.monotonic()
            time.sleep(seconds)
            after = samples(exporter.text())
            return (after[delay] - before[delay]) / (time.monotonic() - start), after

        quiet, busy = [], []
        for _ in range(2):
            quiet.append(rate(2.0)[0])
            hog = subprocess.Popen([sys.executable, "-c", HOG, str(cpu), offline])
            children.append(hog)
            time.sleep(0.3)
            value, after = rate(2.0)
            busy.append(value)
            hog.kill()
            hog.wait()
            time.sleep(0.3)
        assert after[batch_cpu] > 0.5  # the hogs did run on that CPU (over 4 s, shared)
        # Alone the worker waits next to nothing (about 0.01 s/s here); beside the hog about a
        # third of the wall time (0.33 s/s: the hog takes half the CPU while the worker works).
        quiet_rate, busy_rate = sum(quiet) / 2, sum(busy) / 2
        assert busy_rate > quiet_rate + 0.1, (quiet, busy)
        assert busy_rate > 1.5 * quiet_rate, (quiet, busy)
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_live_cgroups_are_reread_after_an_exec_or_a_while_and_recorded_ones_always(tmp_path):
    """A live process's cgroup is kept, once two reads agree, while its command line stays
    (a third of the scan was re-reading it), read again after an exec or CGROUP_REREAD_S; a
    recorded sample is read as it is every time."""
    from fleetscope.collectors import processes
    from fleetscope.collectors.base import Scrape
    from fleetscope.collectors.source import LiveHost, recorded_sample

    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    (proc / "cmdline").write_bytes(b"python3\0-m\0agent.worker\0")
    (proc / "cgroup").write_text("0::/kubepods.slice/online/agent-1\n")
    pools = parse_config({"pools": [{"name": "chat", "class": "online",
                                     "match": {"cgroup": "*/online/*"}}]}).pools

    def pooled(source, at: float) -> list[str]:
        return [p.pool.name for p in processes._scan(Scrape(source, at), pools)]

    live = LiveHost(str(tmp_path))
    assert pooled(live, 1000.0) == ["chat"]
    assert pooled(live, 1002.0) == ["chat"]  # two reads agree: kept from now on
    (proc / "cgroup").write_text("0::/system.slice/batch.service\n")  # moved, no exec
    assert pooled(live, 1010.0) == ["chat"]  # the kept cgroup, within the re-read time
    assert pooled(live, 1002.0 + processes.CGROUP_REREAD_S + 1) == []
    # Seen once, then moved by its supervisor: not kept after one read, so found at once.
    (proc / "cgroup").write_text("0::/kubepods.slice/online/agent-1\n")
    assert pooled(live, 1100.0) == ["chat"]
    (proc / "cgroup").write_text("0::/system.slice/batch.service\n")
    assert pooled(live, 1101.0) == []
    (proc / "cgroup").write_text("0::/kubepods.slice/online/agent-1\n")
    assert pooled(live, 2000.0) == ["chat"]
    (proc / "cmdline").write_bytes(b"/usr/bin/etl_job\0")  # an exec: read again at once
    (proc / "cgroup").write_text("0::/system.slice/batch.service\n")
    assert pooled(live, 2001.0) == []
    recorded = recorded_sample(str(tmp_path))
    (proc / "cgroup").write_text("0::/kubepods.slice/online/agent-1\n")
    assert pooled(recorded, 2002.0) == ["chat"]
    (proc / "cgroup").write_text("0::/system.slice/batch.service\n")
    assert pooled(recorded, 2003.0) == []
    shutil.rmtree(proc)  # the process exits: forgotten
    assert pooled(live, 2004.0) == []
    assert not [k for k in processes._CGROUPS.entries if k[0] == (str(tmp_path),)]


def test_live_kernel_threads_are_skipped_but_a_process_caught_in_execve_is_not(tmp_path):
    """A live pid without a command line and without an executable (a kernel thread, a
    zombie) is not read again while it stays in the table; one with an executable (inside
    execve, its arguments not yet written) is read on the next scrape and joins its pool."""
    from fleetscope.collectors import processes
    from fleetscope.collectors.base import Scrape
    from fleetscope.collectors.source import LiveHost

    pools = parse_config({"pools": [{"name": "chat", "class": "online",
                                     "match": {"cmdline": "agent"}}]}).pools
    kthread = tmp_path / "proc" / "2"
    exec_ing = tmp_path / "proc" / "4343"
    for proc in (kthread, exec_ing):
        proc.mkdir(parents=True)
        (proc / "cmdline").write_bytes(b"")
    (exec_ing / "exe").symlink_to("/bin/true")
    live = LiveHost(str(tmp_path))

    def pooled(at: float) -> list[int]:
        return [p.pid for p in processes._scan(Scrape(live, at), pools)]

    assert pooled(1000.0) == []
    (exec_ing / "cmdline").write_bytes(b"python3\0-m\0agent.worker\0")
    # A kernel thread's pid given a command line (a fixture's stand-in for a reused pid):
    # not read while the skip holds, read again after CGROUP_REREAD_S.
    (kthread / "cmdline").write_bytes(b"agent\0")
    assert pooled(1001.0) == [4343]
    assert pooled(1000.0 + processes.CGROUP_REREAD_S + 1) == [2, 4343]
    # A pid that left the table is forgotten at once: its next holder is read.
    (kthread / "cmdline").write_bytes(b"")
    assert pooled(2000.0) == [4343]
    shutil.rmtree(kthread)
    assert pooled(2001.0) == [4343]
    kthread.mkdir()
    (kthread / "cmdline").write_bytes(b"agent\0")
    assert pooled(2002.0) == [2, 4343]


def test_a_process_exiting_as_its_namespace_is_read_costs_only_its_own_record(tmp_path):
    # Reproduced by the churn soak on a 6.18 kernel: listing /proc/<pid>/net of a process
    # that is exiting fails with EINVAL, and the whole pools collector failed with it (every
    # pool's series lost for that scrape, the caches of gone pids never pruned). A directory
    # that cannot be listed (a symlink loop: ELOOP) stands for it here.
    from fleetscope.collectors.base import Scrape
    from fleetscope.collectors.source import LiveHost
    from fleetscope.collectors.tasks import network_namespace

    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "net").symlink_to("net")
    (tmp_path / "proc" / "4243" / "net").mkdir(parents=True)
    (tmp_path / "proc" / "4243" / "net" / "tcp").write_text("")
    scrape = Scrape(LiveHost(str(tmp_path)))
    assert network_namespace(scrape, 4242) == "root"  # no tables of its own to read
    assert network_namespace(scrape, 4243) == "pid 4243"
