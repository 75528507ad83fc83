"""CPU identification and SIGILL evidence: the cpuinfo and kernel-log parsers on real samples
and fuzzed input, the `cpu_features` collector on fixture roots and bundles, and, live on
this machine, a binary built for an extension this CPU lacks dying of SIGILL and being
counted from the real kernel log."""

from __future__ import annotations

import calendar
import doctest
import json
import os
import re
import resource
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import strategies as st

from fleetscope.collectors import COLLECTORS, Scrape
from fleetscope.collectors import cpu_features as cpu_features_module
from fleetscope.collectors.cpu_features import CpuFeaturesCollector
from fleetscope.collectors.parsers import ParseError, cpuinfo, kmsg
from fleetscope.collectors.parsers.cpuinfo import (
    features_fingerprint,
    parse_cpuinfo,
    psabi_level,
    psabi_level_name,
)
from fleetscope.collectors.parsers.kmsg import scan_kernel_log
from fleetscope.collectors.source import LiveHost, RecordedSample, recorded_sample
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from fleetscope.tools.isa import run_isa_check, scan_binary
from tests.conftest import BUNDLES, require_tool, samples
from tests.fuzzing import parser_fuzz_tests

# --- /proc/cpuinfo samples -------------------------------------------------------------------

# One x86 stanza of the x86-256 fixture (AMD EPYC 7763, Zen 3 KVM guest; format of
# arch/x86/kernel/cpu/proc.c show_cpuinfo(), see tests/fixtures/bundles/README.md).
def _x86_epyc() -> str:
    """The first stanza of the generated x86-256 bundle's cpuinfo (read when a test runs: the
    bundle is written by the session fixture, after collection)."""
    return (BUNDLES / "x86-256" / "static" / "proc" / "cpuinfo").read_text().split("\n\n")[0]

# Verbatim from a Sapphire Rapids KVM guest (Linux 6.18, 2 vCPUs), first stanza.
X86_XEON = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 167
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 1
microcode\t: 0x1
cpu MHz\t\t: 2599.998
cache size\t: 491520 KB
physical id\t: 0
siblings\t: 2
core id\t\t: 0
cpu cores\t: 2
apicid\t\t: 0
initial apicid\t: 0
fpu\t\t: yes
fpu_exception\t: yes
cpuid level\t: 36
wp\t\t: yes
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush \
mmx fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology \
nonstop_tsc cpuid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe \
popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch \
cpuid_fault fsgsbase tsc_adjust bmi1 hle avx2 smep bmi2 erms invpcid rtm avx512f avx512dq \
rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec \
xgetbv1 xsaves avx_vnni avx512_bf16 arat avx512vbmi umip avx512_vbmi2 gfni vaes vpclmulqdq \
avx512_vnni avx512_bitalg avx512_vpopcntdq rdpid cldemote movdiri movdir64b fsrm serialize \
tsxldtrk amx_bf16 avx512_fp16 amx_tile amx_int8 arch_capabilities
bugs\t\t: spectre_v1 spectre_v2 spec_store_bypass swapgs retbleed bhi spectre_v2_user its \
its_native_only
bogomips\t: 5199.99
clflush size\t: 64
cache_alignment\t: 64
address sizes\t: 48 bits physical, 57 bits virtual
power management:
"""

# Kunpeng 920, Huawei Cloud VM, 4.15 kernel (a third-party sample; the print order is
# arch/arm64/kernel/cpuinfo.c's).
ARM_KUNPENG = """\
processor\t: 0
BogoMIPS\t: 200.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
jscvt fcma dcpop asimddp asimdfhm
CPU implementer\t: 0x48
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd01
CPU revision\t: 0

processor\t: 1
BogoMIPS\t: 200.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
jscvt fcma dcpop asimddp asimdfhm
CPU implementer\t: 0x48
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd01
CPU revision\t: 0

"""

# The layout of old vendor arm64 kernels (Android 3.x): one header line, every processor in
# one block, the identification fields shared, a Hardware trailer (arch/arm64/kernel/cpuinfo.c).
ARM_OLD_LAYOUT = """\
Processor\t: AArch64 Processor rev 4 (aarch64)
processor\t: 0
processor\t: 1
processor\t: 2
processor\t: 3
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd03
CPU revision\t: 4

