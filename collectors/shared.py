"""Records that more than one collector reads, parsed once per scrape.

/proc/stat feeds both `cpu` (per-core time) and `pressure` (running/blocked tasks, context
switches); the NUMA topology (`/sys/devices/system/node/node*/cpulist`) groups per-core
series of both into per-node ones.
"""

from __future__ import annotations

from .base import NotAvailable, Scrape
from .parsers.procfs import ProcStat, parse_proc_stat
from .parsers.sysfs import parse_cpulist

NODE_DIR = "sys/devices/system/node"
PROC_STAT = "proc/stat"


def process_dir(pid: int | str) -> str:
    """proc/<pid>, relative to the root."""
    return f"proc/{pid}"


def process_file(pid: int | str, name: str) -> str:
    """proc/<pid>/<name>, relative to the root: a file of one process (`name` one the
    collectors declare per process, or a directory such as fd)."""
    return f"{process_dir(pid)}/{name}"


def proc_stat(scrape: Scrape) -> ProcStat:
    return scrape.memo(PROC_STAT, lambda: parse_proc_stat(scrape.read_text(PROC_STAT)))


def _read_numa_nodes(scrape: Scrape) -> dict[int, list[int]]:
    nodes: dict[int, list[int]] = {}
    missing = None
    for name in scrape.listdir(NODE_DIR):
        if name.startswith("node") and name[4:].isdigit():
            try:
                text = scrape.read_text(f"{NODE_DIR}/{name}/cpulist")
            except NotAvailable as err:  # that node's CPUs are "unknown", the rest still known
                missing = err
                continue
            nodes[int(name[4:])] = parse_cpulist(text, f"/{NODE_DIR}/{name}/cpulist")
    if missing is not None and not nodes:
        raise missing
    return nodes


def numa_node_cpus(scrape: Scrape) -> dict[int, list[int]]:
    """NUMA node -> its CPUs; empty on a kernel without NUMA (no node directory)."""
    return scrape.memo(NODE_DIR, lambda: _read_numa_nodes(scrape))


def numa_node_of_cpus(scrape: Scrape, cpus) -> dict[int, str]:
    """cpu -> NUMA node label value. Without NUMA every CPU is on node "0", as the kernel
    reports memory of a non-NUMA machine on node 0."""
    nodes = numa_node_cpus(scrape)
    if not nodes:
        return dict.fromkeys(cpus, "0")
    node_of = {cpu: str(node) for node, node_cpus in nodes.items() for cpu in node_cpus}
    # A CPU brought online after the topology was read has no node yet.
    return {cpu: node_of.get(cpu, "unknown") for cpu in cpus}
