"""Collector `accelerator`: the node's inference modules (NVIDIA GPUs, Huawei Ascend NPUs):
utilisation, device memory, temperature, power, errors, health, driver and firmware, and
whether that driver/firmware pair is in the operator's compatibility matrix.

Sources, in this order (docs/accelerators.md):
    accelerator_exporter_urls   the node's dcgm-exporter / npu-exporter /metrics, e.g.
        DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-...",modelName="NVIDIA A800-SXM4-80GB"} 0
        npu_chip_info_utilization{id="0",model_name="910Awn-Ascend-V1"} 0 1606402000000
      (the vendor is told from the metric names; collectors/parsers/exporter_metrics.py)
    accelerator_tools           else `nvidia-smi -q -x` and `npu-smi info`, run without a
                                shell; `auto` (the default): those on PATH, only when no
                                exporter url is set
    accelerator_matrix          the driver/firmware matrix (parsers/accelerator_matrix.py)
    usr/local/Ascend/{driver,firmware}/version.info
                                the Ascend packages' versions (parsers/ascend_version.py),
                                read through the scrape when an npu source found chips: the
                                NPU firmware, which neither npu source reports

Live (`scrape.evidence.live`): the exporter endpoints are fetched as the agent runtime's
endpoint is (collectors/agent.py): all at once, never longer than
`accelerator_timeout_seconds` in all; a slow endpoint leaves its request finishing in the
background and this scrape reports the source unavailable. The tools run in a background
thread, killed past the same timeout, and a scrape serves the latest completed run with its
age (`fleetscope_accelerator_sample_age_seconds`) while starting the next: a scrape waits for
a tool only until its first run ends or the timeout passes. Replay (a recorded sample)
reads `cmd/accelerator-exporter-<n>.prom`, `cmd/nvidia-smi-q-x.xml`,
`cmd/nvidia-smi-query-gpu.csv` and `cmd/npu-smi-info.txt`, and the matrix from the bundle's
`static/accelerator-matrix.yaml`: no network, no tool, not the recorded machine's paths.

A source that is absent or unreadable is reported through fleetscope_scrape_source_* with
the reason and costs its own series only; a device seen by two sources is reported once,
by the first. A node with no module and no configured source does not run this collector at
all (`wanted_on`): the default deployment pays nothing for it.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator

from fleetscope.core.bundle_format import (
    ACCELERATOR_MATRIX,
    ASCEND_DRIVER_VERSION,
    ASCEND_FIRMWARE_VERSION,
    CMD,
    KIB,
    NPU_SMI_INFO,
    NVIDIA_SMI_CSV,
    NVIDIA_SMI_XML,
    accelerator_exporter_file,
)
from fleetscope.core.exposition import Family, gauge, labels
from fleetscope.core.named_file import read_named_file

from .agent import _Background, fetch_exposition
from .base import Collector, Evidence, NotAvailable, Scrape, Signal, configured_but_unread
from .parsers import ParseError
from .parsers.accelerator import MAX_OUTPUT_CHARS, AcceleratorDevice
from .parsers.accelerator_matrix import MAX_MATRIX_CHARS, MatrixEntry, listed, parse_matrix
from .parsers.ascend_version import parse_driver_version_info, parse_firmware_version_info
from .parsers.exporter_metrics import parse_dcgm_exporter, parse_npu_exporter
from .parsers.npu_smi import parse_npu_smi_info
from .parsers.nvidia_smi_csv import parse_query_gpu_csv
from .parsers.nvidia_smi_xml import parse_nvidia_smi_xml
from .source import EvidenceSource, LiveHost

log = logging.getLogger("fleetscope.collectors.accelerator")

PREFIX = "fleetscope_accelerator_"
# tool -> (argv after the binary, recorded file, parser)
TOOLS: dict[str, tuple[tuple[str, ...], str, Callable[[str], list[AcceleratorDevice]]]] = {
    "nvidia-smi": (("-q", "-x"), NVIDIA_SMI_XML, parse_nvidia_smi_xml),
    "npu-smi": (("info",), NPU_SMI_INFO, parse_npu_smi_info),
}
# The device nodes the vendors' drivers create: a node with a module has one even when the
# tools are not on the exporter's PATH.
DEVICE_GLOBS = ("dev/nvidia0", "dev/davinci[0-9]*")
_EXPORTER_FILE = re.compile(r"accelerator-exporter-([0-9]{1,4})\.prom\Z")
MATRIX_SOURCE = "accelerator_matrix"
# The Ascend packages' version files: (source name, file, parser, AcceleratorDevice field).
ASCEND_VERSION_FILES = (
    ("ascend-driver-version", ASCEND_DRIVER_VERSION, parse_driver_version_info,
     "driver_version"),
    ("ascend-firmware-version", ASCEND_FIRMWARE_VERSION, parse_firmware_version_info,
     "firmware_version"),
)
ASCEND_SOURCES = ("npu-exporter", "npu-smi")
# A tool run is not started again within this many seconds of the last one ending: two
# Prometheus replicas scraping a node share one run instead of doubling the tools' cost.
MIN_RERUN_SECONDS = 5.0


EXPORTER_SOURCE = "accelerator-exporter-"


def exporter_source(index: int) -> str:
    """The source name of the index-th exporter url (fleetscope_scrape_source_*)."""
    return f"{EXPORTER_SOURCE}{index}"


def parse_exporter(text: str) -> tuple[list[AcceleratorDevice], str]:
    """The devices of a vendor exporter's /metrics and which exporter it is, told from its
    metric names; ParseError when it is neither's."""
    if "DCGM_FI_" in text:
        return parse_dcgm_exporter(text), "dcgm-exporter"
    if "npu_chip_info_" in text:
        return parse_npu_exporter(text), "npu-exporter"
    raise ParseError("neither dcgm-exporter (DCGM_FI_*) nor npu-exporter (npu_chip_info_*) "
                     "metrics")


