"""The instruction a SIGILL faulted on, from the kernel's trap line (collectors/parsers/kmsg.py):

    traps: fs_isa_probe[4242] trap invalid opcode ip:563a66a30134 sp:7ffc... error:0
        in fs_isa_probe[1134,563a66a30000+1000]                      (one line in the log)

- x86, 6.x kernels: 0x1134 is the file offset of the faulting instruction: decoded in the
  binary there ("kernel offset", the surest).
- x86, older kernels (`in libc.so.6[7fa7c7c26000+178000]`): ip minus the mapping's start is
  the offset inside the mapped executable segment, whose file offset the ELF program headers
  give ("ip minus mapping base").
- arm64 up to 4.18: the faulting word itself, `Code: ... (56ade825)` ("Code: word").
- with none of these, or without the binary: the whole-binary `isa check` ("whole-binary
  scan"), which names what the file needs but not what faulted: lower confidence.

`bundle record` keeps the bytes around each faulting offset (`capture()`, 48 bytes, not the
binary), so a bundle diagnosed elsewhere still decodes the instruction (`from_capture()`).
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, field

from fleetscope.collectors.parsers.kmsg import SigillCrash

BEFORE, AFTER = 16, 32  # bytes kept around a faulting offset (x86 instructions are <= 15)
PAGE = 0x1000
PF_X = 0x1
CONFIDENCE = {"kernel offset": 0.95, "ip minus mapping base": 0.85, "Code: word": 0.9,
              "whole-binary scan": 0.5}

# Instructions that fault on every CPU: the program trapped on purpose (or ran into data).
_ALWAYS_UNDEFINED = ("ud0", "ud1", "ud2", "udf", ".byte", "(bad)")


@dataclass
class FaultingInstruction:
    binary: str
    arch: str  # "x86_64" or "aarch64"
    text: str  # "vaddph zmm0,zmm1,[40C0h]"; "" when the bytes do not decode
    extensions: list[str]
    source: str  # key of CONFIDENCE: where the verdict came from
    file_offset: int | None = None
    address: int | None = None  # virtual address in the ELF file
    bytes_hex: str = ""
    note: str = ""
    pids: list[int] = field(default_factory=list)

    @property
    def confidence(self) -> float:
        if self.source.startswith("recorded bytes ("):  # as sure as where the offset came from
            return CONFIDENCE.get(self.source[16:-1], 0.9)
        return CONFIDENCE.get(self.source, 0.5)

    @property
    def mnemonic(self) -> str:
        return self.text.split(" ", 1)[0] if self.text else ""

    def to_json(self) -> dict:
        out = asdict(self)
        out["confidence"] = self.confidence
        out["mnemonic"] = self.mnemonic
        return out


def decode(arch: str, code: bytes, address: int = 0) -> tuple[str, list[str], str]:
    """(text, extensions, note) of the instruction at the start of `code`."""
    if arch == "x86_64":
        from fleetscope.tools.isa_x86 import decode_one

        found = decode_one(code, address)
        if found is None:
            return "", [], "the bytes are not a valid x86-64 instruction (data, or a bad jump)"
        text, extensions, _ = found
    else:
        text, extensions = _decode_a64(code[:4], address)
        if not text:
            return "", [], "the word is not an instruction any AArch64 CPU defines"
    note = ""
    if text.split(" ", 1)[0] in _ALWAYS_UNDEFINED:
        note = "undefined on every CPU: a deliberate trap (__builtin_trap, abort) or a jump " \
               "into data, not a missing extension"
    elif not extensions:
        note = "baseline instruction: every CPU of the architecture has it"
    return text, list(extensions), note


def _decode_a64(word: bytes, address: int) -> tuple[str, tuple[str, ...]]:
    from fleetscope.tools.isa_extensions import classify_a64, load_capstone

    capstone = load_capstone()
    arch = getattr(capstone, "CS_ARCH_ARM64", None) or capstone.CS_ARCH_AARCH64
    md = capstone.Cs(arch, capstone.CS_MODE_ARM)
    for _, _, mnemonic, op_str in md.disasm_lite(word, address):
        return f"{mnemonic} {op_str}".strip(), classify_a64(mnemonic, op_str)
    return "", ()


def from_code_word(crash: SigillCrash) -> FaultingInstruction | None:
    """arm64 <= 4.18: the word in brackets on the `Code:` line after the trap line."""
    if not crash.code_word:
        return None
    word = int(crash.code_word, 16)
    raw = struct.pack("<I", word)
    address = int(crash.ip, 16) if crash.ip else 0
    text, extensions, note = decode("aarch64", raw, address)
    return FaultingInstruction(crash.binary, "aarch64", text, extensions, "Code: word",
                               None, address or None, raw.hex(), note)


# ---------------------------------------------------------------------------------------
# In the binary
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Segment:
    vaddr: int
    offset: int
    filesz: int
    flags: int


def _elf(path: str):
    """(arch, PT_LOAD segments) of an ELF file, or None when it is not one we decode."""
    try:
        from elftools.elf.elffile import ELFFile
    except ImportError:
        return None
    try:
        with open(path, "rb") as stream:
            elf = ELFFile(stream)
            arch = {"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64"}.get(elf.header.e_machine)
            segments = [_Segment(s.header.p_vaddr, s.header.p_offset, s.header.p_filesz,
                                 s.header.p_flags)
                        for s in elf.iter_segments() if s.header.p_type == "PT_LOAD"]
    except Exception:  # unreadable, not ELF, corrupt: no verdict from this file
        return None
    return (arch, segments) if arch else None


def file_offset(crash: SigillCrash, segments: list[_Segment]) -> tuple[int, str] | None:
    """The faulting instruction's file offset and where it came from."""
    if crash.offset is not None:
        return crash.offset, "kernel offset"
    delta = crash.mapping_delta
    if delta is None:
        return None
    executable = [s for s in segments if s.flags & PF_X]
    # The mapping the kernel named starts at the segment's page-aligned file offset; with
    # several executable segments the one whose mapping size matches is it.
    for segment in sorted(executable, key=lambda s: crash.map_size != _mapped_size(s)):
        offset = (segment.offset & ~(PAGE - 1)) + delta
        if segment.offset <= offset < segment.offset + segment.filesz:
            return offset, "ip minus mapping base"
    return None


