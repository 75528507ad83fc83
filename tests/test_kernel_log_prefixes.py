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