def tools_to_run(config, which: Callable[[str], str | None] = shutil.which) -> dict[str, str]:
    """tool -> its path: the configured list, or under `auto` the ones on PATH when no
    exporter url is set."""
    tools = config.accelerator_tools
    if tools == "auto":
        if config.accelerator_exporter_urls:
            return {}
        tools = tuple(TOOLS)
    found = {}
    for tool in tools:
        path = which(tool)
        found[tool] = path or ""
    if config.accelerator_tools == "auto":
        found = {tool: path for tool, path in found.items() if path}
    return found


def has_module(root: str = "/") -> bool:
    """Whether the node shows a vendor's device node under `root` or a vendor tool on PATH."""
    if any(shutil.which(tool) for tool in TOOLS):
        return True
    return any(glob.glob(os.path.join(root, pattern)) for pattern in DEVICE_GLOBS)


def recorded_files(scrape: Scrape) -> list[str]:
    """The accelerator outputs a recorded sample holds, exporters first (by url index)."""
    names = scrape.listdir(CMD)
    exporters = sorted((int(m.group(1)), f"{CMD}/{name}") for name in names
                       if (m := _EXPORTER_FILE.match(name)))
    tools = [path for path in (NVIDIA_SMI_XML, NVIDIA_SMI_CSV, NPU_SMI_INFO)
             if os.path.basename(path) in names]
    return [path for _, path in exporters] + tools


class _ToolRuns:
    """The vendor tools, run together in a background thread when a scrape asks, no run is
    under way and the last ended MIN_RERUN_SECONDS ago or more; the latest completed run
    (outputs or errors per tool) is kept with the time it ended."""

    def __init__(self, source: EvidenceSource, tools: dict[str, str], timeout: float):
        self.source = source
        self.commands = {tool: (tool, [path or tool, *TOOLS[tool][0]])
                         for tool, path in tools.items()}
        self.timeout = timeout
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self.latest: tuple[float, dict[str, str | NotAvailable]] | None = None

    def _run(self) -> None:
        results: dict[str, str | NotAvailable] = {}
        runnable = {tool: command for tool, command in self.commands.items() if command[1][0]
                    and os.path.isabs(command[1][0])}
        for tool in self.commands.keys() - runnable.keys():
            results[tool] = NotAvailable(f"{tool} is not on PATH")
        try:
            outputs = self.source.run_commands(runnable, self.timeout,
                                               {**os.environ, "LC_ALL": "C"})
        except Exception as err:  # noqa: BLE001 (handed to the scrape as unavailable)
            outputs = {tool: NotAvailable(f"{tool}: {err}") for tool in runnable}
        for tool, output in outputs.items():
            results[tool] = output if isinstance(output, NotAvailable) \
                else output.decode("utf-8", "replace")
        with self._lock:
            self.latest = (time.time(), results)
        self._done.set()

    def refresh(self, deadline: float) -> tuple[float, dict[str, str | NotAvailable]] | None:
        """Start a run unless one is under way; the latest completed run, waiting for the
        first one until `deadline` (monotonic)."""
        with self._lock:
            idle = self._thread is None or not self._thread.is_alive()
            if idle and (self.latest is None
                         or time.time() - self.latest[0] >= MIN_RERUN_SECONDS):
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="fleetscope-accelerator-tools")
                self._thread.start()
            latest = self.latest
        if latest is None:
            self._done.wait(max(0.0, deadline - time.monotonic()))
            with self._lock:
                latest = self.latest
        return latest


