"""Command outputs a bundle sample carries besides /proc and /sys (docs/bundle-format.md):

    cmd/perf-stat.csv         perf stat -x, -a -e <events> -- sleep <interval>, for the
                              interval ending at this sample (cmd/perf-stat.args: its argv)
    cmd/ethtool-S-<iface>.txt ethtool -S <iface>, for RDMA netdevs and configured interfaces
    static/cmd/isa-check-<binary>.json
                              `fleetscope isa check --json` of each binary the kernel log
                              saw die of SIGILL, against this node's CPU
    agent.prom                the agent runtime's metrics, with Redis queue depths merged
    cmd/accelerator-exporter-<n>.prom, cmd/nvidia-smi-q-x.xml, cmd/npu-smi-info.txt
                              the accelerator collector's sources, as they answered
                              (docs/accelerators.md); static/accelerator-matrix.yaml: a copy
                              of the config's accelerator_matrix

perf runs in the background across each interval, so recording does not stretch it. Each
part fails alone: a node without perf or ethtool records the rest. Commands are run by the
evidence source (collectors/source.py): a live host (`/`, `/host` in a container) runs them,
a recorded root (a fixture tree) has none to run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess

from fleetscope.bundle.files import copy_globs
from fleetscope.collectors.base import NotAvailable, Scrape
from fleetscope.collectors.cpu_features import CPUINFO
from fleetscope.collectors.source import EvidenceSource, Reader, kill
from fleetscope.core.bundle_format import (
    ACCELERATOR_MATRIX,
    AGENT_PROM,
    CMD,
    PERF_ARGS,
    PERF_STAT,
    ethtool_file,
    isa_check_file,
)
from fleetscope.core.config import Config

log = logging.getLogger("fleetscope.bundle")

ACCELERATOR_GLOBS = ("cmd/accelerator-exporter-*.prom", "cmd/nvidia-smi-q-x.xml",
                     "cmd/nvidia-smi-query-gpu.csv", "cmd/npu-smi-info.txt")


def _safe_file_part(name: str) -> bool:
    """A kernel-log label used in a file name must stay one path component (a task can
    name itself `../../x`)."""
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


class CommandOutputs:
    """Adds cmd/ and agent.prom to each sample; call `sample(dir, interval)` per sample and
    `close()` at the end."""

    def __init__(self, config: Config, source: EvidenceSource):
        self.config = config
        self.source = source
        self.live = source.live
        # The isa check looks for the crashed binaries on this file system and reads this
        # CPU: only when the source is this machine's own root.
        self.own_root = source.own_root
        self._perf: subprocess.Popen | None = None
        self._perf_argv: list[str] | None = None

    def _start_perf(self, interval: float) -> None:
        from fleetscope.collectors.perf import perf_stat_argv, select_events

        perf = os.environ.get("FLEETSCOPE_PERF") or shutil.which("perf")
        if not perf:
            return
        selection = select_events(Scrape(self.source))
        self._perf_argv = perf_stat_argv(perf, selection.events, interval)
        try:
            self._perf = self.source.spawn(self._perf_argv, {**os.environ, "LC_ALL": "C"})
        except (OSError, NotAvailable) as err:
            log.warning("perf could not start: %s", err)
            self._perf = None

    def _finish_perf(self, sample_dir: str) -> None:
        process, self._perf = self._perf, None
        if process is None:
            return
        try:
            output, _ = process.communicate(timeout=self.config.command_timeout_seconds)
        except subprocess.TimeoutExpired:
            kill(process, grace=None)  # perf and its `sleep`
            process.communicate()
            log.warning("perf stat did not finish within %gs: killed",
                        self.config.command_timeout_seconds)
            return
        os.makedirs(os.path.join(sample_dir, CMD), exist_ok=True)
        with open(os.path.join(sample_dir, PERF_STAT), "wb") as out:
            out.write(output)
        with open(os.path.join(sample_dir, PERF_ARGS), "w") as out:
            out.write("\n".join(["perf", *self._perf_argv[1:]]) + "\n")

    def _ethtool(self, sample_dir: str) -> None:
        from fleetscope.collectors.nic import NicCollector, run_ethtool

        interfaces = NicCollector(self.config).interfaces(Scrape(self.source))
        if not interfaces:
            return
        timeout = self.config.command_timeout_seconds
        for iface, text in run_ethtool(self.source, interfaces, timeout).items():
            if isinstance(text, NotAvailable):
                continue
            os.makedirs(os.path.join(sample_dir, CMD), exist_ok=True)
            with open(os.path.join(sample_dir, ethtool_file(iface)), "w") as out:
                out.write(text)

    def _agent(self, sample_dir: str) -> None:
        if not (self.config.agent_metrics_url or self.config.redis_queues):
            return
        from fleetscope.collectors.agent import agent_prom

        text = agent_prom(self.config)
        if text:
            with open(os.path.join(sample_dir, AGENT_PROM), "w") as out:
                out.write(text)

    def _accelerator(self, sample_dir: str) -> None:
        from fleetscope.collectors.accelerator import AcceleratorCollector, record_outputs

        if not AcceleratorCollector.wanted_on(self.config, self.source):
            return
        for relative, text in record_outputs(self.config, self.source).items():
            os.makedirs(os.path.join(sample_dir, CMD), exist_ok=True)
            with open(os.path.join(sample_dir, relative), "w", encoding="utf-8") as out:
                out.write(text)

    def matrix(self, static_dir: str, reader: Reader) -> None:
        """static/accelerator-matrix.yaml: the config's accelerator_matrix file as it is
        (replay judges the recorded devices by it), or a recorded root's copy."""
        from fleetscope.collectors.parsers.accelerator_matrix import MAX_MATRIX_CHARS

        if self.live:
            path = self.config.accelerator_matrix
            if not path:
                return
            try:
                with open(path, "rb") as handle:
                    data = handle.read(MAX_MATRIX_CHARS + 1)
            except OSError as err:
                log.warning("bundle: accelerator_matrix %s not copied: %s", path,
                            err.strerror or err)
                return
        else:
            try:
                data = reader.read_bytes(ACCELERATOR_MATRIX, MAX_MATRIX_CHARS + 1)
            except NotAvailable:
                return
        os.makedirs(static_dir, exist_ok=True)
        with open(os.path.join(static_dir, ACCELERATOR_MATRIX), "wb") as out:
            out.write(data)

    def static(self, static_dir: str, dmesg: str | None, budget=None) -> None:
        """Once per bundle: `isa check` of every binary the kernel log saw die of SIGILL that
        can be found on this node, against this node's CPU (cmd/isa-check-<binary>.json),
        within `budget` (fleetscope/tools/isa_budget.py). The binary stays behind; the
        bundle carries what it needs that the CPU lacks."""
        if not dmesg or not self.own_root:
            return
        from fleetscope.collectors.parsers import ParseError
        from fleetscope.collectors.parsers.kmsg import scan_kernel_log
        from fleetscope.tools.isa import InputError, locate_binary
        from fleetscope.tools.isa_budget import IsaBudget

        budget = budget or IsaBudget(self.config.isa_scan_seconds)

        try:
            crashes = scan_kernel_log(dmesg).crashes
            with open("/" + CPUINFO, encoding="utf-8", errors="replace") as handle:
                cpuinfo = handle.read()
        except (ParseError, OSError):
            return
        latest_first = list(dict.fromkeys(crash.binary for crash in reversed(crashes)))
        for binary in latest_first[:20]:  # the most recent crashes are the incident's
            if not _safe_file_part(binary):
                log.warning("bundle: not checking binary %r: the name cannot be a file name",
                            binary[:60])
                continue
            if not budget.left():
                break
            path = locate_binary(binary, directories=self.config.binary_dirs)
            if path is None:
                continue
            try:
                document = budget.check(path, cpuinfo, "/" + CPUINFO)
            except InputError as err:
                log.warning("bundle: isa check of %s failed: %s", path, err)
                continue
            if document is None:
                continue
            os.makedirs(os.path.join(static_dir, CMD), exist_ok=True)
            with open(os.path.join(static_dir, isa_check_file(binary)), "w") as out:
                json.dump(document, out, indent=1)
        if budget.reason():
            log.warning("bundle: %s", budget.reason())

    def sample(self, sample_dir: str, interval: float, reader: Reader) -> None:
        """The sample's recorded accelerator outputs (read by `reader`, the sample's pass
        over the source) or, on a live host, its command outputs."""
        if not self.live:
            # a replayed root has no commands to run and no endpoints to ask: its recorded
            # accelerator outputs are carried over as they are
            copy_globs(reader, ACCELERATOR_GLOBS, sample_dir)
            return
        for part in (self._finish_perf, self._ethtool, self._agent, self._accelerator):
            try:
                part(sample_dir)
            except Exception as err:  # one missing tool must not cost the bundle
                log.warning("bundle: %s failed: %s", part.__name__.strip("_"), err)
        self._start_perf(interval)

    def close(self) -> None:
        if self._perf is not None:
            kill(self._perf, grace=None)
            self._perf.communicate()
            self._perf = None
