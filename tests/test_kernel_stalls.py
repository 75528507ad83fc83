"""Hung tasks, soft lockups and RCU stalls as real kernels printed them (users' pastes in public
issues, origin beside each; an issue's own indentation removed, nothing else changed), read
into the `kernel_stalls` collector's series and the `hung-task` rule's verdicts.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from fleetscope.collectors.parsers.kmsg import log_clock
from fleetscope.collectors.parsers.stall_log import scan_stalls
from tests.conftest import SCENARIOS

# (origin, kernel and arch, excerpt, [(kind, comm, pid, cpu, stuck)])
CORPUS = [
    ("sonic-net/sonic-buildimage#4822", "4.19 Debian, x86-64",
     "[26825.855448] INFO: task kworker/2:1:5747 blocked for more than 120 seconds.\n"
     "[26825.860651]       Tainted: G        W   E     4.19.0-6-amd64 #1 Debian 4.19.67-2+deb10u2\n"
     "[26825.866477] \"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.\n"
     "[26825.873379] INFO: task ntpd:11794 blocked for more than 120 seconds.\n"
     "[26825.876949]       Tainted: G        W   E     4.19.0-6-amd64 #1 Debian "
     "4.19.67-2+deb10u2\n",
     [("hung_task", "kworker/2:1", 5747, None, 120.0), ("hung_task", "ntpd", 11794, None, 120.0)]),
    ("gluster/gluster-health-report#19", "3.10 CentOS 7 syslog, x86-64",
     "Oct 11 06:07:26 glustern1 kernel: INFO: task glusterfsd:26120 blocked for more than 120 "
     "seconds.\n"
     "Oct 11 06:07:26 glustern1 kernel: \"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" "
     "disables this message.\n"
     "Oct 11 06:07:26 glustern1 kernel: bptm            D ffff8817dddf80b0     0 26120  26119 "
     "0x00000080\n"
     "Oct 11 06:07:26 glustern1 kernel: Call Trace:\n"
     "Oct 11 06:07:26 glustern1 kernel: [<ffffffff8168994f>] mutex_lock+0x1f/0x2f\n",
     [("hung_task", "glusterfsd", 26120, None, 120.0)]),
    ("elastic/logstash#3727", "2.6.32 RHEL 6, x86-64",
     "[130080.754158] INFO: task jbd2/vda1-8:404 blocked for more than 120 seconds.\n"
     "[130080.760642] Not tainted 2.6.32-504.3.3.el6.x86_64 #1\n"
     "[130080.768831] jbd2/vda1-8 D 0000000000000000 0 404 2 0x00000000\n",
     [("hung_task", "jbd2/vda1-8", 404, None, 120.0)]),
    ("logrotate/logrotate#232", "4.16 elrepo on EL7, dmesg -T, x86-64",
     "[Wed Dec 19 03:36:07 2018] INFO: task logrotate:17344 blocked for more than 120 seconds.\n"
     "[Wed Dec 19 03:36:07 2018]       Not tainted 4.16.2-1.el7.elrepo.x86_64 #1\n"
     "[Wed Dec 19 03:36:07 2018] logrotate       D    0 17344  17342 0x00000080\n"
     "[Wed Dec 19 03:36:07 2018] Call Trace:\n"
     "[Wed Dec 19 03:36:07 2018]  jbd2_log_wait_commit+0x98/0x120 [jbd2]\n",
     [("hung_task", "logrotate", 17344, None, 120.0)]),
    ("rockchip-linux/kernel#298", "4.19 RK3399, aarch64 (timeout 10 s)",
     "[   80.481916] INFO: task swapper/0:1 blocked for more than 10 seconds.\n"
     "[   80.481931]       Not tainted 4.19.193 #1\n"
     "[   80.481946] swapper/0       D    0     1      0 0x00000028\n"
     "[   80.481958] Call trace:\n"
     "[   80.481971]  __switch_to+0xc0/0x104\n",
     [("hung_task", "swapper/0", 1, None, 10.0)]),
    ("ophub/amlogic-s9xxx-openwrt#641", "6.6, aarch64",
     "[208560.275403] INFO: task kthreadd:2 blocked for more than 120 seconds.\n"
     "[208560.277302]       Tainted: G         C         6.6.43-flippy-91+ #87\n"
     "[208560.291611] task:kthreadd        state:D stack:0     pid:2     ppid:0      "
     "flags:0x00000008\n"
     "[208560.291634] Call trace:\n"
     "[208560.291638]  __switch_to+0x164/0x270\n",
     [("hung_task", "kthreadd", 2, None, 120.0)]),
    ("thesofproject/linux#3387", "5.18 journal, x86-64",
     "May 31 22:34:22 sh-tglh-0a70-hda-01 kernel: INFO: task kworker/u32:2:113 blocked for more "
     "than 122 seconds.\n"
     "May 31 22:34:22 sh-tglh-0a70-hda-01 kernel:       Not tainted "
     "5.18.0-rc2-daily-default-20220531-0-g46f61a08b40c #dev\n"
     "May 31 22:34:22 sh-tglh-0a70-hda-01 kernel: task:kworker/u32:2   state:D stack:13032 pid:  "
     "113 ppid:     2 flags:0x00004000\n",
     [("hung_task", "kworker/u32:2", 113, None, 122.0)]),
    ("raspberrypi/linux#1587", "4.14, armv7l, syslog without a host",
     "May 17 18:48:11 kernel: [ 6141.921740] INFO: task kworker/u8:0:5 blocked for more than 120 "
     "seconds.\n"
     "May 17 18:48:11 kernel: [ 6141.921785] kworker/u8:0    D    0     5      2 0x00000000\n",
     [("hung_task", "kworker/u8:0", 5, None, 120.0)]),
    ("ROCm/amdgpu#150", "6.2 Ubuntu, x86-64",
     "[279123.167759] task:ipython3        state:D stack:0     pid:827200 ppid:742680 "
     "flags:0x00004002\n"
     "[279123.167866] INFO: task ipython3:827201 blocked for more than 120 seconds.\n"
     "[279123.169050]       Tainted: G        W  OE      6.2.0-35-generic #35~22.04.1-Ubuntu\n",
     [("hung_task", "ipython3", 827201, None, 120.0)]),
    ("sched-ext/sched_ext#131", "6.7, x86-64, no stamp",
     "INFO: task kworker/u4:5:1105 blocked for more than 143 seconds.\n"
     "      Not tainted 6.7.0-g65c265174d11 #7\n"
     "task:kworker/u4:5    state:D stack:11608 pid:1105  tgid:1105  ppid:2      "
     "flags:0x00004000\n",
     [("hung_task", "kworker/u4:5", 1105, None, 143.0)]),
    # console output interleaved with the report: the fragments are no second report
    ("GoogleCloudPlatform/compute-image-packages#905", "5.10 Debian 11, x86-64",
     "[34315.120624] INFO: task jbd2/sda1-8:161 blocked for more than 120 seconds.\n"
     "[34315.127680]       Not tainted 5.10.0-8-cloud-amd64 #1 Debian 5.10.46-4\n"
     "[34315.142345] task:jbd2/sda1-8     state:D stack:    0 pid:  161 ppid:     2 "
     "flags:0x00004000\n"
     "INFO: task jbd2/[34315.188943]  __rq_qos_throttle+0x23/0x30\n"
     "sda1-8:161 block[34315.198883]  submit_bio_noacct+0x3a9/0x420\n"
     "ed for more than[34315.212349]  jbd2_journal_commit_transaction+0x60a/0x1ad0\n"
     " 120 seconds.\n",
     [("hung_task", "jbd2/sda1-8", 161, None, 120.0)]),
    ("shuzhiduo.com/A/pRdBavPa5n (CentOS 6 dmesg)", "2.6.32, x86-64, no prefix, no stamp",
     "BUG: soft lockup - CPU#2 stuck for 67s! [vmmemctl:894]\n"
     "BUG: soft lockup - CPU#4 stuck for 67s! [swapper:0]\n",
     [("soft_lockup", "vmmemctl", 894, 2, 67.0), ("soft_lockup", "swapper", 0, 4, 67.0)]),
    ("imq/linuximq#8", "4.0 VMware, x86-64 ('NMI watchdog: ')",
     "[  520.451222] NMI watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [sshd:2645]\n"
     "[  520.451906] CPU: 0 PID: 2645 Comm: sshd Tainted: G           O    4.0.5 #2\n",
     [("soft_lockup", "sshd", 2645, 0, 22.0)]),
    ("systemd/systemd-centos-ci#660", "6.5 Arch, x86-64, panic on soft lockup",
     "[   36.537323] watchdog: BUG: soft lockup - CPU#3 stuck for 27s! [swapper/3:0]\n"
     "[   36.560762]  </TASK>\n"
     "[   36.560762] Kernel panic - not syncing: softlockup: hung tasks\n"
     "[   36.560762] CPU: 3 PID: 0 Comm: swapper/3 Tainted: G             L     6.5.3-arch1-1 #1\n",
     [("soft_lockup", "swapper/3", 0, 3, 27.0)]),
    ("ubicloud/ubicloud#1113", "6.5 Azure, aarch64",
     "[  904.173307] watchdog: BUG: soft lockup - CPU#1 stuck for 842s! [udevadm:94]\n"
     "[  904.174417] CPU: 1 PID: 94 Comm: udevadm Tainted: G             L     6.5.0-1007-azure "
     "#7~22.04.1-Ubuntu\n"
     "[  904.175111] pstate: 00400005 (nzcv daif +PAN -UAO -TCO -DIT -SSBS BTYPE=--)\n"
     "[  904.175621] pc : d_alloc_parallel+0xb8/0x3d8\n",
     [("soft_lockup", "udevadm", 94, 1, 842.0)]),
    ("sonic-net/sonic-buildimage#17358", "5.10 Debian, x86-64",
     "[ 5300.229390] watchdog: BUG: soft lockup - CPU#2 stuck for 23s! [kworker/2:1:25629]\n"
     "[ 5300.237965] Kernel panic - not syncing: softlockup: hung tasks\n",
     [("soft_lockup", "kworker/2:1", 25629, 2, 23.0)]),
    ("starfive-tech/Fedora_on_StarFive#34", "5.12, riscv64",
     "[53021.381908] watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [cc1plus:171665]\n",
     [("soft_lockup", "cc1plus", 171665, 1, 22.0)]),
    # a task name with a space and a slash (a QEMU vCPU thread)
    ("harvester/harvester#564", "5.x, dmesg -T, x86-64",
     "[Thu Mar 25 00:50:20 2021] rcu: INFO: rcu_sched detected stalls on CPUs/tasks:\n"
     "[Thu Mar 25 00:50:20 2021] rcu:         9-...!: (0 ticks this GP) idle=850/0/0x0 "
     "softirq=354327/354327 fqs=1\n"
     "[Thu Mar 25 00:50:20 2021] rcu:         11-...!: (0 ticks this GP) idle=dd0/0/0x0 "
     "softirq=363050/363050 fqs=1\n"
     "[Thu Mar 25 00:50:20 2021]      (detected by 2, t=663225 jiffies, g=890229, q=72)\n"
     "[Thu Mar 25 00:50:20 2021] Sending NMI from CPU 2 to CPUs 9:\n"
     "[Thu Mar 25 00:50:20 2021] watchdog: BUG: soft lockup - CPU#1 stuck for 2471s! "
     "[CPU 0/KVM:31664]\n"
     "[Thu Mar 25 00:50:20 2021] NMI backtrace for cpu 9 skipped: idling at "
     "native_safe_halt+0xe/0x10\n",
     [("rcu_stall", "", None, 9, None), ("soft_lockup", "CPU 0/KVM", 31664, 1, 2471.0)]),
    ("oxidecomputer/propolis#1153", "6.18 NixOS journal, x86-64",
     "Jun 11 14:12:22 oxcolo kernel: rcu: INFO: rcu_preempt self-detected stall on CPU\n"
     "Jun 11 14:12:22 oxcolo kernel: rcu:         0-....: (1 GPs behind) idle=3514/0/0x3 "
     "softirq=671080/671080 fqs=3762\n"
     "Jun 11 14:12:22 oxcolo kernel: rcu:         (t=21002 jiffies g=1292137 q=85 ncpus=2)\n",
     [("rcu_stall", "", None, 0, None)]),
    ("cilium/tetragon#328", "5.x, x86-64 (starved kthread: no stall of its own)",
     "[  103.087243] rcu: INFO: rcu_sched detected stalls on CPUs/tasks:\n"
     "[  103.087558] rcu: \t1-...!: (0 ticks this GP) idle=cf8/0/0x0 softirq=20/20 fqs=0 \n"
     "[  103.087821] \t(detected by 0, t=38227 jiffies, g=-1127, q=10)\n"
     "[  103.088153] rcu: rcu_sched kthread starved for 38227 jiffies! g-1127 f0x0 "
     "RCU_GP_WAIT_FQS(5) ->state=0x402 ->cpu=1\n",
     [("rcu_stall", "", None, 1, None)]),
    ("openzfs/zfs#557", "3.0 Ubuntu syslog, x86-64",
     "Nov 24 19:39:04 gsan1-coy kernel: [ 3556.510903] INFO: rcu_sched_state detected stall on "
     "CPU 0 (t=105060 jiffies)\n"
     "Nov 24 22:13:27 gsan1-coy kernel: [12757.540104] INFO: rcu_sched_state detected stalls on "
     "CPUs/tasks: { 2} (detected by 7, t=15002 jiffies)\n",
     [("rcu_stall", "", None, 0, None), ("rcu_stall", "", None, 2, None)]),
]


@pytest.mark.parametrize("origin, kernel, text, expected", CORPUS,
                         ids=[origin for origin, *_ in CORPUS])
def test_every_report_of_the_corpus_is_read_right(origin, kernel, text, expected):
    got = [(s.kind, s.comm, s.pid, s.cpu, s.stuck) for s in scan_stalls(text).stalls]
    assert got == expected, f"{origin} ({kernel})"


def test_the_corpus_spans_kernels_arches_and_kinds():
    kernels = " ".join(kernel for _, kernel, *_ in CORPUS)
    for version in ("2.6", "3.", "4.", "5.", "6."):
        assert version in kernels
    assert "aarch64" in kernels and "x86-64" in kernels
    kinds = {kind for *_, expected in CORPUS for kind, *_ in expected}
    assert kinds == {"hung_task", "soft_lockup", "rcu_stall"}


def test_times_come_from_boot_stamps_and_wall_clock_stamps():
    text = "".join(text for origin, _, text, _ in CORPUS if origin in (
        "sonic-net/sonic-buildimage#4822", "logrotate/logrotate#232"))
    boot = 1545100000.0  # a boot before the dmesg -T stamp (2018-12-19 03:36:07 UTC)
    stalls = scan_stalls(text, clock=log_clock(boot, 1545200000.0)).stalls
    assert [s.seconds for s in stalls[:2]] == [26825.855448, 26825.873379]
    assert stalls[2].seconds == pytest.approx(1545190567.0 - boot)
    assert scan_stalls(text).stalls[2].seconds is None  # no clock: counted, timeless


NEGATIVES = [
    # sched_show_task()'s line, the hint and the taint line of a report: not reports
    "[279123.167759] task:ipython3        state:D stack:0     pid:827200 ppid:742680 "
    "flags:0x00004002\n",
    "[26825.866477] \"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.\n",
    # panic after a soft lockup (systemd/systemd-centos-ci#660): no second report
    "[   36.560762] Kernel panic - not syncing: softlockup: hung tasks\n",
    # RCU's own kthread starved (cilium/tetragon#328): no CPU stalled
    "[  103.088153] rcu: rcu_sched kthread starved for 38227 jiffies! g-1127 f0x0 "
    "RCU_GP_WAIT_FQS(5) ->state=0x402 ->cpu=1\n",
    # a program's own words written to /dev/kmsg (facility user): not the kernel's
    "12,5001,200000000,-;agent: INFO: task demo:1 blocked for more than 120 seconds.\n",
    # an interleaved fragment (GoogleCloudPlatform/compute-image-packages#905)
    "INFO: task jbd2/[34315.188943]  __rq_qos_throttle+0x23/0x30\n",
    # a forum's retelling, not the kernel's format (devinit/devdatawarehouse#61)
    "BUG: soft lockup - CPU stuck for 23s! [nautilus-search: 4883]\n",
]


@pytest.mark.parametrize("line", NEGATIVES)
def test_lines_that_are_no_report_are_not_counted(line):
    assert scan_stalls(line).stalls == ()


def test_the_lock_owner_and_spent_warnings_are_kept():
    # kernel/hung_task.c debug_show_blocker() (6.14+) and the hung_task_warnings notice,
    # in the words of the kernel source
    scan = scan_stalls(
        "[  246.752114] INFO: task python3:4321 blocked for more than 122 seconds.\n"
        "[  246.752200] INFO: task python3:4321 is blocked on a mutex likely owned by task "
        "splicer:4320.\n"
        "[  246.752300] Future hung task reports are suppressed, see sysctl "
        "kernel.hung_task_warnings\n")
    assert [s.blocker for s in scan.stalls] == ["mutex owned by task splicer:4320"]
    assert scan.suppressed


def test_a_nul_byte_is_a_parse_error():
    from fleetscope.collectors.parsers import ParseError

    with pytest.raises(ParseError):
        scan_stalls("[ 1.0] INFO: task a:1 blocked for more than 120 seconds.\x00\n")


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_reports_become_per_kind_counts_and_times(tmp_path):
    from fleetscope.core.config import parse_config
    from fleetscope.core.exposition import render
    from fleetscope.exporter import Exporter
    from tests.conftest import samples

    _write(tmp_path / "proc/stat", "cpu  1 0 1 100 0 0 0 0 0 0\nbtime 1764880000\n")
    _write(tmp_path / "dmesg.txt", "".join(text for origin, _, text, _ in CORPUS if origin in (
        "sonic-net/sonic-buildimage#4822", "ubicloud/ubicloud#1113")))
    config = parse_config({"collectors": ["kernel_stalls"]}, ("kernel_stalls",))
    got = samples(render(Exporter(str(tmp_path), config).collect(now=1764910000.0)))
    assert got['fleetscope_kernel_stall_reports_total{kind="hung_task"}'] == 2
    assert got['fleetscope_kernel_stall_reports_total{kind="soft_lockup"}'] == 1
    assert got['fleetscope_kernel_stall_reports_total{kind="rcu_stall"}'] == 0
    assert got['fleetscope_kernel_stall_last_timestamp_seconds{kind="hung_task"}'] == \
        1764880000 + 26825.873
    assert got['fleetscope_kernel_stall_previous_timestamp_seconds{kind="hung_task"}'] == \
        1764880000 + 26825.855
    assert 'fleetscope_kernel_stall_previous_timestamp_seconds{kind="soft_lockup"}' not in got
    assert got['fleetscope_kernel_stall_last_stuck_seconds{kind="soft_lockup"}'] == 842


def test_an_unreadable_log_degrades_to_not_available(tmp_path):
    from fleetscope.core.config import parse_config
    from fleetscope.core.exposition import render
    from fleetscope.exporter import Exporter
    from tests.conftest import samples

    _write(tmp_path / "proc/stat", "cpu  1 0 1 100 0 0 0 0 0 0\nbtime 1764880000\n")
    _write(tmp_path / "dmesg.txt", "[ 1.0] INFO: task a:1 blocked for more than 1 seconds.\x00")
    config = parse_config({"collectors": ["kernel_stalls"]}, ("kernel_stalls",))
    got = samples(render(Exporter(str(tmp_path), config).collect(now=1764910000.0)))
    assert not any(name.startswith("fleetscope_kernel_stall_") for name in got)
    assert any(name.startswith("fleetscope_scrape_source_available") and "kernel_stalls" in name
               and value == 0 for name, value in got.items())


_BOOT_STAMPED = re.compile(r"^\[\s*([0-9]+\.[0-9]+)\] (.*)$", re.M)
_STALL = re.compile(r"soft lockup|blocked for more than")


def _findings(path) -> list[tuple[str, str, str]]:
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                             str(path), "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1, 2), result.stderr
    return [(f["rule"], f["severity"], f.get("phase", "")) for f in
            json.loads(result.stdout)["findings"] if f["rule"] == "hung-task"]


def _rewrite(bundle, keep, shift: float = 0.0) -> None:
    """The scenario's dmesg.txt with only the stall reports `keep(line)` accepts, moved
    `shift` seconds earlier."""
    dmesg = bundle / "static" / "dmesg.txt"
    out = []
    for line in dmesg.read_text().splitlines(keepends=True):
        if _STALL.search(line) and not keep(line):
            continue
        match = _BOOT_STAMPED.match(line)
        if match and shift and _STALL.search(line):
            line = f"[{float(match.group(1)) - shift:12.6f}] {match.group(2)}\n"
        out.append(line)
    dmesg.write_text("".join(out))


@pytest.mark.parametrize("keep, shift, expected", [
    # a soft lockup now: critical
    (lambda line: "soft lockup" in line and "48s" in line, 0.0, ("critical", "ongoing")),
    # one hung task now: a warning; the same task reported again: critical
    (lambda line: "blocked" in line, 0.0, ("warning", "ongoing")),
    # the stalls ten minutes before the window's end: ended; an hour before: history
    (lambda line: True, 600.0, ("warning", "ended")),
    (lambda line: True, 3600.0, ("info", "ended")),
], ids=["soft-lockup-now", "one-hung-task", "ended", "earlier"])
def test_severity_by_kind_and_recency(tmp_path, keep, shift, expected):
    bundle = tmp_path / "b"
    shutil.copytree(SCENARIOS / "hung-task", bundle)
    _rewrite(bundle, keep, shift)
    findings = _findings(bundle)
    assert [(severity, phase) for _, severity, phase in findings] == [expected]


def test_a_hung_task_reported_twice_is_critical(tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(SCENARIOS / "hung-task", bundle)
    _rewrite(bundle, lambda line: "blocked" in line)
    dmesg = bundle / "static" / "dmesg.txt"
    text = dmesg.read_text()
    report = next(line for line in text.splitlines() if "blocked for more than" in line)
    stamp = float(_BOOT_STAMPED.match(report).group(1))
    again = report.replace(f"{stamp:12.6f}".strip(), f"{stamp + 30:.6f}").replace(
        "120 seconds", "150 seconds")
    dmesg.write_text(text + again + "\n")
    assert [(s, p) for _, s, p in _findings(bundle)] == [("critical", "ongoing")]


def test_a_hung_task_the_kernel_reported_here_names_its_lock_owner():
    """A real report of this machine's 6.18 kernel (tests/fixtures/kmsg/README.md): a pipe
    writer in D state behind a splice holding the pipe's mutex; the blocker line names it."""
    from pathlib import Path

    text = (Path(__file__).parent / "fixtures" / "kmsg" / "hung-task-6.18-live.txt").read_text()
    stalls = scan_stalls(text).stalls
    assert [(s.kind, s.comm, s.pid, s.stuck) for s in stalls] == [
        ("hung_task", "python3", 10544, 120.0)]
    assert stalls[0].blocker == "mutex owned by task python3:10500"
    assert stalls[0].seconds == pytest.approx(81351.954748)