def _mapped_size(segment: _Segment) -> int:
    start = segment.offset & ~(PAGE - 1)
    return (segment.offset + segment.filesz - start + PAGE - 1) & ~(PAGE - 1)


def _vaddr(offset: int, segments: list[_Segment]) -> int | None:
    for segment in segments:
        if segment.offset <= offset < segment.offset + segment.filesz:
            return segment.vaddr + offset - segment.offset
    return None


def capture(path: str, crash: SigillCrash) -> dict | None:
    """The bytes around the faulting instruction, for a bundle: enough to decode it on a
    machine without the binary."""
    found = _elf(path)
    if found is None:
        return None
    arch, segments = found
    where = file_offset(crash, segments)
    if where is None:
        return None
    offset, source = where
    start = max(0, offset - BEFORE)
    try:
        with open(path, "rb") as stream:
            stream.seek(start)
            data = stream.read(offset - start + AFTER)
    except OSError:
        return None
    if len(data) <= offset - start:
        return None
    return {"binary": crash.binary, "path": path, "arch": arch, "file_offset": offset,
            "offset_source": source, "mapping_delta": crash.mapping_delta,
            "address": _vaddr(offset, segments), "bytes_start": start, "bytes": data.hex()}


def in_binary(path: str, crash: SigillCrash) -> FaultingInstruction | None:
    """Decode the faulting instruction in the binary itself."""
    captured = capture(path, crash)
    return from_capture(captured) if captured else None


