"""Parser for /proc/interrupts: interrupt counts per IRQ and per online CPU.

    (x86, 6.18 guest)
               CPU0       CPU1
     24:          1          0  IO-APIC   5-edge      ACPI:Ged
     36:          0      84951 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0
    NMI:          0          0   Non-maskable interrupts
    LOC:     122488     132036   Local timer interrupts
    ERR:          0
    (arm64 with GICv3; IPIs are their own rows)
     11:     123456     123457     GICv3  27 Level     arch_timer
     40:         10          0   ITS-MSI 65536 Edge      hns3-0000:7d:00.0-TxRx-0
    IPI0:      1234       2345       Rescheduling interrupts
    Err:          0

kernel/irq/proc.c show_interrupts() prints the header (one `CPU%-8d` per online CPU, so CPU
numbers may have gaps) and one row per IRQ that has a handler or a count: `%*d: `, one
`%10u ` count per online CPU, the chip name (`%8s`, "None" or "-" without one), the hardware
IRQ number, on arm64 `Level`/`Edge` (GENERIC_IRQ_SHOW_LEVEL), the flow name, the actions.
The architecture then appends named per-CPU rows (x86 arch_show_interrupts: NMI, LOC, RES,
CAL, TLB, ...; arm64 show_ipi_list: IPI0..IPIn) and single-number rows (x86 ERR, MIS;
arm64 Err). Counts are 32-bit (`unsigned int` per CPU) and wrap.
"""

from __future__ import annotations

from typing import NamedTuple

from . import ParseError


class IrqRow(NamedTuple):
    name: str  # "36" for an IRQ number, "LOC", "IPI0", "ERR" for architecture rows
    counts: tuple[int, ...]  # one per header CPU; a single number for ERR/MIS/Err
    per_cpu: bool  # False for single-number rows (ERR, MIS, Err)
    chip: str  # "IO-APIC", "PCI-MSIX-0000:00:02.0", "GICv3"; "" for architecture rows
    hwirq: int | None  # hardware IRQ number on the chip, when printed
    description: str  # the rest of the line after the counts (chip, flow, actions; or text)


class Interrupts(NamedTuple):
    cpus: tuple[int, ...]  # the online CPUs, in column order
    rows: list[IrqRow]


def _digits(token: str) -> bool:
    return token.isdigit() and token.isascii()


def _header(line: str) -> tuple[int, ...]:
    header = line.split()
    if not header:
        raise ParseError("/proc/interrupts: no CPU header line")
    cpus: list[int] = []
    for token in header:
        if token[:3] != "CPU" or not _digits(token[3:]):
            raise ParseError(f"/proc/interrupts: header token {token[:40]!r} is not CPU<n>")
        cpus.append(int(token[3:]))
    if len(set(cpus)) != len(cpus):
        raise ParseError("/proc/interrupts: a CPU appears twice in the header")
    return tuple(cpus)


def _row(line: str, ncpu: int) -> IrqRow | None:
    """One row under a header of `ncpu` CPUs; None for a blank line."""
    label, colon, rest = line.partition(":")
    name = label.strip()
    if not colon or not name or not name.isascii() or " " in name or "\t" in name:
        if not line.strip():
            return None
        raise ParseError(f"/proc/interrupts: malformed line {line[:40]!r}")
    tokens = rest.split()
    head = "".join(tokens[:ncpu])
    if len(tokens) >= ncpu and head.isdigit() and head.isascii():
        counts = tuple(map(int, tokens[:ncpu]))
        tail = tokens[ncpu:]
        # A named row without a description is a single number (ERR on a 1-CPU machine)
        per_cpu = bool(tail) or _digits(name)
    elif len(tokens) == 1 and _digits(tokens[0]) and not _digits(name):
        counts, tail, per_cpu = (int(tokens[0]),), [], False  # ERR, MIS, Err
    else:
        raise ParseError(
            f"/proc/interrupts: row {name[:20]!r} does not have {ncpu} counts"
        )
    chip, hwirq = "", None
    if _digits(name):
        if not tail:
            raise ParseError(f"/proc/interrupts: IRQ {name[:20]} has no chip name")
        chip = tail[0]
        if len(tail) > 1:
            number = tail[1].partition("-")[0]
            hwirq = int(number) if _digits(number) else None
    return IrqRow(name, counts, per_cpu, chip, hwirq, " ".join(tail))


def parse_interrupts(text: str) -> Interrupts:
    """Parse /proc/interrupts.

    >>> parsed = parse_interrupts(
    ...     "           CPU0       CPU1       \\n"
    ...     " 36:          0      84951 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0\\n"
    ...     "LOC:     122488     132036   Local timer interrupts\\n"
    ...     "ERR:          0\\n")
    >>> parsed.cpus
    (0, 1)
    >>> parsed.rows[0]  # doctest: +NORMALIZE_WHITESPACE
    IrqRow(name='36', counts=(0, 84951), per_cpu=True, chip='PCI-MSIX-0000:00:02.0',
           hwirq=1, description='PCI-MSIX-0000:00:02.0 1-edge virtio1-req.0')
    >>> parsed.rows[1].counts, parsed.rows[2].per_cpu
    ((122488, 132036), False)
    """
    return InterruptsParser().parse(text)


class InterruptsParser:
    """parse_interrupts for a file read again and again: a line unchanged since the last
    parse under the same CPU header gives back the same IrqRow object, unparsed. On a
    256-core node most of a scrape's cost was turning idle IRQs' 256 counts into integers
    again; now it is proportional to the rows whose counts moved, and a reader can tell an
    unchanged row by identity (`row is previous_row`).

    >>> parser = InterruptsParser()
    >>> text = "   CPU0   CPU1\\n 36:   0   5  PCI-MSIX-0000:00:02.0  1-edge  virtio1\\n"
    >>> parser.parse(text).rows[0] is parser.parse(text).rows[0]
    True
    """

    def __init__(self) -> None:
        # (CPU header, line -> its row) of the last parse, replaced whole, never mutated:
        # a concurrent scrape sees the old pair or the new one.
        self._last: tuple[tuple[int, ...], dict[str, IrqRow]] = ((), {})

    def parse(self, text: str) -> Interrupts:
        lines = text.splitlines()
        if not lines:
            raise ParseError("/proc/interrupts: empty")
        cpus = _header(lines[0])
        last_cpus, last_lines = self._last
        known = last_lines if cpus == last_cpus else {}
        ncpu = len(cpus)
        rows: list[IrqRow] = []
        seen: dict[str, IrqRow] = {}
        for line in lines[1:]:
            row = known.get(line)
            if row is None:
                row = _row(line, ncpu)
                if row is None:
                    continue
            seen[line] = row
            rows.append(row)
        self._last = (cpus, seen)
        return Interrupts(cpus, rows)
