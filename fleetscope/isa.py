"""`fleetscope isa check BINARY [--features-from CPUINFO] [--json]`: which instruction-set
extensions a binary uses, and which of them a CPU lacks (the `isa-mismatch` evidence).

    $ fleetscope isa check ./agent_worker --features-from node17-cpuinfo.txt
    extension   cpuinfo flags  instructions  first use                               this CPU
    AVX-512F    avx512f                 214  0x4011c0 vmovups zmm0, ... (matmul)      missing
    ...

The binary's executable sections are disassembled with capstone (a linear sweep) and every
instruction is mapped to the extension it needs; each extension names the /proc/cpuinfo flag
that provides it, so the check against a CPU is a set difference. For x86 the GNU property
note GNU_PROPERTY_X86_ISA_1_NEEDED (GCC >= 11 `-mneeded`; glibc >= 2.33 refuses to load a
binary above the CPU's level) is read too, and the x86-64 psABI levels (v1-v4) of both sides
are shown.

Limits, said in the output too: a linear sweep also decodes data placed in code sections,
and code behind runtime CPU dispatch (glibc IFUNC, oneDNN, OpenBLAS) is counted although it
never runs on a CPU without the extension. A missing extension is a risk; the faulting ip
in the kernel's SIGILL line (`fleetscope_sigill_crashes_total`) is the proof. capstone 5
does not decode AMX, AVX-512 FP16/BF16, AVX-VNNI and a few newer encodings: those are
recognised from their VEX/EVEX opcode maps here.

Exit codes: 0 no extension missing, 1 extensions missing on that CPU (or the binary is for
another architecture), 2 usage error, 3 unreadable input or not an ELF file.
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import sys
from dataclasses import dataclass, field

from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers.cpuinfo import (
    CpuInfo,
    parse_cpuinfo,
    psabi_level,
    psabi_level_name,
)

EXIT_OK, EXIT_MISSING, EXIT_USAGE, EXIT_INPUT = 0, 1, 2, 3
JSON_FORMAT = "fleetscope-isa-check/1"
DEFAULT_CPUINFO = "/proc/cpuinfo"

# GNU property note (binutils/glibc elf.h): x86 ISA level bits in GNU_PROPERTY_X86_ISA_1_NEEDED.
GNU_PROPERTY_X86_ISA_1_NEEDED = 0xC0008002
ISA_1_LEVEL_BITS = ((1 << 0, 1), (1 << 1, 2), (1 << 2, 3), (1 << 3, 4))  # baseline, v2, v3, v4
SHF_EXECINSTR = 0x4
PF_X = 0x1


@dataclass(frozen=True)
class Extension:
    name: str
    arch: str  # "x86_64" or "aarch64"
    flags: tuple[str, ...]  # /proc/cpuinfo tokens that must all be present
    level: int = 0  # x86-64 psABI level that includes it (2-4), 0 when none does
    hidden: bool = False  # the kernel does not show the flag in /proc/cpuinfo
    note: str = ""


def _x86(name, flags, level=0, hidden=False, note=""):
    return Extension(name, "x86_64", tuple(flags.split()), level, hidden, note)


def _a64(name, flags, note=""):
    return Extension(name, "aarch64", tuple(flags.split()), note=note)


# Flag names as the kernel prints them (arch/x86/include/asm/cpufeatures.h; arm64 hwcap_str[]).
# `hidden`: the kernel keeps the flag out of /proc/cpuinfo ("" name, or a KVM-only CPUID
# leaf), so its absence there proves nothing.
_EXTENSIONS = (
    _x86("SSE3", "pni", 2), _x86("SSSE3", "ssse3", 2), _x86("SSE4.1", "sse4_1", 2),
    _x86("SSE4.2", "sse4_2", 2), _x86("POPCNT", "popcnt", 2), _x86("CMPXCHG16B", "cx16", 2),
    _x86("LAHF-SAHF", "lahf_lm", 2),
    _x86("AVX", "avx", 3), _x86("AVX2", "avx2", 3), _x86("FMA", "fma", 3),
    _x86("F16C", "f16c", 3), _x86("BMI1", "bmi1", 3), _x86("BMI2", "bmi2", 3),
    _x86("LZCNT", "abm", 3, note="runs as BSR on CPUs without it: wrong results, no SIGILL"),
    _x86("MOVBE", "movbe", 3),
    _x86("AVX-512F", "avx512f", 4), _x86("AVX-512BW", "avx512bw", 4),
    _x86("AVX-512CD", "avx512cd", 4), _x86("AVX-512DQ", "avx512dq", 4),
    _x86("AVX-512VL", "avx512vl", 4),
    _x86("AVX-512ER", "avx512er"), _x86("AVX-512PF", "avx512pf"),
    _x86("AVX-512IFMA", "avx512ifma"), _x86("AVX-512VBMI", "avx512vbmi"),
    _x86("AVX-512VBMI2", "avx512_vbmi2"), _x86("AVX-512VNNI", "avx512_vnni"),
    _x86("AVX-512BITALG", "avx512_bitalg"), _x86("AVX-512VPOPCNTDQ", "avx512_vpopcntdq"),
    _x86("AVX-512BF16", "avx512_bf16"), _x86("AVX-512FP16", "avx512_fp16"),
    _x86("AVX-512VP2INTERSECT", "avx512_vp2intersect"),
    _x86("AVX-VNNI", "avx_vnni"), _x86("AVX-VNNI-INT8", "avx_vnni_int8", hidden=True),
    _x86("AVX-VNNI-INT16", "avx_vnni_int16", hidden=True),
    _x86("AVX-IFMA", "avx_ifma", hidden=True),
    _x86("AVX-NE-CONVERT", "avx_ne_convert", hidden=True),
    _x86("CMPCCXADD", "cmpccxadd", hidden=True), _x86("SHA512", "sha512", hidden=True),
    _x86("SM3", "sm3", hidden=True), _x86("SM4", "sm4", hidden=True),
    _x86("AES", "aes"), _x86("VAES", "vaes"), _x86("PCLMULQDQ", "pclmulqdq"),
    _x86("VPCLMULQDQ", "vpclmulqdq"), _x86("SHA", "sha_ni"), _x86("GFNI", "gfni"),
    _x86("AMX-TILE", "amx_tile", note="also needs arch_prctl(ARCH_REQ_XCOMP_PERM), Linux 5.16+"),
    _x86("AMX-INT8", "amx_int8"), _x86("AMX-BF16", "amx_bf16"),
    _x86("AMX-FP16", "amx_fp16", hidden=True), _x86("AMX-COMPLEX", "amx_complex", hidden=True),
    _x86("FMA4", "fma4", note="AMD family 15h only"),
    _x86("XOP", "xop", note="AMD family 15h only"),
    _x86("TBM", "tbm", note="AMD family 15h only"), _x86("SSE4a", "sse4a", note="AMD only"),
    _x86("3DNow!", "3dnow", note="AMD only, removed since family 15h"),
    _x86("RDRAND", "rdrand"), _x86("RDSEED", "rdseed"), _x86("ADX", "adx"),
    _x86("RTM", "rtm", note="with TSX disabled transactions abort instead of SIGILL"),
    _x86("CLWB", "clwb"), _x86("XSAVEC", "xsavec"), _x86("XSAVEOPT", "xsaveopt"),
    _x86("RDPID", "rdpid"), _x86("MOVDIRI", "movdiri"), _x86("MOVDIR64B", "movdir64b"),
    _x86("WAITPKG", "waitpkg"), _x86("RDTSCP", "rdtscp"), _x86("FSGSBASE", "fsgsbase"),
    _x86("SERIALIZE", "serialize"), _x86("TSXLDTRK", "tsxldtrk"), _x86("CLZERO", "clzero"),
    _x86("MWAITX", "mwaitx"), _x86("RDPRU", "rdpru"),
    _a64("LSE", "atomics"), _a64("AES", "aes"), _a64("PMULL", "pmull"), _a64("SHA1", "sha1"),
    _a64("SHA2", "sha2"), _a64("SHA512", "sha512"), _a64("SHA3", "sha3"), _a64("SM3", "sm3"),
    _a64("SM4", "sm4"), _a64("CRC32", "crc32"), _a64("FP16", "fphp"),
    _a64("ASIMD-FP16", "asimdhp"), _a64("DotProd", "asimddp"), _a64("RCpc", "lrcpc"),
    _a64("RCpc2", "ilrcpc"), _a64("RDM", "asimdrdm"), _a64("JSCVT", "jscvt"),
    _a64("FCMA", "fcma"), _a64("DCPoP", "dcpop"), _a64("DCPoDP", "dcpodp"),
    _a64("FHM", "asimdfhm"), _a64("I8MM", "i8mm"), _a64("BF16", "bf16"), _a64("FRINT", "frint"),
    _a64("FlagM", "flagm"), _a64("FlagM2", "flagm2"), _a64("RNG", "rng"), _a64("MTE", "mte"),
    _a64("SB", "sb"), _a64("PAuth", "paca"), _a64("PAuth-generic", "pacg"),
    _a64("SVE", "sve"), _a64("SVE2", "sve2"), _a64("SVE-AES", "sveaes"),
    _a64("SVE-PMULL128", "svepmull"), _a64("SVE-BitPerm", "svebitperm"),
    _a64("SVE-SHA3", "svesha3"), _a64("SVE-SM4", "svesm4"), _a64("SVE-I8MM", "svei8mm"),
    _a64("SVE-BF16", "svebf16"), _a64("SME", "sme"),
)
EXTENSIONS: dict[tuple[str, str], Extension] = {(e.arch, e.name): e for e in _EXTENSIONS}


# ---------------------------------------------------------------------------------------
# x86-64 instruction classification
# ---------------------------------------------------------------------------------------

def _names(ext: str, mnemonics: str) -> dict[str, tuple[str, ...]]:
    return dict.fromkeys(mnemonics.split(), (ext,))


# Instructions whose extension does not depend on the encoding. Baseline x86-64 (SSE, SSE2,
# CMOV, ...) is absent. `tzcnt` is left out on purpose: GCC emits `rep bsf` (the same bytes)
# for generic x86-64 because it gives the same result on CPUs without BMI1; so are hint-space
# instructions that run as NOPs on older CPUs (endbr64, prefetchw, cldemote, clflushopt).
X86_MNEMONICS: dict[str, tuple[str, ...]] = {
    **_names("SSE3", "addsubpd addsubps haddpd haddps hsubpd hsubps lddqu movddup movshdup "
                     "movsldup fisttp"),
    **_names("SSSE3", "pabsb pabsd pabsw palignr phaddd phaddsw phaddw phsubd phsubsw phsubw "
                      "pmaddubsw pmulhrsw pshufb psignb psignd psignw"),
    **_names("SSE4.1", "blendpd blendps blendvpd blendvps dppd dpps extractps insertps "
                       "movntdqa mpsadbw packusdw pblendvb pblendw pcmpeqq pextrb pextrd pextrq "
                       "phminposuw pinsrb pinsrd pinsrq pmaxsb pmaxsd pmaxud pmaxuw pminsb "
                       "pminsd pminud pminuw pmovsxbd pmovsxbq pmovsxbw pmovsxdq pmovsxwd "
                       "pmovsxwq pmovzxbd pmovzxbq pmovzxbw pmovzxdq pmovzxwd pmovzxwq pmuldq "
                       "pmulld ptest roundpd roundps roundsd roundss"),
    **_names("SSE4.2", "crc32 crc32b crc32w crc32l crc32q pcmpestri pcmpestrm pcmpistri "
                       "pcmpistrm pcmpgtq"),
    **_names("SSE4a", "extrq insertq movntsd movntss"),
    **_names("POPCNT", "popcnt"),
    **_names("LZCNT", "lzcnt"),
    **_names("MOVBE", "movbe"),
    **_names("CMPXCHG16B", "cmpxchg16b"),
    **_names("LAHF-SAHF", "lahf sahf"),
    **_names("AES", "aesdec aesdeclast aesenc aesenclast aesimc aeskeygenassist"),
    **_names("PCLMULQDQ", "pclmulqdq pclmullqlqdq pclmulhqlqdq pclmullqhqdq pclmulhqhqdq"),
    **_names("SHA", "sha1msg1 sha1msg2 sha1nexte sha1rnds4 sha256msg1 sha256msg2 sha256rnds2"),
    **_names("GFNI", "gf2p8affineinvqb gf2p8affineqb gf2p8mulb"),
    **_names("BMI1", "andn blsi blsmsk blsr"),
    **_names("BMI2", "bzhi mulx pdep pext rorx sarx shlx shrx"),
    **_names("TBM", "blcfill blci blcic blcmsk blcs blsfill blsic t1mskc tzmsk"),
    **_names("RDRAND", "rdrand"),
    **_names("RDSEED", "rdseed"),
    **_names("ADX", "adcx adox"),
    **_names("RTM", "xbegin xend xabort xtest"),
    **_names("CLWB", "clwb"),
    **_names("XSAVEC", "xsavec xsavec64"),
    **_names("XSAVEOPT", "xsaveopt xsaveopt64"),
    **_names("RDPID", "rdpid"),
    **_names("MOVDIRI", "movdiri"),
    **_names("MOVDIR64B", "movdir64b"),
    **_names("WAITPKG", "umonitor umwait tpause"),
    **_names("RDTSCP", "rdtscp"),
    **_names("FSGSBASE", "rdfsbase rdgsbase wrfsbase wrgsbase"),
    **_names("SERIALIZE", "serialize"),
    **_names("CLZERO", "clzero"),
    **_names("MWAITX", "monitorx mwaitx"),
    **_names("RDPRU", "rdpru"),
    **_names("3DNow!", "femms pavgusb pf2id pf2iw pfacc pfadd pfcmpeq pfcmpge pfcmpgt pfmax "
                       "pfmin pfmul pfnacc pfpnacc pfrcp pfrcpit1 pfrcpit2 pfrsqit1 pfrsqrt "
                       "pfsub pfsubr pi2fd pi2fw pmulhrw pswapd"),
}

# AVX-512 subsets named by mnemonic (EVEX encodings).
X86_AVX512_SUBSETS: dict[str, str] = {
    **dict.fromkeys("vpmadd52luq vpmadd52huq".split(), "AVX-512IFMA"),
    **dict.fromkeys("vpermb vpermi2b vpermt2b vpmultishiftqb".split(), "AVX-512VBMI"),
    **dict.fromkeys("vpcompressb vpcompressw vpexpandb vpexpandw vpshldw vpshldd vpshldq "
                    "vpshldvw vpshldvd vpshldvq vpshrdw vpshrdd vpshrdq vpshrdvw vpshrdvd "
                    "vpshrdvq".split(), "AVX-512VBMI2"),
    **dict.fromkeys("vpdpbusd vpdpbusds vpdpwssd vpdpwssds".split(), "AVX-512VNNI"),
    **dict.fromkeys("vpopcntb vpopcntw vpshufbitqmb".split(), "AVX-512BITALG"),
    **dict.fromkeys("vpopcntd vpopcntq".split(), "AVX-512VPOPCNTDQ"),
    **dict.fromkeys("vcvtne2ps2bf16 vcvtneps2bf16 vdpbf16ps".split(), "AVX-512BF16"),
    **dict.fromkeys("vp2intersectd vp2intersectq".split(), "AVX-512VP2INTERSECT"),
    **dict.fromkeys("vpconflictd vpconflictq vplzcntd vplzcntq vpbroadcastmb2q "
                    "vpbroadcastmw2d".split(), "AVX-512CD"),
    **dict.fromkeys("vexp2ps vexp2pd vrcp28ps vrcp28pd vrcp28ss vrcp28sd vrsqrt28ps vrsqrt28pd "
                    "vrsqrt28ss vrsqrt28sd".split(), "AVX-512ER"),
}
_AVX512_BW_EXTRA = frozenset(
    "vpmaddwd vpunpcklwd vpunpckhwd vpackssdw vpackusdw vpalignr vpslldq vpsrldq vdbpsadbw "
    "vmovdqu8 vmovdqu16 vpmovb2m vpmovw2m vpmovm2b vpmovm2w".split()
)
# Packed-integer mnemonics that end in b/w but narrow dwords/qwords: AVX-512F, not BW.
_AVX512_F_NARROWING = frozenset(
    "vpmovdb vpmovdw vpmovqb vpmovqw vpmovsdb vpmovsdw vpmovsqb vpmovsqw vpmovusdb vpmovusdw "
    "vpmovusqb vpmovusqw".split()
)
_AVX512_DQ = re.compile(
    r"vpmullq|vcvtt?p[sd]2u?qq|vcvtu?qq2p[sd]|vrange[ps][sd]|vreduce[ps][sd]|vfpclass[ps][sd]"
    r"|v(?:extract|insert)[fi](?:32x8|64x2)|vbroadcast[fi](?:32x2|32x8|64x2)|vpmov[dq]2m"
    r"|vpmovm2[dq]|v(?:and|andn|or|xor)p[sd]|vp(?:extr|insr)[dq]"
)
_AVX512_SCALAR_VP = frozenset(
    "vpextrb vpextrw vpextrd vpextrq vpinsrb vpinsrw vpinsrd vpinsrq".split()
)
_FMA3 = re.compile(r"vf(?:n?m(?:add|sub)|maddsub|msubadd)(?:132|213|231)[ps][sd]")
_FMA4 = re.compile(r"vf(?:n?m(?:add|sub)|maddsub|msubadd)[ps][sd]")
_AVX2_ONLY = frozenset(
    "vpbroadcastb vpbroadcastw vpbroadcastd vpbroadcastq vbroadcasti128 vperm2i128 vpermd "
    "vpermq vpermps vpermpd vinserti128 vextracti128 vpblendd vpmaskmovd vpmaskmovq vpsllvd "
    "vpsllvq vpsrlvd vpsrlvq vpsravd vgatherdps vgatherdpd vgatherqps vgatherqpd vpgatherdd "
    "vpgatherdq vpgatherqd vpgatherqq".split()
)
# `vp` mnemonics that AVX (not AVX2) already had in 256 bits, or that belong elsewhere.
_AVX_VP_256 = frozenset("vptest vpermilps vpermilpd vperm2f128".split())
_VEX_NAMED = {
    **dict.fromkeys("vcvtph2ps vcvtps2ph".split(), "F16C"),
    **dict.fromkeys("vpdpbusd vpdpbusds vpdpwssd vpdpwssds".split(), "AVX-VNNI"),
    **dict.fromkeys("vpmadd52luq vpmadd52huq".split(), "AVX-IFMA"),
    **dict.fromkeys("vgf2p8affineinvqb vgf2p8affineqb vgf2p8mulb".split(), "GFNI"),
}
_AES_VECTOR = frozenset("vaesdec vaesdeclast vaesenc vaesenclast vaesimc vaeskeygenassist".split())
_CLMUL_VECTOR = frozenset(
    "vpclmulqdq vpclmullqlqdq vpclmulhqlqdq vpclmullqhqdq vpclmulhqhqdq".split()
)

_LEGACY_PREFIXES = frozenset(b"\x26\x2e\x36\x3e\x64\x65\x66\x67\xf0\xf2\xf3")
_PP = (None, 0x66, 0xF3, 0xF2)


@dataclass(frozen=True, slots=True)
class _Vex:
    """The fields of a VEX, EVEX or XOP prefixed instruction, decoded from its bytes."""

    encoding: str  # "vex", "evex" or "xop"
    map: int  # opcode map: 1 (0F), 2 (0F38), 3 (0F3A), 5, 6 (EVEX), 8-10 (XOP)
    opcode: int
    pp: int | None  # implied prefix: None, 0x66, 0xF3, 0xF2
    w: int
    length_bits: int  # VEX.L, or EVEX.L'L (0: 128, 1: 256, 2: 512)
    broadcast_or_rounding: int  # EVEX.b
    modrm: int
    size: int  # instruction length in bytes


def _escape_index(code: bytes, pos: int, end: int) -> int:
    i = pos
    while i < end and code[i] in _LEGACY_PREFIXES:
        i += 1
    if i < end and 0x40 <= code[i] <= 0x4F:  # REX
        i += 1
    return i


def _decode_vex(code: bytes, pos: int, end: int) -> _Vex | None:
    """Decode a VEX/EVEX/XOP prefixed instruction at `pos` far enough to know its opcode and
    length (64-bit mode), or None when the bytes are not one."""
    i = _escape_index(code, pos, end)
    if i + 2 >= end:
        return None
    lead = code[i]
    b_bit = 0
    if lead == 0xC5:
        encoding, opmap, w = "vex", 1, 0
        length_bits, pp = (code[i + 1] >> 2) & 1, code[i + 1] & 3
        j = i + 2
    elif lead in (0xC4, 0x8F):
        if lead == 0x8F and (code[i + 1] & 0x1F) < 8:
            return None  # POP r/m, not XOP
        encoding = "vex" if lead == 0xC4 else "xop"
        opmap, w = code[i + 1] & 0x1F, code[i + 2] >> 7
        length_bits, pp = (code[i + 2] >> 2) & 1, code[i + 2] & 3
        j = i + 3
    elif lead == 0x62:
        if i + 3 >= end or not code[i + 2] & 0x04:  # EVEX P1 bit 2 is always 1
            return None
        encoding, opmap, w = "evex", code[i + 1] & 0x07, code[i + 2] >> 7
        pp, length_bits, b_bit = code[i + 2] & 3, (code[i + 3] >> 5) & 3, (code[i + 3] >> 4) & 1
        j = i + 4
    else:
        return None
    if j + 1 >= end:
        return None
    opcode, modrm = code[j], code[j + 1]
    size = j + 2 - pos
    mod, rm = modrm >> 6, modrm & 7
    if mod != 3:
        if rm == 4:  # SIB byte
            if j + 2 >= end:
                return None
            size += 1
            if mod == 0 and code[j + 2] & 7 == 5:
                size += 4
        if mod == 1:
            size += 1
        elif mod == 2 or (mod == 0 and rm == 5):
            size += 4
    has_imm8 = opmap == 3 or (encoding == "xop" and opmap == 8) or (
        opmap == 1 and (0x70 <= opcode <= 0x73 or opcode in (0xC2, 0xC4, 0xC5, 0xC6)))
    size += 1 if has_imm8 else (4 if encoding == "xop" and opmap == 10 else 0)
    if pos + size > end:
        return None
    return _Vex(encoding, opmap, opcode, _PP[pp], w, length_bits, b_bit, modrm, size)


def _unknown_vex(fields: _Vex) -> tuple[str, ...]:
    """Extensions of VEX/EVEX instructions capstone 5 cannot decode, by opcode map and opcode
    (Intel SDM opcode tables; the AMX, AVX-VNNI, FP16 and BF16 maps are all newer than the
    LLVM capstone 5 was generated from)."""
    op, pp, opmap = fields.opcode, fields.pp, fields.map
    if fields.encoding == "xop":
        return ("XOP",)
    if fields.encoding == "evex":
        if opmap in (5, 6):  # maps 5 and 6 exist only for AVX-512 FP16
            return ("AVX-512FP16",)
        if opmap == 3 and pp in (None, 0xF3) and op in (0x08, 0x0A, 0x26, 0x27, 0x56, 0x57,
                                                         0x66, 0x67, 0xC2):
            return ("AVX-512FP16",)  # vrndscaleph, vgetmantph, vreduceph, vfpclassph, vcmpph
        if opmap == 2 and ((op == 0x52 and pp == 0xF3) or (op == 0x72 and pp in (0xF2, 0xF3))):
            return ("AVX-512BF16",)  # vdpbf16ps, vcvtne2ps2bf16, vcvtneps2bf16
        if opmap == 2 and op == 0x68 and pp == 0xF2:
            return ("AVX-512VP2INTERSECT",)
        return ("AVX-512F",)
    if opmap == 2:
        if op in (0x49, 0x4B):
            return ("AMX-TILE",)  # ldtilecfg sttilecfg tilerelease tilezero tileload* tilestored
        if op == 0x5E:
            return ("AMX-INT8",)  # tdpbssd tdpbsud tdpbusd tdpbuud
        if op == 0x5C:
            return ("AMX-BF16",) if pp == 0xF3 else ("AMX-FP16",)  # tdpbf16ps / tdpfp16ps
        if op == 0x6C:
            return ("AMX-COMPLEX",)
        if 0x50 <= op <= 0x53:
            return ("AVX-VNNI",) if pp == 0x66 else ("AVX-VNNI-INT8",)
        if op in (0xD2, 0xD3):
            return ("AVX-VNNI-INT16",)
        if op in (0xB4, 0xB5) and pp == 0x66:
            return ("AVX-IFMA",)
        if (op == 0x72 and pp == 0xF3) or op in (0xB0, 0xB1):
            return ("AVX-NE-CONVERT",)
        if op in (0xCB, 0xCC, 0xCD) and pp == 0xF2:
            return ("SHA512",)
        if op == 0xDA:
            return ("SM3",) if pp in (None, 0x66) else ("SM4",)
        if 0xE0 <= op <= 0xEF and pp == 0x66:
            return ("CMPCCXADD",)
    if opmap == 3 and op == 0xDE:
        return ("SM3",)
    return ("AVX",)


def _evex_scalar(mnemonic: str) -> bool:
    if mnemonic.startswith("vp"):
        return mnemonic in _AVX512_SCALAR_VP
    return mnemonic.endswith(("ss", "sd", "sh", "si")) or mnemonic.startswith(
        ("vcomis", "vucomis", "vmovd", "vmovq", "vmovw", "vinsertps", "vextractps"))


def _x86_vector(mnemonic: str, op_str: str, fields: _Vex) -> tuple[str, ...]:
    """Extensions of a capstone-decoded VEX/EVEX/XOP instruction."""
    if fields.encoding == "xop":
        return ("TBM",) if mnemonic == "bextr" else ("XOP",)
    wide = "ymm" in op_str or "zmm" in op_str
    if fields.encoding == "vex":
        if mnemonic == "bextr":
            return ("BMI1",)
        if mnemonic[0] == "k":  # AVX-512 opmask instructions are VEX-encoded
            if mnemonic.endswith("b") or mnemonic in ("kaddw", "ktestw"):
                return ("AVX-512F", "AVX-512DQ")
            if mnemonic.endswith(("d", "q")):
                return ("AVX-512F", "AVX-512BW")
            return ("AVX-512F",)
        if _FMA3.fullmatch(mnemonic):
            return ("AVX", "FMA")
        if _FMA4.fullmatch(mnemonic):
            return ("AVX", "FMA4")
        named = _VEX_NAMED.get(mnemonic)
        if named:
            return ("AVX", named)
        if mnemonic in _AES_VECTOR:
            return ("AVX", "VAES") if wide else ("AVX", "AES")
        if mnemonic in _CLMUL_VECTOR:
            return ("AVX", "VPCLMULQDQ") if wide else ("AVX", "PCLMULQDQ")
        if mnemonic in _AVX2_ONLY or (
            mnemonic in ("vbroadcastss", "vbroadcastsd") and op_str.rsplit(",", 1)[-1].strip()
            .startswith("xmm")
        ) or (mnemonic.startswith("vp") and "ymm" in op_str and mnemonic not in _AVX_VP_256):
            return ("AVX", "AVX2")
        if mnemonic in ("vmovntdqa", "vmpsadbw") and "ymm" in op_str:
            return ("AVX", "AVX2")
        return ("AVX",)
    # EVEX
    found = ["AVX-512F"]
    subset = X86_AVX512_SUBSETS.get(mnemonic)
    if subset:
        found.append(subset)
    elif mnemonic in _AES_VECTOR:
        found.append("VAES")
    elif mnemonic in _CLMUL_VECTOR:
        found.append("VPCLMULQDQ")
    elif mnemonic.startswith("vgf2p8"):
        found.append("GFNI")
    elif _AVX512_DQ.fullmatch(mnemonic):
        found.append("AVX-512DQ")
    elif mnemonic in _AVX512_BW_EXTRA or (
        mnemonic.startswith("vp") and mnemonic.endswith(("b", "w"))
        and mnemonic not in _AVX512_F_NARROWING
    ):
        found.append("AVX-512BW")
    rounding_512 = fields.broadcast_or_rounding and fields.modrm >> 6 == 3
    if fields.length_bits != 2 and not rounding_512 and not _evex_scalar(mnemonic):
        found.append("AVX-512VL")
    return tuple(found)


def _x86_legacy_unknown(code: bytes, pos: int) -> tuple[tuple[str, ...], int] | None:
    """A few legacy-encoded instructions capstone 5 does not know: (extensions, length)."""
    if code[pos:pos + 3] == b"\x0f\x01\xe8":
        return ("SERIALIZE",), 3
    if code[pos:pos + 4] in (b"\xf2\x0f\x01\xe8", b"\xf2\x0f\x01\xe9"):
        return ("TSXLDTRK",), 4  # xsusldtrk, xresldtrk
    return None


# ---------------------------------------------------------------------------------------
# AArch64 instruction classification
# ---------------------------------------------------------------------------------------

_A64_LSE = re.compile(
    r"(?:casp?|swp|ld(?:add|clr|eor|set|smax|smin|umax|umin)|st(?:add|clr|eor|set|smax|smin"
    r"|umax|umin))(?:al|a|l)?[bh]?"
)
_A64_SVE_REG = re.compile(r"\b(?:z(?:3[01]|[12][0-9]|[0-9])|p(?:1[0-5]|[0-9]))\b")
_A64_SVE_ONLY = re.compile(r"(?:sq|uq)?(?:inc|dec)[bhwd]|cnt[bhwd]|rdvl|addvl|addpl|setffr")
_A64_H_REG = re.compile(r"\bh(?:3[01]|[12][0-9]|[0-9])\b")
_A64_VEC_H = re.compile(r"\.[48]h\b")
_A64_Q = re.compile(r"\.1?q\b")
_A64_SIMD: dict[str, str] = {
    **dict.fromkeys("aese aesd aesmc aesimc".split(), "AES"),
    **dict.fromkeys("sha1c sha1h sha1m sha1p sha1su0 sha1su1".split(), "SHA1"),
    **dict.fromkeys("sha256h sha256h2 sha256su0 sha256su1".split(), "SHA2"),
    **dict.fromkeys("sha512h sha512h2 sha512su0 sha512su1".split(), "SHA512"),
    **dict.fromkeys("eor3 bcax rax1 xar".split(), "SHA3"),
    **dict.fromkeys("sm3ss1 sm3tt1a sm3tt1b sm3tt2a sm3tt2b sm3partw1 sm3partw2".split(), "SM3"),
    **dict.fromkeys("sm4e sm4ekey".split(), "SM4"),
    **dict.fromkeys("crc32b crc32h crc32w crc32x crc32cb crc32ch crc32cw crc32cx".split(),
                    "CRC32"),
    **dict.fromkeys("sdot udot".split(), "DotProd"),
    **dict.fromkeys("usdot sudot smmla ummla usmmla".split(), "I8MM"),
    **dict.fromkeys("bfdot bfmmla bfmlalb bfmlalt bfcvt bfcvtn bfcvtn2".split(), "BF16"),
    **dict.fromkeys("ldapr ldaprb ldaprh".split(), "RCpc"),
    **dict.fromkeys("ldapur ldapurb ldapurh ldapursb ldapursh ldapursw stlur stlurb "
                    "stlurh".split(), "RCpc2"),
    **dict.fromkeys("sqrdmlah sqrdmlsh".split(), "RDM"),
    "fjcvtzs": "JSCVT",
    **dict.fromkeys("fcmla fcadd".split(), "FCMA"),
    **dict.fromkeys("fmlal fmlal2 fmlsl fmlsl2".split(), "FHM"),
    **dict.fromkeys("frint32x frint32z frint64x frint64z".split(), "FRINT"),
    **dict.fromkeys("cfinv rmif setf8 setf16".split(), "FlagM"),
    **dict.fromkeys("axflag xaflag".split(), "FlagM2"),
    **dict.fromkeys("irg gmi subp subps addg subg stg st2g stzg stz2g stgp ldg ldgm stgm "
                    "stzgm".split(), "MTE"),
    "sb": "SB",
    # Pointer authentication outside the hint space (paciasp, autiasp, ... are NOPs on CPUs
    # without it and never fault).
    **dict.fromkeys("pacia pacib pacda pacdb autia autib autda autdb paciza pacizb pacdza "
                    "pacdzb autiza autizb autdza autdzb xpaci xpacd ldraa ldrab braa brab "
                    "blraa blrab braaz brabz blraaz blrabz retaa retab".split(), "PAuth"),
    "pacga": "PAuth-generic",
    **dict.fromkeys("smstart smstop".split(), "SME"),
}
# The same mnemonics on SVE registers.
_A64_ON_SVE: dict[str, str] = {
    **dict.fromkeys("aese aesd aesmc aesimc".split(), "SVE-AES"),
    **dict.fromkeys("bdep bext bgrp".split(), "SVE-BitPerm"),
    "rax1": "SVE-SHA3",
    **dict.fromkeys("sm4e sm4ekey".split(), "SVE-SM4"),
    **dict.fromkeys("usdot sudot smmla ummla usmmla".split(), "SVE-I8MM"),
    **dict.fromkeys("bfdot bfmmla bfmlalb bfmlalt bfcvt bfcvtnt".split(), "SVE-BF16"),
}
# SVE2 mnemonics that SVE (v1) does not have in any form; SVE2 forms of mnemonics SVE
# already had (unpredicated mul, smulh, sqadd, tbl with two registers, ...) count as SVE.
_A64_SVE2_ONLY = frozenset(
    "adclb adclt addhnb addhnt addp bcax bsl bsl1n bsl2n cadd cdot cmla eor3 eorbt eortb "
    "faddp fcvtlt fcvtnt fcvtx fcvtxnt flogb fmaxnmp fmaxp fminnmp fminp fmlalb fmlalt "
    "fmlslb fmlslt histcnt histseg match nbsl nmatch pmul pmullb pmullt raddhnb raddhnt "
    "rshrnb rshrnt rsubhnb rsubhnt saba sabalb sabalt sabdlb sabdlt sadalp saddlb saddlbt "
    "saddlt saddwb saddwt sbclb sbclt shadd shrnb shrnt shsub shsubr sli smaxp sminp smlalb "
    "smlalt smlslb smlslt smullb smullt sqabs sqcadd sqdmlalb sqdmlalbt sqdmlalt sqdmlslb "
    "sqdmlslbt sqdmlslt sqdmullb sqdmullt sqneg sqrdcmlah sqrdmlah sqrdmlsh sqrshl sqrshlr "
    "sqrshrnb sqrshrnt sqrshrunb sqrshrunt sqshlr sqshlu sqshrnb sqshrnt sqshrunb sqshrunt "
    "sqsubr sqxtnb sqxtnt sqxtunb sqxtunt srhadd sri srshl srshlr srshr srsra sshllb sshllt "
    "ssra ssublb ssublbt ssublt ssubltb ssubwb ssubwt subhnb subhnt suqadd tbx uaba uabalb "
    "uabalt uabdlb uabdlt uadalp uaddlb uaddlt uaddwb uaddwt uhadd uhsub uhsubr umaxp uminp "
    "umlalb umlalt umlslb umlslt umullb umullt uqrshl uqrshlr uqrshrnb uqrshrnt uqshlr "
    "uqshrnb uqshrnt uqsubr uqxtnb uqxtnt urecpe urhadd urshl urshlr urshr ursqrte ursra "
    "ushllb ushllt usqadd usra usublb usublt usubwb usubwt whilege whilegt whilehi whilehs "
    "whilerw whilewr xar".split()
)
_A64_FP16_EXCLUDED = frozenset("fcvt fcvtl fcvtl2 fcvtn fcvtn2 fcvtxn fcvtxn2 fmlal fmlal2 "
                               "fmlsl fmlsl2".split())


def _a64_classify(mnemonic: str, op_str: str) -> tuple[str, ...]:
    if _A64_LSE.fullmatch(mnemonic):
        return ("LSE",)
    if ("z" in op_str or "p" in op_str) and _A64_SVE_REG.search(op_str):
        if "za" in op_str.split(", ")[0] or mnemonic in ("fmopa", "fmops", "bfmopa", "smopa",
                                                          "umopa", "sumopa", "usmopa"):
            return ("SME",)
        on_sve = _A64_ON_SVE.get(mnemonic)
        if on_sve:
            return (on_sve,)
        if mnemonic in ("pmullb", "pmullt") and _A64_Q.search(op_str):
            return ("SVE-PMULL128",)
        if mnemonic in _A64_SVE2_ONLY:
            return ("SVE2",)
        return ("SVE",)
    if _A64_SVE_ONLY.fullmatch(mnemonic):
        return ("SVE",)
    if "za" in op_str:
        return ("SME",)
    named = _A64_SIMD.get(mnemonic)
    if named:
        return (named,)
    if mnemonic in ("pmull", "pmull2"):
        return ("PMULL",) if _A64_Q.search(op_str) else ()
    if mnemonic == "dc":
        if op_str.startswith("cvadp"):
            return ("DCPoDP",)
        if op_str.startswith("cvap"):
            return ("DCPoP",)
        return ()
    if mnemonic == "mrs" and "rndr" in op_str.lower():  # RNDR, RNDRRS
        return ("RNG",)
    if (mnemonic[0] == "f" or mnemonic in ("scvtf", "ucvtf")) and \
            mnemonic not in _A64_FP16_EXCLUDED and "h" in op_str:
        if _A64_VEC_H.search(op_str):
            return ("ASIMD-FP16",)
        if _A64_H_REG.search(op_str):
            return ("FP16",)
    return ()


# ---------------------------------------------------------------------------------------
# Scanning an ELF file
# ---------------------------------------------------------------------------------------

class InputError(Exception):
    """The input cannot be read or is not what it should be; the message is one line."""


@dataclass
class Use:
    count: int
    address: int
    text: str
    where: str  # section, and function when the symbol table has one


@dataclass
class BinaryScan:
    path: str
    arch: str  # "x86_64" or "aarch64"
    sections: list[str] = field(default_factory=list)
    instructions: int = 0
    undecoded_bytes: int = 0
    uses: dict[str, Use] = field(default_factory=dict)
    isa_level_needed: int | None = None  # from GNU_PROPERTY_X86_ISA_1_NEEDED

    def add(self, extensions: tuple[str, ...], address: int, text: str, where) -> None:
        for name in extensions:
            use = self.uses.get(name)
            if use is None:
                self.uses[name] = Use(1, address, text, where(address))
            else:
                use.count += 1

    @property
    def isa_level_used(self) -> int | None:
        """The x86-64 psABI level the instructions found need (1 when none above baseline)."""
        if self.arch != "x86_64":
            return None
        levels = [EXTENSIONS[("x86_64", name)].level for name in self.uses]
        return max([1, *levels])


class _Symbols:
    """Function names by address, per section, for the `first use` column."""

    def __init__(self, elf):
        self._by_section: dict[int, tuple[list[int], list[tuple[int, str]]]] = {}
        raw: dict[int, list[tuple[int, int, str]]] = {}
        for name in (".symtab", ".dynsym"):
            table = elf.get_section_by_name(name)
            if table is None or not hasattr(table, "iter_symbols"):
                continue
            for symbol in table.iter_symbols():
                index = symbol["st_shndx"]
                if symbol["st_info"]["type"] != "STT_FUNC" or not isinstance(index, int):
                    continue
                raw.setdefault(index, []).append(
                    (symbol["st_value"], symbol["st_size"], symbol.name))
            if raw:
                break  # .symtab has everything .dynsym has
        for index, entries in raw.items():
            entries.sort()
            self._by_section[index] = ([e[0] for e in entries], [(e[1], e[2]) for e in entries])

    def name(self, section_index: int, address: int) -> str:
        entry = self._by_section.get(section_index)
        if not entry:
            return ""
        starts, rest = entry
        at = bisect.bisect_right(starts, address) - 1
        if at < 0:
            return ""
        size, name = rest[at]
        return name if address < starts[at] + max(size, 1) else ""


def _gnu_isa_needed(elf) -> int | None:
    """Highest x86-64 level in GNU_PROPERTY_X86_ISA_1_NEEDED, or None when not recorded."""
    needed = None
    for section in elf.iter_sections():
        if section.header.sh_type != "SHT_NOTE" or not hasattr(section, "iter_notes"):
            continue
        for note in section.iter_notes():
            if note["n_type"] != "NT_GNU_PROPERTY_TYPE_0":
                continue
            for prop in note["n_desc"] or ():
                kind = prop["pr_type"]
                if kind in ("GNU_PROPERTY_X86_ISA_1_NEEDED", GNU_PROPERTY_X86_ISA_1_NEEDED):
                    bits = prop["pr_data"]
                    if isinstance(bits, int):
                        level = max((lvl for bit, lvl in ISA_1_LEVEL_BITS if bits & bit),
                                    default=0)
                        needed = max(needed or 0, level)
    return needed


def _regions(elf) -> list[tuple[str, int, int, bytes]]:
    """(name, section index, address, bytes) of each executable section; the executable
    PT_LOAD segments when the file has no section headers."""
    regions = []
    for index, section in enumerate(elf.iter_sections()):
        header = section.header
        if header.sh_flags & SHF_EXECINSTR and header.sh_type != "SHT_NOBITS" and header.sh_size:
            regions.append((section.name, index, header.sh_addr, section.data()))
    if not regions:
        for number, segment in enumerate(elf.iter_segments()):
            header = segment.header
            if header.p_type == "PT_LOAD" and header.p_flags & PF_X and header.p_filesz:
                regions.append((f"segment {number}", -1, header.p_vaddr, segment.data()))
    return regions


def _load_tools():
    try:
        import capstone
        from elftools.elf.elffile import ELFFile
    except ImportError as err:
        raise InputError(
            f"{err.name or 'capstone/pyelftools'} is not installed: "
            "pip install 'fleetscope[isa]'") from None
    return capstone, ELFFile


WINDOW = 1 << 16  # bytes handed to capstone at a time


def _sweep_x86(capstone, scan: BinaryScan, code: bytes, base: int, where) -> None:
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    end = len(code)
    pos = 0
    mnemonics = X86_MNEMONICS
    while pos < end:
        window_end = min(end, pos + WINDOW)
        last = pos
        for address, size, mnemonic, op_str in md.disasm_lite(code[pos:window_end], base + pos):
            offset = address - base
            last = offset + size
            scan.instructions += 1
            if " " in mnemonic:  # "lock cmpxchg16b", "rep stosb", "notrack jmp"
                mnemonic = mnemonic.rsplit(" ", 1)[-1]
            found = mnemonics.get(mnemonic)
            if found is None and (mnemonic[0] in "vk" or mnemonic == "bextr"):
                fields = _decode_vex(code, offset, end)
                if fields is not None:
                    found = _x86_vector(mnemonic, op_str, fields)
            if found:
                scan.add(found, address, f"{mnemonic} {op_str}".strip(), where)
        if last >= window_end:
            pos = last
            continue
        if last > pos and window_end < end and window_end - last < 16:
            pos = last  # the window cut an instruction in two: start the next one there
            continue
        # capstone stopped at `last`: an encoding it does not know, or data in the section.
        fields = _decode_vex(code, last, end)
        if fields is not None:
            scan.instructions += 1
            text = f"({fields.encoding} map {fields.map} opcode {fields.opcode:#04x}, " \
                   f"not decoded by capstone)"
            scan.add(_unknown_vex(fields), base + last, text, where)
            pos = last + fields.size
            continue
        legacy = _x86_legacy_unknown(code, last)
        if legacy is not None:
            scan.instructions += 1
            scan.add(legacy[0], base + last, legacy[0][0].lower(), where)
            pos = last + legacy[1]
            continue
        scan.undecoded_bytes += 1
        pos = last + 1


def _sweep_a64(capstone, scan: BinaryScan, code: bytes, base: int, where) -> None:
    # capstone 6 renames the architecture CS_ARCH_AARCH64.
    arch = getattr(capstone, "CS_ARCH_ARM64", None) or capstone.CS_ARCH_AARCH64
    md = capstone.Cs(arch, capstone.CS_MODE_ARM)
    md.skipdata = True  # an undecodable word becomes ".byte ..." and the sweep goes on
    for start in range(0, len(code), WINDOW):
        chunk = code[start:start + WINDOW]
        for address, size, mnemonic, op_str in md.disasm_lite(chunk, base + start):
            if mnemonic == ".byte":
                scan.undecoded_bytes += size
                continue
            scan.instructions += 1
            found = _a64_classify(mnemonic, op_str)
            if found:
                scan.add(found, address, f"{mnemonic} {op_str}".strip(), where)


def scan_code(arch: str, code: bytes, base: int = 0, path: str = "<code>") -> BinaryScan:
    """Classify raw machine code ("x86_64" or "aarch64") as if it were one section."""
    capstone, _ = _load_tools()
    scan = BinaryScan(path, arch, [".text"])
    sweep = _sweep_x86 if arch == "x86_64" else _sweep_a64
    sweep(capstone, scan, code, base, lambda at: ".text")
    return scan


def scan_binary(path: str) -> BinaryScan:
    """Disassemble the executable sections of an ELF file and collect the extensions used."""
    capstone, elf_file = _load_tools()
    from elftools.common.exceptions import ELFError

    try:
        stream = open(path, "rb")  # noqa: SIM115 (closed below; pyelftools reads lazily)
    except OSError as err:
        raise InputError(f"{path}: {err.strerror or err}") from None
    with stream:
        try:
            elf = elf_file(stream)
            machine = elf.header.e_machine
            if machine == "EM_X86_64":
                arch = "x86_64"
            elif machine == "EM_AARCH64":
                arch = "aarch64"
            else:
                raise InputError(f"{path}: ELF for {machine}; only x86-64 and AArch64 are "
                                 "supported")
            scan = BinaryScan(path, arch)
            regions = _regions(elf)
            symbols = _Symbols(elf)
            if arch == "x86_64":
                scan.isa_level_needed = _gnu_isa_needed(elf)
        except InputError:
            raise
        except ELFError as err:
            raise InputError(f"{path}: not an ELF file ({err})") from None
        except Exception as err:  # pyelftools raises many exception types on corrupt files
            raise InputError(f"{path}: corrupt ELF file ({type(err).__name__}: {err})") from None
    if not regions:
        raise InputError(f"{path}: no executable code (no executable section or segment)")
    sweep = _sweep_x86 if arch == "x86_64" else _sweep_a64
    for name, index, address, code in regions:
        scan.sections.append(name)

        def where(at: int, name=name, index=index) -> str:
            function = symbols.name(index, at) if index >= 0 else ""
            return f"{name} {function}".strip() if function else name

        sweep(capstone, scan, code, address, where)
    return scan


# ---------------------------------------------------------------------------------------
# Checking against a CPU
# ---------------------------------------------------------------------------------------

@dataclass
class CheckResult:
    scan: BinaryScan
    cpu: CpuInfo
    cpu_source: str
    arch_mismatch: bool
    status: dict[str, str]  # extension -> "present", "missing" or "unknown"
    level_missing: bool  # the GNU property note needs a higher x86-64 level than the CPU has

    @property
    def cpu_level(self) -> int | None:
        return psabi_level(self.cpu.features) if self.cpu.model.arch == "x86_64" else None

    @property
    def missing(self) -> list[str]:
        return [name for name, state in self.status.items() if state == "missing"]

    @property
    def exit_code(self) -> int:
        return EXIT_MISSING if self.arch_mismatch or self.missing or self.level_missing \
            else EXIT_OK


def check(scan: BinaryScan, cpu: CpuInfo, cpu_source: str = "") -> CheckResult:
    """Compare the extensions a binary uses with a CPU's /proc/cpuinfo flags."""
    flags = cpu.features
    mismatch = cpu.model.arch != scan.arch
    status: dict[str, str] = {}
    for name in _ordered(scan):
        extension = EXTENSIONS[(scan.arch, name)]
        if mismatch:
            status[name] = "missing"
        elif all(flag in flags for flag in extension.flags):
            status[name] = "present"
        else:
            status[name] = "unknown" if extension.hidden else "missing"
    level_missing = False
    if scan.isa_level_needed and not mismatch and cpu.model.arch == "x86_64":
        level_missing = scan.isa_level_needed > psabi_level(flags)
    return CheckResult(scan, cpu, cpu_source, mismatch, status, level_missing)


