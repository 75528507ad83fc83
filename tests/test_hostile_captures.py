"""Collectors on real machine captures that are odd in ways the kernel docs do not show.

Origin of every capture below: prometheus/procfs `testdata/fixtures.ttar` (public test data
of Prometheus's procfs library, taken from real machines): `fixtures/proc/26231/status`
(starts with a blank line), `fixtures/proc/26231/{stat,cmdline,limits}`,
`fixtures/proc/26231/interrupts` (a blank line between MIS and PIN) and
`fixtures/proc/26233/schedstat` (a malformed file). One bad record costs that record, never a
collector; absence is reported as absence.
"""

from __future__ import annotations

import shutil

import pytest

from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import BUNDLES, samples

STATUS_26231 = "\n" + "".join(f"{key}:\t{value}\n" for key, value in (
    ("Name", "prometheus"), ("Umask", "0022"), ("State", "S (sleeping)"), ("Tgid", "26231"),
    ("Ngid", "0"), ("Pid", "26231"), ("PPid", "1"), ("TracerPid", "0"),
    ("Uid", "1000\t1000\t1000\t0"), ("Gid", "1001\t1001\t1001\t0"), ("FDSize", "128"),
    ("Groups", ""), ("NStgid", "1"), ("NSpid", "1"), ("NSpgid", "1"), ("NSsid", "1"),
    ("VmPeak", "   58472 kB"), ("VmSize", "   58440 kB"), ("VmLck", "       0 kB"),
    ("VmPin", "       0 kB"), ("VmHWM", "    8028 kB"), ("VmRSS", "    6716 kB"),
    ("RssAnon", "    2092 kB"), ("RssFile", "    4624 kB"), ("RssShmem", "       0 kB"),
    ("VmData", "    2580 kB"), ("VmStk", "     136 kB"), ("VmExe", "     948 kB"),
    ("VmLib", "    6816 kB"), ("VmPTE", "     128 kB"), ("VmPMD", "      12 kB"),
    ("VmSwap", "     660 kB"), ("HugetlbPages", "       0 kB"), ("Threads", "1"),
    ("SigQ", "8/63965"), ("SigPnd", "0000000000000000"), ("ShdPnd", "0000000000000000"),
    ("SigBlk", "7be3c0fe28014a03"), ("SigIgn", "0000000000001000"),
    ("SigCgt", "00000001800004ec"), ("CapInh", "0000000000000000"),
    ("CapPrm", "0000003fffffffff"), ("CapEff", "0000003fffffffff"),
    ("CapBnd", "0000003fffffffff"), ("CapAmb", "0000000000000000"), ("Seccomp", "0"),
    ("Cpus_allowed", "ff"), ("Cpus_allowed_list", "0-7"), ("Mems_allowed", "00000000,00000001"),
    ("Mems_allowed_list", "0"), ("voluntary_ctxt_switches", "4742839"),
    ("nonvoluntary_ctxt_switches", "1727500")))
STAT_26231 = ("26231 (vim) R 5392 7446 5392 34835 7446 4218880 32533 309516 26 82 1677 44 158 "
              "99 20 0 1 0 82375 56274944 1981 18446744073709551615 4194304 6294284 "
              "140736914091744 140736914087944 139965136429984 0 0 12288 1870679807 0 0 0 17 0 "
              "0 0 31 0 0 8391624 8481048 16420864 140736914093252 140736914093279 "
              "140736914093279 140736914096107 0\n")
CMDLINE_26231 = "vim\0test.go\0+10\0"
LIMITS_26231 = """\
Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max file size             unlimited            unlimited            bytes
Max data size             unlimited            unlimited            bytes
Max stack size            8388608              unlimited            bytes
Max core file size        0                    unlimited            bytes
Max resident set          unlimited            unlimited            bytes
Max processes             62898                62898                processes
Max open files            2048                 4096                 files
Max locked memory         18446744073708503040 18446744073708503040 bytes
Max address space         8589934592           unlimited            bytes
Max file locks            unlimited            unlimited            locks
Max pending signals       62898                62898                signals
Max msgqueue size         819200               819200               bytes
Max nice priority         0                    0
Max realtime priority     0                    0
Max realtime timeout      unlimited            unlimited            us
"""
SCHEDSTAT_26233 = """\
 ____________________________________
< this is a malformed schedstat file >
 ------------------------------------
"""


