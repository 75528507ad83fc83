"""The flight recorder: the node's own evidence kept on the node in a bounded ring that is a
bundle directory (docs/bundle-format.md) at every moment, so what reads a recording reads the
minutes before anyone logged in (`diagnose --bundle <state dir>/ring`).

    <state dir>/ring.lock            held by the exporter that records (one per directory)
    <state dir>/ring/META            the bundle's metadata: the samples kept, oldest first,
                                     each with its size ("bytes")
    <state dir>/ring/static/         what does not change (cpuinfo, topology), captured when
                                     the ring opens, and the kernel log, refreshed each sample
    <state dir>/ring/samples/sNNNN/  one sample each, as `bundle record` writes them

Crash safety: a sample is written under a name the metadata never holds (`.partial-sNNNN`)
and renamed into place, then the metadata is replaced (written beside, flushed, renamed). A
`kill -9` at any point leaves metadata naming complete samples only: at most the sample being
written is lost. Opening the ring again removes what the metadata does not name and continues
after the last sample. Samples past the span or the byte bound (config `ring_span_seconds`,
`ring_max_bytes`) go oldest first, once metadata that no longer names them is in place.

Node side: standard library and the bundle recorder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable

from fleetscope.bundle.commands import CommandOutputs
from fleetscope.bundle.record import (
    bundle_meta,
    capture_sample,
    capture_static,
    live_kernel_log,
)
from fleetscope.bundle.redact import Redactor
from fleetscope.collectors.source import DMESG, EvidenceSource
from fleetscope.core.bundle_format import META, SAMPLES, STATIC, load_meta, sample_path
from fleetscope.core.config import Config

log = logging.getLogger("fleetscope.ring")

RING = "ring"
LOCK = "ring.lock"
PARTIAL = ".partial-"


class RingUnavailable(Exception):
    """The ring cannot be kept in this directory; one line for the log."""


def _tree_bytes(path: str) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def _replace(path: str, text: str) -> None:
    """`path` holds `text` whole or not at all: written beside, flushed, renamed."""
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)


def _index(directory: str) -> int | None:
    """sNNNN's number, or None for any other name."""
    name = directory.rpartition("/")[2]
    return int(name[1:]) if name[:1] == "s" and name[1:].isdigit() else None


