"""x86-64 machine code of an ELF file for `fleetscope isa check`: the CPUID feature of every
instruction (iced-x86's `Instruction.cpuid_features()`), and which code runs only behind
runtime CPU dispatch, as far as a static look can tell:

    IFUNC resolvers (STT_GNU_IFUNC symbols, R_X86_64_IRELATIVE) and the functions whose
      address they load (`lea rax, [rip+__memmove_avx512_unaligned_erms]`);
    blocks reached only on one side of a branch on a CPU capability: the output of `cpuid`
      or `xgetbv`, glibc's `_rtld_global_ro` / `_dl_x86_cpu_features`, libgcc's `__cpu_model`,
      OpenSSL's `OPENSSL_ia32cap_P`, `getauxval`, or a global written from one of them
      (`__pthread_force_elision`, found because its value came from a capability),
      or the return value of a function that computes one (OpenSSL's
      `ossl_rsaz_avx512ifma_eligible`: `return (OPENSSL_ia32cap_P[2] & mask) == mask`,
      its callers branch on the bool it returns);
    functions referenced only from such code.

Everything else is "needed": a CPU without the extension faults there. Code is decoded per
function (.eh_frame FDEs and symbols), so constant tables and strings between hand-written
assembly functions are not read as instructions; a file with neither is swept whole.
"""

from __future__ import annotations

import bisect
import re
import struct
from dataclasses import dataclass, field

# iced-x86 CpuidFeature name -> extension name (fleetscope/tools/isa_extensions.py EXTENSIONS).
FEATURE_EXTENSION = {
    "SSE3": "SSE3", "SSSE3": "SSSE3", "SSE4_1": "SSE4.1", "SSE4_2": "SSE4.2",
    "POPCNT": "POPCNT", "CMPXCHG16B": "CMPXCHG16B", "AVX": "AVX", "AVX2": "AVX2",
    "FMA": "FMA", "F16C": "F16C", "BMI1": "BMI1", "BMI2": "BMI2", "LZCNT": "LZCNT",
    "MOVBE": "MOVBE", "AVX512F": "AVX-512F", "AVX512BW": "AVX-512BW", "AVX512CD": "AVX-512CD",
    "AVX512DQ": "AVX-512DQ", "AVX512VL": "AVX-512VL", "AVX512ER": "AVX-512ER",
    "AVX512PF": "AVX-512PF", "AVX512_IFMA": "AVX-512IFMA", "AVX512_VBMI": "AVX-512VBMI",
    "AVX512_VBMI2": "AVX-512VBMI2", "AVX512_VNNI": "AVX-512VNNI",
    "AVX512_BITALG": "AVX-512BITALG", "AVX512_VPOPCNTDQ": "AVX-512VPOPCNTDQ",
    "AVX512_BF16": "AVX-512BF16", "AVX512_FP16": "AVX-512FP16",
    "AVX512_VP2INTERSECT": "AVX-512VP2INTERSECT", "AVX512_4FMAPS": "AVX-512-4FMAPS",
    "AVX512_4VNNIW": "AVX-512-4VNNIW", "AVX_VNNI": "AVX-VNNI", "AVX_VNNI_INT8": "AVX-VNNI-INT8",
    "AVX_VNNI_INT16": "AVX-VNNI-INT16", "AVX_IFMA": "AVX-IFMA",
    "AVX_NE_CONVERT": "AVX-NE-CONVERT", "CMPCCXADD": "CMPCCXADD", "SHA512": "SHA512",
    "SM3": "SM3", "SM4": "SM4", "AES": "AES", "VAES": "VAES", "PCLMULQDQ": "PCLMULQDQ",
    "VPCLMULQDQ": "VPCLMULQDQ", "SHA": "SHA", "GFNI": "GFNI", "AMX_TILE": "AMX-TILE",
    "AMX_INT8": "AMX-INT8", "AMX_BF16": "AMX-BF16", "AMX_FP16": "AMX-FP16",
    "AMX_COMPLEX": "AMX-COMPLEX", "FMA4": "FMA4", "XOP": "XOP", "TBM": "TBM",
    "SSE4A": "SSE4a", "D3NOW": "3DNow!", "D3NOWEXT": "3DNow!", "RDRAND": "RDRAND",
    "RDSEED": "RDSEED", "ADX": "ADX", "RTM": "RTM",
    "HLE_OR_RTM": "RTM",  # xtest: #UD unless HLE or RTM; no CPU that lacks RTM keeps HLE
    "CLWB": "CLWB", "XSAVE": "XSAVE", "XSAVEC": "XSAVEC", "XSAVEOPT": "XSAVEOPT",
    "RDPID": "RDPID", "MOVDIRI": "MOVDIRI", "MOVDIR64B": "MOVDIR64B", "WAITPKG": "WAITPKG",
    "RDTSCP": "RDTSCP", "FSGSBASE": "FSGSBASE", "SERIALIZE": "SERIALIZE",
    "TSXLDTRK": "TSXLDTRK", "CLZERO": "CLZERO", "MONITORX": "MWAITX", "RDPRU": "RDPRU",
    "PKU": "PKU", "ENQCMD": "ENQCMD", "UINTR": "UINTR", "LWP": "LWP",
    "PREFETCHWT1": "PREFETCHWT1", "PTWRITE": "PTWRITE", "KL": "KeyLocker",
    "AESKLE": "KeyLocker", "WIDE_KL": "KeyLocker", "RAO_INT": "RAO-INT",
}
# Baseline x86-64 (8086..SSE2, CMOV, CX8, FXSR, SYSCALL, ...), hint-space instructions that
# run as NOPs on CPUs without the feature (endbr64, bnd, prefetchw, cldemote, clflushopt,
# rdssp/incssp, multi-byte NOP, pause), and privileged ones (#GP in user mode, SIGSEGV: not
# an ISA question) are not extensions.
_NOT_EXTENSIONS = frozenset(
    "INTEL8086 INTEL8086_ONLY INTEL186 INTEL286 INTEL286_ONLY INTEL386 INTEL386_ONLY "
    "INTEL386_A0_ONLY INTEL486 INTEL486_A_ONLY X64 FPU FPU287 FPU287XL_ONLY FPU387 "
    "FPU387SL_ONLY CMOV CX8 FXSR MMX SSE SSE2 SYSCALL SEP TSC CPUID CLFSH PAUSE "
    "MULTIBYTENOP CET_IBT CET_SS MPX PREFETCHW CLDEMOTE CLFLUSHOPT HLE MONITOR".split())


