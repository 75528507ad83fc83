"""Parser for the kernel log: SIGILL crashes (an instruction the CPU does not implement), and
the other fatal traps a process dies of (segfaults, general protection faults, divide errors,
breakpoints: what the crash-loop rule counts).

Input is `dmesg` output or /dev/kmsg records, one per line, e.g. (x86, 6.18, and the same
kind of line read from /dev/kmsg; each is one line in the log, wrapped here):

    [ 1725.924917] traps: ud_probe[6911] trap invalid opcode ip:564cd741512d
        sp:7ffece00e4c0 error:0 in ud_probe[112d,564cd7415000+1000]
    6,341,2230812820,-;traps: probe_fma4[14722] trap invalid opcode ip:557dc188f08b
        sp:7ffe14508080 error:0 in probe_fma4[108b,557dc188f000+1000]

arm64 (4.19+ arch/arm64/kernel/traps.c arm64_show_signal(), and the older do_undefinstr()):

    [  812.331702] agent[4242]: unhandled exception: undefined instruction in agent[400000+1000]
    myproc[1234]: undefined instruction: pc=0000000000400544

Formats, from the kernel source:
- x86 arch/x86/kernel/traps.c show_signal(): pr_fmt "traps: ", then
  `"%s[%d] %s%s ip:%lx sp:%lx error:%lx"` with type "trap " and desc "invalid opcode" for #UD
  (the only x86 trap that raises SIGILL for user code), then print_vma_addr(" in ", ip).
- arm64 arm64_show_signal(): `"%s[%d]: unhandled exception: "`, then `"%s, ESR 0x%08x, "`
  (0x%016lx in 6.x) only when the fault code is non-zero, the description, print_vma_addr.
  do_undefinstr() (5.10) and do_el0_undef() (6.x) call force_signal_inject(SIGILL, ...,  0):
  description "undefined instruction", no ESR part. bad_el0_sync() also raises SIGILL
  ("Bad EL0 synchronous exception", with the ESR part). Kernels up to 4.18 printed
  `"%s[%d]: undefined instruction: pc=%p"`.
- print_vma_addr() (mm/memory.c) appends the basename of the file mapped at ip and
  `[start+size]`, or `[offset,start+size]` on newer kernels; nothing for anonymous or JIT
  memory. So the file named there holds the faulting instruction: the executable or a
  shared library. The task name (comm) is cut to 15 characters. It is a pr_cont piece: when
  another CPU prints in between, ` in libc.so.6[...]` becomes a record of its own, perhaps
  after another task's report; it ends the recent report whose ip lies in that mapping.

Where the faulting instruction is, by kernel:
- 6.x print_vma_addr() `in fs_isa_probe[1134,563a66a30000+1000]`: 0x1134 is the file offset
  of ip in the mapped file (vm_pgoff + ip - vm_start); decode the file there.
- older kernels `in libc.so.6[7fa7c7c26000+178000]`: ip minus the mapping base is the offset
  inside the executable segment's mapping (ip 7fa7c7ca33b4 above: +0x7d3b4).
- arm64 up to 4.18 dumps the words around pc after its line, the faulting one in brackets
  (dump_instr()), e.g. from a Xilinx ZynqMP 4.14 kernel:
      [  104.514173] init[1]: undefined instruction: pc=0000000000401bd0
      [  104.520513] Code: 3e0ffadc 0749bf19 3e4db43a b0d3e231 (56ade825)
  arm64 4.19+ prints the register dump instead (`pc : 0000aaaab1c40754` for a user task).

Timestamps are seconds since boot (local_clock(), as /dev/kmsg's microseconds); boot time
(/proc/stat btime, whole seconds) plus them is the wall-clock time of the crash
(`wall_clock()`): right to a second or two on a server, off by the time spent suspended on a
machine that sleeps (local_clock() stops, btime does not move). Lines that carry a wall-clock
stamp instead (`journalctl -k` -o short, short-precise, short-iso; `dmesg -T`; rsyslog's RFC
3164 and RFC 5424 files) are put on the same clock with a `LogClock`: the stamp less the boot
time. A stamp without a year is in the year the log was read (a bundle sample's time), one
without a zone is UTC (journalctl and dmesg -T print local time; nodes keep UTC):

    Apr  4 05:00:12 test-f kernel: log-user-sessio[66297]: segfault at 0 ...
    [Thu Dec  7 00:05:15 2017] Killed process 28438 (java) total-vm:20255636kB, ...
    2026-07-08T10:01:32+0000 kernel: mte_test[2263]: unhandled exception: ...
    <6>1 2022-02-18T10:11:12.500000+00:00 node7 kernel - - - traps: ...
    kern  :info  : [  106.318686] traps: pcm-sensor-serv[8542] general protection fault ...

The boot stamp wins where a line has both (`host kernel: [ 1611.17] ...`): it is the kernel's
own, finer than the journal's.

Both lines are rate limited (x86: the global printk_ratelimit(); arm64: its own limit, 10 per
5 s) and printed only when debug.exception-trace is 1 and the process has no SIGILL handler.
Dropped reports show up later as `show_signal: N callbacks suppressed` (x86: the global
limit is shared, so N also counts other callers' messages) or
`arm64_show_signal: N callbacks suppressed`.

Other fatal traps (`KernelLogScan.faults`, never SIGILL), as this machine's 6.18 kernel printed
them for gcc-built programs (each one line):

    [  503.338565] hcl_sf[9978]: segfault at 0 ip 000055b0cf3c7139 sp 00007ffef023eb80
        error 6 in hcl_sf[1139,55b0cf3c7000+1000] likely on CPU 0 (core 0, socket 0)
    [  503.399391] traps: hcl_de[9997] trap divide error ip:556b7486b146 sp:7ffecdf67b70
        error:0 in hcl_de[1146,556b7486b000+1000]
    [  503.434395] traps: hcl_i3[10006] trap int3 ip:561613cf212e ...
    [  503.485504] traps: hcl_gp[10026] general protection fault ip:55c0b1f7012d ...

- x86 page faults: arch/x86/mm/fault.c show_signal_msg(), `"%s%s[%d]: segfault at %lx ip %px
  sp %px error %lx"`, print_vma_addr(" in ", ip), and since 6.2 " likely on CPU %d (core %d,
  socket %d)"; the address after "at" is the data address that faulted (0: a NULL deref).
- x86 traps: show_signal() as above with type "trap " and the trap's name ("divide error",
  "int3", "stack segment", "bounds", "overflow", "alignment check", "segment not present",
  ...), or "general protection fault" with no type (do_general_protection()).
- arm64: arm64_show_signal() with the fault's name instead of "undefined instruction", e.g.
  from public logs (Amlogic 4.19, Ubuntu 6.8):
      [  119.156884@1] detect_demo[2510]: unhandled exception: DABT (lower EL), ESR 0x92000046,
          level 2 translation fault in libnn_detect.so[7fbd4f0000+6000]
      mte_test[2263]: unhandled exception: DABT (lower EL), ESR 0x0000000092000051,
          synchronous tag check fault in mte_test[b847a9c80000+1000]
All share printk's rate limit and debug.exception-trace with the SIGILL lines.
"""

