"""Parsers for small sysfs files: CPU lists and NUMA node files.

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


def parse_numastat(text: str) -> dict[str, int]:
    """Parse nodeN/numastat (drivers/base/node.c numastat_show): `key value` lines.

    >>> parse_numastat("numa_hit 1196169\\nnuma_miss 0\\nother_node 12\\n")["other_node"]
    12
    """
    values: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise ParseError(f"numastat: malformed line {line[:40]!r}")
        values[parts[0]] = parse_int(parts[1], f"numastat {parts[0]}")
    if "numa_hit" not in values:
        raise ParseError("numastat: no numa_hit line")
    return values


def parse_distance(text: str) -> list[int]:
    """Parse nodeN/distance: SLIT distances to every online node, in node order.

    >>> parse_distance("10 12 20 22\\n")
    [10, 12, 20, 22]
    """
    distances = [parse_int(token, "node distance") for token in text.split()]
    if not distances:
        raise ParseError("node distance: empty")
    return distances


def parse_node_meminfo(text: str) -> dict[str, int]:
    """Parse nodeN/meminfo (drivers/base/node.c node_read_meminfo) into bytes; HugePages_*
    lines are counts, not kB, and are skipped.

    >>> parse_node_meminfo("Node 0 MemTotal:        4417308 kB\\nNode 0 HugePages_Total:     0\\n")
    {'MemTotal': 4523323392}
    """
    values: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 4 or parts[0] != "Node" or not parts[2].endswith(":"):
            raise ParseError(f"node meminfo: malformed line {line[:40]!r}")
        if len(parts) == 5 and parts[4] == "kB":
            values[parts[2][:-1]] = parse_int(parts[3], "node meminfo") * 1024
    if "MemTotal" not in values:
        raise ParseError("node meminfo: no MemTotal line")
    return values
