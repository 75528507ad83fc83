"""Collector `numa`: NUMA allocation counters, node distances and memory, and per workload
pool how much of its resident memory sits on nodes its CPUs are not on.

Inputs:
    sys/devices/system/node/node2/numastat   numa_hit 1196169 / numa_miss 0 / ... / other_node 0
    sys/devices/system/node/node2/distance   20 22 10 12
    sys/devices/system/node/node2/meminfo    Node 2 MemTotal:       131596288 kB
    proc/<pid>/status (Cpus_allowed_list) and proc/<pid>/numa_maps of pool processes

numastat counts are pages (Documentation/admin-guide/numastat.rst); `other_node` and
`numa_miss` rising mean allocations landing on another node. The per-pool share reads
numa_maps, which makes the kernel walk the process's page tables: it is refreshed at most
every `numa_maps_min_interval_seconds` and served from the last reading in between. Node
distances (the firmware's SLIT) are read once per root and set of nodes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from fleetscope.core.bundle_format import KIB
from fleetscope.core.exposition import Family, counter, gauge, labels

from .base import Collector, Evidence, NotAvailable, Scrape, Signal
from .parsers import ParseError
from .parsers.process import parse_numa_maps
from .parsers.sysfs import parse_cpulist, parse_distance, parse_node_meminfo, parse_numastat
from .processes import pool_processes, process_status
from .shared import NODE_DIR, numa_node_cpus

NUMASTAT_FIELDS = ("numa_hit", "numa_miss", "numa_foreign", "interleave_hit", "local_node",
                   "other_node")
MEMINFO_FIELDS = ("MemTotal", "MemFree", "MemUsed", "FilePages", "AnonPages", "Shmem")



# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_numastat_pages_total", "NUMA allocation outcomes per node", "pages"),
    Signal("fleetscope_pool_numa_remote_memory_ratio",
           "share of a pool's memory on remote NUMA nodes", "ratio"),
)


class NumaCollector(Collector):
    name = "numa"
    evidence = Evidence(signals=SIGNALS,

        once=("sys/devices/system/node/online", "sys/devices/system/node/node*/cpulist",
              "sys/devices/system/node/node*/distance", "sys/devices/system/node/node*/meminfo"),
        sampled=("sys/devices/system/node/node*/numastat",),
        described=((NODE_DIR, "NUMA counters"),),
        read_limits={"cpulist": 64 * KIB, "numastat": 64 * KIB, "distance": 64 * KIB,
                     "meminfo": 64 * KIB})

    def __init__(self, config):
        super().__init__(config)
        self._lock = threading.Lock()
        self._pool_memory: tuple[float, dict] | None = None  # (time read, per-pool bytes)
        self._distance_rows: tuple[tuple, list] | None = None  # ((roots, nodes), samples)

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        try:
            nodes = numa_node_cpus(scrape)
            if not nodes:
                raise NotAvailable(f"/{NODE_DIR} has no node directories (kernel without NUMA)")
        except NotAvailable as err:  # absence, not a collector error
            scrape.sources[(self.name, NODE_DIR)] = (False, str(err))
            return
        yield from self._numastat(scrape, nodes)
        with scrape.source(self.name, f"{NODE_DIR}/node*/distance"):
            yield from self._distances(scrape, nodes)
        with scrape.source(self.name, f"{NODE_DIR}/node*/meminfo"):
            yield from self._meminfo(scrape, nodes)
        if self.config.pools:
            with scrape.source(self.name, "proc/<pid>/numa_maps"):
                yield from self._pool_locality(scrape, nodes)

    def _numastat(self, scrape: Scrape, nodes: dict) -> Iterator[Family]:
        pages = counter(
            "fleetscope_numastat_pages_total",
            "NUMA allocation outcomes per node, in pages (nodeN/numastat; other_node: "
            "allocated here for a process running on another node).",
        )
        for node in nodes:
            with scrape.source(self.name, f"{NODE_DIR}/node{node}/numastat"):
                stats = parse_numastat(scrape.read_text(f"{NODE_DIR}/node{node}/numastat"))
                for field in NUMASTAT_FIELDS:
                    if field in stats:
                        pages.add(stats[field], labels(numa_node=node, field=field))
        if pages.samples:
            yield pages

    def _distances(self, scrape: Scrape, nodes: dict) -> Iterator[Family]:
        distance = gauge(
            "fleetscope_numa_node_distance",
            "SLIT distance from a node to another (10 = local; nodeN/distance).",
        )
        node_ids = sorted(nodes)
        # The firmware's SLIT table cannot change while the node runs: read once per root
        # and set of nodes (memory hotplug adds a node, and so a new reading).
        key = (scrape.roots, tuple(node_ids))
        cached = self._distance_rows
        if cached is None or cached[0] != key:
            rows = []
            for node in node_ids:
                row = parse_distance(scrape.read_text(f"{NODE_DIR}/node{node}/distance"))
                if len(row) != len(node_ids):
                    raise ParseError(f"node{node}/distance has {len(row)} entries, "
                                     f"{len(node_ids)} nodes are online")
                rows += [(labels(numa_node=node, to_numa_node=other), value)
                         for other, value in zip(node_ids, row, strict=True)]
            cached = self._distance_rows = (key, rows)
        distance.samples.extend(cached[1])
        yield distance

    def _meminfo(self, scrape: Scrape, nodes: dict) -> Iterator[Family]:
        memory = gauge("fleetscope_numa_node_memory_bytes",
                       "Memory of each NUMA node by kind (nodeN/meminfo).")
        for node in sorted(nodes):
            values = parse_node_meminfo(scrape.read_text(f"{NODE_DIR}/node{node}/meminfo"))
            for field in MEMINFO_FIELDS:
                if field in values:
                    memory.add(values[field], labels(numa_node=node, field=field))
        yield memory

    def _read_pool_memory(self, scrape: Scrape, nodes: dict) -> dict:
        """Per pool: [local bytes, remote bytes, processes read]."""
        node_of_cpu = {cpu: node for node, cpus in nodes.items() for cpu in cpus}
        per_pool: dict = {}
        any_read = False
        for process in pool_processes(scrape, self.config.pools):
            base = f"proc/{process.pid}"
            try:
                status = process_status(scrape, process.pid)  # shared with pools and irq
                allowed = parse_cpulist(status.get("Cpus_allowed_list", ""))
                resident = parse_numa_maps(scrape.read_text(f"{base}/numa_maps"))
            except (NotAvailable, ParseError):
                continue  # exited, or a kernel thread without numa_maps
            any_read = True
            local_nodes = {node_of_cpu[cpu] for cpu in allowed if cpu in node_of_cpu}
            acc = per_pool.setdefault(process.pool, [0, 0, 0])
            for node, size in resident.items():
                acc[0 if node in local_nodes else 1] += size
            acc[2] += 1
        if not any_read and pool_processes(scrape, self.config.pools):
            raise NotAvailable("no numa_maps readable for any pool process (needs root)")
        return per_pool

    def _pool_locality(self, scrape: Scrape, nodes: dict) -> Iterator[Family]:
        with self._lock:
            cached = self._pool_memory
            fresh = (cached is None or scrape.time < cached[0]
                     or scrape.time - cached[0] >= self.config.numa_maps_min_interval_seconds)
        if fresh:
            per_pool = self._read_pool_memory(scrape, nodes)
            with self._lock:
                self._pool_memory = cached = (scrape.time, per_pool)
        read_at, per_pool = cached
        memory = gauge(
            "fleetscope_pool_memory_bytes",
            "Resident memory of a pool's processes on NUMA nodes of their allowed CPUs "
            "(locality=local) or on other nodes (remote), from numa_maps.",
        )
        ratio = gauge(
            "fleetscope_pool_numa_remote_memory_ratio",
            "Share of a pool's resident memory on NUMA nodes its processes' allowed CPUs are "
            "not on (0-1).",
        )
        for pool in self.config.pools:
            if pool not in per_pool:
                continue
            local, remote, _ = per_pool[pool]
            pool_labels = labels(pool=pool.name, **{"class": pool.workload_class})
            memory.add(local, pool_labels.plus(locality="local"))
            memory.add(remote, pool_labels.plus(locality="remote"))
            ratio.add(round(remote / (local + remote), 6) if local + remote else 0.0, pool_labels)
        age = gauge("fleetscope_pool_numa_maps_age_seconds",
                    "Age of the numa_maps reading behind the pool memory metrics.")
        age.add(round(scrape.time - read_at, 3))
        yield from (memory, ratio, age)
