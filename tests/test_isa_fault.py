"""The faulting instruction of a SIGILL (fleetscope/tools/isa_fault.py) and `isa check` on real
binaries of this machine.

Kernel line formats come from real public logs (origins beside each); the live tests build
binaries with gcc, crash them for real and read this machine's kernel log.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from fleetscope.collectors.parsers.kmsg import boot_time, scan_kernel_log, wall_clock
from fleetscope.tools.isa import run_isa_check
from fleetscope.tools.isa_fault import _Segment as Segment
from fleetscope.tools.isa_fault import (
    capture,
    crashed_binaries,
    file_offset,
    from_capture,
    from_code_word,
    in_binary,
)
from tests.conftest import FIXTURES, SCENARIOS, require_tool
from tests.test_isa import EM_AARCH64, KUNPENG_CPUINFO, TEXT_ADDRESS, X86_CPUINFO, make_elf

KMSG = FIXTURES / "kmsg"  # real public kernel logs; origins in its README.md
ARM64_414 = (KMSG / "arm64-4.14-undefinstr.txt").read_text()
X86_OLD = (KMSG / "x86-traps-before-6.1.txt").read_text()


def test_arm64_code_word_belongs_to_the_line_just_before():
    crashes = scan_kernel_log(ARM64_414).crashes
    words = {(c.comm, c.pid): c.code_word for c in crashes}
    # klogd and syslogd got no Code: line right after theirs (another CPU printed between);
    # the stray Code: at 121.614182 belongs to nobody for sure, so to nobody.
    assert words == {("init", 1): "56ade825", ("klogd", 2051): "",
                     ("testspeed.sh", 2175): "00000000", ("syslogd", 2126): "",
                     ("login", 2137): "00000000"}
    assert crashes[0].ip == "0000000000401bd0"


def test_arm64_code_word_is_decoded():
    crashes = scan_kernel_log(ARM64_414).crashes
    zero = from_code_word(crashes[2])
    assert zero.text == "udf #0" and zero.extensions == []
    assert "not a missing extension" in zero.note and zero.source == "Code: word"
    assert from_code_word(crashes[1]) is None  # no Code: line of its own
    # The same format with an SVE word (ptrue p0.s) names the extension.
    sve = scan_kernel_log("[ 5.0] agent[7]: undefined instruction: pc=0000000000400544\n"
                          "[ 5.0] Code: d503201f d503201f d503201f d503201f (2598e3e0)\n")
    fault = from_code_word(sve.crashes[0])
    assert fault.text == "ptrue p0.s" and fault.extensions == ["SVE"]
    assert fault.address == 0x400544 and fault.confidence == 0.9


def test_arm64_register_dump_gives_pc_on_newer_kernels():
    # 4.19+: arm64_show_signal() then __show_regs(): "pc : <16 hex digits>" for a user task.
    text = ("[  812.331702] agent[4242]: unhandled exception: undefined instruction in "
            "agent[aaaab1c40000+1000]\n"
            "[  812.331710] CPU: 3 PID: 4242 Comm: agent Not tainted 5.10.0 #1\n"
            "[  812.331715] pstate: 60000000 (nZCv daif -PAN -UAO -TCO BTYPE=--)\n"
            "[  812.331719] pc : 0000aaaab1c40754\n")
    crash = scan_kernel_log(text).crashes[0]
    assert crash.ip == "aaaab1c40754" and crash.mapping_delta == 0x754


def test_older_x86_lines_give_the_offset_inside_the_mapping():
    crashes = scan_kernel_log(X86_OLD).crashes
    assert [(c.binary, c.offset, c.mapping_delta) for c in crashes] == [
        ("dmesg", None, 0xF688), ("libc.so.6", None, 0x7D3B4),
        ("libctranslate2-e7e12a4c.so", None, 0x7913C)]
    # dmesg -T dates are not seconds since boot: no wall clock from them.
    assert crashes[1].seconds is None and crashes[0].seconds == pytest.approx(192.409689)
    # Non-PIE dmesg of 2019: one R+X segment from file offset 0 mapped at 0x400000.
    text_only = [Segment(0x400000, 0, 0x1C8F0, 5), Segment(0x61CDF0, 0x1CDF0, 0x1100, 6)]
    assert file_offset(crashes[0], text_only) == (0xF688, "ip minus mapping base")
    # glibc 2.35's layout: the executable segment starts at file offset 0x28000.
    libc = [Segment(0, 0, 0x27FF8, 4), Segment(0x28000, 0x28000, 0x177F3C, 5),
            Segment(0x1A0000, 0x1A0000, 0x5D0F8, 4)]
    assert file_offset(crashes[1], libc) == (0x28000 + 0x7D3B4, "ip minus mapping base")
    assert file_offset(replace(crashes[1], map_start=None), libc) is None


def test_aarch64_binary_decoded_at_the_kernel_offset(tmp_path):
    words = (0xD503201F, 0xD503201F, 0x2598E3E0, 0xD65F03C0)  # nop, nop, ptrue p0.s, ret
    binary = tmp_path / "agent"
    binary.write_bytes(make_elf(EM_AARCH64, b"".join(struct.pack("<I", w) for w in words),
                                sections=False))
    text_offset = 64 + 56  # header, one program header
    line = (f"[ 9.0] agent[4242]: unhandled exception: undefined instruction in "
            f"agent[{text_offset + 8:x},ffffa1e20000+1000]\n")
    crash = scan_kernel_log(line).crashes[0]
    fault = in_binary(str(binary), crash)
    assert (fault.text, fault.extensions, fault.source) == ("ptrue p0.s", ["SVE"],
                                                            "kernel offset")
    assert fault.address == TEXT_ADDRESS + 8
    # What a bundle keeps decodes the same without the file.
    entry = capture(str(binary), crash)
    binary.unlink()
    assert len(bytes.fromhex(entry["bytes"])) <= 48
    again = from_capture(json.loads(json.dumps(entry)))
    assert (again.text, again.extensions) == ("ptrue p0.s", ["SVE"])


def test_isa_check_at_one_offset(tmp_path, capsys):
    words = (0xD503201F, 0x2598E3E0, 0xD65F03C0)  # nop, ptrue p0.s (SVE), ret
    binary = tmp_path / "agent"
    binary.write_bytes(make_elf(EM_AARCH64, b"".join(struct.pack("<I", w) for w in words),
                                sections=False))
    at = 64 + 56 + 4  # the kernel prints hex without 0x
    kunpeng = str(KUNPENG_CPUINFO)
    capsys.readouterr()
    assert run_isa_check([str(binary), "--at", f"{at:x}", "--features-from", kunpeng]) == 1
    out = capsys.readouterr().out
    assert f"at file offset {at:#x}" in out and "ptrue p0.s: SVE (ABSENT on this CPU)" in out
    assert run_isa_check([str(binary), "--at", f"{at - 4:#x}", "--features-from", kunpeng,
                          "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mnemonic"] == "nop"
    assert run_isa_check([str(binary), "--at", "0x99999", "--features-from", kunpeng]) == 3
    assert "not in a loaded segment" in capsys.readouterr().err
    assert run_isa_check([str(binary), "--at", "zz"]) == 2


def test_bad_captures_are_ignored():
    assert from_capture({}) is None
    assert from_capture({"bytes": "zz", "file_offset": 0, "bytes_start": 0,
                         "arch": "x86_64"}) is None
    assert from_capture({"bytes": "90", "file_offset": 5, "bytes_start": 0,
                         "arch": "x86_64"}) is None


def test_crashed_binaries_splits_recent_from_earlier():
    log = ("[  100.000000] traps: old_tool[10] trap invalid opcode ip:1 sp:2 error:0\n"
           "[ 5000.000000] traps: new_tool[20] trap invalid opcode ip:1 sp:2 error:0\n"
           "[ 5001.000000] traps: new_tool[21] trap invalid opcode ip:1 sp:2 error:0\n")
    boot = 1_700_000_000.0
    found = crashed_binaries(scan_kernel_log(log).crashes, boot, boot + 5100, 900)
    assert [(b.binary, b.crashes, b.pids, b.recent) for b in found] == [
        ("new_tool", 2, [21, 20], True), ("old_tool", 1, [10], False)]
    assert found[0].last_time == boot + 5001
    # Without a boot time nothing is known to be recent.
    assert not any(b.recent for b in crashed_binaries(scan_kernel_log(log).crashes, None,
                                                       boot + 5100, 900))


# --- live: gcc binaries, this machine's libraries, real SIGILLs ----------------------------

FP16_C = """\
typedef _Float16 v32h __attribute__((vector_size(64)));
v32h a, b, c;
%s
int main(void) { %s return (int)c[0]; }
"""


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _gcc(tmp_path: Path, name: str, source: str, *flags: str) -> Path:
    gcc = require_tool("gcc")
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    binary = tmp_path / name
    result = subprocess.run([gcc, "-O2", *flags, "-o", str(binary), str(src)],
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        pytest.skip(f"gcc cannot build it: {result.stderr.strip().splitlines()[-1:]}")
    return binary


@pytest.fixture
def fp16_binary(tmp_path):
    if os.uname().machine != "x86_64":
        pytest.skip("builds x86-64 code")
    if "avx512_fp16" in _cpu_flags():
        pytest.skip("this CPU has AVX-512FP16: the binary would not fault")
    # At most 15 characters (the task name the kernel prints) and unique per run.
    name = f"fs_fp16_{os.getpid() % 10**6}"
    return _gcc(tmp_path, name, FP16_C % ("", "c = a + b;"), "-mavx512fp16")


@dataclass(frozen=True)
class Lacking:
    """An instruction of an extension the CPU lacks, alone in a binary's main: the real
    SIGILL, on exactly that instruction."""

    extension: str  # as isa check names it
    mnemonic: str
    asm: str  # GNU as syntax (as assembles every extension whatever gcc's -m flags)
    absent: str  # the /proc/cpuinfo flag the CPU must not have
    present: tuple[str, ...] = ()  # flags it must have, so that nothing else is missing


# In order of preference; AVX-512FP16 only where AVX-512F is there, else the load of its
# operands (vmovdqa64, AVX-512F) would fault first.
LACKING = (
    Lacking("AVX-512FP16", "vaddph", "vaddph %zmm1, %zmm2, %zmm0", "avx512_fp16", ("avx512f",)),
    Lacking("AVX-512F", "vpaddd", "vpaddd %zmm1, %zmm2, %zmm0", "avx512f"),
    Lacking("XOP", "vprotd", "vprotd $1, %xmm1, %xmm0", "xop"),  # AMD family 15h only
    Lacking("FMA4", "vfmaddps", "vfmaddps %xmm3, %xmm2, %xmm1, %xmm0", "fma4", ("avx",)),
)


def lacking_on(flags: set[str]) -> Lacking | None:
    return next((one for one in LACKING
                 if one.absent not in flags and set(one.present) <= flags), None)


def test_the_sigill_instruction_is_one_the_cpu_lacks():
    zen3 = {"avx", "avx2", "fma", "sha_ni"}
    assert lacking_on(zen3).extension == "AVX-512F"
    assert lacking_on(zen3 | {"avx512f", "avx512bw"}).extension == "AVX-512FP16"
    sapphire_rapids = zen3 | {"avx512f", "avx512_fp16"}
    assert lacking_on(sapphire_rapids).extension == "XOP"
    assert lacking_on(sapphire_rapids | {"xop"}).extension == "FMA4"
    assert lacking_on(sapphire_rapids | {"xop", "fma4"}) is None
    # Each instruction decodes to its extension alone: the diagnosis can name exactly it.
    from fleetscope.tools.isa_x86 import decode_one

    gas = {"vaddph": "62f56c4858c1", "vpaddd": "62f16d48fec1", "vprotd": "8fe878c2c101",
           "vfmaddps": "c4e3f168c320"}  # GNU as 2.40 of each LACKING asm
    for one in LACKING:
        text, extensions, _ = decode_one(bytes.fromhex(gas[one.mnemonic]), 0)
        assert text.split()[0] == one.mnemonic and extensions == (one.extension,)


@pytest.fixture
def sigill_binary(tmp_path) -> tuple[Path, Lacking]:
    if os.uname().machine != "x86_64":
        pytest.skip("builds x86-64 code")
    lacking = lacking_on(_cpu_flags())
    if lacking is None:
        pytest.skip("this CPU has every extension the test could fault on")
    # At most 15 characters (the task name the kernel prints) and unique per run.
    name = f"fs_ill_{os.getpid() % 10**6}"
    source = f'int main(void) {{ __asm__ volatile("{lacking.asm}"); return 0; }}\n'
    return _gcc(tmp_path, name, source), lacking


def _check(capsys, path) -> tuple[int, dict]:
    capsys.readouterr()
    code = run_isa_check([str(path), "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.live
@pytest.mark.parametrize("library, dispatched", [
    ("libc.so.6", {"RTM", "AVX-512F", "AVX2"}),  # lock elision; string function variants
    ("libm.so.6", {"FMA4", "FMA"}),  # IFUNC variants of sin, exp, ...
    ("libcrypto.so.3", {"XOP", "SHA"}),  # OpenSSL's OPENSSL_ia32cap_P tests
])
def test_system_libraries_pass_with_their_dispatched_extensions(capsys, library, dispatched):
    path = next((p for p in (f"/lib/x86_64-linux-gnu/{library}",
                             f"/usr/lib/x86_64-linux-gnu/{library}") if os.path.exists(p)),
                None)
    if path is None or os.uname().machine != "x86_64":
        pytest.skip(f"no x86-64 {library} here")
    code, report = _check(capsys, path)
    assert code == 0, report["missing"]
    uses = {e["name"]: e for e in report["extensions"]}
    assert dispatched <= set(report["dispatched"])
    for name in dispatched & set(report["dispatched"]):
        first = uses[name]["first_dispatched_use"]
        assert first and first["dispatch"], name
    flags = _cpu_flags()
    absent = {name for name, e in uses.items() if e["use"] == "dispatched"
              and not set(e["cpuinfo_flags"]) <= flags}
    assert set(report["dispatched_missing"]) == absent  # listed, yet not failing
    assert report["missing"] == []


@pytest.mark.live
def test_a_binary_that_needs_fp16_fails_and_a_guarded_one_passes(tmp_path, capsys,
                                                                  fp16_binary):
    code, report = _check(capsys, fp16_binary)
    assert code == 1 and "AVX-512FP16" in report["missing"]
    fp16 = next(e for e in report["extensions"] if e["name"] == "AVX-512FP16")
    assert fp16["use"] == "needed" and fp16["first_use"]["where"] == ".text main"
    assert fp16["first_use"]["instruction"].startswith("vaddph")
    run_isa_check([str(fp16_binary)])
    assert "AVX-512FP16 (avx512_fp16)" in capsys.readouterr().out
    # The same operation behind __builtin_cpu_supports, and as a target_clones IFUNC.
    guarded = _gcc(tmp_path, "fs_fp16_guard", FP16_C % (
        '__attribute__((target("avx512fp16"))) static void add(void) { c = a + b; }',
        'if (__builtin_cpu_supports("avx512fp16")) add();'))
    clones = _gcc(tmp_path, "fs_fp16_clones", FP16_C % (
        '__attribute__((target_clones("arch=sapphirerapids", "default"))) '
        'void add(void) { c = a + b; }', "add();"))
    for binary, reason in ((guarded, "after a CPU feature test in main"),
                           (clones, "IFUNC target")):
        code, report = _check(capsys, binary)
        assert code == 0, report["missing"]
        assert "AVX-512FP16" in report["dispatched_missing"]
        fp16 = next(e for e in report["extensions"] if e["name"] == "AVX-512FP16")
        assert fp16["first_dispatched_use"]["dispatch"] == reason


# OpenSSL's way (crypto/bn/rsaz_exp_x2.c, crypto/bn/bn_exp.c): a constructor fills a global
# from CPUID, a function returns whether its AVX-512 IFMA bits are all set, and the code that
# picks the RSA path calls it first (`if (ossl_rsaz_avx512ifma_eligible() && ...)`).
FEATURE_TEST_C = """\
#include <cpuid.h>
#include <immintrin.h>

