"""The small interface every collector implements, and the per-scrape context it reads through.

A collector is one file in this folder with one class: it has a `name` (also its `collector`
label), is built from the config without touching /proc, and `collect(scrape)` yields metric
families. Every file it reads goes through `scrape.read_text("proc/stat")`, which prefixes the
root (`--root`), so a fixture tree or a bundle sample replays exactly as a live host.
"""

from __future__ import annotations

import errno
import os
import stat
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from fleetscope.core.bundle_format import read_limit
from fleetscope.core.exposition import Family

from .parsers import ParseError

if TYPE_CHECKING:
    from .source import EvidenceSource

T = TypeVar("T")

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


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

class NotAvailable(Exception):
    """The source does not exist on this machine (no such file, feature off in the kernel).

    The message says what is missing and, where known, how to enable it.
    """


class RefusedPath(NotAvailable):
    """A path that would leave the root (`..`, absolute, a link out) or is not a regular file.

    Such paths come from hostile or broken input (a label joined onto a file name, a link in
    a bundle): they are treated as absent, and their target is never read or quoted.
    """


def check_relative(relative: str) -> str:
    """`relative` itself, or RefusedPath when it could lead outside the root."""
    if relative.startswith("/") or "\0" in relative or ".." in relative.split("/"):
        raise RefusedPath(f"refused path {relative[:80]!r}: it would leave the root")
    return relative


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


class Collector:
    """Base class: subclasses set `name` and implement `collect`."""

    name = ""
    # (metric-name prefix, why its series are usually absent) for the series this collector
    # writes: the reason a rule that reads them gives when it cannot be evaluated.
    missing_hints: tuple[tuple[str, str], ...] = ()

    def __init__(self, config: Any):
        self.config = config

    @classmethod
    def wanted(cls, config: Any) -> bool:
        """Whether the exporter runs this collector when the config names no `collectors`:
        one that only applies to some nodes (Kubernetes) says no where the config does not
        ask for it, and costs such a node nothing."""
        return True

    def collect(self, scrape: Scrape) -> Iterator[Family]:
        raise NotImplementedError

    @classmethod
    def why_missing(cls, prefix: str, present: set[str]) -> str:
        """The usual reason `prefix`'s series are absent; a collector narrows it where the
        series the source does have say more."""
        return dict(cls.missing_hints)[prefix]


class Scrape:
    """What one collection pass sees: the evidence source, the time, and a memo of shared
    reads.

    `evidence` (collectors/source.py) says whether this is the live node or a recorded
    sample, runs commands (a live host only), and gives the roots files are read under: a
    tuple of roots alone is a source of files only, which runs nothing. `time` is the wall
    time of a live scrape or the recorded time of a bundle sample, so rates computed by
    collectors are right in both.
    """

    def __init__(self, evidence: EvidenceSource | tuple[str, ...], now: float | None = None):
        if isinstance(evidence, (tuple, list)):
            from .source import EvidenceSource

            evidence = EvidenceSource(tuple(evidence))
        self.evidence = evidence
        roots = self.roots = evidence.roots
        # Resolved roots: a file read must resolve inside the root it was found under (no
        # links out of a bundle). A live host's root is the host's own, links included (a
        # container's /host, a directory of links to /proc and /sys), and "/" contains
        # everything: a live node pays nothing.
        self._real_roots = {root: (None if evidence.live or os.path.abspath(root) == os.sep
                                   else os.path.realpath(root)) for root in roots}
        self.time = time.time() if now is None else now
        self._memo: dict[str, Any] = {}
        self._root_fds: dict[str, int] = {}
        # (collector, source) -> (available, reason); reported as fleetscope_scrape_source_*
        self.sources: dict[tuple[str, str], tuple[bool, str]] = {}
        self.errors: dict[str, str] = {}  # collector -> first error (makes success 0)

    def path(self, relative: str) -> str:
        """The first existing path for `relative` under the roots (for listings and stat)."""
        check_relative(relative)
        for root in self.roots:
            candidate = os.path.join(root, relative)
            if os.path.exists(candidate):
                return candidate
        return os.path.join(self.roots[0], relative)

    def _inside(self, root: str, resolved: str) -> bool:
        real = self._real_roots.get(root)
        return real is None or resolved == real or resolved.startswith(real + os.sep)

    def _root_fd(self, root: str) -> int:
        """An O_PATH descriptor of a recorded root, opened once per scrape (-1: none)."""
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
        """The text of a file under the root, e.g. read_text("proc/stat").

        Only regular files that resolve inside the root are read, and at most
        `read_limit(relative)` bytes: past it the file is refused as corrupt (ParseError)."""
        check_relative(relative)
        for root in self.roots:
            text = self.read_guarded(root, relative)
            if text is not None:
                return text
        raise NotAvailable(f"/{relative} does not exist")

    def guarded(self, root: str) -> bool:
        """Whether reads under `root` are checked (a recorded root, not the live host's)."""
        return self._real_roots.get(root) is not None

    def read_guarded(self, root: str, relative: str) -> str | None:
        """read_text under one root; None when the file is not there."""
        try:
            fd = self._open_regular(root, relative)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as err:  # EACCES, EOPNOTSUPP (PSI disabled), EIO, ELOOP
            raise NotAvailable(f"/{relative}: {err.strerror or err}") from None
        limit = read_limit(relative)
        try:
            data = _read_bounded(fd, limit + 1)
        except OSError as err:
            raise NotAvailable(f"/{relative}: {err.strerror or err}") from None
        finally:
            os.close(fd)
        if len(data) > limit:
            raise ParseError(f"/{relative}: larger than {limit} bytes, more than the kernel "
                             "writes there: refused")
        return data.decode("utf-8", "replace")

    def listdir(self, relative: str) -> list[str]:
        """Entry names of a directory under the roots (merged across them), sorted."""
        check_relative(relative)
        names: set[str] = set()
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
            names.update(entries)
        return sorted(names)

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """Compute a shared record once per scrape (e.g. parsed /proc/stat for two collectors).

        A failure is remembered too, so every collector that needs the record sees the same
        error without reading the file again.
        """
        if key not in self._memo:
            try:
                self._memo[key] = (True, compute())
            except (NotAvailable, ParseError) as err:
                self._memo[key] = (False, err)
        ok, value = self._memo[key]
        if not ok:
            raise value
        return value

    @contextmanager
    def source(self, collector: str, source: str, hint: str = "") -> Iterator[None]:
        """Run one source of a collector: absence marks it unavailable, corruption an error.

        Either way the rest of the collector still runs, so a missing /proc/schedstat costs the
        run-queue metrics only. `hint` says how to get a missing source.
        """
        try:
            yield
        except NotAvailable as err:
            self.sources[(collector, source)] = (False, f"{err}{hint and ': ' + hint}")
        except ParseError as err:
            self.sources[(collector, source)] = (False, str(err))
            self.errors.setdefault(collector, str(err))
        else:
            self.sources[(collector, source)] = (True, "")