from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass, replace

from . import ParseError

# /dev/kmsg: "<prio>,<seq>,<usec since boot>,<flags>[,caller=...];<message>" and continuation
# lines " KEY=value" (Documentation/ABI/testing/dev-kmsg).
_KMSG = re.compile(r"([0-9]{1,3}),([0-9]{1,20}),([0-9]{1,20}),[^;]{0,64};(.*)", re.ASCII)
# dmesg: optional raw level "<6>", the timestamp "[ 1725.924917]" (or a -T date), an optional
# caller id "[ T6911]".
_DMESG_PREFIX = re.compile(r"(?:<[0-9]{1,3}>)?((?:\[[^\]\n]{1,64}\] ?){1,2})", re.ASCII)
_SECONDS = re.compile(r"\[\s*([0-9]{1,12}\.[0-9]{1,9})\]", re.ASCII)
# journald / syslog: "Dec 01 03:09:00 host kernel: <message>"
_SYSLOG_KERNEL = " kernel: "
# dmesg -x (util-linux): "kern  :info  : " before the stamp; other facilities are userspace's
_DECODED = re.compile(r"([a-z]{2,8}[0-9]?) *:(?:emerg|alert|crit|err|warn|notice|info|debug) *: ",
                      re.ASCII)
# rsyslog RFC 5424 (RSYSLOG_SyslogProtocol23Format): "<6>1 <RFC 3339> host kernel - - - msg"
_RFC5424 = re.compile(r"(?:<(?P<pri>[0-9]{1,3})>1 )?(?P<stamp>[0-9]{4}-\S{1,40}) \S{1,255} "
                      r"kernel \S{1,128} \S{1,32} (?:-|\[.{0,1024}?\]) ?(?P<message>.*)",
                      re.ASCII)
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug",
                                       "Sep", "Oct", "Nov", "Dec"), 1)}