# The families the rules read, titled for people (the console names absent ones so).
SIGNALS = (
    Signal(PREFIX + "healthy", "inference module health (1 healthy)", "check"),
    Signal(PREFIX + "last_xid", "inference module's last XID", "xid"),
    Signal(PREFIX + "matrix_listed",
           "driver/firmware pair listed in the matrix (1 listed)", "check"),
    Signal(PREFIX + "memory_total_bytes", "inference module memory size", "bytes"),
    Signal(PREFIX + "memory_used_bytes", "inference module memory used", "bytes"),
    Signal(PREFIX + "utilization_ratio", "inference module utilisation", "ratio"),
    Signal(PREFIX + "ecc_uncorrected_errors",
           "uncorrected ECC errors of an inference module", "errors"),
    Signal(PREFIX + "error_codes", "error codes an Ascend module raises now", "error codes"),
)


class AcceleratorCollector(Collector):
    name = "accelerator"
    evidence = Evidence(signals=SIGNALS,
                        once=(ASCEND_DRIVER_VERSION, ASCEND_FIRMWARE_VERSION),
                        read_limits={"version.info": 64 * KIB})
    # A configured source that failed leaves the same absence: say so, or an unreachable
    # exporter reads as a node without modules.
    missing_hints = ((PREFIX, "no inference module on this node, or no accelerator source "
                              "configured (accelerator_exporter_urls / accelerator_tools), or "
                              "the configured one unavailable (fleetscope_scrape_source_available"
                              "{collector=\"accelerator\"} 0: the exporter's log says why)"),
                     (PREFIX + "matrix_listed", "no compatibility matrix configured "
                                                "(accelerator_matrix) or it could not be read "
                                                "(the exporter's log says why), or the source "
                                                "names no driver/firmware pair the matrix can "
                                                "judge"))

    @classmethod
    def why_missing(cls, prefix: str, present: set[str],
                    unavailable: frozenset[str] = frozenset()) -> str:
        if prefix == PREFIX + "matrix_listed" and MATRIX_SOURCE in unavailable:
            return configured_but_unread([MATRIX_SOURCE])
        # an exporter url or a vendor tool that failed: not "no inference module"
        down = [s for s in unavailable if s.startswith(EXPORTER_SOURCE) or s in TOOLS]
        if down and PREFIX + "info" not in present:
            return configured_but_unread(down, "is the vendor exporter or tool up?")
        if PREFIX + "info" not in present:
            prefix = PREFIX  # no module seen at all
        return super().why_missing(prefix, present, unavailable)

    def __init__(self, config):
        super().__init__(config)
        urls = config.accelerator_exporter_urls
        self._endpoints = [_Background(exporter_source(i)) for i in range(len(urls))]
        self._tools: _ToolRuns | None = None
        self._tools_lock = threading.Lock()
        self._matrix: tuple[tuple, tuple[MatrixEntry, ...] | ParseError | NotAvailable] | None \
            = None

    @classmethod
    def wanted(cls, config) -> bool:
        return cls.wanted_on(config, LiveHost("/"))

    @classmethod
    def wanted_on(cls, config, source: EvidenceSource) -> bool:
        """A live node: a configured source, or under `auto` a module's device node or tool;
        a recorded sample: a configured source or the outputs it holds."""
        if config.accelerator_exporter_urls or (config.accelerator_tools != "auto"
                                                and config.accelerator_tools):
            return True
        if config.accelerator_tools != "auto":
            return False
        if source.live:
            return has_module(source.roots[0])
        return any(_EXPORTER_FILE.match(name) or f"{CMD}/{name}" in
                   (NVIDIA_SMI_XML, NVIDIA_SMI_CSV, NPU_SMI_INFO)
                   for name in source.reader().listdir(CMD))

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        if scrape.evidence.live:
            found, ages = self._live(scrape)
            matrix = self._live_matrix(scrape)
        else:
            found, ages = self._replay(scrape), {}
            matrix = self._recorded_matrix(scrape)
        found = self._with_ascend_versions(scrape, found)
        yield from families(found, matrix)
        if ages:
            age = gauge(PREFIX + "sample_age_seconds",
                        "Age of the vendor tool output this scrape serves (the tools run in "
                        "the background).")
            for tool, seconds in sorted(ages.items()):
                age.add(round(max(0.0, seconds), 3), labels(source=tool))
            yield age

    # -- sources ---------------------------------------------------------------------

    def _live(self, scrape: Scrape) -> tuple[list[tuple[AcceleratorDevice, str]], dict]:
        timeout = self.config.accelerator_timeout_seconds
        deadline = time.monotonic() + timeout
        urls = self.config.accelerator_exporter_urls
        pending = [(index, background.start(lambda url=url, index=index: fetch_exposition(
            url, timeout, what=exporter_source(index)), timeout))
            for index, (url, background) in enumerate(zip(urls, self._endpoints, strict=True))]
        tools = self._tool_runs(scrape)
        latest = tools.refresh(deadline) if tools is not None else None
        if tools is None and not urls:
            with scrape.source(self.name, "accelerator_tools"):
                raise NotAvailable("no accelerator_exporter_urls, and neither nvidia-smi nor "
                                   "npu-smi on PATH")
        found: list[tuple[AcceleratorDevice, str]] = []
        for index, result in pending:
            with scrape.source(self.name, exporter_source(index),
                               "is the dcgm-exporter / npu-exporter up and serving /metrics?"):
                devices, kind = parse_exporter(result(deadline))
                found.extend((device, kind) for device in devices)
        ages = {}
        if tools is not None:
            for tool in tools.commands:
                with scrape.source(self.name, tool):
                    if latest is None:
                        raise NotAvailable(f"{tool}: no answer within {timeout:g} s")
                    ended, outputs = latest
                    ages[tool] = scrape.time - ended
                    output = outputs[tool]
                    if isinstance(output, NotAvailable):
                        raise output
                    found.extend((device, tool) for device in TOOLS[tool][2](output))
        return found, ages

    def _tool_runs(self, scrape: Scrape) -> _ToolRuns | None:
        with self._tools_lock:
            if self._tools is None:
                tools = tools_to_run(self.config)
                if not tools:
                    return None
                self._tools = _ToolRuns(scrape.evidence, tools,
                                        self.config.accelerator_timeout_seconds)
            return self._tools

    def _replay(self, scrape: Scrape) -> list[tuple[AcceleratorDevice, str]]:
        found: list[tuple[AcceleratorDevice, str]] = []
        files = recorded_files(scrape)
        for index in range(len(self.config.accelerator_exporter_urls)):
            if accelerator_exporter_file(index) not in files:
                with scrape.source(self.name, exporter_source(index)):
                    raise NotAvailable(f"/{accelerator_exporter_file(index)}: the bundle was "
                                       "recorded without it")
        for path in files:
            name = os.path.basename(path)
            match = _EXPORTER_FILE.match(name)
            if match:
                source = exporter_source(int(match.group(1)))
            elif path == NVIDIA_SMI_CSV:
                source = "nvidia-smi"
                if NVIDIA_SMI_XML in files:
                    continue  # the same GPUs, read from the fuller report
            else:
                source = next(tool for tool, (_, file, _) in TOOLS.items() if file == path)
            with scrape.source(self.name, source):
                text = scrape.read_text(path)
                if match:
                    devices, kind = parse_exporter(text)
                elif path == NVIDIA_SMI_CSV:
                    devices, kind = parse_query_gpu_csv(text), "nvidia-smi"
                else:
                    devices, kind = TOOLS[source][2](text), source
                found.extend((device, kind) for device in devices)
        return found

    def _with_ascend_versions(self, scrape: Scrape, found: list[tuple[AcceleratorDevice, str]]
                              ) -> list[tuple[AcceleratorDevice, str]]:
        """The Ascend chips with the driver and firmware of the packages' version files. The
        driver file wins over npu-smi's banner (the same number but between an upgrade and
        its reboot): the pair judged is the one the packages install, both from the files.
        An absent file changes nothing and is no error; a corrupt one is its source's."""
        if not any(device.vendor == "huawei" and source in ASCEND_SOURCES
                   for device, source in found):
            return found
        versions: dict[str, str] = {}
        for name, path, parse, field in ASCEND_VERSION_FILES:
            try:
                text: str | ParseError = scrape.read_text(path)
            except NotAvailable:
                continue
            except ParseError as err:
                text = err
            with scrape.source(self.name, name):
                if isinstance(text, ParseError):
                    raise text
                versions[field] = parse(text).version
        if not versions:
            return found
        filled = []
        for device, source in found:
            if device.vendor == "huawei" and source in ASCEND_SOURCES:
                device = device._replace(
                    driver_version=versions.get("driver_version") or device.driver_version,
                    firmware_version=device.firmware_version
                    or versions.get("firmware_version"))
            filled.append((device, source))
        return filled

    # -- the matrix ------------------------------------------------------------------

    def _cached_matrix(self, key: tuple, read: Callable[[], str]
                       ) -> tuple[MatrixEntry, ...] | ParseError | NotAvailable:
        if self._matrix is None or self._matrix[0] != key:
            try:
                parsed: tuple[MatrixEntry, ...] | ParseError | NotAvailable = \
                    parse_matrix(read())
            except (ParseError, NotAvailable) as err:
                parsed = err
            self._matrix = (key, parsed)
        return self._matrix[1]

    def _live_matrix(self, scrape: Scrape) -> tuple[MatrixEntry, ...] | None:
        path = self.config.accelerator_matrix
        if not path:
            return None
        with scrape.source(self.name, MATRIX_SOURCE):
            try:
                info = os.stat(path)
            except OSError as err:
                raise NotAvailable(f"accelerator_matrix {path}: {err.strerror or err}") from None
            matrix = self._cached_matrix((path, info.st_mtime_ns, info.st_size),
                                         lambda: _read_file(path))
            if isinstance(matrix, ParseError):
                raise ParseError(f"{path}: {matrix}")
            if isinstance(matrix, Exception):
                raise matrix
            return matrix
        return None

    def _recorded_matrix(self, scrape: Scrape) -> tuple[MatrixEntry, ...] | None:
        if not self.config.accelerator_matrix and \
                not os.path.isfile(scrape.path(ACCELERATOR_MATRIX)):
            return None
        with scrape.source(self.name, MATRIX_SOURCE, "the bundle was recorded without it"):
            text = scrape.read_text(ACCELERATOR_MATRIX)
            matrix = self._cached_matrix((scrape.roots, text), lambda: text)
            if isinstance(matrix, Exception):
                raise matrix
            return matrix
        return None


