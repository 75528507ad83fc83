"""Reading a bundle (`fleetscope-bundle/1`, docs/bundle-format.md): open, validate, replay.

    meta.json   {"format": "fleetscope-bundle/1", "hostname": "n1", "interval_s": 5.0,
                 "samples": [{"dir": "samples/s0000", "time": 1764660000.0}, ...],
                 "config": {...}}

A bundle is a directory or the same tree in a .tar.gz. Archives are unpacked into a
temporary directory as regular files and directories only: absolute paths, `..`, links and
device files are refused, and so are archives over the limits below (counted in unpacked
bytes, never in compressed ones: a 58 KB archive can hold a 2 GB sparse file; a member's
header is checked before tarfile reads it). A bundle holds at most MAX_SAMPLES samples, each
in its own directory, and replays into at most MAX_SERIES series (diagnose/evidence.py: the
agent runtime's are left out first). The
scratch directory is removed on every exit path, including Ctrl-C and SIGTERM (the CLI turns SIGTERM
into SystemExit so cleanups run). Inside a directory bundle only regular files resolving
inside it are read (collectors.base.Scrape).
Replaying runs the exporter's collectors over each sample directory through `--root`, so a
bundle yields exactly the series a live node would have exported; each sample is an explicit
RecordedSample (`Bundle.source`), so nothing is run or contacted.
"""

from __future__ import annotations

import math
import os
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field, replace

from fleetscope.collectors.source import RecordedSample
from fleetscope.core.bundle_format import (
    BUNDLE_FORMAT,
    DEFAULT_READ_LIMIT,
    MAX_SERIES,  # noqa: F401  (diagnose/evidence.py holds a replay to it)
    META,
    STATIC,
    load_meta,
)
from fleetscope.core.config import Config, ConfigError, parse_config

MAX_MEMBERS = 500_000
# A member's extended header (GNU long name or link, pax records) is read whole by tarfile
# before anything else looks at it: a name is at most PATH_MAX (4096) bytes.
MAX_HEADER_BYTES = 1024 * 1024
MAX_NAME_CHARS = 200  # of a member's name in an error line
# A day at one sample every ~9 s; replaying costs per sample, whatever its size.
MAX_SAMPLES = 10_000
# A 128-core node recorded for 10 minutes is ~100 MB unpacked; numa_maps, the largest file,
# is capped at 16 MiB by `bundle record`.
MAX_UNPACKED_BYTES = 1024**3
MAX_MEMBER_BYTES = 4 * DEFAULT_READ_LIMIT
SCRATCH_ENV = "FLEETSCOPE_SCRATCH_DIR"  # where archives unpack (default /dev/shm if roomy)

# What a bundle is, for the line that refuses something else.
WHAT_A_BUNDLE_IS = ("a bundle is the directory or .tar.gz that `fleetscope bundle record -o "
                    "PATH` writes on a node")
# The first bytes of the archives tarfile reads ("r:*"): gzip, bzip2, xz; a plain tar says
# "ustar" at offset 257.
_ARCHIVE_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")


class BundleError(Exception):
    """The bundle cannot be read; the message is one line for the user."""


@dataclass
class Sample:
    directory: str  # absolute path of the sample directory
    time: float  # unix seconds


