"""Kernel logs whose lines carry a wall-clock stamp, or none: `journalctl -k` (short, short-iso,
short-precise), `dmesg -T`, `dmesg -x`, rsyslog's files (RFC 3164 and RFC 5424). Their events
were counted but had no time, so no rule that looks back over the log found them; a bundle
recorded from `journalctl -k` read healthy. The node's boot time (/proc/stat btime) puts a
wall-clock stamp on the kernel's clock (seconds since boot); a stamp without a year is in the
year of the time the log was read, and one without a zone is UTC.
"""

from __future__ import annotations

import calendar
import json
import re
import shutil
import subprocess
import sys
import time

import pytest

from fleetscope.collectors.parsers.kmsg import log_clock, scan_kernel_log
from fleetscope.collectors.parsers.oom import scan_oom_kills
from fleetscope.collectors.parsers.pids_log import fork_rejections
from tests.conftest import SCENARIOS


def _utc(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M:%S")))


BOOT = _utc("2019-04-01 00:00:00")
CLOCK = log_clock(BOOT, _utc("2019-04-05 12:00:00"))


def test_rsyslog_file_lines_without_a_boot_stamp():
    # open-ch/log-user-session issue 15: CentOS 7.6's /var/log/messages (RFC 3164, what
    # `journalctl -k` prints as well): no year, no zone
    faults = scan_kernel_log(
        "Apr  4 05:00:12 test-f kernel: log-user-sessio[66297]: segfault at 0 ip "
        "0000000000402669 sp 00007ffe203fb570 error 4 in log-user-session[400000+5000]\n",
        clock=CLOCK).faults
    assert [(f.pid, f.seconds) for f in faults] == [
        (66297, _utc("2019-04-04 05:00:12") - BOOT)]
    # without the node's boot time the line still counts, its time unknown
    assert scan_kernel_log("Apr  4 05:00:12 test-f kernel: log-user-sessio[66297]: segfault at "
                           "0 ip 0000000000402669 sp 00007ffe203fb570 error 4 in "
                           "log-user-session[400000+5000]\n").faults[0].seconds is None


def test_a_stamp_without_a_year_is_not_in_the_future():
    # read on 2 January: a line from 31 December is last year's
    clock = log_clock(_utc("2018-12-01 00:00:00"), _utc("2019-01-02 00:00:00"))
    faults = scan_kernel_log(
        "Dec 31 23:59:59 test-f kernel: log-user-sessio[66297]: segfault at 0 ip "
        "0000000000402669 sp 00007ffe203fb570 error 4 in log-user-session[400000+5000]\n",
        clock=clock).faults
    assert clock.boot + faults[0].seconds == _utc("2018-12-31 23:59:59")


def test_dmesg_T_stamps():
    # kubernetes/kubernetes issue 56891 (RHEL 7.2, `dmesg -T`): the year, no zone
    clock = log_clock(_utc("2017-11-01 00:00:00"), _utc("2017-12-07 01:00:00"))
    kills = scan_oom_kills(
        "[Thu Dec  7 00:05:15 2017] Memory cgroup out of memory: Kill process 24572 (java) "
        "score 0 or sacrifice child\n"
        "[Thu Dec  7 00:05:15 2017] Killed process 28438 (java) total-vm:20255636kB, "
        "anon-rss:466160kB, file-rss:13684kB\n", clock=clock)
    assert [(k.pid, k.constraint, clock.boot + k.seconds) for k in kills] == [
        (28438, "memcg", _utc("2017-12-07 00:05:15"))]


def test_journal_iso_stamps_carry_their_zone():
    # crash-loop's arm64 line from Ubuntu 6.8's journal (tests/test_crashlock.py), `-o short-iso`
    # with the zone; rsyslog's RFC 3339 file stamps, microseconds and an offset, read alike
    line = ("mte_test[2263]: unhandled exception: DABT (lower EL), ESR 0x0000000092000051, "
            "synchronous tag check fault in mte_test[b847a9c80000+1000]")
    clock = log_clock(_utc("2026-07-08 00:00:00"), _utc("2026-07-08 12:00:00"))
    for stamp, wall in (("2026-07-08T10:01:32+0000 kernel: ", _utc("2026-07-08 10:01:32")),
                        ("2026-07-08T12:01:32.250000+02:00 node7 kernel: ",
                         _utc("2026-07-08 10:01:32") + 0.25)):
        fault = scan_kernel_log(stamp + line + "\n", clock=clock).faults[0]
        assert clock.boot + fault.seconds == pytest.approx(wall)


def test_journal_short_precise_and_rfc5424_lines():
    # intel/pcm issue 368's general protection fault (a 5.x kernel, dmesg), as
    # `journalctl -k -o short-precise` (systemd's format: microseconds, no year, no zone)
    # and rsyslog's RSYSLOG_SyslogProtocol23Format (RFC 5424: <PRI>1, then an RFC 3339 stamp,
    # host, app-name, procid, msgid, structured data) print that record
    gpf = ("traps: pcm-sensor-serv[8542] general protection fault ip:7f638b3f9967 "
           "sp:7ffe5e7434b0 error:0 in libc-2.32.so[7f638b3f9000+14f000]")
    clock = log_clock(_utc("2022-02-18 00:00:00"), _utc("2022-02-18 12:00:00"))
    for line in (f"Feb 18 10:11:12.500000 node7 kernel: {gpf}",
                 f"<6>1 2022-02-18T10:11:12.500000+00:00 node7 kernel - - - {gpf}"):
        faults = scan_kernel_log(line + "\n", clock=clock).faults
        assert [(f.pid, clock.boot + f.seconds) for f in faults] == [
            (8542, _utc("2022-02-18 10:11:12") + 0.5)], line


def test_dmesg_x_reads_the_kernels_records_only():
    # the same record as `dmesg -x` prints it (util-linux: facility, level, then the stamp);
    # a record a user process wrote to /dev/kmsg (facility "user") is not the kernel's
    gpf = ("[  106.318686] traps: pcm-sensor-serv[8542] general protection fault "
           "ip:7f638b3f9967 sp:7ffe5e7434b0 error:0 in libc-2.32.so[7f638b3f9000+14f000]")
    faults = scan_kernel_log(f"kern  :info  : {gpf}\nuser  :info  : {gpf}\n").faults
    assert [(f.comm, f.pid, f.seconds) for f in faults] == [
        ("pcm-sensor-serv", 8542, 106.318686)]


def test_fork_refusals_with_wall_clock_stamps():
    # the dmesg -T line of collectors/parsers/pids_log.py's docstring
    clock = log_clock(_utc("2021-11-26 00:00:00"), _utc("2021-11-26 19:00:00"))
    refused = fork_rejections("[Fri Nov 26 18:35:56 2021] cgroup: fork rejected by pids "
                              "controller in /user.slice/user-1000.slice\n", clock=clock)
    assert refused == [("/user.slice/user-1000.slice", _utc("2021-11-26 18:35:56") - clock.boot)]


# -- a bundle recorded from `journalctl -k` -------------------------------------------------

_BOOT_STAMPED = re.compile(r"^\[\s*([0-9]+\.[0-9]+)\] (.*)$", re.M)


def _as_journal(dmesg: str, boot: float, host: str) -> str:
    """The dmesg lines as `journalctl -k` (-o short, UTC) prints the same records."""
    def line(match: re.Match) -> str:
        stamp = time.strftime("%b %d %H:%M:%S", time.gmtime(boot + float(match.group(1))))
        return f"{stamp} {host} kernel: {match.group(2)}"

    return _BOOT_STAMPED.sub(line, dmesg)


def _diagnosis(path) -> set[tuple[str, str]]:
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                             str(path), "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1, 2), result.stderr
    return {(f["rule"], json.dumps(f["subjects"], sort_keys=True))
            for f in json.loads(result.stdout)["findings"]}


@pytest.mark.parametrize("scenario", ["crash-loop", "oom-kill", "isa-mismatch", "hung-task"])
def test_a_journal_bundle_diagnoses_as_the_kmsg_one(scenario, tmp_path):
    bundle = tmp_path / scenario
    shutil.copytree(SCENARIOS / scenario, bundle)
    meta = json.loads((bundle / "meta.json").read_text())
    stat = (bundle / meta["samples"][0]["dir"] / "proc" / "stat").read_text()
    boot = float(re.search(r"^btime ([0-9]+)$", stat, re.M).group(1))
    dmesg = bundle / "static" / "dmesg.txt"
    expected = _diagnosis(bundle)
    journal = _as_journal(dmesg.read_text(), boot, meta["hostname"])
    assert not _BOOT_STAMPED.search(journal)
    dmesg.write_text(journal)
    assert _diagnosis(bundle) == expected
    assert any(rule == scenario for rule, _ in expected)
