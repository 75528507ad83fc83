"""Kernel-log wordings older kernels print, as users pasted them in public issues (origin beside
each): arm64 segfaults before 4.19, and memory cgroup OOM kills before 4.19 whose victim is a
child of the task the cgroup chose.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from fleetscope.collectors.parsers.kmsg import scan_kernel_log
from fleetscope.collectors.parsers.oom import scan_oom_kills
from tests.conftest import SCENARIOS

# arm64 up to 4.18 (arch/arm64/mm/fault.c __do_user_fault): "%s[%d]: unhandled %s (%d) at
# 0x%08lx, esr 0x%03x", then (4.14+) ", in " and print_vma_addr, then show_pte and the
# register dump, each a record of its own.
ARM64_OLD_SEGFAULTS = (
    # longsleep/linux-pine64 issue 60: 3.10, rsyslog's /var/log/messages, no boot stamp
    "Aug 17 16:49:07 localhost kernel: abrt-hook-ccpp[28134]: unhandled level 1 translation "
    "fault (11) at 0x00000000, esr 0x92000005\n"
    "Aug 17 16:49:07 localhost kernel: pgd = ffffffc0753f9000\n"
    "Aug 17 16:49:07 localhost kernel: [00000000] *pgd=0000000000000000\n"
    "Aug 17 16:49:07 localhost kernel:\n"
    "Aug 17 16:49:07 localhost kernel: CPU: 3 PID: 28134 Comm: abrt-hook-ccpp Tainted: G"
    "           O 3.10.105-0-pine64-longsleep #3\n"
    "Aug 17 16:49:07 localhost kernel: PC is at 0x7f863750d0\n"
    "Aug 17 16:49:07 localhost kernel: pc : [<0000007f863750d0>] lr : [<0000007f863751a0>] "
    "pstate: a0000000\n"
    # scaleway/image-ubuntu issue 105: 4.9, show_pte's pr_cont pieces in records of their own
    "[947166.937627] polipo[1657]: unhandled level 3 translation fault (11) at 0xffffcd912fe0, "
    "esr 0x92000047\n"
    "[947166.937639] pgd = ffff8000215ca000\n"
    "[947166.939803] [ffffcd912fe0] *pgd=000000008117e003\n"
    "[947166.941993] , *pud=00000000bb2f4003\n"
    "[947166.942090] CPU: 0 PID: 1657 Comm: polipo Tainted: P                4.9.23-std-1 #1\n"
    "[947166.942158] pc : [<0000aaaad8a9473c>] lr : [<0000aaaad8a95b90>] pstate: 80000000\n"
    # the message of Linux commit 5ee39a71fd89 (4.15-rc3, qemu): the mapping after ", in ",
    # the register dump without a boot stamp (the mail wrapped the first line; one record)
    "sigsegv[33]: unhandled level 2 translation fault (11) at 0x00000000, esr 0x92000046, in "
    "sigsegv[400000+71000]\n"
    "CPU: 1 PID: 33 Comm: sigsegv Tainted: G        W        4.15.0-rc3+ #3\n"
    "Hardware name: linux,dummy-virt (DT)\n"
    "pstate: 60000000 (nZCv daif -PAN -UAO)\n"
    "pc : 0x4003f4\n"
    "lr : 0x4006bc\n"
)


def test_arm64_unhandled_translation_faults_are_segfaults():
    scan = scan_kernel_log(ARM64_OLD_SEGFAULTS)
    assert scan.crashes == ()
    got = [(f.arch, f.comm, f.pid, f.binary, f.address, f.seconds) for f in scan.faults]
    assert got == [("arm64", "abrt-hook-ccpp", 28134, "abrt-hook-ccpp", "00000000", None),
                   ("arm64", "polipo", 1657, "polipo", "ffffcd912fe0", 947166.937627),
                   ("arm64", "sigsegv", 33, "sigsegv", "00000000", None)]
    assert [f.description for f in scan.faults] == [
        "level 1 translation fault", "level 3 translation fault", "level 2 translation fault"]
    # the register dump's pc is where it faulted: the offset into the mapping follows
    assert [f.ip for f in scan.faults] == ["7f863750d0", "aaaad8a9473c", "4003f4"]
    assert scan.faults[2].mapping_delta == 0x3f4


def test_an_arm64_fault_without_a_task_is_not_a_crash():
    # rockchip-linux/kernel issue 97: do_mem_abort()'s line names no task (kernel or user)
    assert scan_kernel_log("rk3399 kernel: Unhandled fault: alignment fault (0x92000021) at "
                           "0x00000000005e65c5\n").faults == ()


# Kernels before 4.19 (mm/oom_kill.c oom_kill_process): "%s: Kill process %d (%s) score %u or
# sacrifice child" names the task the OOM killer chose; a child of it may be the one killed,
# in "Killed process %d (%s) total-vm:..." with no reason of its own.
SACRIFICED_CHILDREN = (
    # apache/doris issue 3525: RHEL 7 (UID after the comm), rsyslog, the child 18177 killed
    "May  8 14:05:27 doris-03 kernel: Memory cgroup out of memory: Kill process 24984 (palo_be) "
    "score 968 or sacrifice child\n"
    "May  8 14:05:27 doris-03 kernel: Killed process 18177 (palo_be), UID 0, "
    "total-vm:70347780kB, anon-rss:45563572kB, file-rss:0kB, shmem-rss:0kB\n"
    # docker/for-linux issue 1001: Ubuntu, syslog with the boot stamp
    "May 15 23:01:53 ubuntu-s-1vcpu-2gb-ams3-01 kernel: [  152.700479] Memory cgroup out of "
    "memory: Kill process 4142 (python3) score 68 or sacrifice child\n"
    "May 15 23:01:53 ubuntu-s-1vcpu-2gb-ams3-01 kernel: [  152.701942] Killed process 4254 "
    "(python3) total-vm:11968kB, anon-rss:4288kB, file-rss:3972kB, shmem-rss:0kB\n"
)


def test_a_sacrificed_child_is_the_memory_cgroups_kill():
    kills = scan_oom_kills(SACRIFICED_CHILDREN)
    assert [(k.pid, k.comm, k.constraint, k.seconds) for k in kills] == [
        (18177, "palo_be", "memcg", None), (4254, "python3", "memcg", 152.701942)]


def test_a_global_kill_after_a_memcg_one_stays_global():
    # linux-test-project/ltp issue 1080 (RHEL 7), then a global one from kubernetes/kubernetes
    # issue 50632's node: the reason of one kill is not carried to the next
    kills = scan_oom_kills(
        "Aug 16 20:29:54 hgzmm3cs239 kernel: Memory cgroup out of memory: Kill process 42453 "
        "(memcg_test_1) score 0 or sacrifice child\n"
        "Aug 16 20:29:54 hgzmm3cs239 kernel: Killed process 42453 (memcg_test_1), UID 0, "
        "total-vm:7296kB, anon-rss:96kB, file-rss:164kB, shmem-rss:0kB\n"
        "Nov 30 10:16:57 iZuf601dofntkxgp7lyfi9Z kernel: Killed process 799153 (node), UID 1000, "
        "total-vm:606096kB, anon-rss:68308kB, file-rss:13648kB, shmem-rss:0kB\n")
    assert [(k.pid, k.constraint) for k in kills] == [(42453, "memcg"), (799153, "global")]


def test_the_task_in_line_names_the_memory_cgroup():
    # bluek8s/kubedirector issue 356 (4.x): the report as pasted (the issue wrapped the Task
    # line; one record). Its Killed line is cut off there after "Killed process 62769 (", so
    # it is given here in oom_kill.c's 4.x format, total-vm from the task table (4382 pages).
    pod = ("/kubepods/pod951f6bc5-c5a5-11ea-8707-80e455f266a2/"
           "024952d653ef1cd852f875a61bd27cf45cb1fd6cab3659ca7e5f12f037d99aa9")
    kills = scan_oom_kills(
        f"[5193605.506728] Task in {pod} killed as a result of limit of {pod}\n"
        "[5193605.506735] memory: usage 524288kB, limit 524288kB, failcnt 0\n"
        "[5193605.506956] Memory cgroup out of memory: Kill process 62685 (bash) score 0 or "
        "sacrifice child\n"
        "[5193605.508964] Killed process 62769 (cp) total-vm:17528kB, anon-rss:0kB, "
        "file-rss:0kB, shmem-rss:0kB\n")
    assert [(k.pid, k.comm, k.constraint, k.memcg, k.oom_memcg, k.limit_kb) for k in kills] == [
        (62769, "cp", "memcg", pod, pod, 524288)]


def test_an_arm64_crash_loop_of_a_4_14_kernel_is_found(tmp_path):
    # The crash-loop scenario's segfaults as an arm64 4.14 kernel prints them (its format in
    # arch/arm64/mm/fault.c __do_user_fault; x86's "Code:" lines dropped): the same finding.
    def diagnosis(path) -> list[tuple[str, str, dict]]:
        result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                                 str(path), "--json"], capture_output=True, text=True,
                                timeout=300)
        assert result.returncode in (0, 1, 2), result.stderr
        return [(f["rule"], f["severity"], f["subjects"])
                for f in json.loads(result.stdout)["findings"]]

    bundle = tmp_path / "crash-loop"
    shutil.copytree(SCENARIOS / "crash-loop", bundle)
    x86 = diagnosis(bundle)
    dmesg = bundle / "static" / "dmesg.txt"
    text = re.sub(r"^\[[^\]]+\] Code: .*\n", "", dmesg.read_text(), flags=re.M)
    arm64, count = re.subn(
        r"(?P<task>\S+\[[0-9]+\]): segfault at (?P<address>[0-9a-f]+) ip \S+ sp \S+ error \S+ "
        r"in (?P<name>[^\[]+)\[(?:[0-9a-f]+,)?(?P<vma>[0-9a-f]+\+[0-9a-f]+)\].*",
        lambda m: (f"{m['task']}: unhandled level 0 translation fault (11) at "
                   f"0x{int(m['address'], 16):08x}, esr 0x92000004, in {m['name']}[{m['vma']}]"),
        text)
    assert count == 5
    dmesg.write_text(arm64)
    assert diagnosis(bundle) == x86
    assert [rule for rule, *_ in x86] == ["crash-loop"]


# One report split over records: print_vma_addr() continues the line with pr_cont, and when
# another CPU prints in between, " in <file>[...]" lands in a record of its own, perhaps after
# another task's line. A report to the kernel's bpf list (xskxceiver selftest, 6.x, dmesg;
# found in the linux-mailinglist-archives mirrors): two segfaults, then both continuations.
SPLIT_REPORTS = """\
[ 7340.337579] xskxceiver[1440]: segfault at 1da718 ip 00007f4161aeac9d sp 00007f41615a6a00 error 6
[ 7340.338040] xskxceiver[1441]: segfault at 7f410000000b ip 00000000004042b5 sp 00007f415bffecf0 \
error 4
[ 7340.338179]  in libc.so.6[61c9d,7f4161aaf000+160000]
[ 7340.339230]  in xskxceiver[42b5,400000+69000]
[ 7340.340300]  likely on CPU 6 (core 0, socket 6)
"""


@pytest.mark.parametrize("form", ["dmesg", "journal"])
def test_a_split_report_names_the_file_that_faulted(form):
    text = SPLIT_REPORTS if form == "dmesg" else re.sub(  # as journalctl -k prints the records
        r"^\[[^\]]+\] ", "Dec  6 10:11:12 node7 kernel: ", SPLIT_REPORTS, flags=re.M)
    faults = scan_kernel_log(text).faults
    # each continuation goes to the task whose ip lies in the mapping it names
    assert [(f.pid, f.binary, f.offset, f.mapping_delta) for f in faults] == [
        (1440, "libc.so.6", 0x61c9d, 0x7f4161aeac9d - 0x7f4161aaf000),
        (1441, "xskxceiver", 0x42b5, 0x42b5)]