# RFC 3339 / journalctl short-iso: "2026-12-06T10:11:12.123456+08:00", "...+0000", "...Z"
_ISO_STAMP = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})[T ](?P<hour>[0-9]{2}):"
    r"(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})(?P<fraction>[.,][0-9]{1,9})?"
    r"(?:Z|(?P<sign>[+-])(?P<zh>[0-9]{2}):?(?P<zm>[0-9]{2}))?", re.ASCII)
# RFC 3164 / journalctl short, short-precise: "Dec  6 10:11:12", "Dec 06 10:11:12.123456";
# dmesg -T: "Sun Dec  6 10:11:12 2026"
_BSD_STAMP = re.compile(
    r"(?:[A-Z][a-z]{2} )?(?P<month>[A-Z][a-z]{2}) {1,2}(?P<day>[0-9]{1,2}) (?P<hour>[0-9]{2}):"
    r"(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})(?P<fraction>\.[0-9]{1,9})?(?: (?P<year>[0-9]{4}))?",
    re.ASCII)

# " in libc.so.6[7fa7c7c26000+178000]" (print_vma_addr); text after it is tolerated, so a
# later kernel appending e.g. " likely on CPU 3" (as segfault reports do) still parses.
_WHERE = r"(?: in (?P<where>[^\[\n]{1,255}\[[^\]\n]{0,64}\]))?.*"
_X86 = re.compile(
    r"(?:traps: )?(?P<comm>.{1,64}?)\[(?P<pid>[0-9]{1,10})\] trap invalid opcode "
    r"ip:(?P<ip>[0-9a-f]{1,16}) sp:[0-9a-f]{1,16} error:[0-9a-f]{1,16}" + _WHERE,
    re.ASCII,
)
_ARM64_DESC = r"(?P<desc>undefined instruction|Bad EL0 synchronous exception)"
_ARM64_ESR = r"(?:[^,\n]{1,80}, ESR 0x[0-9a-f]{1,16}, )?"
_ARM64 = re.compile(
    r"(?P<comm>.{1,64}?)\[(?P<pid>[0-9]{1,10})\]: unhandled exception: "
    + _ARM64_ESR + _ARM64_DESC + _WHERE,
    re.ASCII,
)
# The arm64 line is printed in pieces (pr_info then pr_cont); when another CPU prints in
# between, the description lands in a record of its own.
_ARM64_HEAD = re.compile(
    r"(?P<comm>.{1,64}?)\[(?P<pid>[0-9]{1,10})\]: unhandled exception:\s*", re.ASCII
)
_ARM64_TAIL = re.compile(_ARM64_ESR + _ARM64_DESC + _WHERE, re.ASCII)
_ARM64_OLD = re.compile(
    r"(?P<comm>.{1,64}?)\[(?P<pid>[0-9]{1,10})\]: undefined instruction: pc=(?P<ip>\S{1,20})",
    re.ASCII,
)
_CODE = re.compile(r"Code:(?: [0-9a-f]{8}){0,8} \((?P<word>[0-9a-f]{8})\)(?: [0-9a-f]{8}){0,8}",
                   re.ASCII)
_PC = re.compile(r"pc : (?P<pc>[0-9a-f]{16})", re.ASCII)  # arm64 __show_regs, user task
_VMA = re.compile(r"\[(?:(?P<offset>[0-9a-f]{1,16}),)?(?P<start>[0-9a-f]{1,16})\+"
                  r"(?P<size>[0-9a-f]{1,16})\]$", re.ASCII)