def _read_file(path: str) -> str:
    """The matrix file's text; a FIFO or device named there is refused, not waited on."""
    try:
        # Up to 4 bytes a character: the parser refuses a text over MAX_MATRIX_CHARS.
        data = read_named_file(path, 4 * MAX_MATRIX_CHARS)
        return data.decode("utf-8", "replace")[:MAX_MATRIX_CHARS + 1]
    except OSError as err:
        raise NotAvailable(f"accelerator_matrix {path}: {err.strerror or err}") from None


# -- records -> families ---------------------------------------------------------------

def device_label(device: AcceleratorDevice) -> str:
    """"3", "3/0" (an Ascend chip of npu-smi) or "0/mig5" (a MIG instance)."""
    if device.gpu_instance is not None:
        return f"{device.index}/mig{device.gpu_instance}"
    if device.chip is not None:
        return f"{device.index}/{device.chip}"
    return str(device.index)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def families(found: list[tuple[AcceleratorDevice, str]],
             matrix: tuple[MatrixEntry, ...] | None) -> list[Family]:
    """The exporter's fleetscope_accelerator_* families of the devices found, each device
    once (the first source that reported it)."""
    info = gauge(PREFIX + "info", "An inference accelerator (GPU, MIG instance, NPU chip) with "
                 "its model, driver and firmware (VBIOS); always 1.")
    values = {
        "utilization": gauge(PREFIX + "utilization_ratio",
                             "Busy ratio (GPU utilisation, Ascend AI core), 0-1."),
        "used": gauge(PREFIX + "memory_used_bytes", "Device memory in use (framebuffer, HBM)."),
        "total": gauge(PREFIX + "memory_total_bytes", "Device memory size (used + free where "
                       "the source gives no total)."),
        "temperature": gauge(PREFIX + "temperature_celsius", "Device temperature."),
        "power": gauge(PREFIX + "power_watts", "Device power draw."),
        "ecc_uncorrected": gauge(PREFIX + "ecc_uncorrected_errors",
                                 "Uncorrected (double-bit) ECC errors since the driver loaded."),
        "ecc_corrected": gauge(PREFIX + "ecc_corrected_errors",
                               "Corrected (single-bit) ECC errors since the driver loaded."),
        "xid": gauge(PREFIX + "last_xid", "The last XID error the driver reported (DCGM); 0: "
                     "none."),
        "errors": gauge(PREFIX + "error_codes", "Error codes the Ascend chip raises now "
                        "(npu-exporter); 0: none."),
        "healthy": gauge(PREFIX + "healthy", "The vendor's health verdict: 1 healthy, 0 not."),
    }
    listed_family = gauge(PREFIX + "matrix_listed", "Whether the device's driver/firmware pair "
                          "is in the operator's accelerator_matrix: 1 listed, 0 not.")
    seen: set[tuple[str, str]] = set()
    for device, source in found:
        try:
            key = (device.vendor, device_label(device))
            if key in seen:
                continue
            seen.add(key)
            _add_device(device, source, info, values, listed_family, matrix)
        except (TypeError, ValueError, AttributeError):
            log.debug("accelerator record skipped: %r", device, exc_info=True)
    out = [info, *values.values()]
    if matrix is not None:
        out.append(listed_family)
    return [family for family in out if family.samples]


