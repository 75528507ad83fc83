"""Parser for /proc/cpuinfo on x86 and arm64: the CPU model and its feature set.

x86 (arch/x86/kernel/cpu/proc.c show_cpuinfo(), one block per logical CPU, `key\\t: value`):

    processor	: 0
    vendor_id	: AuthenticAMD
    cpu family	: 25
    model		: 1
    model name	: AMD EPYC 7763 64-Core Processor
    stepping	: 1
    microcode	: 0xa0011d1
    flags		: fpu vme de pse tsc ... avx2 smep bmi2 ...

arm64 (arch/arm64/kernel/cpuinfo.c c_show(); no model name, the MIDR fields instead):

    processor	: 0
    BogoMIPS	: 200.00
    Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp ...
    CPU implementer	: 0x48
    CPU architecture: 8
    CPU variant	: 0x1
    CPU part	: 0xd01
    CPU revision	: 0

Very old arm64 kernels print one `Processor : AArch64 Processor rev 1 (aarch64)` line and
every `processor : N` line in one block followed by shared fields; keys are read by name,
never by position. Flags are whole tokens (`avx` is not `avx2`).

The record describes the first CPU, and lists every distinct CPU variant (model, stepping,
feature set) with its CPU count, so a node with mixed steppings or feature sets shows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from . import ParseError

# x86-64 psABI micro-architecture levels as /proc/cpuinfo tokens (the levels as binutils'
# elf/common.h and glibc's loader name them). SSE3 shows as `pni`, LZCNT as `abm`; OSXSAVE
# has no token and `xsave` is the usual proxy. Each level includes the ones below it.
PSABI_LEVEL_FLAGS: tuple[tuple[str, frozenset[str]], ...] = (
    ("x86-64", frozenset("cmov cx8 fpu fxsr mmx syscall sse sse2 lm".split())),
    ("x86-64-v2", frozenset("cx16 lahf_lm popcnt pni sse4_1 sse4_2 ssse3".split())),
    ("x86-64-v3", frozenset("avx avx2 bmi1 bmi2 f16c fma abm movbe xsave".split())),
    ("x86-64-v4", frozenset("avx512f avx512bw avx512cd avx512dq avx512vl".split())),
)

# MIDR implementer codes (arch/arm64/include/asm/cputype.h ARM_CPU_IMP_*).
ARM_IMPLEMENTERS = {
    "0x41": "ARM",
    "0x42": "Broadcom",
    "0x43": "Cavium",
    "0x46": "Fujitsu",
    "0x48": "HiSilicon",
    "0x4e": "NVIDIA",
    "0x50": "APM",
    "0x51": "Qualcomm",
    "0x61": "Apple",
    "0x6d": "Microsoft",
    "0xc0": "Ampere",
}
# (implementer, part) -> name. HiSilicon 0xd01 is the TaiShan v110 core of Kunpeng 920
# (HISI_CPU_PART_TSV110); 0xd02 is HIP09 (util-linux lscpu: TaiShan-v120).
ARM_PARTS = {
    ("0x48", "0xd01"): "Kunpeng 920",
    ("0x48", "0xd02"): "TaiShan v120",
    ("0x41", "0xd03"): "Cortex-A53",
    ("0x41", "0xd07"): "Cortex-A57",
    ("0x41", "0xd08"): "Cortex-A72",
    ("0x41", "0xd0c"): "Neoverse-N1",
    ("0x41", "0xd40"): "Neoverse-V1",
    ("0x41", "0xd49"): "Neoverse-N2",
    ("0x41", "0xd4f"): "Neoverse-V2",
    ("0x46", "0x001"): "A64FX",
    ("0xc0", "0xac3"): "Ampere-1",
}

# Far above any real machine; keeps corrupt input from growing records without bound.
MAX_PROCESSORS = 65536


def features_fingerprint(features) -> str:
    """A short stable id of a feature set: the first 12 hex digits of the SHA-256 of the
    sorted, space-joined feature names (the kernel's print order does not matter).

    >>> features_fingerprint(["sse2", "avx"]) == features_fingerprint(["avx", "sse2"])
    True
    """
    joined = " ".join(sorted(set(features)))
    return hashlib.sha256(joined.encode()).hexdigest()[:12]


def psabi_level(flags) -> int:
    """The x86-64 psABI level (1-4) a set of /proc/cpuinfo flags satisfies; 0 below baseline.

    >>> psabi_level("cmov cx8 fpu fxsr mmx syscall sse sse2 lm".split())
    1
    """
    have = set(flags)
    level = 0
    for _, needed in PSABI_LEVEL_FLAGS:
        if not needed <= have:
            break
        level += 1
    return level


def psabi_level_name(level: int) -> str:
    """1 -> "x86-64" (the baseline, also called v1), 2 -> "x86-64-v2", ...; 0 -> "none"."""
    return PSABI_LEVEL_FLAGS[level - 1][0] if 1 <= level <= len(PSABI_LEVEL_FLAGS) else "none"


@dataclass(frozen=True, slots=True)
class CpuModel:
    """One CPU's identity. x86 fills vendor..microcode, arm64 the MIDR fields; strings are
    kept as the kernel prints them (`0x48`, `0xd01`, `0xa0011d1`)."""

    arch: str  # "x86_64", "aarch64", or "unknown" (another architecture's format)
    vendor: str = ""  # vendor_id on x86; the implementer's name on arm64
    model_name: str = ""  # `model name` on x86; derived from implementer and part on arm64
    family: str = ""
    model: str = ""
    stepping: str = ""
    microcode: str = ""
    implementer: str = ""
    part: str = ""
    variant: str = ""
    revision: str = ""
    architecture: str = ""
    features: tuple[str, ...] = ()  # x86 `flags` / arm64 `Features`, in the kernel's order

    @property
    def fingerprint(self) -> str:
        return features_fingerprint(self.features)

    @property
    def identity(self) -> tuple:
        """What makes two CPUs the same variant: model, stepping and feature set. Microcode
        is left out: it is a revision of the same silicon, reported on its own."""
        return (self.arch, self.vendor, self.model_name, self.family, self.model,
                self.stepping, self.implementer, self.part, self.variant, self.revision,
                frozenset(self.features))


@dataclass(frozen=True, slots=True)
class CpuInfo:
    model: CpuModel  # the first CPU listed
    cpus: int  # processors listed (online CPUs)
    # Each distinct variant with its number of CPUs, in order of first appearance.
    variants: tuple[tuple[CpuModel, int], ...] = field(default=())

    @property
    def mixed(self) -> bool:
        """True when CPUs differ in model, stepping or feature set."""
        return len(self.variants) > 1

    @property
    def features(self) -> frozenset[str]:
        return frozenset(self.model.features)


def _blocks(text: str, what: str) -> list[list[tuple[str, str]]]:
    blocks: list[list[tuple[str, str]]] = []
    current: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = []
            continue
        key, colon, value = line.partition(":")
        if not colon:
            raise ParseError(f"{what}: line without ':' {line[:60]!r}")
        key = key.strip()
        if not key:
            raise ParseError(f"{what}: empty key in {line[:60]!r}")
        current.append((key, value.strip()))
    if current:
        blocks.append(current)
    return blocks


def _model(fields: dict[str, str]) -> CpuModel:
    if "vendor_id" in fields or "flags" in fields:
        return CpuModel(
            arch="x86_64",
            vendor=fields.get("vendor_id", ""),
            model_name=fields.get("model name", ""),
            family=fields.get("cpu family", ""),
            model=fields.get("model", ""),
            stepping=fields.get("stepping", ""),
            microcode=fields.get("microcode", ""),
            features=tuple(fields.get("flags", "").split()),
        )
    if "CPU implementer" in fields or "Features" in fields:
        implementer = fields.get("CPU implementer", "").lower()
        part = fields.get("CPU part", "").lower()
        vendor = ARM_IMPLEMENTERS.get(implementer, f"implementer {implementer}".strip())
        name = ARM_PARTS.get((implementer, part))
        model_name = f"{vendor} {name}" if name else f"{vendor} part {part}".strip()
        return CpuModel(
            arch="aarch64",
            vendor=vendor,
            model_name=model_name,
            implementer=implementer,
            part=part,
            variant=fields.get("CPU variant", "").lower(),
            revision=fields.get("CPU revision", ""),
            architecture=fields.get("CPU architecture", ""),
            features=tuple(fields.get("Features", "").split()),
        )
    return CpuModel(arch="unknown", model_name=fields.get("model name", fields.get("cpu", "")))


def parse_cpuinfo(text: str, what: str = "/proc/cpuinfo") -> CpuInfo:
    """Parse /proc/cpuinfo into the first CPU's model and the node's CPU variants.

    >>> info = parse_cpuinfo("processor\\t: 0\\nFeatures\\t: fp asimd atomics\\n"
    ...                      "CPU implementer\\t: 0x48\\nCPU architecture: 8\\n"
    ...                      "CPU variant\\t: 0x1\\nCPU part\\t: 0xd01\\nCPU revision\\t: 0\\n")
    >>> info.model.model_name, info.cpus, info.mixed
    ('HiSilicon Kunpeng 920', 1, False)
    """
    if "\x00" in text:
        raise ParseError(f"{what}: NUL bytes (not a text file)")
    cpus: list[dict[str, str]] = []
    shared: dict[str, str] = {}  # fields outside per-CPU blocks (old arm64 layout)
    for block in _blocks(text, what):
        processors = [value for key, value in block if key == "processor"]
        fields = {key: value for key, value in block if key != "processor"}
        for number in processors:
            if not (number.isdigit() and number.isascii()):
                raise ParseError(f"{what}: bad processor number {number[:20]!r}")
        if len(processors) == 1:
            cpus.append(fields)
        else:
            # No processor line: a header or trailer block; several: the old arm64 layout
            # where one block lists every CPU and the fields they share.
            shared.update(fields)
            cpus.extend({} for _ in processors)
        if len(cpus) > MAX_PROCESSORS:
            raise ParseError(f"{what}: more than {MAX_PROCESSORS} processors")
    if not cpus:
        raise ParseError(f"{what}: no processor entries (truncated or not /proc/cpuinfo)")
    variants: dict[tuple, list] = {}
    first: CpuModel | None = None
    for fields in cpus:
        model = _model({**shared, **fields})
        first = first or model
        entry = variants.setdefault(model.identity, [model, 0])
        entry[1] += 1
    assert first is not None
    return CpuInfo(first, len(cpus), tuple((model, count) for model, count in variants.values()))
