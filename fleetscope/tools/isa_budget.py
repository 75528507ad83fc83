"""One time budget for the ELF files a command reads about SIGILL crashes: the bytes of a
faulting instruction (isa_fault.capture) and the whole-binary `isa check`, for the live
`diagnose` and `bundle record` (the exporter reads no ELF file).

    isa_scan_seconds: 30     # node config: all of one command's ELF reads together

Each read runs in a forked child that is killed at its deadline. A timeout inside the reading
code could not do it: a read from a stalled mount (NFS, a FUSE file system a local user
mounted) waits in the kernel, and decoding a 100 MB library takes Python a minute. A
file not read in time is named in `skipped`, and `reason()` says why and which key raises it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any

from fleetscope.tools.isa_extensions import InputError

DEFAULT_SECONDS = 30.0
CONFIG_KEY = "isa_scan_seconds"
# A faulting instruction is an ELF header, its program headers and 48 bytes: a file that
# takes longer is stalled, and the other crashes' reads should not wait for it.
CAPTURE_SECONDS = 2.0
MAX_RESULT_BYTES = 16 * 1024 * 1024


class IsaBudget:
    """The time left for one command's ELF reads, and the files it did not cover."""

    def __init__(self, seconds: float = DEFAULT_SECONDS):
        self.seconds = seconds
        self._deadline = time.monotonic() + seconds
        self.skipped: list[str] = []

    def left(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def reason(self) -> str:
        """Why some files were not read ("" when every read finished)."""
        if not self.skipped:
            return ""
        names = ", ".join(dict.fromkeys(os.path.basename(path) for path in self.skipped[:3]))
        more = f" and {len(self.skipped) - 3} more" if len(self.skipped) > 3 else ""
        return (f"ELF reads of {names}{more} not finished within the {self.seconds:g} s "
                f"budget of the ISA checks ({CONFIG_KEY} raises it)")

    def capture(self, path: str, crash) -> dict | None:
        """isa_fault.capture under the budget: None when it is not done in time."""
        from fleetscope.tools.isa_fault import capture

        try:
            return self._run(path, capture, (path, crash), CAPTURE_SECONDS)
        except InputError:
            return None

    def check(self, path: str, cpuinfo_text: str, cpu_source: str = "") -> dict | None:
        """isa.check_against_cpuinfo under the budget: None when it is not done in time;
        InputError for what the check refuses (not an ELF file, bad cpuinfo)."""
        from fleetscope.tools.isa import check_against_cpuinfo

        return self._run(path, check_against_cpuinfo, (path, cpuinfo_text, cpu_source), None)

    def _run(self, path: str, read: Callable[..., Any], args: tuple, cap: float | None):
        timeout = self.left() if cap is None else min(cap, self.left())
        done, value = in_child(read, args, timeout) if timeout > 0 else (False, None)
        if not done:
            self.skipped.append(path)
            return None
        if isinstance(value, dict) and set(value) == {"error"}:
            raise InputError(str(value["error"]))
        return value


def _prepare() -> None:
    """Import in the parent what the child runs: an import lock another thread held at the
    fork would stall the child (it is killed at its deadline, but never finishes)."""
    for name in ("elftools.elf.elffile", "iced_x86", "capstone", "fleetscope.tools.isa_x86"):
        try:
            __import__(name)
        except ImportError:
            pass


def in_child(read: Callable[..., Any], args: tuple, timeout: float) -> tuple[bool, Any]:
    """(True, read(*args)) from a forked child, (True, {"error": message}) for an exception
    it raised, (False, None) when it had not answered after `timeout` seconds (killed)."""
    _prepare()
    receive, send = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the parent's code
        code = 0
        try:
            os.close(receive)
            try:
                result = read(*args)
            except Exception as err:
                result = {"error": str(err) or type(err).__name__}
            payload = json.dumps(result).encode()
            while payload:
                payload = payload[os.write(send, payload):]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(send)
    deadline = time.monotonic() + timeout
    chunks, size, answered = [], 0, False
    try:
        while size <= MAX_RESULT_BYTES:
            ready, _, _ = select.select([receive], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(receive, 1 << 16)
            if not chunk:
                answered = True
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(receive)
        _end(pid)
    if not answered or not chunks:
        return False, None
    try:
        return True, json.loads(b"".join(chunks))
    except ValueError:
        return False, None


def _end(pid: int) -> None:
    """Kill the child and reap it; one stuck in an uninterruptible read is left (a zombie
    until it wakes) rather than waited for."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for _ in range(100):
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.01)