def _ordered(scan: BinaryScan) -> list[str]:
    order = {e.name: i for i, e in enumerate(_EXTENSIONS) if e.arch == scan.arch}
    return sorted(scan.uses, key=lambda name: order.get(name, len(order)))


def _cpu_line(cpu: CpuInfo) -> str:
    model = cpu.model
    if model.arch == "x86_64":
        ident = f"{model.vendor} family {model.family} model {model.model} " \
                f"stepping {model.stepping}"
    elif model.arch == "aarch64":
        ident = f"implementer {model.implementer} part {model.part} variant {model.variant} " \
                f"revision {model.revision}"
    else:
        ident = "unknown architecture"
    return f"{model.model_name or model.arch} ({ident})"


def to_json(result: CheckResult) -> dict:
    scan = result.scan
    extensions = []
    for name, state in result.status.items():
        extension = EXTENSIONS[(scan.arch, name)]
        use = scan.uses[name]
        extensions.append({
            "name": name,
            "cpuinfo_flags": list(extension.flags),
            "instructions": use.count,
            "first_use": {"address": f"{use.address:#x}", "instruction": use.text,
                          "where": use.where},
            "on_cpu": state,
            "psabi_level": psabi_level_name(extension.level) if extension.level else None,
            "note": extension.note or None,
        })
    needed = scan.isa_level_needed
    return {
        "format": JSON_FORMAT,
        "binary": {
            "path": scan.path,
            "arch": scan.arch,
            "sections": scan.sections,
            "instructions": scan.instructions,
            "undecoded_bytes": scan.undecoded_bytes,
            "isa_level_needed": psabi_level_name(needed) if needed else None,
            "isa_level_used": psabi_level_name(scan.isa_level_used)
            if scan.isa_level_used else None,
        },
        "cpu": {
            "source": result.cpu_source,
            "arch": result.cpu.model.arch,
            "model_name": result.cpu.model.model_name,
            "description": _cpu_line(result.cpu),
            "isa_level": psabi_level_name(result.cpu_level) if result.cpu_level else None,
            "features_fingerprint": result.cpu.model.fingerprint,
            "mixed": result.cpu.mixed,
        },
        "arch_mismatch": result.arch_mismatch,
        "isa_level_missing": result.level_missing,
        "extensions": extensions,
        "missing": result.missing,
        "unknown": [name for name, state in result.status.items() if state == "unknown"],
    }


