"""Collector `tuning`: the kernel settings the troubleshooting guide asks to audit, as
`fleetscope_sysctl{name="net.core.somaxconn"} 4096`.

Inputs, one integer each (proc/sys/<name with dots as slashes>, printed by
kernel/sysctl.c proc_dointvec and friends):

    proc/sys/net/core/somaxconn        4096   accept queue bound (listen backlog cap)
    proc/sys/net/ipv4/tcp_tw_reuse     2      0 off, 1 on, 2 loopback only (the default)
    proc/sys/net/core/rmem_max         212992 largest socket receive buffer (bytes)
    proc/sys/net/core/wmem_max         212992 largest socket send buffer (bytes)
    proc/sys/kernel/threads-max        127868 threads the kernel allows in all
    proc/sys/kernel/pid_max            4194304 highest pid + 1: every thread takes one
    proc/sys/vm/max_map_count          65530  memory mappings per process

Each is optional: one missing (a kernel without IPv4, a read-only /proc/sys) costs that value
only. The net.* values are those of the network namespace the exporter runs in: run it with the
host network (hostNetwork in Kubernetes) to audit the node's.

The per-process limit the guide names (nofile >= 65535) is exported by the pools collector as
`fleetscope_pool_nofile_limit{pool, class}`: it reads /proc/<pid>/limits of every pool process
anyway, for the fd usage ratio.
"""

from __future__ import annotations

from collections.abc import Iterator

from fleetscope.core.exposition import Family, gauge, labels

from .base import Collector, Evidence, Scrape, Signal
from .parsers import ParseError, parse_int

SYSCTLS = (
    "net.core.somaxconn",
    "net.ipv4.tcp_tw_reuse",
    "net.core.rmem_max",
    "net.core.wmem_max",
    "kernel.threads-max",
    "kernel.pid_max",
    "vm.max_map_count",
)


def sysctl_path(name: str) -> str:
    """net.core.somaxconn -> proc/sys/net/core/somaxconn (kernel.threads-max keeps its dash)."""
    return "proc/sys/" + name.replace(".", "/")


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal("fleetscope_sysctl", "kernel settings, by sysctl name", ""),
)


class TuningCollector(Collector):
    name = "tuning"
    evidence = Evidence(signals=SIGNALS,

        # the kernel's boot command line (isolcpus, numa_balancing ...) for whoever reads
        # the bundle; no collector parses it
        once=("proc/cmdline",),
        sampled=tuple(sysctl_path(name) for name in SYSCTLS))

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        family = gauge(
            "fleetscope_sysctl",
            "Kernel settings the troubleshooting guide audits, by sysctl name "
            "(/proc/sys; net.* of the exporter's network namespace).",
        )
        for name in SYSCTLS:
            path = sysctl_path(name)
            with scrape.source(self.name, path):
                text = scrape.read_text(path).strip()
                if not text:
                    raise ParseError(f"/{path}: empty")
                family.add(parse_int(text, f"/{path}"), labels(name=name))
        if family.samples:
            yield family
