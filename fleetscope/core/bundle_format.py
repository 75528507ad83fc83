"""The bundle format `fleetscope-bundle/1` (docs/bundle-format.md): its layout names, the sizes
its files may have, reading meta.json, and where a sample's files are looked up.

    meta.json   {"format": "fleetscope-bundle/1", "hostname": "n1", "interval_s": 5.0,
                 "samples": [{"dir": "samples/s0000", "time": 1764660000.0}, ...],
                 "config": {...}}
    static/     captured once: proc/cpuinfo, topology, dmesg.txt, cmd/isa-check-<binary>.json,
                usr/local/Ascend/{driver,firmware}/version.info
    samples/s0000/  proc/stat ... cmd/perf-stat.csv  cmd/ethtool-S-<iface>.txt  agent.prom

Standard library only, and nothing of fleetscope: the collectors (through `--root`), bundle
recording (fleetscope/bundle/record.py) and reading (fleetscope/bundle/read.py) and the
diagnosis all take the format from here.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

BUNDLE_FORMAT = "fleetscope-bundle/1"

# Layout names, relative to the bundle directory or to a sample directory.
META = "meta.json"
STATIC = "static"
SAMPLES = "samples"
CMD = "cmd"  # command outputs, in a sample (perf, ethtool) or in static/ (isa check)
PERF_STAT = f"{CMD}/perf-stat.csv"  # perf stat -x, -a -e <events> -- sleep <interval>
PERF_ARGS = f"{CMD}/perf-stat.args"  # its argv, one word a line
AGENT_PROM = "agent.prom"  # the agent runtime's exposition, Redis queue depths merged
DMESG = "dmesg.txt"  # static/: output of `dmesg`
SIGILL_FAULTS = f"{CMD}/sigill-faults.json"  # static/: bytes around each SIGILL's instruction
# Inference accelerators (docs/accelerators.md): each tool's or exporter's output, verbatim.
NVIDIA_SMI_XML = f"{CMD}/nvidia-smi-q-x.xml"  # nvidia-smi -q -x
NVIDIA_SMI_CSV = f"{CMD}/nvidia-smi-query-gpu.csv"  # nvidia-smi --query-gpu=... --format=csv
NPU_SMI_INFO = f"{CMD}/npu-smi-info.txt"  # npu-smi info
ACCELERATOR_MATRIX = "accelerator-matrix.yaml"  # static/: the config's accelerator_matrix
# static/: the Ascend driver's and firmware's version files (the NPU firmware version)
ASCEND_DRIVER_VERSION = "usr/local/Ascend/driver/version.info"
ASCEND_FIRMWARE_VERSION = "usr/local/Ascend/firmware/version.info"


def sample_path(index: int) -> str:
    """`samples/s0003`: the directory of the index-th sample."""
    return f"{SAMPLES}/s{index:04d}"


def ethtool_file(interface: str) -> str:
    """`cmd/ethtool-S-<iface>.txt`: the output of `ethtool -S <iface>` in a sample."""
    return f"{CMD}/ethtool-S-{interface}.txt"


def accelerator_exporter_file(index: int) -> str:
    """`cmd/accelerator-exporter-<n>.prom`: the /metrics text of the n-th (from 0)
    accelerator_exporter_urls entry in a sample."""
    return f"{CMD}/accelerator-exporter-{index}.prom"


def isa_check_file(binary: str) -> str:
    """`cmd/isa-check-<binary>.json` in static/: `isa check --json` of a binary that died of
    SIGILL, against the recorded node's CPU."""
    return f"{CMD}/isa-check-{binary}.json"


# The most bytes read from a file no collector declares a limit for (collectors/evidence.py:
# each declares the most the kernel or the tool writes in its files), large enough for
# /proc/interrupts or cpuinfo of a 4,096-CPU machine, and for numa_maps as `bundle record`
# caps it: a bundle file above its limit is refused, not parsed, so a small archive cannot
# cost gigabytes of RAM.
KIB, MIB = 1024, 1024 * 1024
DEFAULT_READ_LIMIT = 16 * MIB
# Distinct series of a whole replay: a recorded node gives a few hundred (the rules read
# per-core and per-pool summaries), an agent runtime some thousands more.
MAX_SERIES = 100_000
MAX_META_BYTES = 64 * MIB  # meta.json: a day of samples at 0.1 s is ~35 MB


def load_meta(path: str) -> Any:
    """A bundle's meta.json, size-capped; ValueError for anything that is not sane JSON
    (RecursionError from a document nested thousands deep included)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = handle.read(MAX_META_BYTES + 1)
    if len(data) > MAX_META_BYTES:
        raise ValueError(f"larger than {MAX_META_BYTES // MIB} MiB")
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def sample_bundle(directory: str) -> tuple[str, float | None] | None:
    """(the bundle's static/, its interval_s) when the absolute `directory` is a sample of a
    bundle (`<bundle>/samples/s0003` with `<bundle>/meta.json` in the bundle format), else
    None. What was captured once (cpuinfo, topology) sits in static/ and is looked up there
    when a sample lacks it (docs/bundle-format.md). For a root given as a path (`--root`); a
    bundle that was opened hands out its samples' sources itself (fleetscope/bundle/read.py)."""
    bundle = os.path.dirname(os.path.dirname(directory))
    try:
        meta = load_meta(os.path.join(bundle, META))
    except (OSError, ValueError):
        return None
    if isinstance(meta, dict) and meta.get("format") == BUNDLE_FORMAT:
        return os.path.join(bundle, STATIC), meta.get("interval_s")
    return None
