"""The evidence a scrape reads, said by the caller: a live host or a recorded sample.

    LiveHost("/")         this node. Any root prefix works: `/host` in a container (the
                          host's /proc and /sys mounted there), or a directory whose proc/,
                          sys/ and dev/ are links or bind mounts of the host's. Files are read
                          under the root; commands (`perf stat`, `ethtool -S`) run here, the
                          agent endpoint and Redis are asked over the network.
    RecordedSample(...)   a bundle sample directory (`samples/s0003`, with the bundle's
                          `static/` behind it and its meta.json `interval_s`), or a fixture
                          tree: files and recorded command outputs are read
                          (`cmd/perf-stat.csv`, `cmd/ethtool-S-<iface>.txt`, `agent.prom`);
                          nothing runs and nothing is contacted.

A collector never guesses which one it has from the root's path or from the bundle layout:
it asks `scrape.evidence`. A recorded sample cannot run a command at all (`spawn` raises), so
replaying a fixture tree never starts the real perf.

The caller decides, once: `evidence_source(root, mode)` is the only place a root string
becomes a source. `mode` is "live", "recorded" or "auto"; auto takes a root as recorded when
it holds recorded evidence (a bundle sample directory, or a tree with `cmd/` or `agent.prom`)
or has no kernel /proc under it (a tree of plain files, e.g. a hand-made fixture), and as a
live host when its proc/ is the kernel's (`proc/self` is there: `/`, `/host`, a directory of
links to the host's proc and sys).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time

from fleetscope.core.bundle_format import BUNDLE_FORMAT, META, STATIC, load_meta

from .base import NotAvailable

log = logging.getLogger("fleetscope.collectors")

EVIDENCE_MODES = ("auto", "live", "recorded")
# What a recorded tree holds besides /proc and /sys: command outputs and the agent's metrics.
RECORDED_MARKERS = ("cmd", "agent.prom")
KILL_GRACE_SECONDS = 1.0  # wait for a SIGKILLed command; one stuck in the kernel is left
MAX_INTERVAL_SECONDS = 86400.0


class CommandTimeout(NotAvailable):
    """A command that did not finish within its timeout (killed with its process group)."""


class EvidenceSource:
    """What every source has: the roots files are read from (the first one wins), whether
    it is the live node, and the sample interval a recording was made at (None: unknown)."""

    live = False

    def __init__(self, roots: tuple[str, ...], interval_s: float | None = None):
        self.roots = tuple(roots)
        self.interval_s = interval_s

    def spawn(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        raise NotAvailable(f"{os.path.basename(argv[0])}: a recorded sample runs no commands")

    def run_commands(self, commands: dict[str, tuple[str, list[str]]], timeout: float,
                     env: dict[str, str] | None = None) -> dict[str, bytes | NotAvailable]:
        """key -> stdout of each (label, argv), run in parallel within `timeout` seconds; a
        failure is the key's NotAvailable (CommandTimeout when it hung and was killed)."""
        return {key: NotAvailable(f"{label}: a recorded sample runs no commands")
                for key, (label, _argv) in commands.items()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self.roots)})"


class RecordedSample(EvidenceSource):
    """A recorded sample: its directory, then the bundle's static/, and the bundle's
    interval. Reads only; `spawn` and `run_commands` refuse."""

    def __init__(self, directory: str, static: str | None = None,
                 interval_s: float | None = None):
        roots = (directory,) if static is None else (directory, static)
        super().__init__(roots, _interval(interval_s))


