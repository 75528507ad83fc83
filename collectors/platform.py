"""The platform's theoretical peak memory bandwidth, where the CPU model tells it.

    peak = sockets x memory channels per socket x transfer rate (MT/s) x 8 bytes

for the server CPUs these clusters run, from the vendors' product specifications. The
config's `platform: memory_peak_bytes_per_second` wins whenever it is set: a node may run its
DIMMs below the CPU's top speed, or leave channels empty, and only the operator knows that.
Sockets are counted from the CPU topology (`physical_package_id`), else `physical id` in
/proc/cpuinfo, else NUMA nodes per socket as the model has them.
"""

from __future__ import annotations

import re

from .base import NotAvailable, Scrape
from .parsers import ParseError
from .parsers.cpuinfo import CpuModel, parse_cpuinfo
from .shared import numa_node_cpus

CPU_DIR = "sys/devices/system/cpu"


# (matcher, channels per socket, MT/s, NUMA nodes per socket by default, spec)
def _x86(family: str, models: set[str], name: str = ""):
    def match(model: CpuModel) -> bool:
        return (model.arch == "x86_64" and model.family == family and model.model in models
                and re.search(name, model.model_name) is not None)
    return match


KNOWN_PLATFORMS = (
    (lambda m: m.arch == "aarch64" and m.implementer == "0x48" and m.part == "0xd01",
     8, 2933, 2, "HiSilicon Kunpeng 920: 8 DDR4-2933 channels per socket (2 dies)"),
    (_x86("25", {"1"}), 8, 3200, 1, "AMD EPYC 7003 (Milan): 8 DDR4-3200 channels per socket"),
    (_x86("23", {"49"}), 8, 3200, 1, "AMD EPYC 7002 (Rome): 8 DDR4-3200 channels per socket"),
    (_x86("25", {"17", "160"}), 12, 4800, 1,
     "AMD EPYC 9004 (Genoa/Bergamo): 12 DDR5-4800 channels per socket"),
    (_x86("6", {"143"}), 8, 4800, 1, "Intel Xeon 4th gen (Sapphire Rapids): 8 DDR5-4800"),
    (_x86("6", {"106"}), 8, 3200, 1, "Intel Xeon 3rd gen (Ice Lake-SP): 8 DDR4-3200"),
    (_x86("6", {"85"}, r"Silver|Bronze"), 6, 2400, 1,
     "Intel Xeon Silver/Bronze 2nd gen (Cascade Lake): 6 DDR4-2400 channels"),
    (_x86("6", {"85"}, r"Gold|Platinum"), 6, 2933, 1,
     "Intel Xeon Gold/Platinum 2nd gen (Cascade Lake): 6 DDR4-2933 channels"),
)


def _sockets(scrape: Scrape, cpuinfo_text: str, nodes_per_socket: int) -> int | None:
    packages: set[str] = set()
    for name in scrape.listdir(CPU_DIR):
        if name.startswith("cpu") and name[3:].isdigit():
            try:
                packages.add(scrape.read_text(
                    f"{CPU_DIR}/{name}/topology/physical_package_id").strip())
            except NotAvailable:
                continue
    if packages:
        return len(packages)
    ids = set(re.findall(r"^physical id\s*:\s*(\d+)", cpuinfo_text, re.M))
    if ids:
        return len(ids)
    nodes = len(numa_node_cpus(scrape))
    return max(1, nodes // nodes_per_socket) if nodes else None


def derived_peak(scrape: Scrape) -> tuple[float, str] | None:
    """(bytes per second, how it was derived), or None for a CPU model not in the table."""
    def compute():
        text = scrape.read_text("proc/cpuinfo")
        model = parse_cpuinfo(text).model
        for match, channels, rate, nodes_per_socket, spec in KNOWN_PLATFORMS:
            if match(model):
                sockets = _sockets(scrape, text, nodes_per_socket)
                if not sockets:
                    return None
                peak = sockets * channels * rate * 1e6 * 8
                return peak, f"{sockets} socket(s) x {spec}"
        return None

    try:
        return scrape.memo("platform_peak", compute)
    except (NotAvailable, ParseError):
        return None
