"""Fatal traps other than SIGILL in the kernel log (crash-loop) and /proc/locks waiters
(lock-contention): the parsers on lines real kernels printed, the collectors on fixture roots,
and the rules' time bound. The faults themselves are produced for real in
tests/test_live_fault_crashlock.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from fleetscope.collectors import COLLECTORS, Scrape
from fleetscope.collectors.locks import LocksCollector
from fleetscope.collectors.parsers import locks as locks_module
from fleetscope.collectors.parsers.kmsg import scan_kernel_log
from fleetscope.collectors.parsers.locks import FileLock, parse_proc_locks
from fleetscope.collectors.source import recorded_sample
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from tests.conftest import SCENARIOS, samples
from tests.test_cpu_features import NOT_SIGILL, SIGILL_LINES, _collect, _root, collector  # noqa: F401

# This machine's 6.18 kernel, gcc-built programs that write through NULL, divide by zero,
# execute int3 and hlt (in user mode: #GP), each one line in the log.
X86_618 = """\
[  503.338565] hcl_sf[9978]: segfault at 0 ip 000055b0cf3c7139 sp 00007ffef023eb80 error 6 \
in hcl_sf[1139,55b0cf3c7000+1000] likely on CPU 0 (core 0, socket 0)
[  503.399391] traps: hcl_de[9997] trap divide error ip:556b7486b146 sp:7ffecdf67b70 error:0 \
in hcl_de[1146,556b7486b000+1000]
[  503.434395] traps: hcl_i3[10006] trap int3 ip:561613cf212e sp:7fffba975bb0 error:0 in \
hcl_i3[112e,561613cf2000+1000]
[  503.485504] traps: hcl_gp[10026] general protection fault ip:55c0b1f7012d sp:7ffcb15a6730 \
error:0 in hcl_gp[112d,55c0b1f70000+1000]
"""
# arm64 arm64_show_signal() for a data abort, from public logs: an Amlogic 4.19 vendor kernel
# (its timestamps carry "@cpu"), and journald output of Ubuntu 6.8 (MTE tag check fault).
ARM64_PUBLIC = """\
[  119.156884@1] detect_demo[2510]: unhandled exception: DABT (lower EL), ESR 0x92000046, \
level 2 translation fault in libnn_detect.so[7fbd4f0000+6000]
2026-07-08T10:01:32+0000 kernel: mte_test[2263]: unhandled exception: DABT (lower EL), ESR \
0x0000000092000051, synchronous tag check fault in mte_test[b847a9c80000+1000]
"""


def test_x86_fatal_traps_as_this_kernel_prints_them():
    scan = scan_kernel_log(X86_618)
    assert scan.crashes == ()  # none is a SIGILL
    got = [(f.binary, f.pid, f.description, f.address, f.offset) for f in scan.faults]
    assert got == [("hcl_sf", 9978, "segfault (error 6)", "0", 0x1139),
                   ("hcl_de", 9997, "divide error", "", 0x1146),
                   ("hcl_i3", 10006, "int3", "", 0x112E),
                   ("hcl_gp", 10026, "general protection fault", "", 0x112D)]
    assert scan.faults[0].ip == "000055b0cf3c7139" and scan.faults[0].seconds == 503.338565


def test_arm64_aborts_from_public_logs():
    faults = scan_kernel_log(ARM64_PUBLIC).faults
    assert [(f.arch, f.comm, f.pid, f.binary, f.description) for f in faults] == [
        ("arm64", "detect_demo", 2510, "libnn_detect.so", "level 2 translation fault"),
        ("arm64", "mte_test", 2263, "mte_test", "synchronous tag check fault")]
    assert faults[0].mapping_delta is None and faults[0].map_start == 0x7FBD4F0000


def test_sigill_stays_sigill_and_the_rest_are_faults():
    lines = "\n".join(line for line, *_ in SIGILL_LINES) + "\n"
    scan = scan_kernel_log(lines + NOT_SIGILL)
    assert len(scan.crashes) == len(SIGILL_LINES) and all(
        c.description in ("invalid opcode", "undefined instruction",
                          "Bad EL0 synchronous exception") for c in scan.crashes)
    # NOT_SIGILL: a segfault, a #GP, a divide error, an int3, an arm64 data abort; the
    # invalid opcode written to /dev/kmsg by userspace (facility 1) is neither.
    assert [(f.pid, f.description) for f in scan.faults] == [
        (77, "segfault (error 4)"), (78, "general protection fault"), (79, "divide error"),
        (80, "int3"), (81, "level 2 translation fault")]
    assert scan.faults[1].binary == "libc.so.6"  # the file holding the instruction


def test_fatal_trap_metrics_from_dmesg_and_kmsg(collector, tmp_path):  # noqa: F811
    root = _root(tmp_path, dmesg="btime is in proc/stat\n" + X86_618 + X86_618)
    (root / "proc" / "stat").write_text("btime 1700000000\n")
    parsed, _ = _collect(collector, root)
    crashes = "fleetscope_fatal_trap_crashes_total"
    last = "fleetscope_fatal_trap_last_crash_timestamp_seconds"
    assert parsed[f'{crashes}{{binary="hcl_sf"}}'] == 2
    assert parsed[f'{crashes}{{binary="hcl_gp"}}'] == 2
    assert parsed[f'{last}{{binary="hcl_sf"}}'] == pytest.approx(1700000503.339, abs=0.001)
    assert not any(k.startswith("fleetscope_sigill_crashes_total{") for k in parsed)
    # /dev/kmsg of a live root: read incrementally, new records only
    root.joinpath("dmesg.txt").unlink()
    (root / "dev").mkdir()
    device = root / "dev" / "kmsg"
    records = [line.split("] ", 1)[1] for line in X86_618.splitlines()]
    device.write_text(f"6,1,100000000,-;{records[0]}\n")
    parsed, _ = _collect(collector, root, live=True)
    assert parsed[f'{crashes}{{binary="hcl_sf"}}'] == 1
    with device.open("a") as handle:
        handle.write(f"6,2,200000000,-;{records[0]}\n6,3,300000000,-;{records[3]}\n")
    parsed, _ = _collect(collector, root, live=True)
    assert parsed[f'{crashes}{{binary="hcl_sf"}}'] == 2
    assert parsed[f'{crashes}{{binary="hcl_gp"}}'] == 1
    assert parsed[f'{last}{{binary="hcl_gp"}}'] == pytest.approx(1700000300.0)


# /proc/locks as this machine's 6.18 printed it: four `flock` commands on one file (each later
# waiter nested behind the one before), and two lockf() callers on another.
PROC_LOCKS = """\
1: FLOCK  ADVISORY  WRITE 15789 fe:00:2146362 0 EOF
1: -> FLOCK  ADVISORY  WRITE 15793 fe:00:2146362 0 EOF
1:  -> FLOCK  ADVISORY  WRITE 15796 fe:00:2146362 0 EOF
1:   -> FLOCK  ADVISORY  WRITE 15799 fe:00:2146362 0 EOF
2: POSIX  ADVISORY  WRITE 11025 fe:00:2146769 0 EOF
2: -> POSIX  ADVISORY  WRITE 11066 fe:00:2146769 0 EOF
"""


def test_proc_locks_holders_and_waiters():
    rows = parse_proc_locks(PROC_LOCKS + "3: OFDLCK ADVISORY  READ  -1 00:06:9 0 EOF\n"
                            "not a lock row\n")
    assert [(r.id, r.kind, r.pid, r.waiting, r.holder) for r in rows] == [
        (1, "FLOCK", 15789, False, None), (1, "FLOCK", 15793, True, 15789),
        (1, "FLOCK", 15796, True, 15789), (1, "FLOCK", 15799, True, 15789),
        (2, "POSIX", 11025, False, None), (2, "POSIX", 11066, True, 11025),
        (3, "OFDLCK", -1, False, None)]
    assert rows[0].device == "fe:00" and rows[0].inode == 2146362
    assert parse_proc_locks("") == []


def test_the_locked_files_path_is_read_under_the_nodes_root(tmp_path):
    """lock-contention names the locked file from the holder's fds under the evidence
    source's root (a container's /host), not this machine's /proc: a root whose proc holds
    pid 4242's fd 3, a link to the locked file, names that file; the same pid under a root
    without it names nothing."""
    from fleetscope.collectors.source import evidence_source
    from rules.builtin.lock_contention import _path

    locked = tmp_path / "sessions.jsonl"
    locked.write_text("")
    fd_dir = tmp_path / "host" / "proc" / "4242" / "fd"
    fd_dir.mkdir(parents=True)
    (fd_dir / "3").symlink_to(locked)
    holder = FileLock(1, "FLOCK", "WRITE", 4242, "fe:00", locked.stat().st_ino, False, None)
    assert _path(Scrape(evidence_source(str(tmp_path / "host"), "live")), holder) == \
        str(locked)
    (tmp_path / "bare").mkdir()
    assert _path(Scrape(evidence_source(str(tmp_path / "bare"), "live")), holder) == ""


def test_docstring_examples():
    import doctest

    failures, tried = doctest.testmod(locks_module)
    assert tried > 0 and failures == 0


def _locks_root(tmp_path, locks: str | None):
    root = tmp_path / "root"
    for pid, argv in ((15789, "python3\0fs_refresh.py\0"), (15793, "python3\0fs_refresh.py\0"),
                      (15796, "python3\0fs_refresh.py\0"), (11066, "cron\0")):
        (root / "proc" / str(pid)).mkdir(parents=True)
        (root / "proc" / str(pid) / "cmdline").write_text(argv)
    if locks is not None:
        (root / "proc" / "locks").write_text(locks)
    return root


def test_locks_collector_counts_a_pools_waiters(tmp_path):
    assert COLLECTORS["locks"] is LocksCollector
    config = parse_config({"pools": [{"name": "refresh", "class": "online",
                                      "match": {"cmdline": "fs_refresh"}}]})
    scrape = Scrape(recorded_sample(str(_locks_root(tmp_path, PROC_LOCKS))))
    parsed = samples(render(list(LocksCollector(config).collect(scrape))))
    assert parsed["fleetscope_file_lock_waiters"] == 4
    # 15793 and 15796 wait; 15799 is no pool process here, 15789 holds
    assert parsed['fleetscope_pool_file_lock_waiters{class="online",pool="refresh"}'] == 2
    assert scrape.sources[("locks", "proc/locks")] == (True, "")


def test_locks_collector_without_proc_locks(tmp_path):
    scrape = Scrape(recorded_sample(str(_locks_root(tmp_path, None))))
    assert list(LocksCollector(parse_config({})).collect(scrape)) == []
    available, reason = scrape.sources[("locks", "proc/locks")]
    assert not available and "CONFIG_FILE_LOCKING" in reason


def _diagnose_bundle(path) -> dict:
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                             str(path), "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1, 2), result.stderr
    return json.loads(result.stdout)


def test_crashes_before_the_window_are_information_only(tmp_path):
    # The crash-loop scenario with its segfaults moved an hour before the window: the node
    # once ran a bad build, it is not crashing now.
    bundle = tmp_path / "crash-loop"
    shutil.copytree(SCENARIOS / "crash-loop", bundle)
    dmesg = bundle / "static" / "dmesg.txt"

    def earlier(match: re.Match) -> str:
        return f"[{float(match.group(1)) - 3600:12.6f}] {match.group(2)}"

    dmesg.write_text(re.sub(r"^\[\s*([0-9.]+)\] (tool-runner\[|Code: )", earlier,
                            dmesg.read_text(), flags=re.M))
    document = _diagnose_bundle(bundle)
    found = [f for f in document["findings"] if f["rule"] == "crash-loop"]
    assert [f["severity"] for f in found] == ["info"]
    assert "tool-runner crashed 5 times" in found[0]["summary"]
    assert document["status"] == "ok"


def test_a_brief_lock_collision_is_not_contention(tmp_path):
    # The lock-contention scenario with its waiters gone from all but one sample: one
    # collision in the window, not workers serialised across it.
    bundle = tmp_path / "lock-contention"
    shutil.copytree(SCENARIOS / "lock-contention", bundle)
    quiet = SCENARIOS / "healthy-busy" / "samples" / "s0000" / "proc" / "locks"
    for sample in sorted((bundle / "samples").iterdir())[1:]:
        shutil.copy(quiet, sample / "proc" / "locks")
    document = _diagnose_bundle(bundle)
    assert "lock-contention" not in {f["rule"] for f in document["findings"]}


@pytest.mark.live
def test_pool_processes_replaced_are_counted(tmp_path):
    """Real processes of a pool replaced one by one (a supervisor restarting a worker): each
    new pid and start time counts once; the first scrape counts none."""
    import time

    from fleetscope.collectors.pools import PoolsCollector
    from fleetscope.collectors.source import evidence_source

    name = f"fs_churn_{tmp_path.name[-12:]}"
    script = tmp_path / f"{name}.py"
    script.write_text("import time; time.sleep(1.2)\n")
    config = parse_config({"pools": [{"name": "runners", "class": "online",
                                      "match": {"cmdline": re.escape(name)}}]})
    pools = PoolsCollector(config)
    source = evidence_source("/", "live")
    counts = []
    for _ in range(4):
        child = subprocess.Popen([sys.executable, str(script)])
        try:
            time.sleep(0.4)
            parsed = samples(render(list(pools.collect(Scrape(source)))))
            counts.append(parsed['fleetscope_pool_process_starts_total{class="online",'
                                 'pool="runners"}'])
        finally:
            child.kill()
            child.wait()
    assert counts == [0, 1, 2, 3]
