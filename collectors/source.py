"""The evidence a scrape reads, said by the caller: a live host or a recorded sample.

    LiveHost("/")         this node. Any root prefix works: `/host` in a container (the
                          host's /proc and /sys mounted there), or a directory whose proc/,
                          sys/ and dev/ are links or bind mounts of the host's. Files are read
                          under the root; commands (`perf stat`, `ethtool -S`) run here, the
                          agent endpoint and Redis are asked over the network.
    RecordedSample(...)   a bundle sample directory (`samples/s0003`, with the bundle's
                          `static/` behind it and its recorded interval), or a fixture
                          tree: files and recorded command outputs are read
                          (`cmd/perf-stat.csv`, `cmd/ethtool-S-<iface>.txt`, `agent.prom`);
                          nothing runs and nothing is contacted.

A collector never guesses which one it has from the root's path or from the bundle layout:
it asks `scrape.evidence`. A recorded sample cannot run a command at all (`spawn` raises), so
replaying a fixture tree never starts the real perf. Every file is read through the source
too: it holds the read limits and, for recorded evidence, the rule that only regular files
resolving inside the root are read; it says which kernel logs it has (`kernel_logs`).

The caller decides, once: `evidence_source(root, mode)` is the only place a root string
becomes a source. `mode` is "live", "recorded" or "auto"; auto takes a root as recorded when
it holds recorded evidence (a bundle sample directory, or a tree with `cmd/` or `agent.prom`)
or has no kernel /proc under it (a tree of plain files, e.g. a hand-made fixture), and as a
live host when its proc/ is the kernel's (`proc/self` is there: `/`, `/host`, a directory of
links to the host's proc and sys).
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import signal
import stat
import subprocess
import threading
import time
import weakref

from fleetscope.core.bundle_format import DMESG, sample_bundle

from .evidence import COLLECTORS
from .parsers import ParseError

log = logging.getLogger("fleetscope.collectors")

EVIDENCE_MODES = ("auto", "live", "recorded")
# What a recorded tree holds besides /proc and /sys: command outputs and the agent's metrics.
RECORDED_MARKERS = ("cmd", "agent.prom")
KMSG = "dev/kmsg"  # the live kernel log, under the root
KILL_GRACE_SECONDS = 1.0  # wait for a SIGKILLed command; one stuck in the kernel is left
MAX_INTERVAL_SECONDS = 86400.0

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


class NotAvailable(Exception):
    """The source does not exist on this machine (no such file, feature off in the kernel).

    The message says what is missing and, where known, how to enable it.
    """


class RefusedPath(NotAvailable):
    """A path that would leave the root (`..`, absolute, a link out) or is not a regular file.

    Such paths come from hostile or broken input (a label joined onto a file name, a link in
    a bundle): they are treated as absent, and their target is never read or quoted.
    """


class CommandTimeout(NotAvailable):
    """A command that did not finish within its timeout (killed with its process group)."""


def check_relative(relative: str) -> str:
    """`relative` itself, or RefusedPath when it could lead outside the root."""
    if relative.startswith("/") or "\0" in relative or ".." in relative.split("/"):
        raise RefusedPath(f"refused path {relative[:80]!r}: it would leave the root")
    return relative


class _Beneath:
    """openat2(2) with RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS (Linux 5.6): the kernel opens
    a recorded root's file only if every step of its path stays inside the root, in one
    call instead of open + readlink of /proc/self/fd (a third of a recorded read). Any
    refusal or error sends the read to the checked path, which decides; where the call is
    missing (an older kernel, a seccomp filter) it is not tried again."""

    NUMBER = 437  # the same on every architecture (the unified syscall table)
    RESOLVE = 0x02 | 0x08  # RESOLVE_NO_MAGICLINKS | RESOLVE_BENEATH

    def __init__(self) -> None:
        self.call = None
        try:
            import ctypes

            class OpenHow(ctypes.Structure):
                _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                            ("resolve", ctypes.c_uint64)]

            libc = ctypes.CDLL(None, use_errno=True)
            self.syscall = libc.syscall
            self.syscall.restype = ctypes.c_long
            self.how = OpenHow(_OPEN_FLAGS, 0, self.RESOLVE)
            self.how_ref = ctypes.byref(self.how)
            self.size = ctypes.sizeof(OpenHow)
            self.get_errno = ctypes.get_errno
            self.call = self._call
        except (OSError, AttributeError, ImportError):
            pass

    def _call(self, dirfd: int, relative: str) -> int:
        """The fd, or -1 (not opened this way: ask the checked path). A path that is not
        there inside the root (ENOENT, ENOTDIR) raises as os.open would."""
        fd = self.syscall(self.NUMBER, dirfd, relative.encode(), self.how_ref, self.size)
        if fd < 0:
            err = self.get_errno()
            if err in (errno.ENOENT, errno.ENOTDIR):
                raise (FileNotFoundError if err == errno.ENOENT else NotADirectoryError)(
                    err, os.strerror(err))
            if err in (errno.ENOSYS, errno.EPERM):  # no openat2 here (seccomp): never again
                self.call = None
            return -1
        return fd


_BENEATH = _Beneath() if os.uname().sysname == "Linux" else None


def _read_bounded(fd: int, most: int) -> bytes:
    """Up to `most` bytes of fd, in page-sized reads: /proc/sys handlers allocate a buffer
    of the size asked for, and fail a 16 MiB read with ENOMEM."""
    chunks = []
    size = 0
    while size < most:
        chunk = os.read(fd, min(65536, most - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


class Reader:
    """Reads of one pass under a source's roots (the first root holding a file wins).

    A recorded root's files are read only when they are regular files resolving inside the
    root, and at most the read limit its collector declares (collectors/evidence.py). The
    roots are resolved when the reader is made, so a root that moves between passes is
    followed."""

    def __init__(self, roots: tuple[str, ...]):
        self.roots = roots
        # Resolved roots: a file read must resolve inside the root it was found under (no
        # links out of a bundle). None: not checked ("/" holds everything).
        self._real_roots: dict[str, str | None] = {}
        for root in roots:
            real = os.path.realpath(root)
            self._real_roots[root] = None if real == os.sep else real
        self._root_fds: dict[str, int] = {}

    def path(self, relative: str) -> str:
        """The first existing path for `relative` under the roots (for listings and stat)."""
        check_relative(relative)
        for root in self.roots:
            candidate = os.path.join(root, relative)
            if os.path.exists(candidate):
                return candidate
        return os.path.join(self.roots[0], relative)

    def guarded(self, root: str) -> bool:
        """Whether reads under `root` are checked (a recorded root, not the live host's)."""
        return self._real_roots.get(root) is not None

    def _inside(self, root: str, resolved: str) -> bool:
        real = self._real_roots.get(root)
        return real is None or resolved == real or resolved.startswith(real + os.sep)

    def _root_fd(self, root: str) -> int:
        """An O_PATH descriptor of a recorded root, opened once per pass (-1: none)."""
        fd = self._root_fds.get(root)
        if fd is None:
            try:
                fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                weakref.finalize(self, os.close, fd)
            except OSError:
                fd = -1
            self._root_fds[root] = fd
        return fd

    def _open_regular(self, root: str, relative: str) -> int:
        """An fd of root/relative when it is a regular file resolving inside root.
        O_NONBLOCK: a FIFO planted in a bundle opens at once instead of waiting for a writer."""
        fd = -1
        checked = self._real_roots.get(root) is not None
        if checked and _BENEATH is not None and _BENEATH.call is not None:
            dirfd = self._root_fd(root)
            if dirfd >= 0:
                fd = _BENEATH.call(dirfd, relative)
                checked = fd < 0  # opened beneath the root: nothing left to check
        if fd < 0:
            path = root + relative if root[-1:] == "/" else f"{root}/{relative}"  # not join
            fd = os.open(path, _OPEN_FLAGS)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise RefusedPath(f"/{relative}: not a regular file: refused")
            if checked:
                try:
                    resolved = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    resolved = os.path.realpath(os.path.join(root, relative))
                if not self._inside(root, resolved):
                    raise RefusedPath(f"/{relative}: a link out of {root}: refused")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read_text(self, relative: str) -> str:
        """The text of a file under the roots, e.g. read_text("proc/stat"); past its
        declared read limit (collectors/evidence.py) the file is refused as corrupt
        (ParseError)."""
        check_relative(relative)
        for root in self.roots:
            text = self.read_under(root, relative)
            if text is not None:
                return text
        raise NotAvailable(f"/{relative} does not exist")

    def read_under(self, root: str, relative: str) -> str | None:
        """read_text under one root; None when the file is not there."""
        limit = COLLECTORS.read_limit(relative)
        data = self._bytes_under(root, relative, limit + 1)
        if data is None:
            return None
        if len(data) > limit:
            raise ParseError(f"/{relative}: larger than {limit} bytes, more than the kernel "
                             "writes there: refused")
        return data.decode("utf-8", "replace")

    def _bytes_under(self, root: str, relative: str, most: int) -> bytes | None:
        """Up to `most` bytes of root/relative opened as _open_regular opens it; None when
        the file is not there."""
        try:
            fd = self._open_regular(root, relative)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as err:  # EACCES, EOPNOTSUPP (PSI disabled), EIO, ELOOP
            raise NotAvailable(f"/{relative}: {err.strerror or err}") from None
        try:
            return _read_bounded(fd, most)
        except OSError as err:
            raise NotAvailable(f"/{relative}: {err.strerror or err}") from None
        finally:
            os.close(fd)

    def read_bytes(self, relative: str, most: int) -> bytes:
        """The first `most` bytes of a file under the roots, as read_text finds and opens it
        (a recorded root's regular files inside the root only), cut rather than refused past
        `most`: what `bundle record` copies."""
        check_relative(relative)
        for root in self.roots:
            data = self._bytes_under(root, relative, most)
            if data is not None:
                return data
        raise NotAvailable(f"/{relative} does not exist")

    def read_proc(self, relative: str, single: bool = False) -> str:
        """A per-process file (collectors/tasks.py): under a recorded root the checked read
        of read_text, so a FIFO or a link to /dev/zero planted at proc/<pid>/cmdline is
        refused, not read forever. A live host's reader reads it faster."""
        return self.read_text(relative)

    def read_head(self, relative: str, size: int) -> str | None:
        """The first `size` characters of a file, None when no root has it (or it does not
        parse: larger than its limit)."""
        check_relative(relative)
        for root in self.roots:
            try:
                text = self.read_under(root, relative)
            except (NotAvailable, ParseError):
                continue
            if text is not None:
                return text[:size]
        return None

    def listdir(self, relative: str) -> list[str]:
        """Entry names of a directory under the roots (merged across them), sorted; none
        when no root has it."""
        return self.entries(relative) or []

    def entries(self, relative: str) -> list[str] | None:
        """listdir's names, or None when no root has the directory (a recorded root's
        directory linked out of it counts as not there)."""
        check_relative(relative)
        names: set[str] | None = None
        for root in self.roots:
            directory = os.path.join(root, relative)
            try:
                entries = os.listdir(directory)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as err:
                raise NotAvailable(f"/{relative}: {err.strerror or err}") from None
            if self._real_roots.get(root) is not None and \
                    not self._inside(root, os.path.realpath(directory)):
                continue  # a link out of the bundle: its entries are not the bundle's
            names = set(entries) if names is None else names | set(entries)
        return None if names is None else sorted(names)

    def files_matching(self, pattern: str) -> list[str]:
        """The relative paths of the files under the roots that match a glob `pattern`
        (merged across roots, sorted). Under a recorded root a match that resolves outside
        it (a link out, or a directory linked out on the way) is left out."""
        check_relative(pattern)
        found: set[str] = set()
        for root in self.roots:
            checked = self._real_roots.get(root) is not None
            for path in glob.glob(os.path.join(root, pattern)):
                if os.path.isfile(path) and not (
                        checked and not self._inside(root, os.path.realpath(path))):
                    found.add(os.path.relpath(path, root))
        return sorted(found)


class LiveReader(Reader):
    """Reads of a live host's root: the host's own, links included (a container's /host, a
    directory of links to /proc and /sys), so nothing is checked against the root, and
    per-process files take the fast path."""

    def __init__(self, roots: tuple[str, ...]):
        self.roots = roots
        self._real_roots = dict.fromkeys(roots)
        self._root_fds = {}

    def read_proc(self, relative: str, single: bool = False) -> str:
        """read_text through os.open/os.read: skipping Python's buffered file object halves
        the cost of a small /proc file (7 us instead of 11 here), which is most of a
        500-process scrape. Same roots, same errors.

        `single`: the file is one seq_file record (stat, status, schedstat, syscall, wchan,
        limits, cgroup: single_open() renders it whole) or cmdline, so a read shorter than
        asked is the whole file and the empty read at the end is spared. Multi-record files
        (net/tcp) come a page at a time and are read to the end. Its paths are built from
        pids and tids, never from labels: it spares itself check_relative."""
        for root in self.roots:
            try:  # root + relative: os.path.join costs a microsecond a call
                fd = os.open(root + relative if root[-1:] == "/" else f"{root}/{relative}",
                             os.O_RDONLY)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as err:
                raise NotAvailable(f"/{relative}: {err.strerror or err}") from None
            try:
                data = os.read(fd, 65536)
                if data and not (single and len(data) < 65536):
                    chunks = [data]
                    while chunks[-1]:
                        chunks.append(os.read(fd, 65536))
                    data = b"".join(chunks)
            except OSError as err:  # ESRCH: the task exited between open and read
                raise NotAvailable(f"/{relative}: {err.strerror or err}") from None
            finally:
                os.close(fd)
            return data.decode("utf-8", "replace")
        raise NotAvailable(f"/{relative} does not exist")

    def read_bytes(self, relative: str, most: int) -> bytes:
        """Up to `most` bytes, nothing checked: the host's own files, links included
        (proc/self). Page-sized reads, as /proc/sys needs."""
        check_relative(relative)
        for root in self.roots:
            try:
                fd = os.open(os.path.join(root, relative), os.O_RDONLY | os.O_CLOEXEC)
                try:
                    return _read_bounded(fd, most)
                finally:
                    os.close(fd)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as err:  # EACCES, ESRCH: the process exited
                raise NotAvailable(f"/{relative}: {err.strerror or err}") from None
        raise NotAvailable(f"/{relative} does not exist")

    def read_head(self, relative: str, size: int) -> str | None:
        check_relative(relative)
        for root in self.roots:
            try:
                fd = os.open(os.path.join(root, relative), os.O_RDONLY)
            except OSError:
                continue
            try:
                return os.read(fd, size).decode("utf-8", "replace")
            finally:
                os.close(fd)
        return None


class EvidenceSource:
    """What every source has: the roots files are read from (the first one wins), whether
    it is the live node, the sample interval a recording was made at (None: unknown), and
    the kernel logs it holds, in the order they are read.

    Reads go through the source's `reader()`, one for each pass over the evidence (a root
    may move between passes: a live /proc does)."""

    live = False
    own_root = False  # this machine's own file system (a LiveHost of "/")
    kernel_logs: tuple[str, ...] = (DMESG,)

    def __init__(self, roots: tuple[str, ...], interval_s: float | None = None):
        self.roots = tuple(roots)
        self.interval_s = interval_s

    def reader(self) -> Reader:
        """The reads of one pass (a scrape): checked, as recorded evidence is read."""
        return Reader(self.roots)

    def read_text(self, relative: str) -> str:
        """One file read outside a scrape (read_text of a new reader)."""
        return self.reader().read_text(relative)

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


class RecordingOf(EvidenceSource):
    """A sample being recorded: the files just written to `directory`, in front of the
    source they were copied from (for what is not copied: fd links, process memory, TCP
    tables). Checked reads in the directory; the source's own rule behind it. Runs nothing."""

    def __init__(self, directory: str, behind: EvidenceSource):
        super().__init__((directory, *behind.roots), behind.interval_s)
        self.behind = behind

    def reader(self) -> Reader:
        reader = Reader(self.roots)
        if self.behind.live:
            reader._real_roots.update(dict.fromkeys(self.behind.roots))
        return reader


class LiveHost(EvidenceSource):
    """This machine, read through a root prefix; runs commands with kill-on-hang."""

    live = True
    kernel_logs = (KMSG, DMESG)

    def __init__(self, root: str = "/"):
        super().__init__((root,))
        # Whether the root is this machine's own file system (not a host mounted at /host):
        # only then are binaries found here the node's, and its CPU the one /proc describes.
        self.own_root = os.path.abspath(root) == os.sep

    def reader(self) -> Reader:
        return LiveReader(self.roots)

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
    """The recorded sample at `directory`: inside a bundle with the bundle's static/ and
    interval (core/bundle_format.py sample_bundle), else the directory alone (a fixture
    tree)."""
    directory = os.path.abspath(directory)
    bundle = sample_bundle(directory)
    if bundle is None:
        return RecordedSample(directory)
    return RecordedSample(directory, *bundle)


def holds_recorded_evidence(root: str) -> bool:
    """Whether `root` is a recording rather than a host: a bundle sample, a tree with
    recorded command outputs or agent metrics, or a tree without a kernel /proc."""
    if sample_bundle(os.path.abspath(root)) is not None:
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