@dataclass
class Bundle:
    root: str  # the unpacked bundle directory
    hostname: str
    interval_s: float
    samples: list[Sample]
    config_raw: dict
    _tempdir: str | None = None
    redacted: dict = field(default_factory=dict)  # what `bundle record` redacted, by kind

    def source(self, sample: Sample) -> RecordedSample:
        """The evidence source replaying `sample`: its directory, then the bundle's static/,
        and the bundle's interval (the perf window of a sample without perf-stat.args)."""
        return RecordedSample(sample.directory, os.path.join(self.root, STATIC),
                              self.interval_s)

    def config(self, override: Config | None = None) -> Config:
        """The recorded config (diagnosis uses it unless --config overrides)."""
        if override is not None:
            return override
        try:
            return parse_config(self.config_raw)
        except ConfigError as err:
            raise BundleError(f"meta.json config is invalid: {err}") from None

    def close(self) -> None:
        if self._tempdir:
            shutil.rmtree(self._tempdir, ignore_errors=True)
            self._tempdir = None

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile's member header, refusing an extended header over MAX_HEADER_BYTES before
    tarfile reads it whole (`_proc_member` is tarfile's hook for subclasses)."""

    def _proc_member(self, archive):
        if self.type in _EXTENDED_HEADERS and self.size > MAX_HEADER_BYTES:
            raise BundleError(f"{archive.name}: refused: an archive member header declares "
                              f"{self.size} bytes of name or attributes, over the "
                              f"{MAX_HEADER_BYTES // 1024**2} MiB limit of a header")
        return super()._proc_member(archive)


_EXTENDED_HEADERS = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
                     tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


def _name(member: tarfile.TarInfo) -> str:
    return repr(member.name[:MAX_NAME_CHARS]) + ("..." if len(member.name) > MAX_NAME_CHARS
                                                 else "")


def _member_path(name: str) -> str | None:
    """The member's path inside the target, or None when it would land outside it."""
    if name.startswith(("/", "\\")) or "\0" in name:
        return None
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if any(part == ".." for part in parts):
        return None
    return os.path.join(*parts) if parts else ""


def _copy_member(source, destination: str, size: int) -> int:
    """Copy at most `size` bytes (the size the header declares); returns bytes written."""
    written = 0
    with open(destination, "wb") as out:
        while written < size:
            chunk = source.read(min(1024 * 1024, size - written))
            if not chunk:
                break
            out.write(chunk)
            written += len(chunk)
    return written


def _extract(archive: tarfile.TarFile, target: str, path: str) -> int:
    """Regular files and directories only: links, devices and paths leaving the target are
    refused (what tarfile's `data` filter refuses, at a fraction of its per-member cost on
    bundles of thousands of small files). Sizes are the unpacked ones; returns their sum."""
    members = 0
    total = 0
    made: set[str] = set()
    for member in archive:
        members += 1
        if members > MAX_MEMBERS:
            raise BundleError(f"{path}: refused: more than {MAX_MEMBERS} archive members "
                              "(the member limit of a bundle)")
        relative = _member_path(member.name)
        if relative is None:
            raise BundleError(f"{path}: refused archive member {_name(member)}: "
                              "it would be written outside the bundle")
        if member.isdir():
            if relative:
                os.makedirs(os.path.join(target, relative), exist_ok=True)
            continue
        if not member.isfile():
            raise BundleError(f"{path}: refused archive member {_name(member)}: "
                              "links and special files have no place in a bundle")
        if member.size > MAX_MEMBER_BYTES:
            raise BundleError(f"{path}: refused archive member {_name(member)}: "
                              f"{member.size} bytes unpacked, over the "
                              f"{MAX_MEMBER_BYTES // 1024**2} MiB limit for one bundle file")
        total += max(member.size, 0)
        if total > MAX_UNPACKED_BYTES:
            raise BundleError(f"{path}: refused: over {MAX_UNPACKED_BYTES // 1024**2} MiB "
                              "unpacked (the size limit of a bundle)")
        destination = os.path.join(target, relative)
        parent = os.path.dirname(destination)
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        _copy_member(archive.extractfile(member), destination, member.size)
    return total


def _read_to_end(archive: tarfile.TarFile, path: str, total: int) -> None:
    """Past the last member: only the end-of-archive zeros, read to the stream's end.

    tarfile takes the first block that is not a valid header for the end of the archive
    and stops before the gzip trailer, whose CRC-32 it never checks: an archive damaged in
    a later gzip member (pigz, `cat a.gz b.gz`) read as the part before the damage. Read to
    the end, the decompressor checks every member's CRC and length (an error here)."""
    left = MAX_UNPACKED_BYTES - total
    while True:
        chunk = archive.fileobj.read(1024 * 1024)
        if not chunk:
            return
        if chunk.strip(b"\0"):
            raise BundleError(f"{path}: refused: a damaged archive (data that is not a member "
                              "after the last readable one)")
        left -= len(chunk)
        if left < 0:
            raise BundleError(f"{path}: refused: over {MAX_UNPACKED_BYTES // 1024**2} MiB "
                              "unpacked (the size limit of a bundle)")


def _scratch_dir() -> str | None:
    """Where to unpack: $FLEETSCOPE_SCRATCH_DIR, else memory-backed /dev/shm when it has
    room for the largest bundle accepted. A bundle is tens of thousands of small files; on a
    disk-backed /tmp creating them costs seconds."""
    if os.environ.get(SCRATCH_ENV):
        return os.environ[SCRATCH_ENV]
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return None
    free = stats.f_bavail * stats.f_frsize
    return "/dev/shm" if free > MAX_UNPACKED_BYTES + 256 * 1024**2 else None


def _unpack(path: str) -> tuple[str, str]:
    """Unpack a .tar.gz safely; returns (bundle root inside it, temp dir to remove)."""
    try:
        tempdir = tempfile.mkdtemp(prefix="fleetscope-bundle-", dir=_scratch_dir())
    except OSError as err:
        raise BundleError(f"cannot create a scratch directory to unpack {path}: "
                          f"{err.strerror or err}") from None
    try:
        with tarfile.open(path, "r:*", tarinfo=_BoundedTarInfo) as archive:
            _read_to_end(archive, path, _extract(archive, tempdir, path))
        # The tree may sit at the top or inside one folder (tar -C parent bundle-dir).
        if os.path.isfile(os.path.join(tempdir, META)):
            return tempdir, tempdir
        entries = os.listdir(tempdir)
        if len(entries) == 1 and os.path.isfile(os.path.join(tempdir, entries[0], META)):
            return os.path.join(tempdir, entries[0]), tempdir
        raise BundleError(f"{path}: archive has no meta.json, so not a fleetscope bundle "
                          f"({WHAT_A_BUNDLE_IS})")
    except BundleError:
        shutil.rmtree(tempdir, ignore_errors=True)
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError, RecursionError,
            zlib.error) as err:
        shutil.rmtree(tempdir, ignore_errors=True)
        detail = str(err).splitlines()[0].rstrip(":") if str(err) else type(err).__name__
        raise BundleError(f"{path}: not a readable .tar.gz bundle, damaged or cut short "
                          f"({detail[:200]})") from None
    except BaseException:  # Ctrl-C, SIGTERM (SystemExit), a bug: the scratch copy goes too
        shutil.rmtree(tempdir, ignore_errors=True)
        raise


