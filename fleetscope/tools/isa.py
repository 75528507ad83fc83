"""`fleetscope isa check BINARY [--features-from CPUINFO] [--json]`: which instruction-set
extensions an ELF binary needs, which it only uses behind runtime CPU dispatch, and which of
them a CPU lacks (the `isa-mismatch` evidence).

    $ fleetscope isa check /usr/lib/x86_64-linux-gnu/libm.so.6
    extension  cpuinfo flags  needed  dispatched  first use                          this CPU
    FMA4       fma4                -         507  0x31c70 vfmaddsd ... (IFUNC target)  absent
    ...
    No extension the binary needs is missing on this CPU (FMA4 is used only behind ...).

x86-64 is decoded with iced-x86, which knows the CPUID feature of every instruction
(`Instruction.cpuid_features()`), function by function (.eh_frame and symbols), and code
that runs only behind runtime dispatch is told apart (fleetscope/tools/isa_x86.py: IFUNC resolvers
and targets, branches on CPUID results or the capability words glibc, libgcc and OpenSSL keep,
glibc-hwcaps variants). "needed" is everything else plus the GNU property note
GNU_PROPERTY_X86_ISA_1_NEEDED (GCC >= 11 `-mneeded`; glibc >= 2.33 refuses to load a binary
above the CPU's level); only "needed" decides the exit code. AArch64 is swept with capstone and
all of it counts as needed.

A missing needed extension is a risk a static look can still get wrong; the faulting
instruction of a SIGILL (fleetscope/tools/isa_fault.py, from the kernel's trap line) is the proof.

Exit codes: 0 no needed extension missing, 1 a needed extension missing on that CPU (or the
binary is for another architecture), 2 usage error, 3 unreadable input or not an ELF file.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import stat
import sys
from dataclasses import dataclass, field

from fleetscope.collectors.cpu_features import CPUINFO
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers.cpuinfo import (
    CpuInfo,
    parse_cpuinfo,
    psabi_level,
    psabi_level_name,
)
from fleetscope.collectors.shared import process_dir, process_file
from fleetscope.tools.isa_extensions import (  # noqa: F401  (callers and tests read them here)
    EXTENSION_TABLE,
    EXTENSIONS,
    Extension,
    InputError,
    classify_a64,
    extension_of,
    load_capstone,
)

EXIT_OK, EXIT_MISSING, EXIT_USAGE, EXIT_INPUT = 0, 1, 2, 3
JSON_FORMAT = "fleetscope-isa-check/1"
DEFAULT_CPUINFO = "/" + CPUINFO

# GNU property note (binutils/glibc elf.h): x86 ISA level bits in GNU_PROPERTY_X86_ISA_1_NEEDED.
GNU_PROPERTY_X86_ISA_1_NEEDED = 0xC0008002
ISA_1_LEVEL_BITS = ((1 << 0, 1), (1 << 1, 2), (1 << 2, 3), (1 << 3, 4))  # baseline, v2, v3, v4
SHF_EXECINSTR = 0x4
PF_X = 0x1


# ---------------------------------------------------------------------------------------
# Scanning an ELF file
# ---------------------------------------------------------------------------------------

@dataclass
class Use:
    count: int
    address: int
    text: str
    where: str  # section, and function when the symbol table or .eh_frame has one
    reason: str = ""  # dispatched code: what makes it run only on CPUs that have it


@dataclass
class BinaryScan:
    path: str
    arch: str  # "x86_64" or "aarch64"
    sections: list[str] = field(default_factory=list)
    instructions: int = 0
    undecoded_bytes: int = 0
    uses: dict[str, Use] = field(default_factory=dict)  # needed: runs unconditionally
    dispatched: dict[str, Use] = field(default_factory=dict)  # only behind CPU dispatch
    isa_level_needed: int | None = None  # from GNU_PROPERTY_X86_ISA_1_NEEDED
    functions: int = 0
    bytes_outside_functions: int = 0  # executable bytes in no known function: not decoded
    hwcaps_level: int = 0  # installed as a glibc-hwcaps x86-64-vN variant
    decoder: str = ""

    def add(self, extensions: tuple[str, ...], address: int, text: str, where) -> None:
        for name in extensions:
            use = self.uses.get(name)
            if use is None:
                self.uses[name] = Use(1, address, text, where(address))
            else:
                use.count += 1

    @property
    def isa_level_used(self) -> int | None:
        """The x86-64 psABI level the needed instructions imply (1 when none above baseline)."""
        if self.arch != "x86_64":
            return None
        levels = [extension_of("x86_64", name).level for name in self.uses]
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


def _elf_file():
    try:
        from elftools.elf.elffile import ELFFile
    except ImportError:
        raise InputError("pyelftools is not installed: pip install 'fleetscope[isa]'") from None
    return ELFFile


def _iced_available() -> None:
    try:
        import iced_x86  # noqa: F401
    except ImportError:
        raise InputError("iced-x86 is not installed (x86 decoding): "
                         "pip install 'fleetscope[isa]'") from None


WINDOW = 1 << 16  # bytes handed to capstone at a time


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
            found = classify_a64(mnemonic, op_str)
            if found:
                scan.add(found, address, f"{mnemonic} {op_str}".strip(), where)


def _sweep_x86(scan: BinaryScan, code: bytes, base: int, where) -> None:
    """A linear sweep of raw x86-64 code (no ELF around it to find functions in)."""
    import iced_x86 as iced

    from fleetscope.tools.isa_x86 import _Features, sweep

    features = _Features(iced)
    formatter = iced.Formatter(iced.FormatterSyntax.INTEL)
    for ins in sweep(iced, code, base):
        if ins.code == iced.Code.INVALID:
            scan.undecoded_bytes += 1
            continue
        scan.instructions += 1
        found = features.of(ins)
        if found:
            scan.add(found, ins.ip, formatter.format(ins), where)


def scan_code(arch: str, code: bytes, base: int = 0, path: str = "<code>") -> BinaryScan:
    """Classify raw machine code ("x86_64" or "aarch64") as if it were one section; all of
    it counts as needed."""
    scan = BinaryScan(path, arch, [".text"])
    if arch == "x86_64":
        _iced_available()
        scan.decoder = "iced-x86"
        _sweep_x86(scan, code, base, lambda at: ".text")
    else:
        scan.decoder = "capstone"
        _sweep_a64(load_capstone(), scan, code, base, lambda at: ".text")
    return scan


_HWCAPS = re.compile(r"/glibc-hwcaps/x86-64-v([234])/")


def hwcaps_level(path: str) -> int:
    """N when the file is installed as a glibc-hwcaps x86-64-vN variant: the dynamic loader
    picks it only on CPUs of that level (glibc >= 2.33), so up to vN is dispatched."""
    match = _HWCAPS.search(os.path.realpath(path))
    return int(match.group(1)) if match else 0


def scan_binary(path: str) -> BinaryScan:
    """Decode the executable code of an ELF file and sort the extensions it uses into needed
    and dispatched."""
    elf_file = _elf_file()
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
            if not regions:
                raise InputError(f"{path}: no executable code (no executable section or "
                                 "segment)")
            scan.sections = [name for name, _, _, _ in regions]
            if arch == "x86_64":
                _iced_available()
                scan.isa_level_needed = _gnu_isa_needed(elf)
                _scan_x86(scan, elf, path, regions)
            else:
                capstone = load_capstone()
                symbols = _Symbols(elf)
                scan.decoder = "capstone"
                for name, index, address, code in regions:
                    def where(at: int, name=name, index=index) -> str:
                        function = symbols.name(index, at) if index >= 0 else ""
                        return f"{name} {function}".strip() if function else name

                    _sweep_a64(capstone, scan, code, address, where)
        except InputError:
            raise
        except ELFError as err:
            raise InputError(f"{path}: not an ELF file ({err})") from None
        except Exception as err:  # pyelftools raises many exception types on corrupt files
            raise InputError(f"{path}: corrupt ELF file ({type(err).__name__}: {err})") from None
    return scan


def _scan_x86(scan: BinaryScan, elf, path: str, regions) -> None:
    from fleetscope.tools.isa_x86 import Image, analyse

    scan.hwcaps_level = hwcaps_level(path)
    result = analyse(Image(elf, path, regions), scan.hwcaps_level)
    scan.decoder = "iced-x86"
    scan.instructions = result.instructions
    scan.undecoded_bytes = result.undecoded_bytes
    scan.functions = result.functions
    scan.bytes_outside_functions = result.skipped_bytes
    for target, source in ((scan.uses, result.needed), (scan.dispatched, result.dispatched)):
        for name, use in source.items():
            target[name] = Use(use.count, use.address, result.texts.get(use.address, ""),
                               use.where, use.reason)


# ---------------------------------------------------------------------------------------
# Checking against a CPU
# ---------------------------------------------------------------------------------------


@dataclass
class CheckResult:
    scan: BinaryScan
    cpu: CpuInfo
    cpu_source: str
    arch_mismatch: bool
    status: dict[str, str]  # needed extension -> "present", "missing" or "unknown"
    level_missing: bool  # the GNU property note needs a higher x86-64 level than the CPU has
    dispatched_status: dict[str, str] = field(default_factory=dict)  # dispatched only

    @property
    def cpu_level(self) -> int | None:
        return psabi_level(self.cpu.features) if self.cpu.model.arch == "x86_64" else None

    @property
    def missing(self) -> list[str]:
        """Needed extensions the CPU lacks: these decide the exit code."""
        return [name for name, state in self.status.items() if state == "missing"]

    @property
    def dispatched_missing(self) -> list[str]:
        return [name for name, state in self.dispatched_status.items() if state == "missing"]

    @property
    def exit_code(self) -> int:
        return EXIT_MISSING if self.arch_mismatch or self.missing or self.level_missing \
            else EXIT_OK


def _state(extension: Extension, flags, mismatch: bool) -> str:
    if mismatch:
        return "missing"
    if all(flag in flags for flag in extension.flags):
        return "present"
    return "unknown" if extension.hidden else "missing"


def check(scan: BinaryScan, cpu: CpuInfo, cpu_source: str = "") -> CheckResult:
    """Compare the extensions a binary uses with a CPU's /proc/cpuinfo flags."""
    flags = cpu.features
    mismatch = cpu.model.arch != scan.arch
    status = {name: _state(extension_of(scan.arch, name), flags, mismatch)
              for name in _ordered(scan.arch, scan.uses)}
    dispatched = {name: _state(extension_of(scan.arch, name), flags, mismatch)
                  for name in _ordered(scan.arch, scan.dispatched) if name not in status}
    level_missing = False
    if scan.isa_level_needed and not mismatch and cpu.model.arch == "x86_64":
        level_missing = scan.isa_level_needed > psabi_level(flags)
    return CheckResult(scan, cpu, cpu_source, mismatch, status, level_missing, dispatched)