def _add_device(device: AcceleratorDevice, source: str, info: Family,
                values: dict[str, Family], listed_family: Family,
                matrix: tuple[MatrixEntry, ...] | None) -> None:
    where = labels(vendor=device.vendor, device=device_label(device))
    rows: list[tuple[str, float]] = []
    if _finite(device.utilization_percent):
        rows.append(("utilization", device.utilization_percent / 100.0))
    if _finite(device.memory_used_bytes):
        rows.append(("used", device.memory_used_bytes))
    total = device.memory_total_bytes
    if not _finite(total) and _finite(device.memory_used_bytes) \
            and _finite(device.memory_free_bytes):
        total = device.memory_used_bytes + device.memory_free_bytes
    if _finite(total):
        rows.append(("total", total))
    for field, key in (("temperature_c", "temperature"), ("power_w", "power"),
                       ("ecc_uncorrected", "ecc_uncorrected"),
                       ("ecc_corrected", "ecc_corrected"), ("last_xid", "xid")):
        value = getattr(device, field)
        if _finite(value):
            rows.append((key, value))
    if source == "npu-exporter":  # the one source that reports raised codes
        rows.append(("errors", len(device.error_codes)))
    if device.healthy is not None:
        rows.append(("healthy", 1 if device.healthy else 0))
    identity = dict(vendor=device.vendor, device=device_label(device),
                    model=device.model or "", driver=device.driver_version or "",
                    firmware=device.firmware_version or "")
    verdict = listed(matrix, device.vendor, device.model, device.driver_version,
                     device.firmware_version) if matrix is not None else None
    # every value checked before any is added: a bad record adds nothing
    info.add(1, labels(**identity, source=source))
    for key, value in rows:
        values[key].add(value, where)
    if verdict is not None:
        listed_family.add(1 if verdict else 0, labels(**identity))