_SEGFAULT = re.compile(
    r"(?P<comm>.{1,64}?)\[(?P<pid>[0-9]{1,10})\]: segfault at (?P<address>[0-9a-f]{1,16}) "
    r"ip (?P<ip>[0-9a-f]{1,16}) sp [0-9a-f]{1,16} error (?P<error>[0-9a-f]{1,16})" + _WHERE,
    re.ASCII,
)
_X86_TRAP = re.compile(
    r"(?:traps: )?(?P<comm>.{1,64}?)\[(?P<pid>[0-9]{1,10})\] "
    r"(?P<desc>trap [a-z0-9 ]{1,40}?|general protection(?: fault)?) "  # 3.x/4.x: no "fault"
    r"ip:(?P<ip>[0-9a-f]{1,16}) sp:[0-9a-f]{1,16} error:[0-9a-f]{1,16}" + _WHERE,
    re.ASCII,
)
_ARM64_FAULT = re.compile(
    r"(?P<comm>.{1,64}?)\[(?P<pid>[0-9]{1,10})\]: unhandled exception: " + _ARM64_ESR
    + r"(?P<desc>[^\n]{1,120}?)(?: in (?P<where>[^\[\n]{1,255}\[[^\]\n]{0,64}\]))?",
    re.ASCII,
)
# arm64 up to 4.18 (arch/arm64/mm/fault.c __do_user_fault): the fault's name, the signal, the
# data address; 4.14-4.18 add ", in " and print_vma_addr.
_ARM64_OLD_FAULT = re.compile(
    r"(?P<comm>.{1,64}?)\[(?P<pid>[0-9]{1,10})\]: unhandled (?P<desc>[A-Za-z0-9 ()]{1,80}?) "
    r"\((?P<signal>[0-9]{1,2})\) at 0x(?P<address>[0-9a-f]{1,16}), esr 0x[0-9a-f]{1,16}"
    r"(?:,? in (?P<where>[^\[\n]{1,255}\[[^\]\n]{0,64}\]))?.*",
    re.ASCII,
)
# What arm64 prints after such a line, before the next message: show_pte() ("pgd = ...",
# "[addr] *pgd=...", its pr_cont pieces ", *pud=..." when they land in records of their own)
# and the register dump (__show_regs: "pc : [<...>]" up to 4.14, "pc : 0x..." after).
_ARM64_DUMP = ("pgd = ", "[", "*pgd=", ", *p", "CPU: ", "Hardware name", "task: ", "PC is at ",
               "LR is at ", "pstate: ")
_OLD_PC = re.compile(r"pc : (?:\[<(?P<bracketed>[0-9a-f]{1,16})>\]|0x(?P<hex>[0-9a-f]{1,16}))"
                     r"(?: .*)?", re.ASCII)
# print_vma_addr()'s pr_cont piece in a record of its own: " in libc.so.6[61c9d,7f41...+1600]"
_IN_RECORD = re.compile(r" in (?P<where>[^\[\n]{1,255}\[[^\]\n]{0,64}\])", re.ASCII)
_SUPPRESSED = re.compile(r"(?:arm64_)?show_signal: ([0-9]{1,10}) callbacks suppressed", re.ASCII)

MAX_NAME = 256  # a binary name longer than this is cut (label values stay bounded)


@dataclass(frozen=True, slots=True)
class SigillCrash:
    """One SIGILL crash the kernel logged."""

    arch: str  # "x86" or "arm64" (which kernel printed the line)
    comm: str  # task name as printed (at most 15 characters on most kernels)
    pid: int
    binary: str  # the file holding the faulting instruction, else comm (anonymous/JIT code)
    mapping: str  # the raw text after " in " ("" when the kernel printed none)
    ip: str  # faulting address in hex as printed ("" when the line has none)
    seconds: float | None  # kernel timestamp, seconds since boot, when the line carries one
    description: str  # "invalid opcode", "undefined instruction", ...
    offset: int | None = None  # file offset of ip (6.x kernels print it in the mapping)
    map_start: int | None = None  # start of the mapping holding ip
    map_size: int | None = None
    code_word: str = ""  # arm64 <= 4.18: the faulting instruction word from `Code:`
    address: str = ""  # a segfault's faulting data address in hex ("segfault at <address>")

    @property
    def mapping_delta(self) -> int | None:
        """ip minus the mapping's start: the offset inside the mapped segment."""
        if self.map_start is None or not self.ip:
            return None
        try:
            return int(self.ip, 16) - self.map_start
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class KernelLogScan:
    crashes: tuple[SigillCrash, ...]
    suppressed: int  # reports the kernel's rate limit dropped ("callbacks suppressed")
    lines: int  # log lines or records read
    faults: tuple[SigillCrash, ...] = ()  # fatal traps other than SIGILL, in log order


