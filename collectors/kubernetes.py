"""Collector `kubernetes`: what the kubelet decided on this node, per pool, never per pod
(pods are named in diagnoses; a pod label would grow without bound).

Inputs (node paths from the config's `kubernetes:` block, read under --root):

    var/log/pods/<namespace>_<pod>_<uid>/    the pods on the node (collectors/pods.py)
    var/lib/kubelet/cpu_manager_state        {"policyName":"static","defaultCpuSet":"0,3-7",
                                              "entries":{"<uid>":{"agent":"1-2"}},...}
    var/lib/kubelet/memory_manager_state     the memory manager's checkpoint, where present

Runs only when the config has a `kubernetes:` block or a pool matches by Kubernetes terms:
a node without Kubernetes pays nothing for it. A missing file is reported as an unavailable
source (`fleetscope_scrape_source_available 0`) whose reason names the read-only mount the
exporter's container needs.
"""

from __future__ import annotations

from collections.abc import Iterator

from fleetscope.core.exposition import Family, gauge, labels

from .base import Collector, NotAvailable, Scrape
from .parsers import ParseError
from .parsers.kubepods import parse_cpu_manager_state, parse_memory_manager_state
from .pods import MOUNT_HINT, exclusive_cpus, pod_index
from .processes import pool_processes


class KubernetesCollector(Collector):
    name = "kubernetes"

    @classmethod
    def wanted(cls, config) -> bool:
        return config.kubernetes.configured or any(p.by_pod for p in config.pools)

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        paths = self.config.kubernetes
        pools = self.config.pools
        kubelet = paths.relative(paths.kubelet_root)
        with scrape.source(self.name, "pod_logs"):
            index = pod_index(scrape, paths)
            yield gauge("fleetscope_kubernetes_pods",
                        "Pods on the node: directories of the kubelet's pod log directory "
                        "(/var/log/pods).").add(len(index.pods))
        state = None
        hint = MOUNT_HINT.format(path=f"{paths.kubelet_root}/cpu_manager_state")
        with scrape.source(self.name, "cpu_manager_state", hint):
            state = parse_cpu_manager_state(scrape.read_text(f"{kubelet}/cpu_manager_state"))
            yield gauge("fleetscope_kubernetes_cpu_manager_policy_info",
                        "The kubelet's CPU manager policy (none or static), from its "
                        "checkpoint.").add(1, labels(policy=state.policy))
            exclusive = frozenset().union(*(cpus for containers in state.exclusive.values()
                                            for cpus in containers.values()))
            yield gauge("fleetscope_kubernetes_exclusive_cpus",
                        "CPUs the static CPU manager gave containers for their own use."
                        ).add(len(exclusive))
        hint = MOUNT_HINT.format(path=f"{paths.kubelet_root}/memory_manager_state")
        with scrape.source(self.name, "memory_manager_state", hint):
            memory = parse_memory_manager_state(
                scrape.read_text(f"{kubelet}/memory_manager_state"))
            yield gauge("fleetscope_kubernetes_memory_manager_policy_info",
                        "The kubelet's memory manager policy (None or Static), from its "
                        "checkpoint.").add(1, labels(policy=memory.policy))
        if state is not None and any(p.by_pod for p in pools):
            yield self._pool_exclusive(scrape, state)

    def _pool_exclusive(self, scrape: Scrape, state) -> Family:
        """Per pool matched by Kubernetes terms: the CPUs its pods' containers hold
        exclusively (0: none, they share the default pool)."""
        family = gauge("fleetscope_pool_exclusive_cpus",
                       "CPUs the kubelet's static CPU manager gave the pool's containers "
                       "for their own use; 0 when they run on the shared pool.")
        by_pool: dict[tuple[str, str], set[int]] = {}
        try:
            members = pool_processes(scrape, self.config.pools)
        except (NotAvailable, ParseError):
            members = []
        for process in members:
            if not process.pool.by_pod:
                continue
            key = (process.pool.name, process.pool.workload_class)
            cpus = by_pool.setdefault(key, set())
            if process.pod is not None:
                cpus.update(exclusive_cpus(state, process.pod))
        for (pool, workload_class), cpus in sorted(by_pool.items()):
            family.add(len(cpus), labels(pool=pool, **{"class": workload_class}))
        return family