def to_table(result: CheckResult) -> str:
    scan = result.scan
    out = [
        f"binary: {scan.path} ({scan.arch}; {', '.join(scan.sections)}; "
        f"{scan.instructions} instructions, {scan.undecoded_bytes} bytes not decoded)",
        f"cpu:    {_cpu_line(result.cpu)} from {result.cpu_source}"
        + (f", {psabi_level_name(result.cpu_level)}" if result.cpu_level else ""),
    ]
    if scan.arch == "x86_64":
        needed = scan.isa_level_needed
        out.append(f"x86 ISA level: needed by the GNU property note: "
                   f"{psabi_level_name(needed) if needed else 'not recorded'}; "
                   f"used by the instructions: {psabi_level_name(scan.isa_level_used or 1)}")
    out.append("")
    if result.arch_mismatch:
        out.append(f"The binary is for {scan.arch}, the CPU is {result.cpu.model.arch}: "
                   "it cannot run there.")
    if not result.status:
        out.append("No instruction-set extension beyond the architecture's baseline is used.")
    else:
        rows = [("extension", "cpuinfo flags", "instructions", "first use", "this CPU")]
        for name, state in result.status.items():
            extension = EXTENSIONS[(scan.arch, name)]
            use = scan.uses[name]
            first = f"{use.address:#x} {use.text}"
            if len(first) > 48:
                first = first[:45] + "..."
            first += f" ({use.where})"
            label = {"present": "ok", "missing": "MISSING",
                     "unknown": "unknown (flag not shown in /proc/cpuinfo)"}[state]
            if extension.note and state != "present":
                label += f"; {extension.note}"
            rows.append((name, " ".join(extension.flags), str(use.count), first, label))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        for row in rows:
            out.append("  ".join(
                [row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2].rjust(widths[2]),
                 row[3].ljust(widths[3]), row[4]]).rstrip())
    out.append("")
    missing = result.missing
    if result.level_missing:
        out.append(f"The binary's GNU property note needs "
                   f"{psabi_level_name(scan.isa_level_needed or 0)}; this CPU is "
                   f"{psabi_level_name(result.cpu_level or 0)}: glibc will refuse to load it "
                   "(\"CPU ISA level is lower than required\").")
    if missing:
        flags = ", ".join(f"{name} ({' '.join(EXTENSIONS[(scan.arch, name)].flags)})"
                          for name in missing)
        out.append(f"{len(missing)} extension(s) used by the binary are missing on this CPU: "
                   f"{flags}.")
    elif not result.arch_mismatch and not result.level_missing:
        out.append("No extension the binary uses is missing on this CPU.")
    if missing:
        out.append("Code behind runtime CPU dispatch is counted too: a missing extension is a "
                   "risk; the faulting ip in the kernel's SIGILL line is the proof.")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------