@dataclass(frozen=True, slots=True)
class LogClock:
    """What puts a wall-clock stamp on the kernel's clock (seconds since boot)."""

    boot: float  # /proc/stat btime, Unix seconds
    day: float  # the (UTC) day the log was read: the year of stamps that print none

    def since_boot(self, stamp: str) -> float | None:
        """Seconds since boot of a wall-clock stamp (the ones _ISO_STAMP and _BSD_STAMP
        read), None when it is none of them."""
        wall = _wall(stamp, self.day)
        return None if wall is None else wall - self.boot


def log_clock(boot: float | None, now: float) -> LogClock | None:
    """The clock of a node's log read at `now`; None without its boot time. Equal for all
    reads of one day, so a parse of the same text on that clock can be kept."""
    return None if boot is None else LogClock(boot, now - now % 86400)


def _wall(stamp: str, day: float) -> float | None:
    iso = _ISO_STAMP.search(stamp)
    if iso:
        fields = [int(iso.group(name)) for name in ("year", "month", "day", "hour", "minute",
                                                     "second")]
        offset = 0
        if iso.group("sign"):
            offset = (int(iso.group("zh")) * 60 + int(iso.group("zm"))) * 60
            offset = -offset if iso.group("sign") == "-" else offset
        fraction = float("0." + iso.group("fraction")[1:]) if iso.group("fraction") else 0.0
        return calendar.timegm((*fields, 0, 0, 0)) - offset + fraction
    bsd = _BSD_STAMP.search(stamp)
    if not bsd or bsd.group("month") not in _MONTHS:
        return None
    fields = (_MONTHS[bsd.group("month")], int(bsd.group("day")), int(bsd.group("hour")),
              int(bsd.group("minute")), int(bsd.group("second")))
    fraction = float(bsd.group("fraction") or 0.0)
    if bsd.group("year"):
        return calendar.timegm((int(bsd.group("year")), *fields, 0, 0, 0)) + fraction
    year = time.gmtime(day).tm_year
    for candidate in (year, year - 1):  # a December line read in January is last year's
        try:
            wall = calendar.timegm((candidate, *fields, 0, 0, 0)) + fraction
        except ValueError:  # 29 February of a year without one
            continue
        if wall < day + 2 * 86400:  # a day of clocks skewed or zones unlike UTC
            return wall
    return None


def _message(line: str, clock: LogClock | None = None) -> tuple[str, float | None] | None:
    """The message of one log line and its timestamp (seconds since boot); None for lines that
    are not kernel messages (continuation lines, userspace records written to /dev/kmsg)."""
    if not line or line[0] in " \t":
        return None  # /dev/kmsg continuation (" SUBSYSTEM=...") or indented dump text
    match = _KMSG.match(line)
    if match:
        if int(match.group(1)) >> 3 != 0:  # facility 0 is the kernel; others are userspace
            return None
        return match.group(4), int(match.group(3)) / 1e6
    decoded = _DECODED.match(line)
    if decoded:
        if decoded.group(1) != "kern":
            return None
        line = line[decoded.end():]
    stamp = ""  # the wall-clock stamp a syslog or journal prefix carries
    rfc5424 = _RFC5424.fullmatch(line) if " kernel " in line[:400] else None
    if rfc5424 and (rfc5424.group("pri") is None or int(rfc5424.group("pri")) >> 3 == 0):
        stamp, line = rfc5424.group("stamp"), rfc5424.group("message")
    elif line.startswith(_SYSLOG_KERNEL.lstrip()):  # the identifier alone: "kernel: [..] ..."
        line = line[len(_SYSLOG_KERNEL) - 1:]
    else:
        prefix, found, message = (line + " ").partition(_SYSLOG_KERNEL)  # an empty one too
        if found:  # a syslog or journal prefix, then perhaps the boot stamp dmesg prints
            stamp, line = prefix, message
    seconds = None
    match = _DMESG_PREFIX.match(line)
    if match:
        boot_stamp = _SECONDS.match(match.group(1))
        if boot_stamp:
            return line[match.end():], float(boot_stamp.group(1))
        stamp = stamp or match.group(1)  # dmesg -T: "[Sun Dec  6 10:11:12 2026] "
        line = line[match.end():]
    if stamp and clock is not None:
        seconds = clock.since_boot(stamp)
    return line, seconds


def _crash(arch, comm, pid, where, ip, seconds, description) -> SigillCrash:
    return _mapped(SigillCrash(arch, comm, pid, comm[:MAX_NAME], "", ip, seconds, description),
                   where)