def _refuse_what_is_no_archive(path: str) -> None:
    """A file that is no archive at all (a log, a config, a core dump) is not a damaged
    bundle: say what a bundle is, rather than a decompressor's complaint."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(512)
    except OSError as err:
        raise BundleError(f"{path}: cannot read it: {err.strerror or err}") from None
    if head.startswith(_ARCHIVE_MAGIC) or head[257:262] == b"ustar":
        return
    raise BundleError(f"{path}: not a readable bundle: no archive of any kind "
                      f"({WHAT_A_BUNDLE_IS})")


def open_bundle(path: str) -> Bundle:
    """Open and validate a bundle directory or .tar.gz."""
    if not os.path.exists(path):
        raise BundleError(f"{path}: no such bundle")
    tempdir = None
    root = path
    if os.path.isfile(path):
        _refuse_what_is_no_archive(path)
        root, tempdir = _unpack(path)
    elif not os.path.isdir(path):
        raise BundleError(f"{path}: neither a bundle directory nor a .tar.gz file")
    try:
        return _read_meta(os.path.abspath(root), tempdir)
    except BaseException:
        if tempdir:
            shutil.rmtree(tempdir, ignore_errors=True)
        raise


def one_line(text: str, limit: int = 120) -> str:
    """Text from a bundle made safe to print on one line of a report."""
    cleaned = "".join(c if c.isprintable() else "?" for c in text)
    return cleaned[:limit]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


LAST_UNIX_SECOND = 253402300799  # 9999-12-31 23:59:59 UTC: what a calendar can still show


def _unix_time(value) -> bool:
    """A sample time a clock can have: finite unix seconds from 1970 to the year 9999 (a
    hostile 9.2e18 would overflow every date conversion downstream)."""
    return _finite(value) and 0 <= value <= LAST_UNIX_SECOND


def _read_meta(root: str, tempdir: str | None) -> Bundle:
    meta_path = os.path.join(root, META)
    real_root = os.path.realpath(root)
    if os.path.islink(meta_path) and \
            not os.path.realpath(meta_path).startswith(real_root + os.sep):
        raise BundleError(f"{meta_path}: a link out of the bundle: refused")
    try:
        meta = load_meta(meta_path)
    except FileNotFoundError:
        raise BundleError(f"{root}: no meta.json, so not a fleetscope bundle "
                          f"({WHAT_A_BUNDLE_IS})") from None
    except (OSError, ValueError) as err:
        detail = getattr(err, "strerror", None) or str(err)
        raise BundleError(f"{meta_path}: unreadable ({one_line(detail, 200)})") from None
    if not isinstance(meta, dict) or meta.get("format") != BUNDLE_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        found = one_line(found) if isinstance(found, str) else found \
            if isinstance(found, (int, float, type(None))) else type(found).__name__
        raise BundleError(f"{meta_path}: format is {found!r}, expected {BUNDLE_FORMAT!r}")
    raw_samples = meta.get("samples")
    if not isinstance(raw_samples, list) or not raw_samples:
        raise BundleError(f"{meta_path}: no samples")
    if len(raw_samples) > MAX_SAMPLES:
        raise BundleError(f"{meta_path}: refused: {len(raw_samples)} samples, over the "
                          f"{MAX_SAMPLES} a bundle may hold (the samples limit of a bundle)")
    samples = []
    first_of: dict[str, int] = {}  # sample directory -> the first sample naming it
    for index, raw in enumerate(raw_samples):
        if not isinstance(raw, dict) or not isinstance(raw.get("dir"), str) \
                or "\0" in raw["dir"] or not _unix_time(raw.get("time")):
            raise BundleError(f"{meta_path}: samples[{index}] needs dir and a finite time in unix "
                              "seconds (1970 to 9999)")
        directory = os.path.realpath(os.path.join(root, raw["dir"]))
        if not directory.startswith(real_root + os.sep):
            raise BundleError(f"{meta_path}: samples[{index}] points outside the bundle")
        if not os.path.isdir(directory):
            raise BundleError(f"{meta_path}: sample directory {one_line(raw['dir'])} is "
                              "missing")
        if first_of.setdefault(directory, index) != index:
            raise BundleError(f"{meta_path}: samples[{index}] names the directory of "
                              f"samples[{first_of[directory]}]: each sample has its own")
        samples.append(Sample(directory, float(raw["time"])))
    if any(b.time <= a.time for a, b in zip(samples, samples[1:], strict=False)):
        raise BundleError(f"{meta_path}: sample times are not ascending")
    config = meta.get("config", {})
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise BundleError(f"{meta_path}: config must be an object")
    interval = meta.get("interval_s", 0)
    interval = float(interval) if _finite(interval) and interval >= 0 else 0.0
    hostname = meta.get("hostname")
    redacted = meta.get("redacted")
    redacted = {str(k)[:40]: v for k, v in redacted.items() if _finite(v)} \
        if isinstance(redacted, dict) else {}
    return Bundle(root, one_line(hostname, 255) if isinstance(hostname, str) else "unknown",
                  interval, samples, config, tempdir, redacted)


def replay_config(config: Config) -> Config:
    """Replaying reads every sample completely: no rate limits between samples, and the
    per-core summary shape the rules read."""
    return replace(config, busy_interval_min_seconds=0.0, numa_maps_min_interval_seconds=0.0,
                   per_core="summary")