def from_capture(entry: dict) -> FaultingInstruction | None:
    """Decode what `capture()` kept (a bundle's static/cmd/sigill-faults.json entry)."""
    try:
        data = bytes.fromhex(entry["bytes"])
        at = int(entry["file_offset"]) - int(entry["bytes_start"])
        arch = str(entry["arch"])
    except (KeyError, TypeError, ValueError):
        return None
    if not 0 <= at < len(data) or arch not in ("x86_64", "aarch64"):
        return None
    address = entry.get("address")
    address = int(address) if isinstance(address, int) else 0
    text, extensions, note = decode(arch, data[at:], address)
    size = 4 if arch == "aarch64" else 15
    source = str(entry.get("offset_source") or "kernel offset")
    return FaultingInstruction(str(entry.get("binary", "")), arch, text, extensions, source,
                               int(entry["file_offset"]), address or None,
                               data[at:at + size].hex(), note)


def matches(entry: dict, crash: SigillCrash) -> bool:
    """Whether a captured entry is the fault of this crash (same file and place)."""
    if entry.get("binary") != crash.binary:
        return False
    if crash.offset is not None:
        return entry.get("file_offset") == crash.offset
    delta = crash.mapping_delta
    return delta is not None and entry.get("mapping_delta") == delta


# ---------------------------------------------------------------------------------------
# Per binary, for a diagnosis
# ---------------------------------------------------------------------------------------

@dataclass
class CrashedBinary:
    binary: str
    crashes: int
    pids: list[int]
    last_time: float | None  # Unix seconds of the latest crash, None without a timestamp
    recent: bool  # within the look-back before the diagnosis
    fault: FaultingInstruction | None
    on_cpu: dict[str, str]  # extension of the faulting instruction -> present/missing/unknown
    scan_missing: list[str] = field(default_factory=list)  # whole-binary scan, last resort


def crashed_binaries(crashes, boot: float | None, now: float, lookback: float, *,
                     captures: list[dict] = (), locate=None, read=capture,
                     cpu_flags=frozenset(), cpu_arch: str = "",
                     limit: int = 10) -> list[CrashedBinary]:
    """Group SIGILL crashes by binary (latest first) and name each one's faulting
    instruction: from bytes a bundle recorded, from the binary when `locate(name)` finds it
    (`read(path, crash)`: capture(), or the same under a time budget), from an arm64
    `Code:` word."""
    from fleetscope.collectors.parsers.kmsg import wall_clock
    from fleetscope.tools.isa_extensions import extension_of

    groups: dict[str, list] = {}
    for crash in crashes:
        groups.setdefault(crash.binary, []).append(crash)

    def latest(items):
        times = [t for t in (wall_clock(c, boot) for c in items) if t is not None]
        return max(times) if times else None

    order = sorted(groups, key=lambda b: (latest(groups[b]) or 0.0, len(groups[b])),
                   reverse=True)
    out = []
    for binary in order[:limit]:
        items = groups[binary]
        when = latest(items)
        fault = None
        for crash in reversed(items):  # the latest crash with something to decode
            fault = _fault(crash, captures, locate, read)
            if fault is not None:
                break
        pids = list(dict.fromkeys(c.pid for c in reversed(items)))
        if fault is not None:
            fault.pids = pids[:10]
        arch = fault.arch if fault else ""
        on_cpu = {}
        if fault is not None and cpu_arch:
            for name in fault.extensions:
                extension = extension_of(arch, name)
                if cpu_arch != arch:
                    on_cpu[name] = "missing"
                elif all(flag in cpu_flags for flag in extension.flags):
                    on_cpu[name] = "present"
                else:
                    on_cpu[name] = "unknown" if extension.hidden else "missing"
        out.append(CrashedBinary(binary, len(items), pids, when,
                                 when is not None and when >= now - lookback, fault, on_cpu))
    return out


def _fault(crash: SigillCrash, captures, locate, read) -> FaultingInstruction | None:
    for entry in captures:
        if isinstance(entry, dict) and matches(entry, crash):
            found = from_capture(entry)
            if found is not None:
                found.source = "recorded bytes (" + str(entry.get("offset_source")) + ")"
                return found
    if locate is not None and (crash.offset is not None or crash.mapping_delta is not None):
        path = locate(crash.binary)
        captured = read(path, crash) if path else None
        found = from_capture(captured) if captured else None
        if found is not None:
            return found
    return from_code_word(crash)