def _mapped(crash: SigillCrash, where: str | None) -> SigillCrash:
    """The crash with print_vma_addr's text: the file that faulted and where it is mapped."""
    binary, mapping = _binary(where, crash.comm)
    offset = start = size = None
    vma = _VMA.search(mapping)
    if vma:
        start, size = int(vma.group("start"), 16), int(vma.group("size"), 16)
        if vma.group("offset"):
            offset = int(vma.group("offset"), 16)
    return replace(crash, binary=binary, mapping=mapping, offset=offset, map_start=start,
                   map_size=size)


def _continue(where: str, *found: list[SigillCrash]) -> None:
    """Ends the report a split-off " in <file>[...]" record belongs to: of the last few
    printed without a mapping, the one whose ip lies in that mapping (another task's line may
    come between a report and its end; a lone piece whose ip nothing matches is dropped)."""
    vma = _VMA.search(where)
    if not vma:
        return
    start, size = int(vma.group("start"), 16), int(vma.group("size"), 16)
    for reports in found:
        for index in range(len(reports) - 1, max(-1, len(reports) - 5), -1):
            crash = reports[index]
            try:
                inside = not crash.mapping and 0 <= int(crash.ip, 16) - start < size
            except ValueError:  # no ip printed
                continue
            if inside:
                reports[index] = _mapped(crash, where)
                return


def _binary(where: str | None, comm: str) -> tuple[str, str]:
    """(binary, mapping) from print_vma_addr's text, e.g. "libc.so.6[7fa7c7c26000+178000]"."""
    if not where:
        return comm[:MAX_NAME], ""
    name = where[: where.index("[")].strip()
    return (name or comm)[:MAX_NAME], where.strip()[:MAX_NAME]


