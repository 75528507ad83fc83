"""Kernel logs as fleets write them: a syslog or journal prefix before the boot stamp.

Reproduced: `host kernel: [ 1611.175045] traps: ...` (syslog, `journalctl -k -o short`) and
`kernel: [ ...] ...` counted the crash but lost its time and read the task as
`[ 1611.175045] traps: python`, so isa-mismatch and crash-loop never fired from such a log.
"""

from __future__ import annotations

import pytest

from fleetscope.collectors.parsers.kmsg import scan_kernel_log

TRAP = ("traps: python[4242] trap invalid opcode ip:7f3a2c1d5e10 sp:7ffd9a1b2c30 error:0 in "
        "libagentcore.so[7f3a2c000000+3d0000]")
SEGFAULT = ("agent_worker[5151]: segfault at 0 ip 00005598aefc3139 sp 00007ffe1d2c3b40 "
            "error 6 in agent_worker[5598aefc3000+1000]")


@pytest.mark.parametrize("prefix", [
    "Dec  6 12:00:01 node7 kernel: ",  # rsyslog's /var/log/messages, journalctl -o short
    "2026-12-06T12:00:01.123456+08:00 node7 kernel: ",  # rsyslog's RFC 3339 stamps
    "kernel: ",  # journalctl -o cat with the identifier
    "",  # dmesg itself
])
def test_a_prefixed_line_keeps_its_task_and_boot_time(prefix):
    scan = scan_kernel_log(f"{prefix}[ 1611.175045] {TRAP}\n{prefix}[ 1612.250000] {SEGFAULT}\n")
    assert [(c.comm, c.pid, c.binary, c.seconds) for c in scan.crashes] == [
        ("python", 4242, "libagentcore.so", 1611.175045)]
    assert [(f.comm, f.pid, f.seconds) for f in scan.faults] == [
        ("agent_worker", 5151, 1612.25)]


# Lines users pasted from RHEL 7.9 (microsoft/omi issue 733) and Oracle Linux 6
# (apple/cups issue 5687): 3.x/4.x kernels print "general protection", no "fault".
OLDER_GP = (
    "messages-20230122:Jan 19 07:58:14 hostname kernel: [ 1037.095796] traps: omiengine[2417] "
    "general protection ip:7fae689668c1 sp:7ffc5a4208b8 error:0 in libc-2.17.so"
    "[7fae687f7000+1c4000]\n"
    "kernel: cupsd[9073] general protection ip:7f3dd1338716 sp:7ffdadea62d8 error:0 in "
    "libc-2.12.so[7f3dd1210000+18b000]\n")


def test_the_older_general_protection_wording_is_a_fatal_trap():
    faults = scan_kernel_log(OLDER_GP).faults
    assert [(f.comm, f.pid, f.binary, f.seconds) for f in faults] == [
        ("omiengine", 2417, "libc-2.17.so", 1037.095796), ("cupsd", 9073, "libc-2.12.so", None)]


# OOM kills as RHEL 7 (kubernetes/kubernetes issue 50632) and CentOS 6 (cPanelSSP/SSP issue
# 76) kernels print them: the UID after the comm, or between the pid and the comm.
OLDER_KILLS = (
    "Nov 30 10:16:57 iZuf601dofntkxgp7lyfi9Z kernel: Killed process 799153 (node), UID 1000, "
    "total-vm:606096kB, anon-rss:68308kB, file-rss:13648kB, shmem-rss:0kB\n"
    "Mar  2 17:35:10 server1 kernel: [2858609.598568] Killed process 11726, UID 498, (mysqld) "
    "total-vm:7823732kB, anon-rss:2539268kB, file-rss:768kB\n")


def test_the_older_oom_kill_wordings_are_kills():
    from fleetscope.collectors.parsers.oom import scan_oom_kills

    assert [(k.pid, k.comm, k.seconds) for k in scan_oom_kills(OLDER_KILLS)] == [
        (799153, "node", None), (11726, "mysqld", 2858609.598568)]