Hardware\t: Qualcomm Technologies, Inc MSM8953
"""


def _x86_stanza(number: int, stepping: int, microcode: str = "0xa0011d1") -> str:
    stanza = re.sub(r"(?m)^processor\t: \d+", f"processor\t: {number}", _x86_epyc())
    stanza = re.sub(r"(?m)^stepping\t: \d+", f"stepping\t: {stepping}", stanza)
    return re.sub(r"(?m)^microcode\t: \S+", f"microcode\t: {microcode}", stanza) + "\n\n"


def test_x86_cpuinfo_real_samples():
    epyc = parse_cpuinfo(_x86_epyc())
    model = epyc.model
    assert (model.arch, model.vendor, model.model_name) == (
        "x86_64", "AuthenticAMD", "AMD EPYC 7763 64-Core Processor")
    assert (model.family, model.model, model.stepping, model.microcode) == (
        "25", "1", "1", "0xa0011d1")
    assert "avx2" in epyc.features and "avx512f" not in epyc.features
    assert psabi_level_name(psabi_level(epyc.features)) == "x86-64-v3"  # Zen 3: no AVX-512
    xeon = parse_cpuinfo(X86_XEON)
    assert xeon.model.model_name == "Intel(R) Xeon(R) Processor"
    assert (xeon.model.family, xeon.model.model) == ("6", "167")
    assert psabi_level(xeon.features) == 4
    assert {"amx_tile", "avx512_fp16", "avx_vnni"} <= xeon.features
    assert not xeon.mixed and xeon.cpus == 1


def test_arm64_cpuinfo_kunpeng_920():
    info = parse_cpuinfo(ARM_KUNPENG)
    model = info.model
    assert model.arch == "aarch64"
    assert (model.vendor, model.model_name) == ("HiSilicon", "HiSilicon Kunpeng 920")
    assert (model.implementer, model.part, model.variant, model.revision) == (
        "0x48", "0xd01", "0x1", "0")
    assert model.architecture == "8"
    assert model.features[:3] == ("fp", "asimd", "evtstrm")  # the kernel's hwcap order
    assert "atomics" in info.features and "sve" not in info.features and "lrcpc" not in \
        info.features
    assert info.cpus == 2 and not info.mixed


def test_arm64_cpuinfo_old_layout_shares_fields():
    info = parse_cpuinfo(ARM_OLD_LAYOUT)
    assert info.cpus == 4 and not info.mixed
    assert info.model.model_name == "ARM Cortex-A53"
    assert info.variants[0][1] == 4


def test_fixture_cpuinfo_files():
    x86 = parse_cpuinfo((BUNDLES / "x86-256/static/proc/cpuinfo").read_text())
    arm = parse_cpuinfo((BUNDLES / "kunpeng-128/static/proc/cpuinfo").read_text())
    assert (x86.cpus, x86.mixed, arm.cpus, arm.mixed) == (256, False, 128, False)
    assert arm.model.model_name == "HiSilicon Kunpeng 920"


def test_mixed_stepping_node():
    text = "".join(_x86_stanza(n, 1) for n in range(3)) + _x86_stanza(3, 2, "0xa0011ce")
    info = parse_cpuinfo(text)
    assert info.mixed
    assert [(m.stepping, count) for m, count in info.variants] == [("1", 3), ("2", 1)]
    assert info.model.stepping == "1"  # the record describes the first CPU


def test_microcode_alone_does_not_make_a_node_mixed():
    info = parse_cpuinfo(_x86_stanza(0, 1, "0x1") + _x86_stanza(1, 1, "0x2"))
    assert not info.mixed


def test_mixed_feature_sets_and_big_little():
    # Same model, one CPU lacking a flag (e.g. a microcode update that did not reach it).
    other = _x86_stanza(1, 1).replace(" avx2 ", " ")
    assert parse_cpuinfo(_x86_stanza(0, 1) + other).mixed
    little = ARM_KUNPENG.split("\n\n")[0].replace("0x48", "0x41").replace("0xd01", "0xd03")
    big = ARM_KUNPENG.split("\n\n")[0].replace("0x48", "0x41").replace("0xd01", "0xd08")
    info = parse_cpuinfo(little + "\n\n" + big + "\n")
    assert [m.model_name for m, _ in info.variants] == ["ARM Cortex-A53", "ARM Cortex-A72"]


def test_fingerprint_and_psabi_levels():
    assert features_fingerprint(["b", "a"]) == features_fingerprint(["a", "b", "a"])
    assert len(features_fingerprint(["avx"])) == 12
    baseline = "cmov cx8 fpu fxsr mmx syscall sse sse2 lm".split()
    assert psabi_level(baseline) == 1
    assert psabi_level(baseline[:-1]) == 0 and psabi_level_name(0) == "none"
    v2 = baseline + "cx16 lahf_lm popcnt pni sse4_1 sse4_2 ssse3".split()
    assert psabi_level_name(psabi_level(v2)) == "x86-64-v2"
    # LZCNT shows as abm: without it a CPU with AVX2 is still v2.
    v3_without_abm = v2 + "avx avx2 bmi1 bmi2 f16c fma movbe xsave".split()
    assert psabi_level(v3_without_abm) == 2
    assert psabi_level(v3_without_abm + ["abm"]) == 3


def test_unknown_architecture_is_not_an_error():
    info = parse_cpuinfo("processor\t: 0\ncpu\t\t: POWER9 (raw), altivec supported\n")
    assert info.model.arch == "unknown" and info.features == frozenset()


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no processor"),
        ("\n\n", "no processor"),
        ("vendor_id\t: GenuineIntel\n", "no processor"),
        ("processor\t: x\nvendor_id\t: GenuineIntel\n", "processor number"),
        ("processor\t: 0\nthis line has no colon\n", "without ':'"),
        ("processor\t: 0\n: value\n", "empty key"),
        ("processor\t: 0\nflags\t: a\x00b\n", "NUL"),
    ],
)
def test_cpuinfo_malformed(text, message):
    with pytest.raises(ParseError, match=message):
        parse_cpuinfo(text)


# --- kernel log samples ----------------------------------------------------------------------

# (line, arch, comm, pid, binary). Origins: captures on a Linux 6.18 x86 VM and third-party
# reports (arch/x86/kernel/traps.c show_signal() prints them); util-linux/util-linux#863
# (dmesg and journalctl forms, a dmesg binary built for a newer CPU); a /dev/kmsg record
# captured on a 6.18 x86 VM. The arm64 lines follow arch/arm64/kernel/traps.c
# arm64_show_signal() (5.10 and 6.x print the same text for an undefined instruction:
# force_signal_inject(..., 0), no ESR part) and the <= 4.18 do_undefinstr() format; they are
# built from the format, not captured.
SIGILL_LINES = [
    ("[ 1725.924917] traps: ud_probe[6911] trap invalid opcode ip:564cd741512d "
     "sp:7ffece00e4c0 error:0 in ud_probe[112d,564cd7415000+1000]",
     "x86", "ud_probe", 6911, "ud_probe"),
    ("[ 1664.444779] traps: agent_worker_il[6073] trap invalid opcode ip:55bc07eee040 "
     "sp:7fff9ef3b438 error:0 in agent_worker_ill[1040,55bc07eee000+1000]",
     "x86", "agent_worker_il", 6073, "agent_worker_ill"),
    ("traps: dmesg[1466] trap invalid opcode ip:40f688 sp:7ffffef32440 error:0 "
     "in dmesg[400000+1d000]", "x86", "dmesg", 1466, "dmesg"),
    ("traps: pressure-vessel[244404] trap invalid opcode ip:7fa7c7ca33b4 sp:7ffd68505de0 "
     "error:0 in libc.so.6[7fa7c7c26000+178000]",
     "x86", "pressure-vessel", 244404, "libc.so.6"),
    ("traps: qli-runner[39553] trap invalid opcode ip:7f2f1fb30e23 sp:7f2d97dff080 error:0",
     "x86", "qli-runner", 39553, "qli-runner"),
    ("Sep 07 10:05:13 apollo kernel: traps: dmesg[1466] trap invalid opcode ip:40f688 "
     "sp:7ffffef32440 error:0 in dmesg[400000+1d000]", "x86", "dmesg", 1466, "dmesg"),
    ("[  192.409689] traps: dmesg[1286] trap invalid opcode ip:40f688 sp:7ffcf184d5f0 "
     "error:0 in dmesg[400000+1d000]", "x86", "dmesg", 1286, "dmesg"),
    ("6,341,2230812820,-;traps: probe_fma4[14722] trap invalid opcode ip:557dc188f08b "
     "sp:7ffe14508080 error:0 in probe_fma4[108b,557dc188f000+1000]",
     "x86", "probe_fma4", 14722, "probe_fma4"),
    ("[Mon Dec  1 03:09:00 2025] traps: Web Content[3301] trap invalid opcode ip:7f00 "
     "sp:7ffe error:0 in libxul.so[7f0000+2000]", "x86", "Web Content", 3301, "libxul.so"),
    ("[  812.331702] agent[4242]: unhandled exception: undefined instruction "
     "in agent[aaaab1c30000+20000]", "arm64", "agent", 4242, "agent"),
    ("[  812.331702] [ T4242] agent[4242]: unhandled exception: undefined instruction "
     "in libkv.so[754,ffffa1e20000+40000]", "arm64", "agent", 4242, "libkv.so"),
    ("6,902,812331702,-,caller=T4242;ort-worker[4242]: unhandled exception: undefined "
     "instruction", "arm64", "ort-worker", 4242, "ort-worker"),
    ("[  90.1] probe[77]: unhandled exception: Unknown/Uncategorized, ESR 0x0000000002000000, "
     "Bad EL0 synchronous exception in probe[400000+1000]", "arm64", "probe", 77, "probe"),
    ("myproc[1234]: undefined instruction: pc=0000000000400544", "arm64", "myproc", 1234,
     "myproc"),
]


@pytest.mark.parametrize("line, arch, comm, pid, binary", SIGILL_LINES)
def test_sigill_lines(line, arch, comm, pid, binary):
    crashes = scan_kernel_log(line + "\n").crashes
    assert len(crashes) == 1
    crash = crashes[0]
    assert (crash.arch, crash.comm, crash.pid, crash.binary) == (arch, comm, pid, binary)


def test_sigill_details():
    crash = scan_kernel_log(SIGILL_LINES[0][0]).crashes[0]
    assert crash.ip == "564cd741512d" and crash.seconds == 1725.924917
    assert crash.mapping == "ud_probe[112d,564cd7415000+1000]"
    record = scan_kernel_log(SIGILL_LINES[7][0]).crashes[0]
    assert record.seconds == pytest.approx(2230.81282)  # /dev/kmsg: microseconds since boot
    assert scan_kernel_log(SIGILL_LINES[4][0]).crashes[0].mapping == ""  # anonymous / JIT


# What a kernel log holds around those lines: none of it is a SIGILL crash.
NOT_SIGILL = """\
[  812.331702] CPU: 3 PID: 4242 Comm: agent Not tainted 5.10.0-60.18.0.50.oe2203.aarch64 #1
[  812.331710] Hardware name: Huawei TaiShan 200 (Model 2280)/BC82AMDD, BIOS 1.79 08/21/2021
[  812.331715] pstate: 60000000 (nZCv daif -PAN -UAO -TCO BTYPE=--)
[  812.331719] pc : 0000aaaab1c40754
[  812.331722] lr : 0000ffffa1e2c0c4
[  812.331725] sp : 0000ffffd2a7c9e0
[  812.331729] x29: 0000ffffd2a7c9e0 x28: 0000000000000000
[  100.000001] worker[77]: segfault at 0 ip 00005559d1e0a131 sp 00007ffd9c1f2a30 error 4 in \
worker[5559d1e0a000+1000] likely on CPU 1 (core 1, socket 0)
[  100.000002] traps: worker[78] general protection fault ip:7f3b1 sp:7ffd9 error:0 in \
libc.so.6[7f3b0000+195000]
[  100.000003] traps: worker[79] trap divide error ip:401136 sp:7ffd9 error:0 in worker[401000+1000]
[  100.000004] traps: worker[80] trap int3 ip:401137 sp:7ffd9 error:0 in worker[401000+1000]
[  100.000005] agent[81]: unhandled exception: DABT (lower EL), ESR 0x0000000092000006, level 2 \
translation fault in agent[400000+1000]
14,1200,100000006,-;traps: fake[82] trap invalid opcode ip:1 sp:2 error:0 in fake[1+2]
 SUBSYSTEM=cpu
 DEVICE=+cpu:cpu0