def _ordered(arch: str, names) -> list[str]:
    order = {e.name: i for i, e in enumerate(EXTENSION_TABLE) if e.arch == arch}
    return sorted(names, key=lambda name: (order.get(name, len(order)), name))


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


def _use_json(use: Use | None) -> dict | None:
    if use is None:
        return None
    out = {"address": f"{use.address:#x}", "instruction": use.text, "where": use.where}
    if use.reason:
        out["dispatch"] = use.reason
    return out


def to_json(result: CheckResult) -> dict:
    scan = result.scan
    extensions = []
    rows = [(name, state, "needed") for name, state in result.status.items()] + [
        (name, state, "dispatched") for name, state in result.dispatched_status.items()]
    for name, state, kind in rows:
        extension = extension_of(scan.arch, name)
        needed, dispatched = scan.uses.get(name), scan.dispatched.get(name)
        first = needed or dispatched
        extensions.append({
            "name": name,
            "use": kind,
            "cpuinfo_flags": list(extension.flags),
            "instructions": (needed.count if needed else 0)
            + (dispatched.count if dispatched else 0),
            "needed_instructions": needed.count if needed else 0,
            "dispatched_instructions": dispatched.count if dispatched else 0,
            "first_use": _use_json(first),
            "first_dispatched_use": _use_json(dispatched),
            "on_cpu": state,
            "psabi_level": psabi_level_name(extension.level) if extension.level else None,
            "note": extension.note or None,
        })
    needed_level = scan.isa_level_needed
    return {
        "format": JSON_FORMAT,
        "binary": {
            "path": scan.path,
            "arch": scan.arch,
            "sections": scan.sections,
            "decoder": scan.decoder,
            "instructions": scan.instructions,
            "undecoded_bytes": scan.undecoded_bytes,
            "functions": scan.functions,
            "bytes_outside_functions": scan.bytes_outside_functions,
            "glibc_hwcaps": psabi_level_name(scan.hwcaps_level) if scan.hwcaps_level else None,
            "isa_level_needed": psabi_level_name(needed_level) if needed_level else None,
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
        "dispatched": list(result.dispatched_status) + [
            name for name in result.status if name in scan.dispatched],
        "dispatched_missing": result.dispatched_missing,
    }


_VERDICT = {"present": "ok", "missing": "ABSENT",
            "unknown": "unknown (flag not shown in /proc/cpuinfo)"}


def to_table(result: CheckResult) -> str:
    scan = result.scan
    out = [
        f"binary: {scan.path} ({scan.arch}; {', '.join(scan.sections)}; "
        f"{scan.instructions} instructions decoded by {scan.decoder}"
        + (f" in {scan.functions} functions" if scan.functions else "")
        + f", {scan.undecoded_bytes} bytes not decodable"
        + (f", {scan.bytes_outside_functions} bytes outside functions"
           if scan.bytes_outside_functions else "") + ")",
        f"cpu:    {_cpu_line(result.cpu)} from {result.cpu_source}"
        + (f", {psabi_level_name(result.cpu_level)}" if result.cpu_level else ""),
    ]
    if scan.arch == "x86_64":
        needed = scan.isa_level_needed
        out.append(f"x86 ISA level: needed by the GNU property note: "
                   f"{psabi_level_name(needed) if needed else 'not recorded'}; "
                   f"used unconditionally by the code: "
                   f"{psabi_level_name(scan.isa_level_used or 1)}"
                   + (f"; installed as a glibc-hwcaps {psabi_level_name(scan.hwcaps_level)} "
                      "variant" if scan.hwcaps_level else ""))
    out.append("")
    if result.arch_mismatch:
        out.append(f"The binary is for {scan.arch}, the CPU is {result.cpu.model.arch}: "
                   "it cannot run there.")
    rows_in = [(name, state, "needed") for name, state in result.status.items()] + [
        (name, state, "dispatched") for name, state in result.dispatched_status.items()]
    if not rows_in:
        out.append("No instruction-set extension beyond the architecture's baseline is used.")
    else:
        rows = [("extension", "cpuinfo flags", "needed", "dispatched", "first use",
                 "this CPU")]
        reasons: list[str] = []
        for name, state, kind in rows_in:
            extension = extension_of(scan.arch, name)
            needed, dispatched = scan.uses.get(name), scan.dispatched.get(name)
            use = needed or dispatched
            first = f"{use.address:#x} {use.text}"
            if len(first) > 44:
                first = first[:41] + "..."
            first += f" ({use.where})"
            if kind == "dispatched" and use.reason:
                reasons.append(f"  {name}: {use.reason}")
            label = _VERDICT[state]
            if kind == "dispatched" and state == "missing":
                label = "absent: skipped at run time"
            if extension.note and state != "present":
                label += f"; {extension.note}"
            rows.append((name, " ".join(extension.flags), str(needed.count) if needed else "-",
                         str(dispatched.count) if dispatched else "-", first, label))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        for row in rows:
            out.append("  ".join(
                [row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2].rjust(widths[2]),
                 row[3].rjust(widths[3]), row[4].ljust(widths[4]), row[5]]).rstrip())
        if reasons:
            out += ["", "Dispatched only (why the CPU never runs it without the extension):",
                    *reasons]
    out.append("")
    missing = result.missing
    if result.level_missing:
        out.append(f"The binary's GNU property note needs "
                   f"{psabi_level_name(scan.isa_level_needed or 0)}; this CPU is "
                   f"{psabi_level_name(result.cpu_level or 0)}: glibc will refuse to load it "
                   "(\"CPU ISA level is lower than required\").")
    if missing:
        flags = ", ".join(f"{name} ({' '.join(extension_of(scan.arch, name).flags)})"
                          for name in missing)
        out.append(f"{len(missing)} extension(s) the binary needs are missing on this CPU: "
                   f"{flags}.")
    elif not result.arch_mismatch and not result.level_missing:
        out.append("No extension the binary needs is missing on this CPU.")
    skipped = result.dispatched_missing
    if skipped and not result.arch_mismatch:
        out.append(f"Used only behind runtime CPU dispatch, absent here and skipped at run "
                   f"time: {', '.join(skipped)}.")
    if scan.arch == "aarch64" and result.status:
        out.append("AArch64 code is not split by dispatch: every use counts as needed.")
    if missing:
        out.append("A static look can mistake dispatched code for needed code; the faulting "
                   "instruction in the kernel's SIGILL line is the proof.")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------
