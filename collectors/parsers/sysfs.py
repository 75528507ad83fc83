"""Parsers for small sysfs files: CPU lists.

`/sys/devices/system/node/node1/cpulist` holds "32-63" or "0-63,128-191"; the kernel prints
it with the "%*pbl" format (lib/vsprintf.c bitmap_list_string), ranges only, no strides.
A memory-only node prints an empty line.
"""

from __future__ import annotations

from . import ParseError, parse_int

# Far above any real machine (the kernel's NR_CPUS tops out at 8192); a bound keeps a corrupt
# "0-4294967295" from allocating billions of ints.
MAX_CPUS = 65536


def parse_cpulist(text: str, what: str = "cpulist") -> list[int]:
    """Parse a kernel CPU list.

    >>> parse_cpulist("0-2,8,10-11\\n")
    [0, 1, 2, 8, 10, 11]
    >>> parse_cpulist("\\n")
    []
    """
    text = text.strip()
    if not text:
        return []
    cpus: list[int] = []
    for part in text.split(","):
        first, dash, last = part.partition("-")
        start = parse_int(first, what)
        end = parse_int(last, what) if dash else start
        if end < start or end >= MAX_CPUS:
            raise ParseError(f"{what}: bad range {part[:40]!r}")
        cpus.extend(range(start, end + 1))
    if len(cpus) > MAX_CPUS:
        raise ParseError(f"{what}: more than {MAX_CPUS} CPUs")
    return cpus