unsigned int cpu_caps[4];

__attribute__((constructor)) static void caps_init(void)
{
    unsigned int a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) { cpu_caps[2] = b; cpu_caps[3] = c; }
}

/* avx512f, avx512dq, avx512ifma, avx512vl */
#define IFMA_BITS ((1u << 16) | (1u << 17) | (1u << 21) | (1u << 31))
__attribute__((noinline)) int avx512ifma_eligible(void)
{
    return (cpu_caps[2] & IFMA_BITS) == IFMA_BITS;
}
/* A wrapper that tail-calls the test is a test too. */
__attribute__((noinline)) int fast_path_ok(void) { return avx512ifma_eligible(); }

__attribute__((noinline, target("avx512f,avx512ifma")))
void madd52(long long *r, const long long *a, const long long *b)
{
    __m512i x = _mm512_loadu_si512(a), y = _mm512_loadu_si512(b), z = _mm512_loadu_si512(r);
    _mm512_storeu_si512(r, _mm512_madd52lo_epu64(z, x, y));
}

__attribute__((noinline)) void madd52_generic(long long *r, const long long *a,
                                              const long long *b)
{
    for (int i = 0; i < 8; i++) r[i] += (a[i] * b[i]) & ((1LL << 52) - 1);
}

long long r[8], a[8], b[8];
int main(void) { %s return (int)r[0]; }
"""


@pytest.mark.live
@pytest.mark.parametrize("test_call", ["avx512ifma_eligible()", "fast_path_ok()"])
def test_a_feature_test_function_guards_what_its_caller_runs_after_it(tmp_path, capsys,
                                                                       test_call):
    if os.uname().machine != "x86_64":
        pytest.skip("builds x86-64 code")
    guarded = _gcc(tmp_path, "fs_ifma_guard", FEATURE_TEST_C % (
        f"if ({test_call}) madd52(r, a, b); else madd52_generic(r, a, b);"))
    always = _gcc(tmp_path, "fs_ifma_always", FEATURE_TEST_C % "madd52(r, a, b);")
    no_avx512 = str(X86_CPUINFO)  # AMD EPYC 7763: AVX2, no AVX-512 of any kind

    def check(binary: Path) -> tuple[int, dict]:
        capsys.readouterr()
        code = run_isa_check([str(binary), "--features-from", no_avx512, "--json"])
        return code, json.loads(capsys.readouterr().out)

    code, report = check(guarded)
    assert code == 0, report["missing"]
    assert {"AVX-512F", "AVX-512IFMA"} <= set(report["dispatched_missing"])
    ifma = next(e for e in report["extensions"] if e["name"] == "AVX-512IFMA")
    assert ifma["use"] == "dispatched" and ifma["needed_instructions"] == 0
    assert ifma["first_dispatched_use"]["instruction"].startswith("vpmadd52luq")
    assert ifma["first_dispatched_use"]["where"] == ".text madd52"
    assert ifma["first_dispatched_use"]["dispatch"] == "after a CPU feature test in main"
    # The same code run without asking first is needed, and missing on that CPU.
    code, report = check(always)
    assert code == 1
    assert {"AVX-512F", "AVX-512IFMA"} <= set(report["missing"])
    ifma = next(e for e in report["extensions"] if e["name"] == "AVX-512IFMA")
    assert ifma["use"] == "needed" and ifma["first_use"]["where"] == ".text madd52"


def _kernel_log() -> str:
    dmesg = shutil.which("dmesg")
    result = subprocess.run([dmesg], capture_output=True, text=True, timeout=30) \
        if dmesg else None
    if result is None or result.returncode != 0:
        pytest.skip("the kernel log is not readable here (dmesg needs CAP_SYSLOG)")
    return result.stdout


def _crash(binary: Path) -> tuple[int, float, float]:
    """Run the binary until the kernel logs its SIGILL; (pid, before, after)."""
    trace = Path("/proc/sys/debug/exception-trace")
    if trace.exists() and trace.read_text().strip() == "0":
        pytest.skip("debug.exception-trace is 0: the kernel logs no SIGILL")
    for _attempt in range(3):
        before = time.time()
        process = subprocess.Popen([str(binary)], stderr=subprocess.DEVNULL)
        assert process.wait(timeout=60) == -4  # killed by SIGILL
        after = time.time()
        time.sleep(0.2)
        pattern = re.compile(rf"\b{re.escape(binary.name)}\[{process.pid}\] trap invalid opcode")
        if pattern.search(_kernel_log()):
            return process.pid, before, after
        time.sleep(5.5)  # printk_ratelimit(): 10 lines per 5 s for the whole machine
    pytest.fail(f"the kernel never logged the SIGILL of {binary.name}")


def _diagnose(*args: str, env=None) -> dict:
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", *args, "--json"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode in (0, 1, 2), result.stderr
    return json.loads(result.stdout)


@pytest.mark.live
def test_real_sigill_names_the_faulting_instruction_live_and_from_a_bundle(tmp_path,
                                                                           sigill_binary):
    binary, lacking = sigill_binary
    log_before = _kernel_log()
    pid, before, after = _crash(binary)
    text = _kernel_log()
    ours = [c for c in scan_kernel_log(text).crashes
            if c.binary == binary.name and c.pid == pid]
    assert len(ours) == 1
    crash = ours[0]
    assert crash.offset is not None or crash.mapping_delta is not None
    fault = in_binary(str(binary), crash)
    assert fault.mnemonic == lacking.mnemonic and fault.extensions == [lacking.extension]
    assert fault.source == ("kernel offset" if crash.offset is not None
                            else "ip minus mapping base")
    # `isa check --at` the offset of the line says the same.
    at = crash.offset if crash.offset is not None else fault.file_offset
    check = subprocess.run([sys.executable, "-m", "fleetscope", "isa", "check",
                            str(binary), "--at", f"{at:x}"],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 1
    assert check.stdout.rstrip().endswith(
        f": {fault.text}: {lacking.extension} (ABSENT on this CPU)")
    # Its time: boot time + the log's seconds lands between the launch and the exit
    # (btime has whole seconds; the kernel clock and wall clock drift apart a little).
    boot = boot_time(Path("/proc/stat").read_text())
    assert before - 2 <= wall_clock(crash, boot) <= after + 2
    # Crashes already in the log before this test happened before it.
    for old in scan_kernel_log(log_before).crashes:
        when = wall_clock(old, boot)
        assert when is None or when <= before + 2

    # Live diagnose finds the binary on PATH (the kernel prints base names only).
    env = {**os.environ, "PATH": f"{binary.parent}{os.pathsep}{os.environ['PATH']}"}
    live = _diagnose("--seconds", "2", env=env)
    finding = next(f for f in live["findings"] if f["rule"] == "isa-mismatch")
    assert binary.name in finding["subjects"]["binaries"]
    assert pid in finding["subjects"]["pids"]
    assert f"faulted on {fault.text}: {lacking.extension} absent on this CPU [" in \
        finding["summary"]
    signals = " ".join(e["signal"] for e in finding["evidence"])
    assert "verdict from the kernel offset" in signals or \
        "verdict from the ip minus mapping base" in signals

    # A bundle recorded here, diagnosed after the binary is gone.
    bundle = tmp_path / "node.tar.gz"
    record = subprocess.run([sys.executable, "-m", "fleetscope", "bundle", "record",
                             "--seconds", "1", "--interval", "1", "-o", str(bundle)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert record.returncode == 0, record.stderr
    binary.unlink()
    moved = tmp_path / "elsewhere" / "node.tar.gz"
    moved.parent.mkdir()
    bundle.rename(moved)
    replayed = _diagnose("--bundle", str(moved))
    finding = next(f for f in replayed["findings"] if f["rule"] == "isa-mismatch")
    assert binary.name in finding["subjects"]["binaries"]
    assert pid in finding["subjects"]["pids"]
    assert f"faulted on {fault.text}: {lacking.extension} absent on this CPU [recorded " \
        "bytes" in finding["summary"]


@pytest.mark.live
def test_a_sigill_binary_off_path_is_found_where_the_node_runs_it(tmp_path, sigill_binary):
    """Agent binaries run from their own directory (/opt/<app>/bin), not from PATH. Run by its
    full path, the binary's SIGILL is still decoded live: found on its supervisor's command
    line, beside another executable of the app, or in the config's binary_dirs; with none of
    them the instruction stays unknown (the answer this once gave in every case)."""
    app = tmp_path / "opt" / "agent" / "bin"
    app.mkdir(parents=True)
    built, lacking = sigill_binary
    binary = app / built.name
    shutil.move(built, binary)
    _crash(binary)
    env = {**os.environ, "PATH": os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if d and Path(d) != app)}

    def decoded(*args: str) -> bool:
        document = _diagnose("--seconds", "2", *args, env=env)
        finding = next(f for f in document["findings"] if f["rule"] == "isa-mismatch")
        assert binary.name in finding["subjects"]["binaries"]
        return f"faulted on {lacking.mnemonic} " in finding["summary"] and \
            f": {lacking.extension} absent on this CPU [" in finding["summary"]

    def decoded_while_running(argv: list[str]) -> bool:
        process = subprocess.Popen(argv)
        try:
            return decoded()
        finally:
            process.kill()
            process.wait(timeout=10)

    assert not decoded()
    # The supervisor that restarts it names its path on its command line.
    assert decoded_while_running([sys.executable, "-c", "import time; time.sleep(120)",
                                  str(binary)])
    # Another executable of the app runs from the same directory.
    sibling = app / "fs_gateway"
    shutil.copy(shutil.which("sleep"), sibling)
    assert decoded_while_running([str(sibling), "120"])
    # Nothing of the app runs: the config says where its binaries are.
    config = tmp_path / "node.yaml"
    config.write_text(json.dumps({"binary_dirs": [str(app)]}))
    assert decoded("--config", str(config))


def test_scenario_bundle_names_the_faulting_instruction_without_the_binary():
    # The isa-mismatch scenario: a Kunpeng 920 node (no SVE), arm64 5.10 lines without the
    # file offset, and the bytes `bundle record` kept; the library itself is not in the bundle.
    document = _diagnose("--bundle", str(SCENARIOS / "isa-mismatch"))
    finding = document["findings"][0]
    assert finding["rule"] == "isa-mismatch"
    assert finding["subjects"]["binaries"] == ["libagentcore.so"]
    assert len(finding["subjects"]["pids"]) == 4
    assert "faulted on ptrue p0.s: SVE absent on this CPU" in finding["summary"]
    assert "ip minus mapping base" in finding["summary"]


@pytest.mark.live
def test_glibc_hwcaps_variant_is_dispatched_up_to_its_level(tmp_path, capsys):
    if os.uname().machine != "x86_64":
        pytest.skip("builds x86-64 code")
    source = ("float x[256], y[256];\n"
              "void axpy(float a) { for (int i = 0; i < 256; i++) y[i] += a * x[i]; }\n")
    library = _gcc(tmp_path, "libaxpy.so", source, "-march=x86-64-v3", "-shared", "-fPIC")
    _code, plain = _check(capsys, library)
    needed = {e["name"] for e in plain["extensions"] if e["use"] == "needed"}
    assert {"AVX", "FMA"} & needed  # vectorised with AVX2/FMA, unconditionally
    # The same file where the loader looks for x86-64-v3 variants (glibc >= 2.33).
    variant = tmp_path / "glibc-hwcaps" / "x86-64-v3" / "libaxpy.so"
    variant.parent.mkdir(parents=True)
    shutil.copy(library, variant)
    code, report = _check(capsys, variant)
    assert code == 0 and report["binary"]["glibc_hwcaps"] == "x86-64-v3"
    assert not {e["name"] for e in report["extensions"] if e["use"] == "needed"} & needed
    reasons = {e["first_dispatched_use"]["dispatch"] for e in report["extensions"]
               if e["name"] in needed}
    assert reasons == {"glibc-hwcaps x86-64-v3 variant: loaded only on CPUs of that level"}