@dataclass
class Use:
    count: int
    address: int
    where: str  # section and function
    reason: str = ""  # for dispatched code: why it counts as dispatched


@dataclass
class X86Scan:
    instructions: int = 0
    undecoded_bytes: int = 0
    skipped_bytes: int = 0  # executable bytes outside every known function, not decoded
    functions: int = 0
    needed: dict[str, Use] = field(default_factory=dict)
    dispatched: dict[str, Use] = field(default_factory=dict)
    texts: dict[int, str] = field(default_factory=dict)  # address -> instruction text


# Capability sources known by name: objects that hold CPUID results, and functions that
# return them (glibc, libgcc's __builtin_cpu_supports, OpenSSL, Linux auxv).
CAPABILITY_OBJECTS = frozenset((
    "_rtld_global_ro", "_dl_x86_cpu_features", "__x86_cpu_features", "__cpu_model",
    "__cpu_features2", "OPENSSL_ia32cap_P", "_dl_hwcap", "_dl_hwcap2", "GLRO_dl_hwcap",
))
CAPABILITY_FUNCTIONS = frozenset((
    "getauxval", "__getauxval", "__get_cpu_features", "__x86_get_cpu_features",
    "_dl_x86_get_cpu_features", "__x86_get_cpuid_feature_leaf", "__cpu_indicator_init",
    "OPENSSL_ia32_cpuid", "OPENSSL_ia32cap_loc",
))
CAPABILITY_SPAN = 64  # bytes of a capability object counted from its start (struct fields)

ENDBR64 = b"\xf3\x0f\x1e\xfa"
R_X86_64_64, R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT = 1, 6, 7
R_X86_64_RELATIVE, R_X86_64_IRELATIVE = 8, 37


def _iced():
    import iced_x86

    return iced_x86


class _Features:
    """CpuidFeature ids -> extension names, cached by instruction code."""

    def __init__(self, iced):
        names = {value: name for name, value in vars(iced.CpuidFeature).items()
                 if isinstance(value, int)}
        self._by_feature = {}
        for value, name in names.items():
            if name in _NOT_EXTENSIONS:
                continue
            self._by_feature[value] = FEATURE_EXTENSION.get(name, name)
        self._by_code: dict[int, tuple[str, ...]] = {}
        self._tzcnt = iced.Mnemonic.TZCNT
        self._lahf = (iced.Mnemonic.LAHF, iced.Mnemonic.SAHF)

    def of(self, ins) -> tuple[str, ...]:
        code = ins.code
        found = self._by_code.get(code)
        if found is None:
            if ins.mnemonic == self._tzcnt:
                found = ()  # the bytes of `rep bsf`: GCC emits it for generic x86-64
            elif ins.mnemonic in self._lahf:
                found = ("LAHF-SAHF",)  # needs CPUID LAHF_LM in 64-bit mode
            elif ins.is_privileged:
                found = ()
            else:
                found = tuple(dict.fromkeys(
                    self._by_feature[f] for f in ins.cpuid_features() if f in self._by_feature))
            self._by_code[code] = found
        return found


def sweep(iced, code: bytes, address: int):
    """Every instruction of `code` in order; an invalid one (INVALID code, counted as one
    byte) resynchronises at the next byte, so it never swallows a valid one after it."""
    decoder = iced.Decoder(64, code, ip=address)
    invalid = iced.Code.INVALID
    while decoder.can_decode:
        position = decoder.position
        ins = decoder.decode()
        if ins.code == invalid:
            decoder.position = position + 1
            decoder.ip = address + position + 1
        yield ins


def decode_one(code: bytes, address: int) -> tuple[str, tuple[str, ...], int] | None:
    """(Intel-syntax text, extensions, length) of the instruction at the start of `code`,
    or None when the bytes are not a valid instruction."""
    iced = _iced()
    decoder = iced.Decoder(64, code, ip=address)
    ins = decoder.decode()
    if ins.code == iced.Code.INVALID:
        return None
    formatter = iced.Formatter(iced.FormatterSyntax.INTEL)
    return formatter.format(ins), _Features(iced).of(ins), ins.len


# ---------------------------------------------------------------------------------------
# The ELF image: segments, functions, relocations
# ---------------------------------------------------------------------------------------

