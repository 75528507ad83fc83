"""Parsers on real samples (inline) and on the malformed inputs a node can hand them."""

from __future__ import annotations

import pytest

from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers.procfs import (
    CPU_STAT_FIELDS,
    parse_loadavg,
    parse_pressure,
    parse_proc_stat,
    parse_schedstat,
)
from fleetscope.collectors.parsers.sysfs import parse_cpulist

# Verbatim from a Linux 6.18 x86_64 VM (kernel Documentation/filesystems/proc.rst).
PROC_STAT_REAL = """\
cpu  2693 0 1863 312790 314 0 50 116 0 0
cpu0 837 0 674 157344 6 0 8 45 0 0
cpu1 1856 0 1189 155446 308 0 41 71 0 0
intr 155476 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
ctxt 313870
btime 1764600000
processes 2093
procs_running 2
procs_blocked 0
softirq 9000 1 2 3 4 5 6 7 8 9 8955
"""


def test_proc_stat_real_sample():
    stat = parse_proc_stat(PROC_STAT_REAL)
    assert sorted(stat.cpus) == [0, 1]
    assert stat.cpus[1][CPU_STAT_FIELDS.index("user")] == 1856
    assert stat.cpus[1][CPU_STAT_FIELDS.index("steal")] == 71
    assert stat.total == (2693, 0, 1863, 312790, 314, 0, 50, 116, 0, 0)
    assert stat.scalars["ctxt"] == 313870
    assert stat.scalars["procs_running"] == 2
    assert stat.interrupts_total == 155476
    assert stat.softirqs_total == 9000


def test_proc_stat_old_kernel_without_guest_columns():
    # 2.6.24-era kernels print 8 columns (no guest, guest_nice): they read as 0.
    stat = parse_proc_stat("cpu  1 2 3 4 5 6 7 8\ncpu0 1 2 3 4 5 6 7 8\n")
    assert stat.cpus[0] == (1, 2, 3, 4, 5, 6, 7, 8, 0, 0)


def test_proc_stat_cpu_numbering_with_gaps():
    # Offline CPUs have no line; numbers are kept, not renumbered.
    stat = parse_proc_stat("cpu  2 0 0 2 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n"
                           "cpu3 1 0 0 1 0 0 0 0 0 0\n")
    assert sorted(stat.cpus) == [0, 3]


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no cpu lines"),
        ("intr 5\nctxt 9\n", "no cpu lines"),
        ("cpu  1 2 3\ncpu0 1 2 3\n", "fields"),  # truncated mid-line
        ("cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 1 2 x 4 5 6 7 8 9 10\n", "/proc/stat"),
        ("cpu  1 2 3 4 5 6 7 8 9 10\ncpuX 1 2 3 4 5 6 7 8 9 10\n", "cpu number"),
        ("cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 1 2 3 4 5 6 7 8 9 10\ncpu0 1 2 3 4 5 6 7 8 9 10\n",
         "twice"),
        ("cpu  1 2 3 4 5 6 7 -8 9 10\ncpu0 1 2 3 4 5 6 7 8 9 10\n", "negative"),
        ("cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 1 2 3 4 5 6 7 8 9 10\nctxt many\n", "ctxt"),
        ("cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr\n", "/proc/stat"),
        ("cpu  1 2 3 4 5 6 7 8 9 10\ncpu0 1 2 3 4 5 6 7 8 9 10 \u00e9\n", "non-ASCII"),
    ],
)
def test_proc_stat_malformed(text, message):
    with pytest.raises(ParseError, match=message):
        parse_proc_stat(text)


def test_loadavg():
    load = parse_loadavg("0.20 0.18 0.12 1/80 11206\n")
    assert (load.load1, load.load5, load.load15) == (0.2, 0.18, 0.12)
    assert (load.runnable, load.threads, load.last_pid) == (1, 80, 11206)


@pytest.mark.parametrize(
    "text", ["", "0.20 0.18 0.12\n", "nan 0.18 0.12 1/80 11206\n", "1e3 0 0 1/80 1\n",
             "0.20 0.18 0.12 1-80 11206\n", "0.20 0.18 0.12 /80 11206\n"],
)
def test_loadavg_malformed(text):
    with pytest.raises(ParseError):
        parse_loadavg(text)


def test_pressure_real_sample_and_old_kernel_cpu():
    # Verbatim from a 6.18 VM (kernel Documentation/accounting/psi.rst).
    io = parse_pressure("some avg10=2.32 avg60=0.64 avg300=0.48 total=3035326\n"
                        "full avg10=2.32 avg60=0.64 avg300=0.46 total=2891613\n")
    assert io["some"].total_us == 3035326 and io["full"].avg300 == 0.46
    # Kernels before 5.13 print only `some` for cpu; /proc/pressure/irq only `full`.
    assert set(parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")) == {"some"}
    assert set(parse_pressure("full avg10=0.00 avg60=0.00 avg300=0.00 total=12\n")) == {"full"}


@pytest.mark.parametrize(
    "text", ["", "some avg10=1.65 avg60=0.50 avg300=0.33\n",
             "some avg10=1.65 avg60=0.50 avg300=0.33 total=-4\n",
             "some avg60=1.65 avg10=0.50 avg300=0.33 total=4\n",
             "many avg10=1.65 avg60=0.50 avg300=0.33 total=4\n",
             "some avg10=inf avg60=0.50 avg300=0.33 total=4\n"],
)
def test_pressure_malformed(text):
    with pytest.raises(ParseError):
        parse_pressure(text)


SCHEDSTAT_REAL = """\
version 15
timestamp 4295347219
cpu0 0 0 0 0 0 0 3035466036 858375615 67578
domain0 0000,01000001 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
cpu1 0 0 0 0 0 0 2035466036 58375615 7578
domain0 0000,02000002 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
"""


def test_schedstat_real_sample():
    cpus = parse_schedstat(SCHEDSTAT_REAL)
    assert cpus[0].running_ns == 3035466036
    assert cpus[0].waiting_ns == 858375615
    assert cpus[1].timeslices == 7578


def test_schedstat_v17_domain_names_are_skipped():
    text = ("version 17\ntimestamp 1\ncpu0 0 0 0 0 0 0 10 20 30\n"
            "domain0 SMT 00000003 " + " ".join(["0"] * 45) + "\n")
    assert parse_schedstat(text)[0].waiting_ns == 20


@pytest.mark.parametrize(
    "text", ["", "timestamp 1\ncpu0 0 0 0 0 0 0 1 2 3\n", "version 14\ncpu0 0 0 0 0 0 0 1 2 3\n",
             "version 15\ntimestamp 1\n", "version 15\ncpu0 0 0 0 0 0 0 1 2\n",
             "version 15\ncpu0 0 0 0 0 0 0 1 x 3\n"],
)
def test_schedstat_malformed(text):
    with pytest.raises(ParseError):
        parse_schedstat(text)


@pytest.mark.parametrize(
    "text, cpus",
    [("0-3\n", [0, 1, 2, 3]), ("0-1,128-129\n", [0, 1, 128, 129]), ("7\n", [7]), ("\n", [])],
)
def test_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["3-1", "0-", "a", "0-4294967295", "1,,2", "-1"])
def test_cpulist_malformed(text):
    with pytest.raises(ParseError):
        parse_cpulist(text)