# Command
# ---------------------------------------------------------------------------------------

def offset(text: str) -> int:
    """A file offset in hex, as the kernel prints it (`1134` or `0x1134`)."""
    value = int(text.strip(), 16)
    if value < 0:
        raise ValueError(text)
    return value


def build_isa_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetscope isa check",
        description="List the instruction-set extensions an ELF binary needs and those it "
        "uses only behind runtime CPU dispatch, and report those a CPU lacks (exit 1 when a "
        "needed one is missing).",
    )
    parser.add_argument("binary", metavar="BINARY", help="ELF executable or shared library")
    parser.add_argument(
        "--features-from",
        metavar="CPUINFO",
        default=DEFAULT_CPUINFO,
        help="the CPU to check against, as a /proc/cpuinfo file (default: this machine's)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--at", metavar="OFFSET", type=offset,
        help="decode only the instruction at this file offset, in hex (the first number in "
        "the brackets of a kernel trap line: `in agent[1134,...]`) and check its extension",
    )
    return parser


def _check_at(path: str, offset: int, cpu: CpuInfo, as_json: bool) -> int:
    """`isa check BINARY --at OFFSET`: the one instruction a SIGILL line points at."""
    from fleetscope.collectors.parsers.kmsg import SigillCrash
    from fleetscope.tools.isa_fault import in_binary

    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    crash = SigillCrash("", "", 0, os.path.basename(path), "", "", None, "", offset)
    fault = in_binary(path, crash)
    if fault is None:
        raise InputError(f"{path}: offset {offset:#x} is not in a loaded segment of an x86-64 "
                         "or AArch64 ELF file")
    states = {name: _state(extension_of(fault.arch, name), cpu.features,
                           cpu.model.arch != fault.arch) for name in fault.extensions}
    if as_json:
        sys.stdout.write(json.dumps({**fault.to_json(), "on_cpu": states}, indent=2) + "\n")
    else:
        needs = ", ".join(f"{name} ({_VERDICT[state]} on this CPU)"
                          for name, state in states.items()) or "no extension"
        address = f" (address {fault.address:#x})" if fault.address is not None else ""
        sys.stdout.write(f"{path} at file offset {offset:#x}{address}: "
                         f"{fault.text or '(not a valid instruction)'}: {needs}"
                         + (f"; {fault.note}" if fault.note else "") + "\n")
    return EXIT_MISSING if "missing" in states.values() else EXIT_OK