def record_outputs(config, source: EvidenceSource) -> dict[str, str]:
    """What `bundle record` writes in a sample: each exporter url's /metrics and each vendor
    tool's output, as they answered within accelerator_timeout_seconds (all at once), by
    their file names (docs/bundle-format.md). A source that fails, or answers more than a
    tool ever prints, is left out, as the collector leaves it out."""
    timeout = config.accelerator_timeout_seconds
    deadline = time.monotonic() + timeout
    pending = [(accelerator_exporter_file(index), _Background(exporter_source(index)).start(
        lambda url=url, index=index: fetch_exposition(url, timeout, what=exporter_source(index)),
        timeout)) for index, url in enumerate(config.accelerator_exporter_urls)]
    tools = {tool: (tool, [path, *TOOLS[tool][0]])
             for tool, path in tools_to_run(config).items() if path}
    outputs: dict[str, str] = {}
    for tool, output in source.run_commands(tools, timeout,
                                            {**os.environ, "LC_ALL": "C"}).items():
        if not isinstance(output, NotAvailable):
            outputs[TOOLS[tool][1]] = output.decode("utf-8", "replace")
    for relative, result in pending:
        try:
            outputs[relative] = result(deadline)
        except (NotAvailable, ParseError) as err:
            log.warning("bundle: %s not recorded: %s", relative, err)
    return {relative: text for relative, text in outputs.items()
            if len(text) <= MAX_OUTPUT_CHARS}