class Image:
    """What the analysis needs of an ELF file, read once with pyelftools."""

    def __init__(self, elf, path: str, regions):
        self.path = path
        self.regions = regions  # [(section name, index, address, bytes)]
        self.segments = []  # (vaddr, offset, filesz, flags)
        for segment in elf.iter_segments():
            h = segment.header
            if h.p_type == "PT_LOAD":
                self.segments.append((h.p_vaddr, h.p_offset, h.p_filesz, h.p_flags))
        self.stream = elf.stream
        self.entry = elf.header.e_entry
        self.position_independent = elf.header.e_type == "ET_DYN"
        self.symbols: dict[int, str] = {}
        self.sizes: dict[int, int] = {}
        self.exported: set[int] = set()
        self.ifunc_resolvers: set[int] = set()
        self.object_symbols: dict[int, str] = {}
        self.dynsym_names: list[str] = []
        self._read_symbols(elf)
        self.slot_names: dict[int, str] = {}  # GOT slot -> symbol
        self.data_refs: set[int] = set()  # code addresses stored in data (function pointers)
        self._read_relocations(elf)
        self.plt_names: dict[int, str] = {}
        self.fde_ranges: dict[int, int] = {}
        self._read_eh_frame_hdr(elf)

    def read(self, address: int, size: int) -> bytes:
        for vaddr, offset, filesz, _ in self.segments:
            if vaddr <= address < vaddr + filesz:
                self.stream.seek(offset + address - vaddr)
                return self.stream.read(min(size, vaddr + filesz - address))
        return b""

    def code_at(self, address: int) -> bool:
        return any(start <= address < start + len(data) for _, _, start, data in self.regions)

    def _read_symbols(self, elf) -> None:
        for table_name in (".dynsym", ".symtab"):
            table = elf.get_section_by_name(table_name)
            if table is None or not hasattr(table, "iter_symbols"):
                continue
            for symbol in table.iter_symbols():
                if table_name == ".dynsym":
                    self.dynsym_names.append(symbol.name)
                kind = symbol["st_info"]["type"]
                defined = symbol["st_shndx"] != "SHN_UNDEF"
                value = symbol["st_value"]
                if not defined or not value:
                    continue
                if kind in ("STT_FUNC", "STT_GNU_IFUNC", "STT_LOOS"):
                    if symbol.name and value not in self.symbols:
                        self.symbols[value] = symbol.name
                    if symbol["st_size"]:
                        self.sizes[value] = max(self.sizes.get(value, 0), symbol["st_size"])
                    if kind != "STT_FUNC":
                        self.ifunc_resolvers.add(value)
                    if table_name == ".dynsym" and symbol["st_info"]["bind"] != "STB_LOCAL":
                        self.exported.add(value)
                elif kind == "STT_OBJECT" and symbol.name in CAPABILITY_OBJECTS:
                    self.object_symbols[value] = symbol.name

    def _read_relocations(self, elf) -> None:
        from elftools.elf.relocation import RelocationSection

        for section in elf.iter_sections():
            if not isinstance(section, RelocationSection) or not section.is_RELA():
                continue
            data = section.data()
            for at in range(0, len(data) - 23, 24):
                offset, info, addend = struct.unpack_from("<QQq", data, at)
                kind, index = info & 0xFFFFFFFF, info >> 32
                name = self.dynsym_names[index] if 0 < index < len(self.dynsym_names) else ""
                if kind in (R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT, R_X86_64_64) and name:
                    self.slot_names[offset] = name
                elif kind == R_X86_64_IRELATIVE:
                    self.ifunc_resolvers.add(addend)
                elif kind == R_X86_64_RELATIVE and self.code_at(addend):
                    self.data_refs.add(addend)

    def _read_eh_frame_hdr(self, elf) -> None:
        """Function ranges from the .eh_frame_hdr search table and each FDE's pc_range
        (the encodings GCC and LLVM use on x86-64: table datarel|sdata4, FDE pcrel|sdata4)."""
        section = elf.get_section_by_name(".eh_frame_hdr")
        if section is None:
            return
        data, base = section.data(), section.header.sh_addr
        if len(data) < 12 or data[0] != 1 or data[2] != 0x03 or data[3] != 0x3B:
            return
        count = struct.unpack_from("<I", data, 8)[0]
        for i in range(min(count, (len(data) - 12) // 8)):
            start, fde = struct.unpack_from("<ii", data, 12 + 8 * i)
            start, fde = base + start, base + fde
            record = self.read(fde, 16)
            if len(record) < 16:
                continue
            pc_begin, pc_range = struct.unpack_from("<iI", record, 8)
            if fde + 8 + pc_begin == start and pc_range:
                self.fde_ranges[start] = pc_range

    def read_plt(self, iced) -> None:
        """PLT entry address -> the symbol its `jmp [rip+slot]` goes to."""
        for name, _, start, data in self.regions:
            if not name.startswith(".plt"):
                continue
            for ins in iced.Decoder(64, data, ip=start):
                if ins.is_jmp_near_indirect and ins.is_ip_rel_memory_operand:
                    target = self.slot_names.get(ins.ip_rel_memory_address)
                    if target:
                        self.plt_names[start + (ins.ip - start) // 16 * 16] = target


# ---------------------------------------------------------------------------------------
# Functions
# ---------------------------------------------------------------------------------------

@dataclass
class _Function:
    start: int
    end: int
    section: str
    name: str
    uses: dict[str, list] = field(default_factory=dict)  # ext -> [count, first address]
    guarded_uses: dict[str, list] = field(default_factory=dict)
    refs: list[tuple[int, bool]] = field(default_factory=list)  # (target, from guarded code)
    reads: set[int] = field(default_factory=set)  # rip-relative data addresses read
    leas: set[int] = field(default_factory=set)
    stores: list[tuple[int, bool]] = field(default_factory=list)  # (address, capability value)
    calls: set[str] = field(default_factory=set)  # named callees (PLT or symbols)
    has_cpuid: bool = False
    returns_capability: bool = False  # rax holds a capability value at a `ret` (a feature test)
    branches: set[int] = field(default_factory=set)  # call / jmp / jcc targets elsewhere
    conditional: bool = False  # has a conditional branch
    pointers: set[int] = field(default_factory=set)  # code addresses stored to memory
    addresses: set[int] = field(default_factory=set)  # code addresses taken (lea)
    guard: str = ""  # why guarded blocks are guarded
    refs_only: bool = False  # bytes between known functions: read for references only

    @property
    def where(self) -> str:
        return f"{self.section} {self.name}".strip()


def _functions(image: Image) -> list[_Function]:
    starts: dict[int, int] = {}  # start -> end (0: unknown)
    for start, size in image.fde_ranges.items():
        starts[start] = start + size
    for start in image.symbols:
        if start not in starts:
            size = image.sizes.get(start, 0)
            starts[start] = start + size if size else 0
    starts.setdefault(image.entry, 0)
    out: list[_Function] = []
    for name, _, base, data in image.regions:
        if name.startswith(".plt"):
            continue
        end_of_section = base + len(data)
        inside = sorted(s for s in starts if base <= s < end_of_section)
        if not inside:
            out.append(_Function(base, end_of_section, name, ""))  # nothing known: sweep
            continue
        covered = base
        for i, start in enumerate(inside):
            following = inside[i + 1] if i + 1 < len(inside) else end_of_section
            end = min(starts[start] or following, end_of_section)
            if start > covered:
                out.append(_Function(covered, start, name, "", refs_only=True))
            out.append(_Function(start, end, name, image.symbols.get(start, "")))
            covered = max(covered, end)
        if covered < end_of_section:
            out.append(_Function(covered, end_of_section, name, "", refs_only=True))
    return out


class _Analyser:
    def __init__(self, image: Image):
        self.iced = iced = _iced()
        self.image = image
        self.features = _Features(iced)
        self.OPK_REG, self.OPK_MEM = iced.OpKind.REGISTER, iced.OpKind.MEMORY
        self.RIP = iced.Register.RIP
        self.INVALID = iced.Code.INVALID
        fc = iced.FlowControl
        self.FC_NEXT, self.FC_CALL, self.FC_COND = fc.NEXT, fc.CALL, fc.CONDITIONAL_BRANCH
        self.FC_JMP, self.FC_RET = fc.UNCONDITIONAL_BRANCH, fc.RETURN
        self.FC_ENDS = {fc.UNCONDITIONAL_BRANCH, fc.RETURN, fc.INDIRECT_BRANCH, fc.EXCEPTION,
                        fc.INTERRUPT}
        m = iced.Mnemonic
        self.LEA, self.CPUID, self.XGETBV = m.LEA, m.CPUID, m.XGETBV
        self.XOR, self.SUB = m.XOR, m.SUB
        self.no_write = {m.CMP, m.TEST, m.BT, m.PUSH}
        self.padding = {m.NOP, m.INT3}
        self.full = {}
        reg = iced.Register
        self.cpuid_out = {reg.RAX, reg.RBX, reg.RCX, reg.RDX}
        self.xgetbv_out = {reg.RAX, reg.RDX}
        self.RAX = reg.RAX
        self.caller_saved = {reg.RAX, reg.RCX, reg.RDX, reg.RSI, reg.RDI, reg.R8, reg.R9,
                             reg.R10, reg.R11}
        self.full_register = iced.RegisterExt.full_register
        self.cap_slots = {slot for slot, name in image.slot_names.items()
                          if name in CAPABILITY_OBJECTS}
        self.cap_starts: list[int] = sorted(image.object_symbols)
        self.cap_exact: set[int] = set()
        self.cpuid_functions: set[int] = set()
        self.feature_tests: set[int] = set()  # functions that return a capability value

    def reg(self, register: int) -> int:
        full = self.full.get(register)
        if full is None:
            full = self.full[register] = self.full_register(register)
        return full

    def capability_address(self, address: int) -> bool:
        if address in self.cap_exact or address in self.cap_slots:
            return True
        at = bisect.bisect_right(self.cap_starts, address) - 1
        return at >= 0 and address < self.cap_starts[at] + CAPABILITY_SPAN

    def callee_name(self, target: int) -> str:
        return self.image.plt_names.get(target) or self.image.symbols.get(target, "")

    # -- first pass: what every function uses and references -----------------------------

    def light(self, function: _Function, code: bytes, base: int, scan: X86Scan) -> None:
        features = self.features
        OPK_MEM, INVALID, LEA = self.OPK_MEM, self.INVALID, self.LEA
        FC_NEXT, FC_CALL, FC_COND, FC_JMP = self.FC_NEXT, self.FC_CALL, self.FC_COND, self.FC_JMP
        start, end = function.start, function.end
        decoder = sweep(self.iced, code[start - base:end - base], start)
        refs_only = function.refs_only
        last = None  # the last instruction that is not alignment padding
        pointer = None  # (register, code address) of the lea just before
        padding = self.padding
        for ins in decoder:
            if ins.mnemonic not in padding:
                last = ins
            if ins.code == INVALID:
                if not refs_only:
                        scan.undecoded_bytes += 1
                continue
            if refs_only:  # tables and strings decode as anything: keep only what they point at
                found = ()
            else:
                scan.instructions += 1
                found = features.of(ins)
            if found:
                for name in found:
                    entry = function.uses.get(name)
                    if entry is None:
                        function.uses[name] = [1, ins.ip]
                    else:
                        entry[0] += 1
            flow = ins.flow_control
            if flow != FC_NEXT:
                if flow == FC_COND:
                    function.conditional = True
                if flow in (FC_CALL, FC_JMP, FC_COND) and not ins.is_jmp_near_indirect:
                    target = ins.near_branch_target
                    if target and not (start <= target < end):
                        function.refs.append((target, False))
                        function.branches.add(target)
                        if flow == FC_CALL:
                            name = self.callee_name(target)
                            if name:
                                function.calls.add(name)
                elif ins.is_call_near_indirect and ins.is_ip_rel_memory_operand:
                    name = self.image.slot_names.get(ins.ip_rel_memory_address)
                    if name:
                        function.calls.add(name)
            if ins.is_ip_rel_memory_operand:
                address = ins.ip_rel_memory_address
                if ins.mnemonic == LEA:
                    function.leas.add(address)
                    if self.image.code_at(address):
                        function.refs.append((address, False))
                        function.addresses.add(address)
                        pointer = (ins.op0_register, address)
                        continue
                elif ins.op0_kind == OPK_MEM and ins.mnemonic not in self.no_write:
                    function.stores.append((address, False))
                else:
                    function.reads.add(address)
            elif (ins.mnemonic == self.CPUID or ins.mnemonic == self.XGETBV) and not refs_only:
                function.has_cpuid = True
            if pointer is not None:
                # `lea rax, [rip+f]; mov [rbx+8], rax`: a function pointer stored, not a table
                if ins.op_count == 2 and ins.op0_kind == OPK_MEM and \
                        ins.op1_kind == self.OPK_REG and ins.op1_register == pointer[0]:
                    function.pointers.add(pointer[1])
                pointer = None
        if last is not None and not refs_only and last.flow_control not in self.FC_ENDS \
                and last.code != INVALID:
            function.refs.append((end, False))  # runs on into the next function

    def needs_flow(self, function: _Function) -> bool:
        if function.refs_only:
            return False
        if function.has_cpuid or function.calls & CAPABILITY_FUNCTIONS or \
                function.branches & self.feature_tests:
            return True
        return any(self.capability_address(a) for a in function.reads | function.leas) or any(
            self.capability_address(a) for a, _ in function.stores)

    # -- second pass: blocks, capability taint, guarded blocks ---------------------------

    def flow(self, function: _Function, code: bytes, base: int) -> None:
        """Re-decode a function that reads a capability and split its uses and references
        into unconditional and guarded ones."""
        start, end = function.start, function.end
        instructions = [ins for ins in sweep(self.iced, code[start - base:end - base], start)
                        if ins.code != self.INVALID]
        if not instructions:
            return
        leaders = {start}
        for i, ins in enumerate(instructions):
            flow = ins.flow_control
            if flow == self.FC_COND or flow == self.FC_JMP:
                target = ins.near_branch_target
                if start <= target < end:
                    leaders.add(target)
            if flow != self.FC_NEXT and flow != self.FC_CALL and i + 1 < len(instructions):
                leaders.add(instructions[i + 1].ip)
        block_starts = sorted(leaders)
        block_of = {}
        blocks: list[list] = []  # per block: instructions
        current = -1
        for ins in instructions:
            if ins.ip in leaders or current < 0:
                current = bisect.bisect_right(block_starts, ins.ip) - 1
                while len(blocks) <= current:
                    blocks.append([])
            blocks[current].append(ins)
            block_of[ins.ip] = current
        index_of = {s: i for i, s in enumerate(block_starts)}
        successors: list[list[int]] = [[] for _ in blocks]
        cap_branches: list[tuple[int, int, int]] = []
        tainted: set[int] = set()
        flags_tainted = False
        pending: dict[int, set[int]] = {}
        store_taint: list[tuple[int, bool]] = []
        function.returns_capability = False
        for b, block in enumerate(blocks):
            if not block:
                continue
            carried = pending.pop(block[0].ip, None)
            if carried:
                tainted |= carried
            for ins in block:
                flow = ins.flow_control
                mnemonic = ins.mnemonic
                reads_cap = False
                dest = None
                for op in range(ins.op_count):
                    kind = ins.op_kind(op)
                    if kind == self.OPK_REG:
                        register = self.reg(ins.op_register(op))
                        if op == 0 and mnemonic not in self.no_write:
                            dest = register
                            if mnemonic == self.LEA:
                                continue
                        if register in tainted:
                            reads_cap = True
                    elif kind == self.OPK_MEM:
                        if ins.memory_base == self.RIP:
                            if self.capability_address(ins.ip_rel_memory_address):
                                reads_cap = True
                        elif (ins.memory_base and self.reg(ins.memory_base) in tainted) or (
                                ins.memory_index and self.reg(ins.memory_index) in tainted):
                            reads_cap = True
                if mnemonic == self.LEA:  # the address itself: a pointer to a capability
                    reads_cap = ins.is_ip_rel_memory_operand and \
                        self.capability_address(ins.ip_rel_memory_address)
                if (mnemonic == self.XOR or mnemonic == self.SUB) and ins.op_count == 2 and \
                        ins.op0_kind == self.OPK_REG and ins.op1_kind == self.OPK_REG and \
                        ins.op0_register == ins.op1_register:
                    reads_cap = False  # xor eax, eax
                if ins.rflags_read and flags_tainted and dest is not None:
                    reads_cap = True  # setcc / cmovcc / sbb after a capability test
                if ins.op_count and ins.op0_kind == self.OPK_MEM and \
                        mnemonic not in self.no_write and ins.memory_base == self.RIP:
                    store_taint.append((ins.ip_rel_memory_address, reads_cap, b))
                if dest is not None:
                    if reads_cap:
                        tainted.add(dest)
                    else:
                        tainted.discard(dest)
                if ins.rflags_modified:
                    flags_tainted = reads_cap
                if mnemonic == self.CPUID:
                    tainted |= self.cpuid_out
                elif mnemonic == self.XGETBV:
                    tainted |= self.xgetbv_out
                if flow == self.FC_CALL:
                    tainted -= self.caller_saved
                    target = ins.near_branch_target
                    name = self.callee_name(target) if target else (
                        self.image.slot_names.get(ins.ip_rel_memory_address, "")
                        if ins.is_ip_rel_memory_operand else "")
                    if name in CAPABILITY_FUNCTIONS or self._cpuid_function(target) or \
                            target in self.feature_tests:
                        tainted.add(self.RAX)
                elif flow == self.FC_COND or flow == self.FC_JMP:
                    target = ins.near_branch_target
                    if start <= target < end and target > ins.ip:
                        pending.setdefault(target, set()).update(tainted)
                    elif flow == self.FC_JMP and target in self.feature_tests:
                        function.returns_capability = True  # a tail call to a feature test
                elif flow == self.FC_RET and self.RAX in tainted:
                    # Its caller's `test eax, eax; je` is then a capability branch.
                    function.returns_capability = True
            last = block[-1]
            flow = last.flow_control
            following = b + 1 if b + 1 < len(blocks) else None
            if flow == self.FC_COND or flow == self.FC_JMP:
                target = last.near_branch_target
                taken = index_of.get(target) if start <= target < end else None
                if taken is not None:
                    successors[b].append(taken)
                if flow == self.FC_COND and following is not None:
                    successors[b].append(following)
                if flow == self.FC_COND and flags_tainted:
                    cap_branches.append((b, taken if taken is not None else -1,
                                         following if following is not None else -1))
            elif flow not in self.FC_ENDS and following is not None:
                successors[b].append(following)
            if flow in self.FC_ENDS:
                tainted = set()
                flags_tainted = False
        guarded = self._guarded(len(blocks), successors, cap_branches)
        guarded_ips = {b for b in guarded}
        # Redo the function's tallies with the split.
        function.uses.clear()
        function.guarded_uses.clear()
        refs = []
        branch_blocks = {b for b, _, _ in cap_branches}
        for b, block in enumerate(blocks):
            is_guarded = b in guarded_ips
            uses = function.guarded_uses if is_guarded else function.uses
            for ins in block:
                for name in self.features.of(ins):
                    entry = uses.get(name)
                    if entry is None:
                        uses[name] = [1, ins.ip]
                    else:
                        entry[0] += 1
                flow = ins.flow_control
                target = None
                if flow in (self.FC_CALL, self.FC_JMP, self.FC_COND) and \
                        not ins.is_jmp_near_indirect:
                    target = ins.near_branch_target
                    if target and start <= target < end:
                        target = None
                elif ins.mnemonic == self.LEA and ins.is_ip_rel_memory_operand and \
                        self.image.code_at(ins.ip_rel_memory_address):
                    target = ins.ip_rel_memory_address
                if target:
                    # A branch to another function taken on a capability test is dispatch.
                    refs.append((target, is_guarded or (
                        b in branch_blocks and ins is block[-1] and flow == self.FC_COND),
                        ins.mnemonic == self.LEA))
        # A function that reads the CPU's capabilities and takes the addresses of several
        # functions picks implementations (a resolver written in C, glibc's
        # __libc_ifunc_impl_list, OpenSSL's method selection): those addresses are choices.
        choices = {target for target, _, is_lea in refs if is_lea}
        function.refs = [(target, guarded or (is_lea and len(choices) > 1))
                         for target, guarded, is_lea in refs]
        function.stores = [(address, tainted or b in guarded_ips)
                           for address, tainted, b in store_taint]
        if cap_branches:
            function.guard = f"after a CPU feature test in {function.name or hex(start)}"

    def _cpuid_function(self, target: int) -> bool:
        return target in self.cpuid_functions

    @staticmethod
    def _guarded(count: int, successors, cap_branches) -> set[int]:
        """Blocks on one side only of a capability branch, not reachable from the entry
        without passing one."""
        if not cap_branches:
            return set()
        stops = {b for b, _, _ in cap_branches}

        def reach(first: int, avoid: set[int], barrier: int | None = None) -> set[int]:
            seen: set[int] = set()
            todo = [first] if first >= 0 else []
            while todo:
                node = todo.pop()
                if node in seen or node == barrier:
                    continue
                seen.add(node)
                if node in avoid:
                    continue
                todo.extend(successors[node])
            return seen

        unconditional = reach(0, stops)
        guarded: set[int] = set()
        for b, taken, following in cap_branches:
            one, other = reach(taken, set(), b), reach(following, set(), b)
            guarded |= one ^ other
        return guarded - unconditional


# Rounds of the capability flow: globals filled from a capability and feature tests found
# in one round are sources in the next (a wrapper around a feature test is one itself).
FLOW_ROUNDS = 6


def analyse(image: Image, hwcaps_level: int = 0) -> X86Scan:
    """Decode every function of an x86-64 image and sort extension uses into needed and
    dispatched."""
    analyser = _Analyser(image)
    iced = analyser.iced
    image.read_plt(iced)
    scan = X86Scan()
    functions = _functions(image)
    code_of: dict[str, tuple[int, bytes]] = {name: (base, data)
                                             for name, _, base, data in image.regions}
    for function in functions:
        if not function.refs_only:
            base, data = code_of[function.section]
            analyser.light(function, data, base, scan)
    functions = _discover(functions, analyser, code_of, scan)
    _table_fillers(functions)
    scan.functions = sum(1 for f in functions if not f.refs_only)
    starts = {f.start for f in functions if not f.refs_only}
    for function in functions:
        if function.refs_only:
            base, data = code_of[function.section]
            function.refs = _raw_refs(data, base, function.start, function.end, starts)
            scan.skipped_bytes += function.end - function.start
    by_start = {f.start: f for f in functions}
    analyser.cpuid_functions = {f.start for f in functions if f.has_cpuid}
    # Globals a CPUID routine is handed or fills (OPENSSL_ia32cap_P when stripped).
    for function in functions:
        touches_cpuid = function.has_cpuid or any(
            target in analyser.cpuid_functions for target, _ in function.refs)
        if touches_cpuid:
            for address in function.leas | {a for a, _ in function.stores}:
                if not image.code_at(address):
                    bisect.insort(analyser.cap_starts, address)
    # start -> the feature tests it calls, as known when it was analysed
    analysed: dict[int, set[int]] = {}
    for _round in range(FLOW_ROUNDS):  # capability sources found in one round widen the next
        todo = [f for f in functions if analyser.needs_flow(f) and (
            f.start not in analysed
            or f.branches & analyser.feature_tests != analysed[f.start])]
        if not todo:
            break
        for function in todo:
            base, data = code_of[function.section]
            analyser.flow(function, data, base)
            analysed[function.start] = function.branches & analyser.feature_tests
        for function in todo:
            for address, capability in function.stores:
                if capability and not analyser.capability_address(address):
                    analyser.cap_exact.add(address)
            if function.returns_capability:
                analyser.feature_tests.add(function.start)
    dispatched = _dispatched_functions(image, functions, by_start)
    for function in functions:
        reason = dispatched.get(function.start)
        for name, (count, address) in function.uses.items():
            _tally(scan.dispatched if reason else scan.needed, name, count, address,
                   function.where, reason or "")
        for name, (count, address) in function.guarded_uses.items():
            _tally(scan.dispatched, name, count, address, function.where,
                   reason or function.guard)
    for name, reason in PROBE_FIRST.items():
        if name in scan.needed:
            use = scan.needed.pop(name)
            use.reason = reason
            _merge(scan.dispatched, name, use)
    if hwcaps_level:
        from fleetscope.tools.isa_extensions import EXTENSIONS

        for name in list(scan.needed):
            extension = EXTENSIONS.get(("x86_64", name))
            if extension and 0 < extension.level <= hwcaps_level:
                use = scan.needed.pop(name)
                use.reason = f"glibc-hwcaps x86-64-v{hwcaps_level} variant: loaded only on " \
                             "CPUs of that level"
                _merge(scan.dispatched, name, use)
    formatter = iced.Formatter(iced.FormatterSyntax.INTEL)
    for use in [*scan.needed.values(), *scan.dispatched.values()]:
        if use.address not in scan.texts:
            ins = iced.Decoder(64, image.read(use.address, 15), ip=use.address).decode()
            scan.texts[use.address] = formatter.format(ins)
    return scan


# Extensions a program can use only after asking at run time, wherever the instructions sit:
# a static look cannot follow those checks (glibc's lock elision is chosen through the mutex
# kind, set from CPUID RTM at startup), and no compiler emits these instructions on its own.
PROBE_FIRST = {
    "RTM": "Intel TSX: used only after CPUID says RTM (glibc's lock elision and *_rtm string "
           "functions, enabled at startup)",
    "PKU": "protection keys: reached only after pkey_alloc() succeeds, which the kernel "
           "refuses on CPUs without PKU",
}


TABLE_CHOICES = 4  # function addresses taken by one function with branches: a dispatch table


def _table_fillers(functions: list[_Function]) -> None:
    """A function that takes the addresses of several functions under conditions fills a
    table of implementations chosen at run time (x265's setupAssemblyPrimitives(p, cpuMask),
    FFmpeg's *_init_x86): what it points at runs only when chosen."""
    starts = {f.start for f in functions if not f.refs_only}
    for function in functions:
        if function.refs_only or not function.conditional or function.guard:
            continue
        chosen = function.addresses & starts
        if len(chosen) >= TABLE_CHOICES:
            function.refs = [(target, guarded or (target in chosen
                                                   and target not in function.branches))
                             for target, guarded in function.refs]
            name = function.name or hex(function.start)
            function.guard = f"picked at run time from the table {name} fills"


def _discover(functions: list[_Function], analyser: _Analyser, code_of, scan: X86Scan,
              rounds: int = 8) -> list[_Function]:
    """Code without unwind info or symbols (hand-written assembly) between known functions:
    a place a decoded function calls, jumps to or takes the address of starts a function
    there, up to the next known start."""
    for _round in range(rounds):
        gaps = sorted((f for f in functions if f.refs_only), key=lambda f: f.start)
        if not gaps:
            break
        gap_starts = [g.start for g in gaps]
        known = {f.start for f in functions}
        targets: dict[int, set[int]] = {}
        for function in functions:
            if function.refs_only:
                continue
            for target in function.branches | function.addresses:
                if target in known:
                    continue
                at = bisect.bisect_right(gap_starts, target) - 1
                if at < 0 or target >= gaps[at].end:
                    continue
                # An address taken (lea) may be a table in .text; a function entry that can
                # be called through a pointer starts with endbr64 in CET builds.
                if target in function.branches or target in function.pointers or \
                        analyser.image.read(target, 4) == ENDBR64:
                    targets.setdefault(at, set()).add(target)
        if not targets:
            break
        replaced = {}
        for at, inside in targets.items():
            gap = gaps[at]
            pieces, cursor = [], gap.start
            for start in sorted(inside):
                if start > cursor:
                    pieces.append(_Function(cursor, start, gap.section, "", refs_only=True))
                pieces.append(_Function(start, 0, gap.section, ""))
                cursor = start
            for i, piece in enumerate(pieces):
                if not piece.refs_only:
                    piece.end = pieces[i + 1].start if i + 1 < len(pieces) else gap.end
            replaced[id(gap)] = pieces
            for piece in pieces:
                if not piece.refs_only:
                    base, data = code_of[piece.section]
                    analyser.light(piece, data, base, scan)
        functions = [piece for f in functions for piece in replaced.get(id(f), [f])]
    return functions


# rel32 call / jmp / jcc and RIP-relative lea, as bytes: in a table or a string they are
# mostly noise, but noise can only add references (keep code "needed"), never remove one.
_RAW_REF = re.compile(
    rb"[\xe8\xe9]|\x0f[\x80-\x8f]|[\x48\x4c]\x8d[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]")


def _raw_refs(code: bytes, base: int, start: int, end: int, starts: set[int]
              ) -> list[tuple[int, bool]]:
    """Known function starts that the bytes of a gap could refer to."""
    chunk = code[start - base:end - base]
    refs = []
    for match in _RAW_REF.finditer(chunk):
        at = match.end()
        if at + 4 > len(chunk):
            break
        target = start + at + 4 + int.from_bytes(chunk[at:at + 4], "little", signed=True)
        if target in starts:
            refs.append((target, False))
    return refs


def _tally(target: dict[str, Use], name: str, count: int, address: int, where: str,
           reason: str) -> None:
    use = target.get(name)
    if use is None:
        target[name] = Use(count, address, where, reason)
    else:
        use.count += count


def _merge(target: dict[str, Use], name: str, use: Use) -> None:
    existing = target.get(name)
    if existing is None:
        target[name] = use
    else:
        existing.count += use.count


def _dispatched_functions(image: Image, functions: list[_Function],
                          by_start: dict[int, _Function]) -> dict[int, str]:
    """start -> reason for functions that run only through dispatch: IFUNC resolvers, and
    functions whose every reference comes from dispatched code (fixpoint)."""
    referrers: dict[int, list[tuple[int, bool]]] = {}
    for function in functions:
        for target, guarded in function.refs:
            if target in by_start:
                referrers.setdefault(target, []).append((function.start, guarded))
    dispatched = {start: "IFUNC resolver" for start in image.ifunc_resolvers if start in by_start}
    roots = (image.exported | image.data_refs | {image.entry}) - set(dispatched)
    if image.position_independent:
        # In a shared object or PIE every way to reach code is a reference in the file (a
        # branch, a rip-relative address, a relocation): code nothing refers to never runs.
        for function in functions:
            if not function.refs_only and function.start not in roots and \
                    function.start not in referrers and function.start not in dispatched:
                dispatched[function.start] = "nothing in the file refers to it (dead code)"
    changed = True
    while changed:
        changed = False
        for function in functions:
            start = function.start
            if start in dispatched or start in roots or function.refs_only:
                continue
            refs = referrers.get(start)
            if not refs:
                continue
            if all(guarded or source in dispatched for source, guarded in refs):
                source, guarded = refs[0]
                origin = by_start[source]
                if source in image.ifunc_resolvers:
                    dispatched[start] = "IFUNC target"
                elif guarded:
                    dispatched[start] = origin.guard or "after a CPU feature test"
                else:
                    dispatched[start] = f"reached only from dispatched code " \
                                        f"({origin.name or hex(source)})"
                changed = True
    return dispatched