class FlightRecorder:
    """Samples `source` into `<state_dir>/ring` every `config.ring_interval_seconds`."""

    def __init__(self, state_dir: str, config: Config, source: EvidenceSource):
        self.state_dir = state_dir
        self.ring = os.path.join(state_dir, RING)
        self.config = config
        self.source = source
        self.interval = config.ring_interval_seconds
        self.redactor = Redactor(config.redact)
        self.samples: list[dict] = []
        self.next_index = 0
        self._lock: int | None = None
        self._commands: CommandOutputs | None = None
        self._kernel_log_from: str | None = None  # the command static/dmesg.txt came from

    def open(self) -> None:
        """Lock the directory, pick up the ring a previous exporter left, capture the static
        evidence; RingUnavailable says why the ring cannot be kept here."""
        try:
            os.makedirs(self.ring, mode=0o700, exist_ok=True)
            lock = os.open(os.path.join(self.state_dir, LOCK),
                           os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as err:
            raise RingUnavailable(f"cannot keep the flight recorder's ring in "
                                  f"{self.state_dir}: {err.strerror or err}") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            raise RingUnavailable(f"another exporter keeps the ring in {self.state_dir}: "
                                  "this one records nothing there") from None
        self._lock = lock
        self.samples = self._kept_samples()
        self._remove_unnamed()
        if self.samples:
            self.next_index = max(_index(s["dir"]) or 0 for s in self.samples) + 1
        capture_static(self.source, os.path.join(self.ring, STATIC))
        self._commands = CommandOutputs(self.config, self.source)

    def _kept_samples(self) -> list[dict]:
        """The samples the ring's metadata names whose directories are there."""
        try:
            meta = load_meta(os.path.join(self.ring, META))
        except (OSError, ValueError):
            return []
        kept = []
        for sample in meta.get("samples") or () if isinstance(meta, dict) else ():
            if isinstance(sample, dict) and isinstance(sample.get("dir"), str) \
                    and _index(sample["dir"]) is not None \
                    and sample["dir"] == sample_path(_index(sample["dir"])) \
                    and os.path.isdir(os.path.join(self.ring, sample["dir"])):
                kept.append({"dir": sample["dir"], "time": float(sample.get("time") or 0),
                             "bytes": int(sample.get("bytes") or 0)})
        return kept

    def _remove_unnamed(self) -> None:
        """Sample directories the metadata does not name: a sample cut by a kill, or one
        dropped once metadata without it was written."""
        named = {s["dir"].rpartition("/")[2] for s in self.samples}
        samples = os.path.join(self.ring, SAMPLES)
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(samples):
                if name not in named:
                    shutil.rmtree(os.path.join(samples, name), ignore_errors=True)

    def record_one(self, now: float | None = None) -> dict:
        """Capture one sample into the ring; the metadata entry it got."""
        now = time.time() if now is None else now
        relative = sample_path(self.next_index)
        final = os.path.join(self.ring, relative)
        partial = os.path.join(self.ring, SAMPLES, PARTIAL + os.path.basename(relative))
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial, mode=0o700)
        capture_sample(self.source, partial, now, self.interval, self.config, self.redactor,
                       self._commands)
        entry = {"dir": relative, "time": round(now, 3), "bytes": _tree_bytes(partial)}
        os.replace(partial, final)
        self.next_index += 1
        if self.samples and entry["time"] <= self.samples[-1]["time"]:
            entry["time"] = self.samples[-1]["time"] + 0.001  # a clock stepped back
        self.samples.append(entry)
        dropped = self._drop_oldest(now)
        self._refresh_kernel_log()
        _replace(os.path.join(self.ring, META), json.dumps(bundle_meta(
            self.interval, self.samples, self.config, self.redactor, self._kernel_log_from)))
        for sample in dropped:  # now that the metadata no longer names them
            shutil.rmtree(os.path.join(self.ring, sample["dir"]), ignore_errors=True)
        return entry

    def _drop_oldest(self, now: float) -> list[dict]:
        """Samples past the span or over the byte bound, oldest first; the newest stays."""
        dropped = []
        total = sum(s["bytes"] for s in self.samples)
        while len(self.samples) > 1 and (
                self.samples[0]["time"] < now - self.config.ring_span_seconds
                or total > self.config.ring_max_bytes):
            sample = self.samples.pop(0)
            total -= sample["bytes"]
            dropped.append(sample)
        return dropped

    def _refresh_kernel_log(self) -> None:
        """static/dmesg.txt as the kernel has it now (a live node's own root only): the
        event rules read a ring's crashes and OOM kills there."""
        if not self.source.own_root:
            return
        text, command = live_kernel_log(self.config.command_timeout_seconds)
        if text is not None:
            _replace(os.path.join(self.ring, STATIC, DMESG), text)
            self._kernel_log_from = command

    def run(self, stop: threading.Event) -> None:
        """A sample every interval until `stop`; a sample that fails is logged and skipped."""
        start = time.monotonic()
        while not stop.is_set():
            try:
                self.record_one()
            except (OSError, ValueError) as err:
                log.warning("flight recorder: a sample was not kept: %s", err)
            elapsed = time.monotonic() - start
            stop.wait(self.interval - elapsed % self.interval)

    def close(self) -> None:
        if self._commands is not None:
            self._commands.close()
            self._commands = None
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None


def start(state_dir: str, config: Config, source: EvidenceSource
          ) -> Callable[[], None] | None:
    """The exporter's flight recorder running in a thread, and how to stop it; None (one
    warning) where the directory cannot hold the ring."""
    recorder = FlightRecorder(state_dir, config, source)
    try:
        recorder.open()
    except RingUnavailable as err:
        log.warning("%s", err)
        return None
    stop = threading.Event()
    threading.Thread(target=recorder.run, args=(stop,), name="flight-recorder",
                     daemon=True).start()
    log.info("flight recorder: a sample every %g s into %s", recorder.interval, recorder.ring)

    def close() -> None:
        stop.set()
        recorder.close()
    return close
