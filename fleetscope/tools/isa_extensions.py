"""The instruction-set extensions `isa check` names, with the /proc/cpuinfo flags a CPU shows
for each, and the AArch64 mnemonic classification; what isa.py, isa_x86.py and isa_fault.py
share, so none of them imports another for it."""

from __future__ import annotations

import re
from dataclasses import dataclass


class InputError(Exception):
    """The input cannot be read or is not what it should be; the message is one line."""


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
EXTENSION_TABLE = (
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
    _x86("RTM", "rtm", note="Intel TSX: off on most Intel parts since 2021, never on AMD"),
    _x86("CLWB", "clwb"), _x86("XSAVEC", "xsavec"), _x86("XSAVEOPT", "xsaveopt"),
    _x86("RDPID", "rdpid"), _x86("MOVDIRI", "movdiri"), _x86("MOVDIR64B", "movdir64b"),
    _x86("WAITPKG", "waitpkg"), _x86("RDTSCP", "rdtscp"), _x86("FSGSBASE", "fsgsbase"),
    _x86("SERIALIZE", "serialize"), _x86("TSXLDTRK", "tsxldtrk"), _x86("CLZERO", "clzero"),
    _x86("MWAITX", "mwaitx"), _x86("RDPRU", "rdpru"), _x86("XSAVE", "xsave"),
    _x86("PKU", "pku"), _x86("ENQCMD", "enqcmd"), _x86("UINTR", "uintr"), _x86("LWP", "lwp"),
    _x86("AVX-512-4FMAPS", "avx512_4fmaps"), _x86("AVX-512-4VNNIW", "avx512_4vnniw"),
    _x86("PREFETCHWT1", "prefetchwt1", hidden=True), _x86("PTWRITE", "ptwrite", hidden=True),
    _x86("KeyLocker", "keylocker", hidden=True), _x86("RAO-INT", "rao_int", hidden=True),
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
EXTENSIONS: dict[tuple[str, str], Extension] = {(e.arch, e.name): e for e in EXTENSION_TABLE}


def extension_of(arch: str, name: str) -> Extension:
    """The table entry; a feature the table does not know yet shows with its decoder name and
    an "unknown" verdict rather than a guessed cpuinfo flag."""
    found = EXTENSIONS.get((arch, name))
    return found or Extension(name, arch, (name.lower(),), hidden=True)


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


def classify_a64(mnemonic: str, op_str: str) -> tuple[str, ...]:
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


def load_capstone():
    try:
        import capstone
    except ImportError:
        raise InputError("capstone is not installed (AArch64 decoding): "
                         "pip install 'fleetscope[isa]'") from None
    return capstone
