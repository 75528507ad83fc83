"""Property-based fuzzing: every parser returns records or raises ParseError, nothing else,
on arbitrary text and on real samples cut or corrupted at random."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import strategies as st

from fleetscope.collectors.parsers import process, procfs, sysfs
from tests.fuzzing import parser_fuzz_tests
from tests.test_parsers import PROC_STAT_REAL, SCHEDSTAT_REAL

PARSERS = {
    "proc_stat": (procfs.parse_proc_stat, PROC_STAT_REAL),
    "loadavg": (procfs.parse_loadavg, "0.20 0.18 0.12 1/80 11206\n"),
    "pressure": (procfs.parse_pressure, "some avg10=2.32 avg60=0.64 avg300=0.48 total=3035326\n"
                                        "full avg10=2.32 avg60=0.64 avg300=0.46 total=2891613\n"),
    "schedstat": (procfs.parse_schedstat, SCHEDSTAT_REAL),
    "cpulist": (sysfs.parse_cpulist, "0-63,128-191\n"),
    "numastat": (sysfs.parse_numastat, "numa_hit 1196169\nnuma_miss 0\nother_node 7\n"),
    "distance": (sysfs.parse_distance, "10 12 20 22\n"),
    "node_meminfo": (sysfs.parse_node_meminfo, "Node 0 MemTotal:        4417308 kB\n"
                                               "Node 0 HugePages_Total:     0\n"),
    "pid_stat": (process.parse_pid_stat, "42 (my (odd) name) R 1 42 42 0 -1 4194304 0 0 0 0 "
                                         "150 30 0 0 20 0 3 0 1000 0 0 0 0 0 0 0 0 0 0 0 0 0 "
                                         "0 0 0 7 0 0 0 0 0\n"),
    "status": (process.parse_status, "Name:\tpython3\nThreads:\t64\n"
                                     "Cpus_allowed_list:\t64-95\n"),
    "pid_schedstat": (process.parse_pid_schedstat, "84886 2950931 2\n"),
    "cgroup": (process.parse_cgroup, "0::/kubepods.slice/online/agent-chat\n"),
    "limits": (process.parse_limits,
               "Limit                     Soft Limit           Hard Limit           Units\n"
               "Max open files            1024                 1048576              files\n"),
    "numa_maps": (process.parse_numa_maps,
                  "558a818f3000 default file=/usr/bin/head mapped=2 N0=2 kernelpagesize_kB=4\n"
                  "7f457b688000 default anon=2 dirty=2 active=0 N0=2 kernelpagesize_kB=4\n"),
}

# Text shaped like /proc files: digits, spaces, newlines, the punctuation they use, and a
# little of everything else.
procish = st.text(
    alphabet=st.sampled_from(list("0123456789 \n\t-,./=:_cpuversionsomefullavgtotalx\x00\u00e9")),
    max_size=400,
)



test_fuzz_garbage, test_fuzz_cut_and_corrupted = parser_fuzz_tests(PARSERS, procish)


@pytest.mark.parametrize("module", [procfs, sysfs, process])
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0