swapper/2[0]: undefined instruction: pc=ffffffc0006e77e4
Internal error: Oops - undefined instruction: 0 [#1] PREEMPT SMP
[    0.000000] Linux version 6.18.0 (gcc (Debian 12.2.0-14) 12.2.0) #1 SMP PREEMPT_DYNAMIC
"""


def test_other_kernel_messages_are_ignored():
    # Segfaults, other traps, arm64 data aborts, a userspace record in /dev/kmsg (facility
    # 1), /dev/kmsg continuation lines, the arm64 register dump, and a 4.4 kernel-mode undef
    # in the idle task (apritzel/pine64#5, an oops, not a process crash).
    scan = scan_kernel_log(NOT_SIGILL)
    assert scan.crashes == ()
    assert scan.lines == len(NOT_SIGILL.splitlines())


def test_arm64_line_split_by_another_cpu():
    # pr_info + pr_cont: when another CPU prints in between, the description is a record of
    # its own.
    text = ("[  9.1] agent[5]: unhandled exception: \n"
            "[  9.1] undefined instruction in agent[400000+1000]\n")
    crashes = scan_kernel_log(text).crashes
    assert [(c.comm, c.pid, c.binary) for c in crashes] == [("agent", 5, "agent")]


def test_text_after_the_mapping_is_tolerated():
    # Defensive: segfault reports gained " likely on CPU N (core N, socket N)" in 6.2; should
    # trap reports grow a suffix too, the crash still counts. File names may hold spaces.
    text = ("traps: a[12] trap invalid opcode ip:1 sp:2 error:0 in my lib.so[1,2+3] likely on "
            "CPU 1 (core 1, socket 0)\n"
            "traps: b[13] trap invalid opcode ip:1 sp:2 error:0 likely on CPU 1\n")
    assert [c.binary for c in scan_kernel_log(text).crashes] == ["my lib.so", "b"]


def test_rate_limit_reports():
    text = ("[ 10.0] show_signal: 3 callbacks suppressed\n"
            "[ 20.0] arm64_show_signal: 12 callbacks suppressed\n"
            "[ 30.0] net_ratelimit: 7 callbacks suppressed\n")
    assert scan_kernel_log(text).suppressed == 15


def test_kernel_log_corrupt():
    with pytest.raises(ParseError, match="NUL"):
        scan_kernel_log("traps: a[1] trap invalid opcode\x00")


# --- fuzzing ---------------------------------------------------------------------------------

FUZZED = {
    "cpuinfo_x86": (parse_cpuinfo, X86_XEON),
    "cpuinfo_arm64": (parse_cpuinfo, ARM_KUNPENG),
    "kernel_log": (scan_kernel_log, "\n".join(line for line, *_ in SIGILL_LINES) + "\n"
                   + NOT_SIGILL),
}
logish = st.text(
    alphabet=st.sampled_from(list("0123456789abcdef []:;,.+-_\n\t/xtrapsinvlidocdeuhnxFU\x00é")),
    max_size=400,
)



test_fuzz_garbage, test_fuzz_cut_and_corrupted = parser_fuzz_tests(FUZZED, logish)


@pytest.mark.parametrize("module", [cpuinfo, kmsg])
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0


# --- the collector on fixture roots ---------------------------------------------------------

def _collect(collector, root, live: bool = False) -> tuple[dict[str, float], Scrape]:
    scrape = Scrape(LiveHost(str(root)) if live else recorded_sample(str(root)))
    families = list(collector.collect(scrape))
    return samples(render(families)), scrape


@pytest.fixture
def collector():
    instance = CpuFeaturesCollector(parse_config({}))
    yield instance
    instance.close()


def test_registered():
    assert COLLECTORS["cpu_features"] is CpuFeaturesCollector


@pytest.mark.parametrize("bundle", ["x86-256", "kunpeng-128"])
def test_cpu_metrics_on_fixture_bundles(collector, bundle):
    parsed, scrape = _collect(collector, BUNDLES / bundle / "samples" / "s0000")
    assert scrape.sources[("cpu_features", "proc/cpuinfo")] == (True, "")
    info = [k for k in parsed if k.startswith("fleetscope_cpu_info{")]
    features = [k for k in parsed if k.startswith("fleetscope_cpu_features_info{")]
    models = {k: v for k, v in parsed.items() if k.startswith("fleetscope_cpu_model_cpus{")}
    assert len(info) == 1 and len(features) == 1 and len(models) == 1
    if bundle == "x86-256":
        assert info[0] == (
            'fleetscope_cpu_info{arch="x86_64",family="25",microcode="0xa0011d1",model="1",'
            'model_name="AMD EPYC 7763 64-Core Processor",stepping="1",vendor="AuthenticAMD"}')
        assert 'isa_level="x86-64-v3"' in features[0]
        assert list(models.values()) == [256]
    else:
        assert info[0] == (
            'fleetscope_cpu_info{arch="aarch64",architecture="8",implementer="0x48",'
            'model_name="HiSilicon Kunpeng 920",part="0xd01",revision="0",variant="0x1",'
            'vendor="HiSilicon"}')
        assert 'features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics' in features[0]
        assert list(models.values()) == [128]
    fingerprint = re.search(r'fingerprint="([0-9a-f]{12})"', features[0]).group(1)
    flags = parse_cpuinfo((BUNDLES / bundle / "static/proc/cpuinfo").read_text()).features
    assert fingerprint == features_fingerprint(flags)


def _root(tmp_path: Path, cpuinfo_text: str | None = X86_XEON, dmesg: str | None = None):
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True, exist_ok=True)
    if cpuinfo_text is not None:
        (root / "proc" / "cpuinfo").write_text(cpuinfo_text)
    if dmesg is not None:
        (root / "dmesg.txt").write_text(dmesg)
    return root


def test_mixed_node_metrics(collector, tmp_path):
    text = "".join(_x86_stanza(n, 1) for n in range(6)) + "".join(
        _x86_stanza(n, 2) for n in range(6, 8))
    parsed, _ = _collect(collector, _root(tmp_path, text))
    models = {k: v for k, v in parsed.items() if k.startswith("fleetscope_cpu_model_cpus{")}
    assert sorted(models.values()) == [2, 6]
    assert any('stepping="2"' in k for k in models)


def test_sigill_counts_from_dmesg_txt(collector, tmp_path):
    dmesg = "\n".join([SIGILL_LINES[0][0], SIGILL_LINES[0][0], SIGILL_LINES[3][0],
                       "[ 5.0] show_signal: 4 callbacks suppressed"]) + "\n" + NOT_SIGILL
    parsed, scrape = _collect(collector, _root(tmp_path, dmesg=dmesg))
    assert parsed['fleetscope_sigill_crashes_total{binary="ud_probe"}'] == 2
    assert parsed['fleetscope_sigill_crashes_total{binary="libc.so.6"}'] == 1
    assert parsed["fleetscope_sigill_reports_suppressed_total"] == 4
    assert scrape.sources[("cpu_features", "dmesg.txt")] == (True, "")
    # A static file: the next scrape reports the same counts, not twice as many.
    again, _ = _collect(collector, _root(tmp_path, dmesg=dmesg))
    assert again['fleetscope_sigill_crashes_total{binary="ud_probe"}'] == 2


LAST = "fleetscope_sigill_last_crash_timestamp_seconds"


def test_last_crash_time_is_boot_time_plus_kernel_seconds(collector, tmp_path):
    # /proc/stat btime + the log's seconds since boot; the latest crash per binary counts.
    dmesg = ("[  100.250000] traps: ud_probe[1] trap invalid opcode ip:1 sp:2 error:0 in "
             "ud_probe[1000,2000+1000]\n"
             "[ 1725.924917] traps: ud_probe[2] trap invalid opcode ip:1 sp:2 error:0 in "
             "ud_probe[1000,2000+1000]\n"
             "[  900.000000] traps: other_tool[3] trap invalid opcode ip:1 sp:2 error:0\n"
             # journald's format has no kernel timestamp: its own stamp is the time, in the
             # year the log was read (UTC)
             "Dec 01 03:09:00 node17 kernel: traps: wall_clock[4] trap invalid opcode ip:1 "
             "sp:2 error:0\n")
    root = _root(tmp_path, dmesg=dmesg)
    (root / "proc" / "stat").write_text("cpu  1 2 3 4 5 6 7 0 0 0\nbtime 1764227651\n")
    parsed, scrape = _collect(collector, root)
    assert parsed[f'{LAST}{{binary="ud_probe"}}'] == pytest.approx(1764227651 + 1725.924917)
    assert parsed[f'{LAST}{{binary="other_tool"}}'] == pytest.approx(1764227651 + 900)
    year = time.gmtime(scrape.time).tm_year
    stamped = [calendar.timegm((y, 12, 1, 3, 9, 0, 0, 0, 0)) for y in (year, year - 1)]
    assert parsed[f'{LAST}{{binary="wall_clock"}}'] in [
        t for t in stamped if t < scrape.time + 2 * 86400][:1]
    assert parsed['fleetscope_sigill_crashes_total{binary="wall_clock"}'] == 1


def test_last_crash_time_needs_the_boot_time(collector, tmp_path):
    # Without /proc/stat there is no wall clock to give: counts stay, times are absent.
    parsed, _ = _collect(collector, _root(tmp_path, dmesg=SIGILL_LINES[0][0] + "\n"))
    assert parsed['fleetscope_sigill_crashes_total{binary="ud_probe"}'] == 1
    assert not any(k.startswith(LAST) for k in parsed)


def test_binary_label_is_bounded(collector, tmp_path, monkeypatch):
    # Five binaries, bin0 crashing first (and most often), bin4 last: the three that crashed
    # most recently keep their names, the older two count as "other".
    monkeypatch.setattr(cpu_features_module, "MAX_BINARIES", 3)
    lines = []
    for index, repeat in enumerate([5, 4, 3, 2, 1]):
        line = SIGILL_LINES[2][0].replace("dmesg[", f"bin{index}[")
        lines += [line] * repeat
    parsed, _ = _collect(collector, _root(tmp_path, dmesg="\n".join(lines) + "\n"))
    crashes = {k: v for k, v in parsed.items() if k.startswith("fleetscope_sigill_crashes")}
    assert crashes == {
        'fleetscope_sigill_crashes_total{binary="bin2"}': 3,
        'fleetscope_sigill_crashes_total{binary="bin3"}': 2,
        'fleetscope_sigill_crashes_total{binary="bin4"}': 1,
        'fleetscope_sigill_crashes_total{binary="other"}': 9,
    }


def test_new_crash_is_named_when_the_ring_filled_every_label(collector, tmp_path, monkeypatch):
    # Reproduces a live failure: a long-running node's ring held more old crashing binaries
    # than the label cap, so a binary crashing now was counted only as "other". It must get
    # its own series; the binary whose latest crash is oldest folds into "other" (whose count
    # and crash time take it over), and no remaining series' counter goes down.
    monkeypatch.setattr(cpu_features_module, "MAX_BINARIES", 3)
    root = _root(tmp_path)
    (root / "proc" / "stat").write_text("btime 1700000000\n")
    (root / "dev").mkdir()
    device = root / "dev" / "kmsg"
    body = SIGILL_LINES[2][0]  # "traps: dmesg[1466] trap invalid opcode ..."
    records = [f"6,{seq},{seq * 1_000_000},-;" + body.replace("dmesg[", f"old{seq}[")
               for seq in range(1, 5)]  # old1 .. old4, one crash each, old1 first
    device.write_text("\n".join(records) + "\n")
    first, _ = _collect(collector, root, live=True)
    named = {k for k in first if k.startswith("fleetscope_sigill_crashes_total")}
    assert named == {f'fleetscope_sigill_crashes_total{{binary="{b}"}}'
                     for b in ("old2", "old3", "old4", "other")}
    with device.open("a") as handle:
        handle.write("6,9,9000000,-;" + body.replace("dmesg[", "fresh_bin[") + "\n")
    after, _ = _collect(collector, root, live=True)
    assert after['fleetscope_sigill_crashes_total{binary="fresh_bin"}'] == 1
    assert f'{LAST}{{binary="fresh_bin"}}' in after
    assert after[f'{LAST}{{binary="fresh_bin"}}'] == pytest.approx(1700000009)
    assert 'fleetscope_sigill_crashes_total{binary="old2"}' not in after
    assert after['fleetscope_sigill_crashes_total{binary="other"}'] == 2  # old1 + old2
    assert after[f'{LAST}{{binary="other"}}'] == pytest.approx(1700000002)
    for key, value in first.items():
        if key.startswith("fleetscope_sigill_crashes_total") and key in after:
            assert after[key] >= value


def test_kmsg_is_read_incrementally(collector, tmp_path, monkeypatch):
    # A regular file at <root>/dev/kmsg of a live root stands in for the device: it is opened
    # once and read until no more data each scrape, so only records appended since are new.
    root = _root(tmp_path)
    (root / "dev").mkdir()
    device = root / "dev" / "kmsg"
    first = "6,1,100,-;" + SIGILL_LINES[0][0].split("] ", 1)[1] + "\n"
    device.write_text(first)
    parsed, scrape = _collect(collector, root, live=True)
    assert parsed['fleetscope_sigill_crashes_total{binary="ud_probe"}'] == 1
    assert scrape.sources[("cpu_features", "dev/kmsg")] == (True, "")
    parsed, _ = _collect(collector, root, live=True)
    assert parsed['fleetscope_sigill_crashes_total{binary="ud_probe"}'] == 1  # nothing new
    with device.open("a") as handle:
        handle.write("6,2,200,-;" + SIGILL_LINES[3][0] + "\n")
        handle.write("6,3,300,-;" + SIGILL_LINES[0][0].split("] ", 1)[1] + "\n")
    parsed, _ = _collect(collector, root, live=True)
    assert parsed['fleetscope_sigill_crashes_total{binary="ud_probe"}'] == 2
    assert parsed['fleetscope_sigill_crashes_total{binary="libc.so.6"}'] == 1
    # /dev/kmsg stamps records in microseconds since boot; the latest crash sets the time.
    (root / "proc" / "stat").write_text("btime 1700000000\n")
    with device.open("a") as handle:
        handle.write("6,4,5000000,-;" + SIGILL_LINES[0][0].split("] ", 1)[1] + "\n")
    parsed, _ = _collect(collector, root, live=True)
    assert parsed[f'{LAST}{{binary="ud_probe"}}'] == pytest.approx(1700000005.0)
    assert parsed['fleetscope_sigill_crashes_total{binary="ud_probe"}'] == 3


def test_missing_sources_are_unavailable_not_errors(collector, tmp_path):
    parsed, scrape = _collect(collector, _root(tmp_path, cpuinfo_text=None))
    assert parsed == {}
    assert scrape.errors == {}
    assert scrape.sources[("cpu_features", "proc/cpuinfo")][0] is False
    kmsg_source = scrape.sources[("cpu_features", "dev/kmsg")]
    assert kmsg_source[0] is False and "dmesg.txt" in kmsg_source[1]
    assert scrape.sources[("cpu_features", "proc/sys/debug/exception-trace")][0] is False


def test_corrupt_cpuinfo_costs_only_its_metrics(collector, tmp_path):
    root = _root(tmp_path, cpuinfo_text="processor\t: 0\nnot cpuinfo\n", dmesg=SIGILL_LINES[0][0])
    parsed, scrape = _collect(collector, root)
    assert not [k for k in parsed if k.startswith("fleetscope_cpu_")]
    assert parsed['fleetscope_sigill_crashes_total{binary="ud_probe"}'] == 1
    assert "cpu_features" in scrape.errors


def test_corrupt_kernel_log_costs_only_the_crash_counter(collector, tmp_path):
    parsed, scrape = _collect(collector, _root(tmp_path, dmesg="\x00\x01binary"))
    assert "cpu_features" in scrape.errors
    assert scrape.sources[("cpu_features", "dmesg.txt")][0] is False
    assert not [k for k in parsed if k.startswith("fleetscope_sigill_crashes")]
    assert any(k.startswith("fleetscope_cpu_info{") for k in parsed)


def test_exception_trace_gauge(collector, tmp_path):
    root = _root(tmp_path)
    (root / "proc/sys/debug").mkdir(parents=True)
    (root / "proc/sys/debug/exception-trace").write_text("0\n")
    parsed, _ = _collect(collector, root)
    assert parsed["fleetscope_sigill_exception_trace_enabled"] == 0


# The fixture bundles' kernel logs (static/dmesg.txt) hold SIGILL lines among other messages.
# The expected counts are recomputed here by a simpler rule than the parser's: a line naming
# "trap invalid opcode" (x86) or an arm64 undefined-instruction / Bad EL0 report; the binary
# is the file named after " in " (without its [..] part), else the task name.
_REFERENCE = [
    re.compile(r"traps: (?P<comm>.+?)\[\d+\] trap invalid opcode [^ ]+ [^ ]+ error:\S+"
               r"(?: in (?P<file>.+)\[[^\[]*\])?$"),
    re.compile(r"(?:^|\] |;)(?P<comm>[^\[\];]+?)\[\d+\]: unhandled exception: (?:.+, ESR .+, )?"
               r"(?:undefined instruction|Bad EL0 synchronous exception)"
               r"(?: in (?P<file>.+)\[[^\[]*\])?$"),
    re.compile(r"(?:^|\] |;)(?P<comm>[^\[\];]+?)\[[1-9]\d*\]: undefined instruction: pc="),
]


def _reference_sigill_counts(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in text.splitlines():
        record = re.match(r"(\d+),\d+,\d+,", line)
        if record and int(record.group(1)) >= 8:
            continue  # a /dev/kmsg record written by userspace, not the kernel
        for pattern in _REFERENCE:
            match = pattern.search(line.rstrip())
            if match:
                file = match.groupdict().get("file")
                binary = file.strip() if file else match.group("comm")
                counts[binary] = counts.get(binary, 0) + 1
                break
    return counts


def test_reference_rule_agrees_on_the_samples():
    text = "\n".join(line for line, *_ in SIGILL_LINES) + "\n" + NOT_SIGILL
    expected: dict[str, int] = {}
    for _, _, _, _, binary in SIGILL_LINES:
        expected[binary] = expected.get(binary, 0) + 1
    assert _reference_sigill_counts(text) == expected


@pytest.mark.parametrize("bundle", ["x86-256", "kunpeng-128"])
def test_sigill_on_fixture_bundle_dmesg(collector, bundle):
    dmesg = BUNDLES / bundle / "static" / "dmesg.txt"
    if not dmesg.exists():
        pytest.skip(f"{dmesg.relative_to(BUNDLES)} is not in the fixture bundle yet")
    text = dmesg.read_text()
    expected = _reference_sigill_counts(text)
    assert expected, "the fixture's dmesg.txt is meant to hold SIGILL lines"
    parsed, scrape = _collect(collector, BUNDLES / bundle / "samples" / "s0000")
    # Read through the bundle's fallback root (static/), not from a file in the sample.
    assert scrape.sources[("cpu_features", "dmesg.txt")] == (True, "")
    got = {k[len('fleetscope_sigill_crashes_total{binary="'):-2]: v for k, v in parsed.items()
           if k.startswith("fleetscope_sigill_crashes_total{")}
    assert got == expected
    arch = "x86" if bundle == "x86-256" else "arm64"
    assert {c.arch for c in scan_kernel_log(text).crashes} == {arch}


def test_promtool_accepts_the_metrics(collector, tmp_path):
    promtool = require_tool("promtool")
    mixed = "".join(_x86_stanza(n, 1 + n % 2) for n in range(4))
    dmesg = "\n".join(line for line, *_ in SIGILL_LINES) + "\n"
    scrape = Scrape(RecordedSample(str(_root(tmp_path, mixed, dmesg))))
    text = render(list(collector.collect(scrape)))
    assert "fleetscope_sigill_crashes_total{" in text and "fleetscope_cpu_model_cpus{" in text
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("bundle", ["x86-256", "kunpeng-128"])
def test_exporter_on_bundle_reports_cpu_features(bundle):
    exporter = Exporter(str(BUNDLES / bundle / "samples" / "s0001"), parse_config({}))
    parsed = samples(render(exporter.collect()))
    assert parsed['fleetscope_scrape_collector_success{collector="cpu_features"}'] == 1
    assert any(k.startswith("fleetscope_cpu_features_info{") for k in parsed)
    for collector_instance in exporter.collectors:
        if isinstance(collector_instance, CpuFeaturesCollector):
            collector_instance.close()


# --- live: a real SIGILL on this machine -----------------------------------------------------

# (gcc flags, /proc/cpuinfo flag, extension name in `isa check`, the compiler's macro for
# it, C computing `out` from the volatile `x` with it). Each is an extension some current
# CPUs lack: FMA4 and XOP exist only on AMD family 15h, VP2INTERSECT on Tiger Lake and Zen 5.
CANDIDATES = [
    ("-mfma4", "fma4", "FMA4", "__FMA4__",
     "__m128 a = _mm_set1_ps(x); out = _mm_cvtss_f32(_mm_macc_ps(a, a, a));"),
    ("-mxop", "xop", "XOP", "__XOP__",
     "__m128i a = _mm_set1_epi32((int)x); out = (float)_mm_cvtsi128_si32(_mm_roti_epi32(a, 3));"),
    ("-mavx512f -mavx512vp2intersect", "avx512_vp2intersect", "AVX-512VP2INTERSECT",
     "__AVX512VP2INTERSECT__",
     "__m512i a = _mm512_set1_epi32((int)x); __mmask16 m0, m1; "
     "_mm512_2intersect_epi32(a, a, &m0, &m1); out = (float)m0;"),
]
# aarch64: Kunpeng 920 (armv8.2-a) has no SVE, so an SVE instruction (cntw) is its SIGILL.
AARCH64_CANDIDATES = [
    ("-march=armv8.2-a+sve", "sve", "SVE", "__ARM_FEATURE_SVE",
     "out = (float)svcntw() * x;"),
]
INTRINSIC_HEADERS = {"__ARM_FEATURE_SVE": "arm_sve.h"}  # x86 macros: x86intrin.h


def sigill_candidates(machine: str, flags: frozenset[str]) -> list[tuple]:
    """The candidate builds of `machine` (os.uname().machine) needing an extension the
    CPU with cpuinfo `flags` lacks, in the order to try them."""
    candidates = {"x86_64": CANDIDATES, "aarch64": AARCH64_CANDIDATES}.get(machine, [])
    return [candidate for candidate in candidates if candidate[1] not in flags]


# One source for both builds: the extension's code when the compiler targets it, plain C in
# the baseline build (-march=x86-64).
PROGRAM = """\
#include <stdio.h>
#if defined({macro})
#include <{header}>
#endif
int main(int argc, char **argv) {{
    volatile float x = (float)argc;
    float out;
#if defined({macro})
    {body}
#else
    out = x * x + x;
#endif
    printf("%f\\n", out);
    return 0;
}}
"""


def _cpu_flags() -> frozenset[str]:
    return parse_cpuinfo(Path("/proc/cpuinfo").read_text()).features


def _no_core_dump():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _build(gcc: str, tmp_path: Path, name: str, flags: str, macro: str, body: str) -> Path:
    source = tmp_path / f"{name}.c"
    source.write_text(PROGRAM.format(macro=macro, body=body,
                                     header=INTRINSIC_HEADERS.get(macro, "x86intrin.h")))
    binary = tmp_path / name
    result = subprocess.run([gcc, "-O2", *flags.split(), "-o", str(binary), str(source)],
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(result.stderr.strip().splitlines()[-1] if result.stderr else "gcc")
    return binary


@pytest.mark.live
def test_live_sigill_is_counted_and_explained(tmp_path, capsys):
    if os.uname().machine != "x86_64":
        pytest.skip("the live SIGILL test builds x86-64 code")
    gcc = require_tool("gcc")
    flags = _cpu_flags()
    chosen = None
    for gcc_flags, cpu_flag, extension, macro, body in sigill_candidates("x86_64", flags):
        try:
            # Unique per run (another run's crash must not be counted as ours); at most 15
            # characters so the task name the kernel prints is the file name.
            binary = _build(gcc, tmp_path, f"fs_ill_{os.getpid() % 10**7}", gcc_flags, macro,
                            body)
        except RuntimeError:
            continue  # this gcc does not know the option
        chosen = (cpu_flag, extension, macro, body, binary)
        break
    if chosen is None:
        pytest.skip("this CPU has every candidate extension (fma4, xop, avx512_vp2intersect) "
                    "or gcc supports none of them")
    cpu_flag, extension, macro, body, binary = chosen
    baseline = _build(gcc, tmp_path, "fs_baseline", "-march=x86-64", macro, body)

    # The binary needs an extension this CPU lacks: `isa check` names it (exit 1), and the
    # baseline build of the same program has nothing missing (exit 0).
    capsys.readouterr()
    assert run_isa_check([str(binary), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert extension in report["missing"]
    listed = {e["name"]: e for e in report["extensions"]}
    assert listed[extension]["on_cpu"] == "missing"
    assert cpu_flag in listed[extension]["cpuinfo_flags"]
    assert listed[extension]["first_use"]["where"] == ".text main"
    assert run_isa_check([str(binary)]) == 1
    table = capsys.readouterr().out
    assert f"{extension} ({cpu_flag})" in table and "missing on this CPU" in table
    assert run_isa_check([str(baseline), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["missing"] == []

    # The kernel logs the trap only when debug.exception-trace (show_unhandled_signals) is 1
    # and the process has no SIGILL handler; reading /dev/kmsg needs CAP_SYSLOG.
    trace = Path("/proc/sys/debug/exception-trace")
    trace_on = trace.exists() and trace.read_text().strip() != "0"
    kmsg_readable = os.access("/dev/kmsg", os.R_OK)
    collector = CpuFeaturesCollector(parse_config({}))
    key = f'fleetscope_sigill_crashes_total{{binary="{binary.name}"}}'
    try:
        before, scrape = _collect(collector, "/", live=True)  # reads the whole ring first
        live = scrape.sources.get(("cpu_features", "dev/kmsg"), (False, ""))[0]
        counted = False
        for _attempt in range(3):
            run = subprocess.run([str(binary)], capture_output=True, timeout=60,
                                 preexec_fn=_no_core_dump)
            assert run.returncode == -4, (run.returncode, run.stderr)  # killed by SIGILL
            if not (trace_on and kmsg_readable and live):
                break
            time.sleep(0.2)
            after, _ = _collect(collector, "/", live=True)
            if after.get(key, 0) == before.get(key, 0) + 1:
                counted = True
                break
            # printk_ratelimit(): at most 10 such lines per 5 s for the whole machine; a
            # line dropped now shows up as "show_signal: N callbacks suppressed" later.
            # Wait for the next interval and crash again.
            before = after
            time.sleep(5.5)
    finally:
        collector.close()
    if not trace_on:
        pytest.skip("debug.exception-trace is 0: the kernel does not log unhandled SIGILL, "
                    "so the crash cannot be counted (isa check and SIGILL were verified)")
    if not (kmsg_readable and live):
        pytest.skip("/dev/kmsg is not readable here (needs root/CAP_SYSLOG)")
    assert counted, f"the SIGILL of {binary.name} was not counted from /dev/kmsg"


@pytest.mark.live
def test_live_gnu_property_isa_level(tmp_path):
    gcc = require_tool("gcc")
    try:
        binary = _build(gcc, tmp_path, "fs_v3_needed", "-march=x86-64-v3 -mneeded", "NONE",
                        "")
    except RuntimeError:
        pytest.skip("this gcc has no -mneeded (GCC 11 or later emits the ISA level note)")
    assert scan_binary(str(binary)).isa_level_needed == 3


def test_sigill_candidate_of_a_kunpeng_920_is_sve():
    """Selection on the Kunpeng 920 cpuinfo fixture (MIDR 0x481fd010, its Features line):
    SVE, which it lacks; none on an aarch64 CPU that has SVE; never an x86 build."""
    cpuinfo = BUNDLES / "kunpeng-128" / "static" / "proc" / "cpuinfo"
    features = parse_cpuinfo(cpuinfo.read_text()).features
    assert "asimd" in features and "sve" not in features  # the fixture is an armv8.2 core
    assert [c[1] for c in sigill_candidates("aarch64", features)] == ["sve"]
    assert sigill_candidates("aarch64", features | {"sve"}) == []
    x86 = {c[1] for c in sigill_candidates("x86_64", frozenset())}
    assert "sve" not in x86 and x86 == {c[1] for c in CANDIDATES}