# Command
# ---------------------------------------------------------------------------------------

def build_isa_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetscope isa check",
        description="List the instruction-set extensions an ELF binary uses and report those "
        "a CPU lacks (exit 1 when any is missing).",
    )
    parser.add_argument("binary", metavar="BINARY", help="ELF executable or shared library")
    parser.add_argument(
        "--features-from",
        metavar="CPUINFO",
        default=DEFAULT_CPUINFO,
        help="the CPU to check against, as a /proc/cpuinfo file (default: this machine's)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def run_isa_check(argv: list[str]) -> int:
    """`fleetscope isa check`: 0 nothing missing, 1 missing, 2 usage error, 3 input error."""
    parser = build_isa_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse printed usage (2) or help (0)
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    try:
        try:
            with open(args.features_from, "rb") as handle:
                text = handle.read().decode("utf-8", "replace")
        except OSError as err:
            raise InputError(f"{args.features_from}: {err.strerror or err}") from None
        try:
            cpu = parse_cpuinfo(text, args.features_from)
        except ParseError as err:
            raise InputError(str(err)) from None
        scan = scan_binary(args.binary)
    except InputError as err:
        print(f"fleetscope isa check: error: {err}", file=sys.stderr)
        return EXIT_INPUT
    result = check(scan, cpu, args.features_from)
    if args.json:
        sys.stdout.write(json.dumps(to_json(result), indent=2) + "\n")
    else:
        sys.stdout.write(to_table(result))
    return result.exit_code


# Where a binary the kernel named by its file name alone may live on a node.
LIBRARY_DIRS = ("/usr/local/lib", "/usr/local/lib64", "/usr/lib", "/usr/lib64", "/lib", "/lib64",
                "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu")


def locate_binary(name: str, root: str = "/") -> str | None:
    """The file a SIGILL line names (`in libagentcore.so[...]`: a base name only), looked up
    on PATH and in the usual library directories under `root`."""
    import os
    import shutil

    if not name or "/" in name:
        return None
    if root in ("", "/"):
        found = shutil.which(name)
        if found:
            return found
    for directory in LIBRARY_DIRS:
        candidate = os.path.join(root, directory.lstrip("/"), name)
        if os.path.isfile(candidate):
            return candidate
    return None


def check_against_cpuinfo(path: str, cpuinfo_text: str, cpu_source: str = "") -> dict:
    """`isa check` as data (the JSON document): what `path` uses that this CPU lacks.
    Raises InputError for an unreadable or non-ELF file, ParseError for bad cpuinfo."""
    return to_json(check(scan_binary(path), parse_cpuinfo(cpuinfo_text), cpu_source))
