"""Two kernel-log events read into the rules they belong to: NVIDIA's `NVRM: Xid` lines into
accelerator-errors (a node whose GPUs no dcgm-exporter watches), and the kernel's
`Possible SYN flooding on port N` into listen-overflow's evidence (never a finding of its
own). The lines are real ones from public issues (tests/fixtures/kmsg/README.md names each
origin); the ground truth beside them is read off the text by hand.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetscope.collectors.parsers.kmsg import log_clock
from fleetscope.collectors.parsers.syn_flood import syn_floods
from fleetscope.collectors.parsers.xid import meaning, xid_errors
from fleetscope.collectors.source import recorded_sample
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import FIXTURES, SCENARIOS, samples

KMSG = FIXTURES / "kmsg"


def _xids(name: str, clock=None) -> list[tuple]:
    return [(e.device, e.code, e.pid, e.name, e.seconds)
            for e in xid_errors((KMSG / name).read_text(), clock)]


# -- the Xid parser ---------------------------------------------------------------------------

def test_xid_lines_with_a_boot_stamp_behind_a_syslog_prefix():
    # gpu-operator#1146: Xid 48 then 64 on 0000:07:00; the NVRM lines about 0000:0a:00.0
    # (RmInitAdapter failed) are no Xid
    assert _xids("nvidia-xid-48-syslog.txt") == [
        ("0000:07:00", 48, None, "", 219.470994), ("0000:07:00", 64, None, "", 219.47105)]
    assert "double-bit ECC" in meaning(48)


def test_xid_lines_name_the_process_and_skip_the_other_nvrm_lines():
    # chia-gigahorse#301: "NVRM: GPU at PCI:..." and "sched: RT throttling" are not Xids
    assert _xids("nvidia-xid-31-dmesg.txt") == [
        ("0000:0a:00", 31, 13332, "cuda_plot_k32_v", 14328.198504),
        ("0000:0a:00", 62, None, "", 14370.687545),
        ("0000:0a:00", 45, None, "", 14370.688139),
        ("0000:0a:00", 45, None, "", 14372.202098),
        ("0000:0a:00", 45, None, "", 14376.322743)]
    first = xid_errors((KMSG / "nvidia-xid-31-dmesg.txt").read_text())[0]
    assert first.text.startswith("Ch 00000010, intr 00000000. MMU Fault: ENGINE CE2")
    assert "page fault" in first.meaning


def test_xid_lines_of_an_older_driver_without_pid():
    assert _xids("nvidia-xid-before-pid.txt") == [
        ("0000:01:00", 32, None, "", 24128.828315), ("0000:01:00", 32, None, "", 24128.828608),
        ("0000:01:00", 31, None, "", 24128.834365)]


def test_xid_lines_without_a_stamp_count_with_no_time():
    assert _xids("nvidia-xid-unstamped.txt") == [
        ("0000:08:00", 31, 169800, "chrome", None), ("0000:08:00", 31, 174421, "chrome", None)]


def test_a_previous_xid_named_inside_the_text_is_not_a_report():
    # open-gpu-kernel-modules#1150: four GPUs' Xid 45, each "caused by previous Xid 14x"
    found = _xids("nvidia-xid-45-journal.txt")
    assert [(device, code) for device, code, *_ in found] == [
        ("0000:dc:00", 45), ("0000:ed:00", 45), ("0000:ba:00", 45), ("0000:97:00", 45)]


def test_dmesg_T_stamps_go_on_the_boot_clock():
    # gpud#46, `dmesg --ctime` (local time, read as UTC): three Xid 13 at 11:43:09, Xid 109
    # at 11:43:14 with the process the driver named
    boot = 1725000000.0  # 2024-08-30 06:40:00 UTC
    clock = log_clock(boot, 1725020000.0)
    at = 1725018189.0  # 2024-08-30 11:43:09 UTC
    assert _xids("nvidia-xid-dmesg-T.txt", clock) == [
        ("0000:cb:00", 13, None, "", at - boot), ("0000:cb:00", 13, None, "", at - boot),
        ("0000:cb:00", 13, None, "", at - boot),
        ("0000:cb:00", 109, 1797828, "pt_main_thread", at + 5 - boot)]


def test_the_drivers_fallen_off_the_bus_notice_is_not_an_xid():
    # NVSentinel#155: the multi-line notice (indented continuations) is no Xid; the Xid 79
    # line is
    assert _xids("nvidia-fallen-off-the-bus.txt") == [("0000:44:00", 79, None, "", None)]
    assert meaning(79) == "GPU has fallen off the bus"


@pytest.mark.parametrize("line", [
    # NVSwitch's own errors (SXid), not a GPU's
    "[ 12.000001] nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 11001, Fatal, ingress invalid "
    "command",
    "[ 12.000001] NVRM: GPU at PCI:0000:08:00: GPU-34d7319c-5b19-1e75-186d-c187099e4fe5",
    # a userspace record written to /dev/kmsg (facility 1) quoting an Xid
    "14,2201,5667545996,-;gpu-agent: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
    # dmesg -x: a userspace facility
    "user  :info  : [ 1611.175045] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
    # no code
    "[ 12.000001] NVRM: Xid (PCI:0000:3b:00): GPU has fallen off the bus",
])
def test_lines_that_look_close_are_not_xids(line):
    assert xid_errors(line + "\n") == []


def test_a_pci_function_and_upper_case_bus_ids_name_the_same_gpu():
    text = ("[ 5.1] NVRM: Xid (PCI:0000:3B:00.0): 79, pid=2113, GPU has fallen off the bus.\n"
            "[ 5.2] NVRM: Xid (0000:3b:00): 79, GPU has fallen off the bus.\n")
    assert [(e.device, e.pid) for e in xid_errors(text)] == [("0000:3b:00", 2113),
                                                              ("0000:3b:00", None)]


# -- the SYN-flood parser ---------------------------------------------------------------------

def test_syn_flood_lines_of_real_kernels():
    found = [(f.port, f.address, f.protocol, f.cookies, f.seconds)
             for f in syn_floods((KMSG / "syn-flood.txt").read_text())]
    assert found == [
        (5000, "", "TCP", True, 31617.809376),  # OpenWrt logread prefix
        (8080, "", "TCP", True, 375852.589465),
        (25565, "", "TCP", True, 376429.759274),
        (25565, "", "TCP", True, 376614.858572),
        (7001, "", "TCP", False, 2320864.954447),  # 3.x: no slab name, syncookies off
        (830, "", "TCPv6", True, None)]


def test_syn_flood_lines_with_the_listeners_address():
    # kernels since 2022 ("tcp: Add listening address to SYN flood message"): the examples of
    # that commit, behind the kernel's pr_fmt and the protocol's request-sock name
    text = "".join(f"[ 255.126921] TCP: request_sock_{proto}: Possible SYN flooding on port "
                   f"{where}. Sending cookies.\n"
                   for proto, where in (("TCP", "0.0.0.0:9001"), ("TCP", "127.0.0.1:9001"),
                                        ("TCPv6", "[::]:9001"), ("TCPv6", "[fc00::1]:9001")))
    assert [(f.port, f.address, f.protocol) for f in syn_floods(text)] == [
        (9001, "0.0.0.0", "TCP"), (9001, "127.0.0.1", "TCP"), (9001, "[::]", "TCPv6"),
        (9001, "[fc00::1]", "TCPv6")]


@pytest.mark.parametrize("line", [
    "[ 9.6] TCP: request_sock_TCP: Possible SYN flooding on port 99999. Sending cookies.",
    "[ 9.6] TCP: request_sock_TCP: Possible SYN flooding on port . Sending cookies.",
    "user  :warn  : [ 9.6] TCP: request_sock_TCP: Possible SYN flooding on port 80. Sending "
    "cookies.",
    "[ 9.6] netfilter: Possible SYN flooding on port 80 seen by the firewall",
])
def test_lines_that_look_close_are_not_syn_floods(line):
    assert syn_floods(line + "\n") == []


# -- the exporter ------------------------------------------------------------------------------

def _tree(root: Path, dmesg: str, btime: int = 1764368609) -> Path:
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "stat").write_text(f"cpu  1 0 1 100 0 0 0 0 0 0\nbtime {btime}\n")
    (root / "dmesg.txt").write_text(dmesg)
    return root


def test_the_exporter_exposes_xid_and_syn_flood_lines(tmp_path):
    text = ((KMSG / "nvidia-xid-48-syslog.txt").read_text()
            + (KMSG / "nvidia-xid-unstamped.txt").read_text()
            + (KMSG / "syn-flood.txt").read_text())
    tree = _tree(tmp_path / "t", text)
    exported = samples(render(Exporter(recorded_sample(str(tree)),
                                       parse_config({})).collect(now=1764662470.0)))
    boot = 1764368609
    xid = {key: value for key, value in exported.items() if "_xid_" in key}
    assert xid == {
        'fleetscope_accelerator_xid_errors_total{device="0000:07:00",vendor="nvidia",xid="48"}': 1,
        'fleetscope_accelerator_xid_errors_total{device="0000:07:00",vendor="nvidia",xid="64"}': 1,
        'fleetscope_accelerator_xid_errors_total{device="0000:08:00",vendor="nvidia",xid="31"}': 2,
        'fleetscope_accelerator_xid_last_timestamp_seconds{device="0000:07:00",vendor="nvidia",'
        'xid="48"}': round(boot + 219.470994, 3),
        'fleetscope_accelerator_xid_last_timestamp_seconds{device="0000:07:00",vendor="nvidia",'
        'xid="64"}': round(boot + 219.47105, 3)}
    syn = {key: value for key, value in exported.items() if "_syn_flood_" in key}
    assert {key: value for key, value in syn.items() if "_total" in key} == {
        f'fleetscope_tcp_syn_flood_notices_total{{port="{port}"}}': count
        for port, count in ((5000, 1), (8080, 1), (25565, 2), (7001, 1), (830, 1))}
    assert syn['fleetscope_tcp_syn_flood_last_timestamp_seconds{port="25565"}'] == round(
        boot + 376614.858572, 3)
    assert 'fleetscope_tcp_syn_flood_last_timestamp_seconds{port="830"}' not in syn


def test_without_such_lines_the_families_have_no_series(tmp_path):
    tree = _tree(tmp_path / "t", "[    0.000000] Linux version 6.8.0\n")
    text = render(Exporter(recorded_sample(str(tree)), parse_config({})).collect(now=1.0))
    assert "# TYPE fleetscope_accelerator_xid_errors_total counter" in text
    assert "# TYPE fleetscope_tcp_syn_flood_notices_total counter" in text
    assert not [k for k in samples(text) if "_xid_" in k or "_syn_flood_" in k]


# -- bundles diagnosed -------------------------------------------------------------------------

def _diagnosis(path: Path) -> dict:
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                             str(path), "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1, 2), result.stderr
    return json.loads(result.stdout)


def _bundle_with(tmp_path: Path, scenario: str, lines: list[tuple[float, str]]) -> Path:
    """A copy of a scenario bundle whose static/dmesg.txt ends with `lines`, each (seconds
    before the bundle's last sample, message) stamped on the node's boot clock."""
    bundle = tmp_path / scenario
    shutil.copytree(SCENARIOS / scenario, bundle)
    meta = json.loads((bundle / "meta.json").read_text())
    end = meta["samples"][-1]["time"]
    stat = (bundle / meta["samples"][-1]["dir"] / "proc" / "stat").read_text()
    boot = float(next(line.split()[1] for line in stat.splitlines() if line.startswith("btime")))
    dmesg = bundle / "static" / "dmesg.txt"
    dmesg.write_text(dmesg.read_text() + "".join(
        f"[{end - ago - boot:13.6f}] {message}\n" for ago, message in lines))
    return bundle


XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2113, name=python3, GPU has fallen off the bus."
XID_13 = ("NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp "
          "Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter")


def test_a_bundle_with_xid_lines_names_the_gpu(tmp_path):
    # a CPU node's healthy bundle, no accelerator source: the kernel log alone says a GPU
    # fell off the bus 40 s before the window's end (and once 20 s before that); another
    # GPU logged an Xid 13 two days ago (one finding per node and rule: the worst)
    healthy = _diagnosis(SCENARIOS / "healthy-idle")
    assert not [f for f in healthy["findings"] if f["rule"] == "accelerator-errors"]
    bundle = _bundle_with(tmp_path, "healthy-idle", RECENT)
    found = [f for f in _diagnosis(bundle)["findings"] if f["rule"] == "accelerator-errors"]
    assert [(f["severity"], f["subjects"]["devices"]) for f in found] == [
        ("critical", ["0000:3b:00"])]
    rows = {e["signal"]: e for e in found[0]["evidence"]}
    assert rows["NVRM Xid lines in the kernel log"]["value"] == 2
    assert rows["seconds since the last NVRM Xid line"]["value"] == pytest.approx(40, abs=0.01)
    xid = [e for e in found[0]["evidence"] if e["signal"].startswith("NVRM Xid 79")]
    assert len(xid) == 1 and xid[0]["value"] == 2
    assert "(GPU has fallen off the bus) of GPU 0000:3b:00" in xid[0]["signal"]
    assert "(pid 2113 python3)" in xid[0]["signal"]
    assert "kernel log: Xid 79 (GPU has fallen off the bus) x2" in found[0]["summary"]


def test_an_old_xid_is_information(tmp_path):
    bundle = _bundle_with(tmp_path, "healthy-idle", OLD)
    document = _diagnosis(bundle)
    found = [f for f in document["findings"] if f["rule"] == "accelerator-errors"]
    assert [(f["severity"], f["subjects"]["devices"]) for f in found] == [
        ("info", ["0000:cb:00"])]
    assert "Xid errors in the kernel log, the last 2 d" in found[0]["summary"]
    assert "Xid 13 (graphics engine exception" in found[0]["summary"]
    assert document["status"] == _diagnosis(SCENARIOS / "healthy-idle")["status"]


RECENT = [(2 * 86400, XID_13), (60, XID_79), (40, XID_79)]
OLD = [(2 * 86400, XID_13)]


@pytest.mark.parametrize(("lines", "severity"), [(RECENT, "critical"), (OLD, "info")])
def test_the_xid_bundle_fires_the_same_alerts_in_prometheus(tmp_path, lines, severity):
    import yaml

    from tests.conftest import require_tool
    from tests.test_rules_promtool import _promtool_case, write_rules

    promtool = require_tool("promtool")
    bundle = _bundle_with(tmp_path, "healthy-idle", lines)
    write_rules(tmp_path)
    case, findings = _promtool_case(bundle)
    assert [(f.rule.id, f.severity) for f in findings if f.rule.id == "accelerator-errors"] == [
        ("accelerator-errors", severity)]
    expected = [alert for test in case["alert_rule_test"]
                if test["alertname"] == "FleetscopeAcceleratorErrors"
                for alert in test["exp_alerts"]]
    assert expected and all(alert["exp_labels"]["severity"] == severity for alert in expected)
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yml"], "evaluation_interval": case["interval"], "tests": [case]}))
    result = subprocess.run([promtool, "test", "rules", str(tmp_path / "test.yml")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]


SYN_8443 = ("TCP: request_sock_TCP: Possible SYN flooding on port 8443. Sending cookies.  "
            "Check SNMP counters.")


def test_the_listen_overflow_finding_names_the_port_the_kernel_named(tmp_path):
    before = [f for f in _diagnosis(SCENARIOS / "listen-overflow")["findings"]
              if f["rule"] == "listen-overflow"]
    assert before and "SYN flooding" not in before[0]["summary"]
    bundle = _bundle_with(tmp_path, "listen-overflow", [(3600, SYN_8443), (50, SYN_8443)])
    after = [f for f in _diagnosis(bundle)["findings"] if f["rule"] == "listen-overflow"]
    assert [f["severity"] for f in after] == [f["severity"] for f in before]
    assert "the kernel logged 'Possible SYN flooding' on port 8443" in after[0]["summary"]
    rows = {e["signal"]: e["value"] for e in after[0]["evidence"]}
    assert rows["'Possible SYN flooding on port N' kernel-log lines"] == 2
    named = [signal for signal in rows if signal.startswith("kernel: Possible SYN flooding")]
    assert len(named) == 1 and "port 8443 (TCP, sending cookies), the last at" in named[0]
    assert rows[named[0]] == 2


def test_syn_cookies_on_a_healthy_node_are_no_finding(tmp_path):
    healthy = _diagnosis(SCENARIOS / "healthy-idle")
    bundle = _bundle_with(tmp_path, "healthy-idle", [(50, SYN_8443), (20, SYN_8443)])
    flooded = _diagnosis(bundle)
    assert [(f["rule"], f["severity"]) for f in flooded["findings"]] == [
        (f["rule"], f["severity"]) for f in healthy["findings"]]
    assert flooded["status"] == healthy["status"]
    assert "listen-overflow" not in {item["rule"] for item in flooded["not_evaluated"]} - {
        item["rule"] for item in healthy["not_evaluated"]}
