"""Node collectors: one file each, registered here by name (also their `collector` label).

Importing this package does no I/O; collectors read only inside `collect()`.
"""

from .accelerator import AcceleratorCollector
from .agent import AgentCollector
from .base import Collector, NotAvailable, Scrape
from .cpu import CpuCollector
from .cpu_features import CpuFeaturesCollector
from .fork_limits import ForkLimitsCollector
from .harm import HarmCollector
from .irq import IrqCollector
from .kernel_stalls import KernelStallsCollector
from .kubernetes import KubernetesCollector
from .listen import ListenCollector
from .locks import LocksCollector
from .memory import MemoryCollector
from .nic import NicCollector
from .numa import NumaCollector
from .perf import PerfCollector
from .pools import PoolsCollector
from .pressure import PressureCollector
from .rdma import RdmaCollector
from .source import EvidenceSource, LiveHost, RecordedSample, evidence_source
from .syn_flood import SynFloodCollector
from .tcp import TcpCollector
from .tuning import TuningCollector
from .xid import XidCollector

COLLECTORS: dict[str, type[Collector]] = {
    cls.name: cls for cls in (CpuCollector, PressureCollector, NumaCollector)
}
COLLECTORS.update({c.name: c for c in (PoolsCollector, IrqCollector, TuningCollector)})

COLLECTORS[AgentCollector.name] = AgentCollector
COLLECTORS[CpuFeaturesCollector.name] = CpuFeaturesCollector
COLLECTORS.update({c.name: c for c in (RdmaCollector, NicCollector, TcpCollector)})
COLLECTORS[PerfCollector.name] = PerfCollector
COLLECTORS[KubernetesCollector.name] = KubernetesCollector
COLLECTORS[ForkLimitsCollector.name] = ForkLimitsCollector
COLLECTORS[KernelStallsCollector.name] = KernelStallsCollector
COLLECTORS[MemoryCollector.name] = MemoryCollector
COLLECTORS[LocksCollector.name] = LocksCollector
COLLECTORS[ListenCollector.name] = ListenCollector
COLLECTORS[HarmCollector.name] = HarmCollector
COLLECTORS[AcceleratorCollector.name] = AcceleratorCollector
COLLECTORS[XidCollector.name] = XidCollector
COLLECTORS[SynFloodCollector.name] = SynFloodCollector

__all__ = ["COLLECTORS", "Collector", "EvidenceSource", "LiveHost", "NotAvailable",
           "RecordedSample", "Scrape", "evidence_source"]