def run_isa_check(argv: list[str]) -> int:
    """`fleetscope isa check`: 0 nothing needed missing, 1 missing, 2 usage, 3 input error."""
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
        if args.at is not None:
            return _check_at(args.binary, args.at, cpu, args.json)
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


MAX_PROCESSES_SEARCHED = 20_000  # a node's process table, bounded
MAX_CMDLINE_BYTES = 65_536
# Larger than any binary or library a node runs (a statically linked inference server is a few
# hundred MiB): a bigger file named by a crash is not read, however it got there.
MAX_BINARY_BYTES = 1 << 30


def _usable(path: str, owners: set[int] | None) -> bool:
    """A file worth reading for a crash: regular (never a FIFO or device, whose open can
    block), at most MAX_BINARY_BYTES, and owned by one of `owners` (root or the user of the
    process that led to it: any local user can name a file on a command line) unless the
    operator's config named its directory (`owners` None)."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size <= MAX_BINARY_BYTES and (
        owners is None or info.st_uid in owners)


def locate_binary(name: str, root: str = "/", directories: tuple[str, ...] = ()) -> str | None:
    """The file a SIGILL line names (`in libagentcore.so[...]`: a base name only): in the
    config's `directories`, on PATH, in the usual library directories under `root`, and, on
    the live node, where it runs things (most agent binaries run from their own directory,
    /opt/<app>/bin): a live process's executable of that name, a path of that name on a
    process's command line (the supervisor restarting it), a file of that name beside a
    running executable. Only regular files of a bounded size, owned by root or by the
    user whose process led to them (see _usable), and of a command line only executables."""
    import shutil

    if not name or "/" in name or "\0" in name:
        return None
    live = root in ("", "/")
    ours = {0, os.geteuid()}
    for directory in directories:
        candidate = os.path.join(root, directory.lstrip("/"), name)
        if _usable(candidate, None):
            return candidate
    if live:
        found = shutil.which(name)
        if found and _usable(found, ours):
            return found
    for directory in LIBRARY_DIRS:
        candidate = os.path.join(root, directory.lstrip("/"), name)
        if _usable(candidate, ours):
            return candidate
    return _where_it_runs(name) if live else None


def _where_it_runs(name: str) -> str | None:
    """`name` as the node's live processes run it (see locate_binary)."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()][:MAX_PROCESSES_SEARCHED]
    except OSError:
        return None
    beside: dict[str, set[int]] = {}
    for pid in pids:
        try:
            owners = {0, os.stat("/" + process_dir(pid)).st_uid}
        except OSError:
            continue
        try:
            exe = os.readlink("/" + process_file(pid, "exe")).removesuffix(" (deleted)")
        except OSError:
            exe = ""
        if exe.startswith("/"):
            if os.path.basename(exe) == name and _usable(exe, owners):
                return exe
            beside.setdefault(os.path.join(os.path.dirname(exe), name), set()).update(owners)
        try:
            with open("/" + process_file(pid, "cmdline"), "rb") as handle:
                argv = handle.read(MAX_CMDLINE_BYTES).split(b"\0")
        except OSError:
            continue
        for raw in argv:
            arg = raw.decode("utf-8", "replace")
            # a program a supervisor restarts is executable; any other file a user names
            # on a command line is not the node's binary
            if arg.startswith("/") and os.path.basename(arg) == name and \
                    _usable(arg, owners) and os.access(arg, os.X_OK):
                return arg
    for candidate, owners in beside.items():
        if _usable(candidate, owners):
            return candidate
    return None


def check_against_cpuinfo(path: str, cpuinfo_text: str, cpu_source: str = "") -> dict:
    """`isa check` as data (the JSON document): what `path` needs that this CPU lacks.
    Raises InputError for an unreadable or non-ELF file, ParseError for bad cpuinfo."""
    return to_json(check(scan_binary(path), parse_cpuinfo(cpuinfo_text), cpu_source))
