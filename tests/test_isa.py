"""`fleetscope isa check`: instruction classification on known encodings, ELF handling
(sections, stripped files, GNU property notes), the check against the fixture nodes' CPUs,
output formats and exit codes. The live SIGILL end to end is in test_cpu_features.py.

The encodings below were assembled with GNU as 2.40 (x86-64, and aarch64 with
`.arch armv8.6-a+sve2+...`) and read back with objdump; the mnemonic is in each comment.
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import pytest

from fleetscope.tools.isa import (
    EXTENSIONS,
    build_isa_parser,
    run_isa_check,
    scan_code,
)
from tests.conftest import BUNDLES

X86_CPUINFO = BUNDLES / "x86-256" / "static" / "proc" / "cpuinfo"  # AMD EPYC 7763: v3
KUNPENG_CPUINFO = BUNDLES / "kunpeng-128" / "static" / "proc" / "cpuinfo"  # no SVE, no RCpc

X86_CASES = [
    ("c5edfed9", {"AVX2"}),  # vpaddd %ymm1,%ymm2,%ymm3
    ("c5ec58d9", {"AVX"}),  # vaddps %ymm1,%ymm2,%ymm3
    ("c4e27d18d1", {"AVX2"}),  # vbroadcastss %xmm1,%ymm2 (register source)
    ("c4e275901c90", {"AVX2"}),  # vpgatherdd %ymm1,(%rax,%ymm2,4),%ymm3
    ("c4e26db8d9", {"FMA"}),  # vfmadd231ps %ymm1,%ymm2,%ymm3
    ("c4e3e168e120", {"FMA4"}),  # vfmaddps %xmm1,%xmm2,%xmm3,%xmm4
    ("8fe97090da", {"XOP"}),  # vprotb %xmm1,%xmm2,%xmm3
    ("8fea7810c00a000000", {"TBM"}),  # bextr $0xa,%eax,%eax (XOP-encoded: TBM, not BMI1)
    ("c4e27d13d1", {"F16C"}),  # vcvtph2ps %xmm1,%ymm2
    ("c4e2e0f2c8", {"BMI1"}),  # andn %rax,%rbx,%rcx (VEX, but no AVX needed)
    ("c4e2e3f5c8", {"BMI2"}),  # pdep %rax,%rbx,%rcx
    ("f3480fbdd8", {"LZCNT"}),  # lzcnt %rax,%rbx
    ("f3480fbcd8", set()),  # tzcnt %rax,%rbx: also `rep bsf`, which GCC emits for x86-64
    ("f3480fb8d8", {"POPCNT"}),  # popcnt %rax,%rbx
    ("f20f38f0d8", {"SSE4.2"}),  # crc32 %al,%ebx
    ("660f3800d1", {"SSSE3"}),  # pshufb %xmm1,%xmm2
    ("660f3840d1", {"SSE4.1"}),  # pmulld %xmm1,%xmm2
    ("f20fd0d1", {"SSE3"}),  # addsubps %xmm1,%xmm2
    ("660f78c10201", {"SSE4a"}),  # extrq $0x1,$0x2,%xmm1
    ("480f38f018", {"MOVBE"}),  # movbe (%rax),%rbx
    ("480fc708", {"CMPXCHG16B"}),  # cmpxchg16b (%rax)
    ("f0480fc70f", {"CMPXCHG16B"}),  # lock cmpxchg16b (%rdi)
    ("66480f38f6d8", {"ADX"}),  # adcx %rax,%rbx
    ("c7f800000000", {"RTM"}),  # xbegin
    ("660f38dcd1", {"AES"}),  # aesenc %xmm1,%xmm2
    ("c4e269dcd9", {"AVX", "AES"}),  # vaesenc %xmm1,%xmm2,%xmm3
    ("c4e26ddcd9", {"VAES"}),  # vaesenc %ymm1,%ymm2,%ymm3
    ("c4e36d44d900", {"VPCLMULQDQ"}),  # vpclmullqlqdq %ymm1,%ymm2,%ymm3
    ("0f38cbd1", {"SHA"}),  # sha256rnds2 %xmm0,%xmm1,%xmm2
    ("660f38cfd1", {"GFNI"}),  # gf2p8mulb %xmm1,%xmm2
    ("62f16d48fdd9", {"AVX-512BW"}),  # vpaddw %zmm1,%zmm2,%zmm3
    ("62f2ed4840d9", {"AVX-512DQ"}),  # vpmullq %zmm1,%zmm2,%zmm3
    ("62f27d48c4d1", {"AVX-512CD"}),  # vpconflictd %zmm1,%zmm2
    ("62f16c2958d9", {"AVX-512F", "AVX-512VL"}),  # vaddps %ymm1,%ymm2,%ymm3{%k1}
    ("62b16c0858d9", {"AVX-512F", "AVX-512VL"}),  # vaddps %xmm17,%xmm2,%xmm3
    ("62b16e0858d9", {"AVX-512F"}),  # vaddss %xmm17,%xmm2,%xmm3 (scalar: no VL)
    ("62f26d4850d9", {"AVX-512VNNI"}),  # vpdpbusd %zmm1,%zmm2,%zmm3
    ("62f26d2850d9", {"AVX-512VL", "AVX-512VNNI"}),  # vpdpbusd %ymm1,...
    ("62f2ed48b4d9", {"AVX-512IFMA"}),  # vpmadd52luq %zmm1,%zmm2,%zmm3
    ("62f26d488dd9", {"AVX-512VBMI"}),  # vpermb %zmm1,%zmm2,%zmm3
    ("62f27d4863ca", {"AVX-512VBMI2"}),  # vpcompressb %zmm1,%zmm2
    ("62f27d4854d1", {"AVX-512BITALG"}),  # vpopcntb %zmm1,%zmm2
    ("62f27d4855d1", {"AVX-512VPOPCNTDQ"}),  # vpopcntd %zmm1,%zmm2
    ("c5f892c8", {"AVX-512F"}),  # kmovw %eax,%k1 (opmask instructions are VEX-encoded)
    ("c5fb92c8", {"AVX-512BW"}),  # kmovd %eax,%k1
    ("c5f992c8", {"AVX-512DQ"}),  # kmovb %eax,%k1
    ("c5ec4ad9", {"AVX-512DQ"}),  # kaddw %k1,%k2,%k3
    # Newer encodings (capstone 5 did not decode these):
    ("c4e26d50d9", {"AVX-VNNI"}),  # {vex} vpdpbusd %ymm1,%ymm2,%ymm3
    ("c4e26f50d9", {"AVX-VNNI-INT8"}),  # vpdpbssd %ymm1,%ymm2,%ymm3
    ("c4e2fdb4d9", {"AVX-IFMA"}),  # {vex} vpmadd52luq %ymm1,%ymm2,%ymm3
    ("c4e27e72d1", {"AVX-NE-CONVERT"}),  # {vex} vcvtneps2bf16 %ymm1,%xmm2
    ("62f26e4852d9", {"AVX-512BF16", "AVX-512F"}),  # vdpbf16ps %zmm1,%zmm2,%zmm3
    ("62f27e2872d1", {"AVX-512BF16", "AVX-512VL"}),  # vcvtneps2bf16 %ymm1,%xmm2
    ("62f56c4858d9", {"AVX-512FP16"}),  # vaddph %zmm1,%zmm2,%zmm3 (map 5)
    ("62f66d48b8d9", {"AVX-512FP16"}),  # vfmadd231ph %zmm1,%zmm2,%zmm3 (map 6)
    ("62f26f4868d1", {"AVX-512F", "AVX-512VP2INTERSECT"}),  # vp2intersectd %zmm1,%zmm2,%k2
    ("c4e27b4b0418", {"AMX-TILE"}),  # tileloadd (%rax,%rbx,1),%tmm0
    ("c4e2784900", {"AMX-TILE"}),  # ldtilecfg (%rax)
    ("c4e27849c0", {"AMX-TILE"}),  # tilerelease
    ("c4e2735eda", {"AMX-INT8"}),  # tdpbssd %tmm1,%tmm2,%tmm3
    ("c4e2725cda", {"AMX-BF16"}),  # tdpbf16ps %tmm1,%tmm2,%tmm3
    ("0f01e8", {"SERIALIZE"}),  # serialize
    ("4889c8", set()),  # mov %rcx,%rax
    ("0f28c1", set()),  # movaps %xmm1,%xmm0 (SSE: baseline x86-64)
]


@pytest.mark.parametrize("hex_bytes, expected", X86_CASES, ids=[c[0] for c in X86_CASES])
def test_x86_classification(hex_bytes, expected):
    scan = scan_code("x86_64", bytes.fromhex(hex_bytes) + b"\xc3")  # ... ret
    assert set(scan.uses) == expected
    assert scan.undecoded_bytes == 0 and scan.instructions == 2


A64_CASES = [
    (0xB8200041, {"LSE"}),  # ldadd w0, w1, [x2]
    (0xF8E00041, {"LSE"}),  # ldaddal x0, x1, [x2]
    (0x88A07C41, {"LSE"}),  # cas w0, w1, [x2]
    (0xB8208041, {"LSE"}),  # swp w0, w1, [x2]
    (0xB820005F, {"LSE"}),  # stadd w0, [x2]
    (0x4E284820, {"AES"}),  # aese v0.16b, v1.16b
    (0x0EE2E020, {"PMULL"}),  # pmull v0.1q, v1.1d, v2.1d
    (0x0E22E020, set()),  # pmull v0.8h, v1.8b, v2.8b (plain NEON)
    (0x5E020020, {"SHA1"}),  # sha1c q0, s1, v2.4s
    (0x5E024020, {"SHA2"}),  # sha256h q0, q1, v2.4s
    (0xCE628020, {"SHA512"}),  # sha512h q0, q1, v2.2d
    (0xCE020C20, {"SHA3"}),  # eor3 v0.16b, v1.16b, v2.16b, v3.16b
    (0xCEC08420, {"SM4"}),  # sm4e v0.4s, v1.4s
    (0x9AC25C20, {"CRC32"}),  # crc32cx w0, w1, x2
    (0x1EE22820, {"FP16"}),  # fadd h0, h1, h2
    (0x4E421420, {"ASIMD-FP16"}),  # fadd v0.8h, v1.8h, v2.8h
    (0x4E22D420, set()),  # fadd v0.4s, v1.4s, v2.4s
    (0x4E829420, {"DotProd"}),  # sdot v0.4s, v1.16b, v2.16b
    (0xB8BFC020, {"RCpc"}),  # ldapr w0, [x1]
    (0x99404020, {"RCpc2"}),  # ldapur w0, [x1, #4]
    (0x6E828420, {"RDM"}),  # sqrdmlah v0.4s, v1.4s, v2.4s
    (0x1E7E0020, {"JSCVT"}),  # fjcvtzs w0, d1
    (0x6E82CC20, {"FCMA"}),  # fcmla v0.4s, v1.4s, v2.4s, #90
    (0xD50B7C20, {"DCPoP"}),  # dc cvap, x0
    (0x0E22EC20, {"FHM"}),  # fmlal v0.2s, v1.2h, v2.2h
    (0x4E82A420, {"I8MM"}),  # smmla v0.4s, v1.16b, v2.16b
    (0x6E42FC20, {"BF16"}),  # bfdot v0.4s, v1.8h, v2.8h
    (0x6E21E820, {"FRINT"}),  # frint32x v0.4s, v1.4s
    (0xD500401F, {"FlagM"}),  # cfinv
    (0xD53B2400, {"RNG"}),  # mrs x0, rndr
    (0x9ADF1020, {"MTE"}),  # irg x0, x1
    (0xD50330FF, {"SB"}),  # sb
    (0x2598E3E0, {"SVE"}),  # ptrue p0.s
    (0xA540A000, {"SVE"}),  # ld1w {z0.s}, p0/z, [x0]
    (0x25A11C00, {"SVE"}),  # whilelo p0.s, x0, x1
    (0x04B0E3E0, {"SVE"}),  # incw x0 (no SVE register in the operands)
    (0x44826020, {"SVE2"}),  # sqdmlalb z0.s, z1.h, z2.h
    (0x4582B420, {"SVE-BitPerm"}),  # bdep z0.s, z1.s, z2.s
    (0x4522E020, {"SVE-AES"}),  # aese z0.b, z0.b, z1.b
    (0xF8200420, {"PAuth"}),  # ldraa x0, [x1]
    (0xDAC10020, {"PAuth"}),  # pacia x0, x1
    (0xD503233F, set()),  # paciasp: hint space, a NOP on CPUs without PAuth
    (0xD503245F, set()),  # bti c: hint space
    (0xF9400020, set()),  # ldr x0, [x1]
    (0x4EA29C20, set()),  # mul v0.4s, v1.4s, v2.4s
]


@pytest.mark.parametrize("word, expected", A64_CASES, ids=[f"{c[0]:08x}" for c in A64_CASES])
def test_aarch64_classification(word, expected):
    scan = scan_code("aarch64", struct.pack("<I", word))
    assert set(scan.uses) == expected
    assert scan.instructions == 1 and scan.undecoded_bytes == 0


def test_every_extension_names_cpuinfo_flags():
    for (arch, name), extension in EXTENSIONS.items():
        assert extension.flags and all(f == f.lower() for f in extension.flags), name
        assert arch in ("x86_64", "aarch64")


def test_instruction_cut_by_the_disassembly_window():
    # A long run of code: an instruction 64 KiB in (where capstone cut its windows) is whole.
    nops = b"\x90" * (65536 - 3)
    scan = scan_code("x86_64", nops + bytes.fromhex("62f16d48fdd9") + b"\xc3")
    assert scan.uses["AVX-512BW"].count == 1 and scan.uses["AVX-512BW"].address == 65533
    assert scan.undecoded_bytes == 0 and scan.instructions == len(nops) + 2


def test_undecodable_bytes_are_skipped():
    # 0x06 (push %es) does not exist in 64-bit mode; the sweep steps over it.
    scan = scan_code("x86_64", b"\x06" + bytes.fromhex("c5edfed9") + b"\xc3")
    assert scan.undecoded_bytes == 1 and set(scan.uses) == {"AVX2"}
    arm = scan_code("aarch64", b"\xff\xff\xff\xff" + struct.pack("<I", 0xB8200041))
    assert arm.undecoded_bytes == 4 and set(arm.uses) == {"LSE"}


# --- hand-made ELF files ---------------------------------------------------------------------

EM_X86_64, EM_AARCH64, EM_RISCV = 62, 183, 243
SHT_PROGBITS, SHT_STRTAB, SHT_NOTE = 1, 3, 7
TEXT_ADDRESS = 0x401000


def gnu_isa_needed_note(bits: int) -> bytes:
    """A NT_GNU_PROPERTY_TYPE_0 note holding GNU_PROPERTY_X86_ISA_1_NEEDED = bits."""
    desc = struct.pack("<III", 0xC0008002, 4, bits) + b"\0" * 4  # padded to 8 bytes
    return struct.pack("<III", 4, len(desc), 5) + b"GNU\0" + desc


def make_elf(machine: int, text: bytes, note: bytes = b"", executable: bool = True,
             sections: bool = True) -> bytes:
    """A minimal little-endian ELF64 executable: .text, an optional .note.gnu.property and
    .shstrtab; with sections=False, one executable PT_LOAD and no section headers (as
    `sstrip` leaves a file)."""
    header_size, phdr_size, shdr_size = 64, 56, 64
    phnum = 0 if sections else 1
    text_offset = header_size + phnum * phdr_size
    body = bytearray(text)
    note_offset = text_offset + len(body)
    body += note
    names = b"\0.text\0.note.gnu.property\0.shstrtab\0"
    names_offset = text_offset + len(body)
    body += names
    while (text_offset + len(body)) % 8:
        body += b"\0"
    shoff = text_offset + len(body) if sections else 0
    shnum = (3 + (1 if note else 0)) if sections else 0
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    out = bytearray(ident + struct.pack(
        "<HHIQQQIHHHHHH", 2, machine, 1, TEXT_ADDRESS, header_size if phnum else 0, shoff, 0,
        header_size, phdr_size, phnum, shdr_size, shnum, shnum - 1 if sections else 0))
    if phnum:
        out += struct.pack("<IIQQQQQQ", 1, 5, text_offset, TEXT_ADDRESS, TEXT_ADDRESS,
                           len(text), len(text), 0x1000)
    out += body
    if sections:
        def section(name, kind, flags, address, offset, size, align):
            return struct.pack("<IIQQQQIIQQ", name, kind, flags, address, offset, size, 0, 0,
                               align, 0)
        out += b"\0" * shdr_size
        out += section(1, SHT_PROGBITS, 0x6 if executable else 0x2, TEXT_ADDRESS, text_offset,
                       len(text), 16)
        if note:
            out += section(7, SHT_NOTE, 0x2, 0, note_offset, len(note), 8)
        out += section(26, SHT_STRTAB, 0, 0, names_offset, len(names), 1)
    return bytes(out)


def _write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def _json(capsys, argv) -> tuple[int, dict]:
    capsys.readouterr()
    code = run_isa_check([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


A64_KUNPENG_MISSING = b"".join(struct.pack("<I", w) for w in (
    0xB8200041,  # ldadd: LSE, Kunpeng 920 has it (atomics)
    0x4E829420,  # sdot: DotProd, has it (asimddp)
    0xB8BFC020,  # ldapr: RCpc, Kunpeng 920 lacks lrcpc
    0x2598E3E0,  # ptrue: SVE, Kunpeng 920 lacks it
    0xD65F03C0,  # ret
))


def test_aarch64_binary_against_kunpeng_920(tmp_path, capsys):
    binary = _write(tmp_path, "agent", make_elf(EM_AARCH64, A64_KUNPENG_MISSING))
    code, report = _json(capsys, [binary, "--features-from", str(KUNPENG_CPUINFO)])
    assert code == 1
    assert report["format"] == "fleetscope-isa-check/1"
    assert report["missing"] == ["RCpc", "SVE"]
    states = {e["name"]: e["on_cpu"] for e in report["extensions"]}
    assert states == {"LSE": "present", "DotProd": "present", "RCpc": "missing",
                      "SVE": "missing"}
    rcpc = next(e for e in report["extensions"] if e["name"] == "RCpc")
    assert rcpc["cpuinfo_flags"] == ["lrcpc"]
    assert rcpc["first_use"] == {"address": "0x401008", "instruction": "ldapr w0, [x1]",
                                 "where": ".text"}
    assert report["cpu"]["model_name"] == "HiSilicon Kunpeng 920"
    assert report["binary"]["arch"] == "aarch64" and report["binary"]["instructions"] == 5
    # The table says the same.
    assert run_isa_check([binary, "--features-from", str(KUNPENG_CPUINFO)]) == 1
    table = capsys.readouterr().out
    assert "RCpc (lrcpc), SVE (sve)" in table and "ABSENT" in table


def test_aarch64_binary_that_fits_kunpeng_920(tmp_path, capsys):
    code_bytes = A64_KUNPENG_MISSING[:8] + A64_KUNPENG_MISSING[-4:]
    binary = _write(tmp_path, "agent", make_elf(EM_AARCH64, code_bytes))
    code, report = _json(capsys, [binary, "--features-from", str(KUNPENG_CPUINFO)])
    assert (code, report["missing"]) == (0, [])


X86_MILAN_MISSING = bytes.fromhex(
    "c4e26db8d9"  # vfmadd231ps ymm: FMA, EPYC 7763 has it
    "62f16d48fdd9"  # vpaddw zmm: AVX-512BW, EPYC 7763 (Zen 3) has no AVX-512
    "c4e27b4b0418"  # tileloadd: AMX-TILE
    "c4e3e168e120"  # vfmaddps: FMA4 (AMD family 15h only)
    "c4e26d50d9"  # {vex} vpdpbusd: AVX-VNNI
    "62f56c4858d9"  # vaddph zmm: AVX-512 FP16
    "c3"
)


def test_x86_binary_against_epyc_7763(tmp_path, capsys):
    binary = _write(tmp_path, "worker", make_elf(EM_X86_64, X86_MILAN_MISSING))
    code, report = _json(capsys, [binary, "--features-from", str(X86_CPUINFO)])
    assert code == 1
    assert report["missing"] == ["AVX-512BW", "AVX-512FP16", "AVX-VNNI", "AMX-TILE", "FMA4"]
    states = {e["name"]: e["on_cpu"] for e in report["extensions"]}
    assert states["FMA"] == "present"
    assert {e["use"] for e in report["extensions"]} == {"needed"}  # no ELF around: all needed
    assert report["cpu"]["isa_level"] == "x86-64-v3"
    assert report["binary"]["isa_level_used"] == "x86-64-v4"
    assert report["binary"]["isa_level_needed"] is None  # no GNU property note


def test_hidden_cpuinfo_flag_is_unknown_not_missing(tmp_path, capsys):
    # AVX-IFMA has no /proc/cpuinfo flag ("" in cpufeatures.h): absence proves nothing.
    binary = _write(tmp_path, "ifma", make_elf(EM_X86_64, bytes.fromhex("c4e2fdb4d9c3")))
    code, report = _json(capsys, [binary, "--features-from", str(X86_CPUINFO)])
    assert code == 0
    assert report["unknown"] == ["AVX-IFMA"] and report["missing"] == []


@pytest.mark.parametrize("bits, level, code", [(0b1, "x86-64", 0), (0b111, "x86-64-v3", 0),
                                                (0b1111, "x86-64-v4", 1)])
def test_gnu_property_isa_level_needed(tmp_path, capsys, bits, level, code):
    binary = _write(tmp_path, "tool", make_elf(EM_X86_64, b"\xc3", gnu_isa_needed_note(bits)))
    got, report = _json(capsys, [binary, "--features-from", str(X86_CPUINFO)])
    assert report["binary"]["isa_level_needed"] == level
    assert report["isa_level_missing"] is (code == 1)
    assert got == code
    run_isa_check([binary, "--features-from", str(X86_CPUINFO)])
    table = capsys.readouterr().out
    assert f"needed by the GNU property note: {level};" in table
    if code:
        assert "CPU ISA level is lower than required" in table


def test_binary_for_another_architecture(tmp_path, capsys):
    binary = _write(tmp_path, "agent", make_elf(EM_AARCH64, A64_KUNPENG_MISSING))
    code, report = _json(capsys, [binary, "--features-from", str(X86_CPUINFO)])
    assert code == 1 and report["arch_mismatch"] is True


def test_stripped_file_without_section_headers(tmp_path, capsys):
    binary = _write(tmp_path, "stripped", make_elf(EM_X86_64, X86_MILAN_MISSING,
                                                   sections=False))
    code, report = _json(capsys, [binary, "--features-from", str(X86_CPUINFO)])
    assert code == 1 and "FMA4" in report["missing"]
    assert report["binary"]["sections"] == ["segment 0"]


def test_baseline_code_has_nothing_missing(tmp_path, capsys):
    binary = _write(tmp_path, "plain", make_elf(EM_X86_64, bytes.fromhex("4889c80f28c1c3")))
    assert run_isa_check([binary, "--features-from", str(X86_CPUINFO)]) == 0
    out = capsys.readouterr().out
    assert "No instruction-set extension beyond the architecture's baseline" in out


# --- usage and input errors ------------------------------------------------------------------

def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fleetscope isa check: error: ")
    return lines[0]


def test_not_an_elf_file(tmp_path, capsys):
    path = _write(tmp_path, "script.sh", b"#!/bin/sh\necho hi\n")
    assert run_isa_check([path, "--features-from", str(X86_CPUINFO)]) == 3
    assert "not an ELF file" in _error_line(capsys)


def test_missing_and_unreadable_inputs(tmp_path, capsys):
    assert run_isa_check([str(tmp_path / "nope"), "--features-from", str(X86_CPUINFO)]) == 3
    assert "No such file" in _error_line(capsys)
    assert run_isa_check([str(tmp_path), "--features-from", str(X86_CPUINFO)]) == 3
    _error_line(capsys)
    binary = _write(tmp_path, "ok", make_elf(EM_X86_64, b"\xc3"))
    assert run_isa_check([binary, "--features-from", str(tmp_path / "no-cpuinfo")]) == 3
    assert "no-cpuinfo" in _error_line(capsys)
    bad_cpuinfo = _write(tmp_path, "cpuinfo", b"this is not /proc/cpuinfo\n")
    assert run_isa_check([binary, "--features-from", bad_cpuinfo]) == 3
    assert "cpuinfo" in _error_line(capsys)


@pytest.mark.parametrize("cut", [4, 20, 63, 100])
def test_truncated_elf(tmp_path, capsys, cut):
    data = make_elf(EM_X86_64, X86_MILAN_MISSING)[:cut]
    path = _write(tmp_path, "cut", data)
    assert run_isa_check([path, "--features-from", str(X86_CPUINFO)]) == 3
    _error_line(capsys)


def test_unsupported_machine_and_no_code(tmp_path, capsys):
    riscv = _write(tmp_path, "riscv", make_elf(EM_RISCV, b"\x13\x00\x00\x00"))
    assert run_isa_check([riscv, "--features-from", str(X86_CPUINFO)]) == 3
    assert "EM_RISCV" in _error_line(capsys)
    data_only = _write(tmp_path, "data", make_elf(EM_X86_64, b"\xc3", executable=False))
    assert run_isa_check([data_only, "--features-from", str(X86_CPUINFO)]) == 3
    assert "no executable code" in _error_line(capsys)


def test_usage_errors(capsys):
    assert run_isa_check([]) == 2
    assert "usage: fleetscope isa check" in capsys.readouterr().err
    assert run_isa_check(["--no-such-option", "x"]) == 2
    assert run_isa_check(["--help"]) == 0
    assert "--features-from" in capsys.readouterr().out


def test_parser_for_the_cli():
    parser = build_isa_parser()
    assert isinstance(parser, argparse.ArgumentParser)
    args = parser.parse_args(["bin", "--features-from", "f", "--json"])
    assert (args.binary, args.features_from, args.json) == ("bin", "f", True)
    assert parser.parse_args(["bin"]).features_from == "/proc/cpuinfo"