class LiveHost(EvidenceSource):
    """This machine, read through a root prefix; runs commands with kill-on-hang."""

    live = True

    def __init__(self, root: str = "/"):
        super().__init__((root,))

    def spawn(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """A command in its own session (so a timeout kills its whole process group), no
        stdin, stdout and stderr piped. OSError when it cannot start."""
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, start_new_session=True)

    def run_commands(self, commands: dict[str, tuple[str, list[str]]], timeout: float,
                     env: dict[str, str] | None = None) -> dict[str, bytes | NotAvailable]:
        """Each child is drained by its own thread, so a slow one never blocks the others on
        a full pipe. A child that does not die within KILL_GRACE_SECONDS of SIGKILL (stuck in
        a driver) is left to be reaped by subprocess's cleanup; the caller goes on."""
        deadline = time.monotonic() + timeout
        results: dict[str, bytes | NotAvailable] = {}
        threads = [threading.Thread(target=self._run_one,
                                    args=(key, label, argv, env, timeout, deadline, results),
                                    name=f"fleetscope-{label}", daemon=True)
                   for key, (label, argv) in commands.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return {key: results.get(key, NotAvailable(f"{label} failed"))
                for key, (label, _argv) in commands.items()}

    def _run_one(self, key: str, label: str, argv: list[str], env, timeout: float,
                 deadline: float, results: dict) -> None:
        try:
            proc = self.spawn(argv, env)
        except OSError as err:
            results[key] = NotAvailable(f"cannot run {argv[0]}: {err.strerror or err}")
            return
        try:
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill(proc)
            results[key] = CommandTimeout(
                f"{label} did not finish within {timeout:g} s (command_timeout_seconds); "
                "killed")
            return
        if proc.returncode != 0:
            message = err.decode("utf-8", "replace").strip().splitlines()
            results[key] = NotAvailable(f"{label} exited {proc.returncode}"
                                        + (f": {message[-1][:200]}" if message else ""))
            return
        results[key] = out


def kill(proc: subprocess.Popen, grace: float | None = KILL_GRACE_SECONDS) -> None:
    """SIGKILL a spawned command's process group (the command and its children), then wait
    up to `grace` seconds for it (None: do not wait)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except OSError:
            pass
    if grace is None:
        return
    try:
        proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        log.warning(
            "%s (pid %d) survived SIGKILL; it is stuck in the kernel",
            os.path.basename(str(proc.args[0])), proc.pid)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _interval(value) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and 0 < value < MAX_INTERVAL_SECONDS:
        return float(value)
    return None


def recorded_sample(directory: str) -> RecordedSample:
    """The recorded sample at `directory`: inside a bundle (`<bundle>/samples/sNNNN` with
    `<bundle>/meta.json` in the bundle format) with the bundle's static/ and interval_s,
    else the directory alone (a fixture tree)."""
    directory = os.path.abspath(directory)
    bundle = os.path.dirname(os.path.dirname(directory))
    try:
        meta = load_meta(os.path.join(bundle, META))
    except (OSError, ValueError):
        return RecordedSample(directory)
    if isinstance(meta, dict) and meta.get("format") == BUNDLE_FORMAT:
        return RecordedSample(directory, os.path.join(bundle, STATIC), meta.get("interval_s"))
    return RecordedSample(directory)


def holds_recorded_evidence(root: str) -> bool:
    """Whether `root` is a recording rather than a host: a bundle sample, a tree with
    recorded command outputs or agent metrics, or a tree without a kernel /proc."""
    if len(recorded_sample(root).roots) > 1:
        return True
    if any(os.path.lexists(os.path.join(root, marker)) for marker in RECORDED_MARKERS):
        return True
    # The kernel's procfs always has `self` (a link to the reader's /proc/<pid>); a tree of
    # copied files does not (bundle record never copies it).
    return not os.path.lexists(os.path.join(root, "proc", "self"))


def evidence_source(root: str, mode: str = "auto") -> EvidenceSource:
    """The source for `--root DIR` and `--evidence MODE` (see the module docstring)."""
    if mode not in EVIDENCE_MODES:
        raise ValueError(f"evidence must be one of {', '.join(EVIDENCE_MODES)}, got {mode!r}")
    if mode == "auto":
        mode = "recorded" if holds_recorded_evidence(root) else "live"
    return LiveHost(root) if mode == "live" else recorded_sample(root)
