"""Parser for NVIDIA's Xid reports in the kernel log: the GPU driver's own word that a module
hit an error, which a node without dcgm-exporter has no other way to see.

The driver (NVRM, nvidia.ko) prints one line per error, the PCI bus id of the GPU (domain,
bus, device; some drivers add the function), the Xid code, and, since the 4xx drivers, the
process that had the channel (`pid='<unknown>', name=<unknown>` when none), then a text
that depends on the code. Real lines, each one line in the log:

    [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An
        uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer ...
    NVRM: Xid (PCI:0000:08:00): 31, pid=169800, name=chrome, Ch 00000023, intr 00000000.
        MMU Fault: ENGINE CE0 HUBCLIENT_HSCE0 faulted @ 0x0_0abe0000. ...
    [24128.834365] NVRM: Xid (PCI:0000:01:00): 31, Ch 00000003, engmask 00000101, intr ...
    NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus

What the codes mean is NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors); the ones
a fleet meets most are in MEANINGS. NVSwitch's `SXid` lines and the driver's other NVRM
lines (`NVRM: GPU at PCI:...`, `... caused by previous Xid 149` inside another Xid's text)
are not Xid reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .kmsg import LogClock, messages_with

# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, <text>"; older drivers print no
# pid/name and some no "PCI:" prefix.
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
    r"(?:\.[0-7])?\): (?P<code>[0-9]{1,4}),"
    r"(?: pid=(?P<pid>[0-9]{1,10}|'<unknown>'),)?(?: name=(?P<name>[^,]{0,64}),)?"
    r" ?(?P<text>.*)", re.ASCII)
MAX_TEXT = 200  # the driver's text after the code, cut (a finding shows it, bounded)

# NVIDIA's Xid catalog: what the codes a fleet meets most often say.
MEANINGS = {
    8: "GPU stopped processing",
    13: "graphics engine exception (often the application: an illegal address or instruction)",
    31: "GPU memory page fault (MMU fault: usually the application's bad address)",
    32: "invalid or corrupted push buffer stream",
    38: "driver firmware error",
    43: "GPU stopped processing (the application's channel hit an error)",
    44: "graphics engine fault during context switch",
    45: "preemptive cleanup after earlier errors (follows another Xid)",
    48: "double-bit ECC error (uncorrectable memory error)",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    68: "video processor exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (the affected application was stopped)",
    95: "uncontained ECC error (every application on the GPU is affected)",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
    154: "GPU recovery action changed (reset or reboot required)",
}


@dataclass(frozen=True, slots=True)
class XidError:
    """One Xid report."""

    device: str  # PCI bus id as the driver prints it, lower case: "0000:3b:00"
    code: int
    pid: int | None  # the process whose channel hit it, when the driver names one
    name: str  # that process's name ("" when none)
    text: str  # the driver's text after the code (and pid/name)
    seconds: float | None  # seconds since boot, when the line is stamped

    @property
    def meaning(self) -> str:
        return meaning(self.code)


def meaning(code: int) -> str:
    """What an Xid code says, from NVIDIA's catalog; "" for one not listed here."""
    return MEANINGS.get(code, "")


def xid_errors(text: str, clock: LogClock | None = None) -> list[XidError]:
    """The Xid reports of a kernel log, in log order (`clock` times the lines stamped with
    the wall clock).

    >>> [(e.device, e.code, e.pid, e.name, e.seconds) for e in xid_errors(
    ...     "[ 1399.140323] NVRM: Xid (PCI:0000:01:00): 79, pid=2113, name=python3, GPU has "
    ...     "fallen off the bus.\\n")]
    [('0000:01:00', 79, 2113, 'python3', 1399.140323)]
    """
    found = []
    for message, seconds in messages_with(text, "NVRM: Xid (", clock):
        match = _XID.match(message)
        if not match:
            continue
        pid = match.group("pid")
        name = match.group("name") or ""
        found.append(XidError(
            match.group("bus").lower(), int(match.group("code")),
            int(pid) if pid and pid.isdigit() else None,
            "" if name == "<unknown>" else name.strip(),
            match.group("text").strip()[:MAX_TEXT], seconds))
    return found