def _root(tmp_path):
    """The kunpeng-128 fixture sample with the procfs capture's process added."""
    root = tmp_path / "root"
    shutil.copytree(BUNDLES / "kunpeng-128" / "static", root, dirs_exist_ok=True)
    shutil.copytree(BUNDLES / "kunpeng-128" / "samples" / "s0000", root, dirs_exist_ok=True)
    process = root / "proc" / "26231"
    process.mkdir()
    (process / "status").write_text(STATUS_26231)
    (process / "stat").write_text(STAT_26231)
    (process / "cmdline").write_text(CMDLINE_26231)
    (process / "limits").write_text(LIMITS_26231)
    (process / "schedstat").write_text(SCHEDSTAT_26233)
    (process / "cgroup").write_text("0::/user.slice\n")
    return root


def _scrape(root, config):
    exporter = Exporter(str(root), parse_config(config, ("pools", "irq", "cpu", "pressure")))
    return samples(render(exporter.collect()))


def test_status_with_a_leading_blank_line_is_still_read(tmp_path):
    parsed = _scrape(_root(tmp_path), {"collectors": ["pools", "irq"], "pools": [
        {"name": "editor", "class": "online", "match": {"cmdline": "^vim test"}}]})
    assert parsed['fleetscope_scrape_collector_success{collector="pools"}'] == 1
    assert parsed['fleetscope_scrape_collector_success{collector="irq"}'] == 1
    switches = [v for k, v in parsed.items() if k.startswith("fleetscope_pool_context_switches")
                and 'pool="editor"' in k]
    assert 4742839 in switches and 1727500 in switches
    # The malformed schedstat costs the run-queue delay of that process only.
    assert parsed['fleetscope_pool_processes{class="online",pool="editor"}'] == 1


def test_missing_cpulist_keeps_summary_cpu_time(tmp_path):
    root = _root(tmp_path)
    for cpulist in (root / "sys" / "devices" / "system" / "node").glob("node*/cpulist"):
        cpulist.unlink()
    parsed = _scrape(root, {"collectors": ["cpu"]})
    assert parsed['fleetscope_scrape_collector_success{collector="cpu"}'] == 1
    assert parsed['fleetscope_scrape_source_available{collector="cpu",'
                  'source="sys/devices/system/node"}'] == 0
    unknown = [k for k in parsed if k.startswith("fleetscope_cpu_numa_node_seconds_total")
               and 'numa_node="unknown"' in k]
    assert unknown, "summary-mode CPU time disappeared with the topology"


def test_missing_cpulist_keeps_summary_schedstat(tmp_path):
    """The same capture without the node cpulists: the pressure collector's per-NUMA-node
    schedstat families stay, on numa_node="unknown", summing every CPU line."""
    root = _root(tmp_path)
    for cpulist in (root / "sys" / "devices" / "system" / "node").glob("node*/cpulist"):
        cpulist.unlink()
    lines = [line.split() for line in (root / "proc" / "schedstat").read_text().splitlines()
             if line.startswith("cpu")]
    parsed = _scrape(root, {"collectors": ["pressure"]})
    assert parsed['fleetscope_scrape_collector_success{collector="pressure"}'] == 1
    assert parsed['fleetscope_scrape_source_available{collector="pressure",'
                  'source="sys/devices/system/node"}'] == 0
    for name, field in (("running_seconds_total", 7), ("waiting_seconds_total", 8),
                        ("timeslices_total", 9)):
        key = f'fleetscope_schedstat_numa_node_{name}{{numa_node="unknown"}}'
        expected = sum(int(line[field]) for line in lines)
        scale = 1 if name == "timeslices_total" else 1e9
        assert key in parsed, f"{name} disappeared with the topology"
        assert parsed[key] == pytest.approx(expected / scale)


def test_one_missing_cpulist_costs_that_node_only(tmp_path):
    root = _root(tmp_path)
    (root / "sys" / "devices" / "system" / "node" / "node3" / "cpulist").unlink()
    parsed = _scrape(root, {"collectors": ["cpu"]})
    nodes = {k.split('numa_node="')[1].split('"')[0] for k in parsed
             if k.startswith("fleetscope_cpu_numa_node_cpus")}
    assert nodes == {"0", "1", "2", "unknown"}