def scan_kernel_log(text: str, what: str = "kernel log",
                    clock: LogClock | None = None) -> KernelLogScan:
    """SIGILL crashes and rate-limit reports in `dmesg` text or /dev/kmsg records (`clock`
    times the lines that carry a wall-clock stamp).

    >>> scan = scan_kernel_log(
    ...     "[ 1725.924917] traps: ud_probe[6911] trap invalid opcode ip:564cd741512d "
    ...     "sp:7ffece00e4c0 error:0 in ud_probe[112d,564cd7415000+1000]\\n")
    >>> crash = scan.crashes[0]
    >>> crash.binary, crash.pid, crash.arch, crash.seconds
    ('ud_probe', 6911, 'x86', 1725.924917)
    """
    if "\x00" in text:
        raise ParseError(f"{what}: NUL bytes (not kernel log text)")
    crashes: list[SigillCrash] = []
    faults: list[SigillCrash] = []
    suppressed = 0
    lines = 0
    pending: tuple[re.Match, float | None] | None = None  # arm64 head waiting for its tail
    last_crash: int | None = None
    dumping: int | None = None  # an old arm64 fault whose register dump may follow
    for line in text.splitlines():
        lines += 1
        parsed = _message(line, clock)
        if parsed is None:
            continue
        message, seconds = parsed
        message = message.rstrip()
        if message.startswith(" in "):
            piece = _IN_RECORD.fullmatch(message)
            if piece:
                _continue(piece.group("where"), crashes, faults)
                continue
        if dumping is not None:
            if message.startswith("pc : "):
                pc = _OLD_PC.fullmatch(message)
                if pc and not faults[dumping].ip:
                    faults[dumping] = replace(faults[dumping], ip=(
                        pc.group("bracketed") or pc.group("hex")).lstrip("0") or "0")
                dumping = None
                continue
            if not message or message.startswith(_ARM64_DUMP):
                continue
            dumping = None
        follows, last_crash = last_crash, None  # the crash printed just before, if any
        if follows is not None and crashes[follows].arch == "arm64":
            if message.startswith("Code:") and not crashes[follows].code_word:
                code = _CODE.fullmatch(message)
                if code:
                    crashes[follows] = replace(crashes[follows], code_word=code.group("word"))
                continue
            if message.startswith("pc : ") and not crashes[follows].ip:
                pc = _PC.fullmatch(message)
                if pc:
                    crashes[follows] = replace(crashes[follows], ip=pc.group("pc").lstrip("0"))
                continue
            if not message.startswith(("CPU: ", "Hardware name", "pstate: ")):
                follows = None
            last_crash = follows  # the register dump's header lines come between
        if pending is not None:
            head, head_seconds = pending
            pending = None
            tail = _ARM64_TAIL.fullmatch(message)
            if tail:
                crashes.append(_crash("arm64", head.group("comm"), int(head.group("pid")),
                                      tail.group("where"), "", head_seconds, tail.group("desc")))
                last_crash = len(crashes) - 1
                continue
        if "]: segfault at " in message:
            match = _SEGFAULT.fullmatch(message)
            if match:
                faults.append(replace(_crash(
                    "x86", match.group("comm"), int(match.group("pid")), match.group("where"),
                    match.group("ip"), seconds, f"segfault (error {match.group('error')})"),
                    address=match.group("address")))
            continue
        if "trap " in message or "] general protection " in message:
            match = _X86_TRAP.fullmatch(message)
            if match and match.group("desc") != "trap invalid opcode":
                desc = match.group("desc").removeprefix("trap ")
                faults.append(_crash("x86", match.group("comm"), int(match.group("pid")),
                                     match.group("where"), match.group("ip"), seconds,
                                     "general protection fault" if desc.startswith(
                                         "general protection") else desc))
                continue
        if "invalid opcode" in message:
            match = _X86.fullmatch(message)
            if match:
                crashes.append(_crash("x86", match.group("comm"), int(match.group("pid")),
                                      match.group("where"), match.group("ip"), seconds,
                                      "invalid opcode"))
                last_crash = len(crashes) - 1
            continue
        if "]: unhandled exception:" in message:
            match = _ARM64.fullmatch(message)
            if match:
                crashes.append(_crash("arm64", match.group("comm"), int(match.group("pid")),
                                      match.group("where"), "", seconds, match.group("desc")))
                last_crash = len(crashes) - 1
                continue
            fault = _ARM64_FAULT.fullmatch(message)
            if fault:  # any other fault name: SIGSEGV, SIGBUS, SIGTRAP...
                faults.append(_crash("arm64", fault.group("comm"), int(fault.group("pid")),
                                     fault.group("where"), "", seconds, fault.group("desc")))
                continue
            head = _ARM64_HEAD.fullmatch(message)
            if head:
                pending = (head, seconds)
            continue
        if "]: unhandled " in message and ", esr 0x" in message:
            match = _ARM64_OLD_FAULT.fullmatch(message)
            if match:
                faults.append(replace(_crash(
                    "arm64", match.group("comm"), int(match.group("pid")), match.group("where"),
                    "", seconds, match.group("desc")), address=match.group("address")))
                dumping = len(faults) - 1
            continue
        if "]: undefined instruction: pc=" in message:
            match = _ARM64_OLD.fullmatch(message)
            if match:
                crashes.append(_crash("arm64", match.group("comm"), int(match.group("pid")),
                                      None, match.group("ip"), seconds,
                                      "undefined instruction"))
                last_crash = len(crashes) - 1
            continue
        if "callbacks suppressed" in message:
            match = _SUPPRESSED.fullmatch(message)
            if match:
                suppressed += int(match.group(1))
    # pid 0 is the idle task: an undefined instruction there is a kernel oops (old arm64
    # kernels printed the same line for kernel mode), not a process killed by SIGILL.
    return KernelLogScan(tuple(c for c in crashes if c.pid), suppressed, lines,
                         tuple(f for f in faults if f.pid))


def boot_time(stat_text: str) -> float | None:
    """`btime` of /proc/stat: the boot time in Unix seconds, or None when absent."""
    for line in stat_text.splitlines():
        if line.startswith("btime "):
            value = line[6:].strip()
            return float(value) if value.isdigit() else None
    return None


def wall_clock(crash: SigillCrash, boot: float | None) -> float | None:
    """Unix time of a crash: boot time plus the kernel timestamp (seconds since boot)."""
    if boot is None or crash.seconds is None:
        return None
    return boot + crash.seconds


def messages_with(text: str, needle: str, clock: LogClock | None = None):
    """(message, seconds since boot or None) of each kernel record in `text` whose line holds
    `needle`, in log order, whatever prefix and stamp the line carries (`clock` times the
    wall-clock stamps); userspace records and continuation lines are skipped."""
    for line in text.splitlines():
        if needle not in line:
            continue
        parsed = _message(line, clock)
        if parsed is not None:
            yield parsed[0].strip(), parsed[1]
