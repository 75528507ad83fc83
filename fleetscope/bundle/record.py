"""`fleetscope bundle record`: capture a node's raw evidence into a bundle (docs/bundle-format.md).

    fleetscope bundle record --seconds 30 --interval 5 -o /tmp/node17.tar.gz

Files are copied byte for byte from /proc and /sys (through `--root`), so anything that
reads through a root reads a sample exactly as it read the live node. What changes goes in
`samples/sNNNN/`, what does not in `static/`. Every copy goes through the evidence source's
reader: a recorded root (`--root` of a bundle sample or a fixture tree) gives only its regular
files inside the root, so a link out of it or a FIFO is left out. Command outputs (`perf
stat`, `ethtool -S`, `dmesg`) and the agent runtime's metrics are stored as those tools print
them. A file the
node lacks is simply absent: the rules that need it are then "not evaluated".

Secrets stay behind (fleetscope.bundle.redact): command lines and the recorded config are redacted,
what was redacted is counted in the bundle's metadata (`redacted`) for `bundle show`, and
/proc/<pid>/environ is never read. Files are 0600 in 0700 directories. The output path is
never clobbered (`--force` replaces an archive by rename, never writing through a symlink),
and it is checked writable before the window is recorded.

Node side: standard library, plus the collectors' own helpers for commands.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable

from fleetscope.bundle.commands import CommandOutputs
from fleetscope.bundle.files import MAX_FILE_BYTES, copy_file, copy_globs
from fleetscope.bundle.kubernetes import capture_pods
from fleetscope.bundle.redact import Redactor
from fleetscope.collectors.base import COLLECTORS, NotAvailable, Scrape
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.processes import pool_processes
from fleetscope.collectors.shared import process_dir, process_file
from fleetscope.collectors.source import DMESG, EvidenceSource, Reader, RecordingOf
from fleetscope.core.bundle_format import (
    BUNDLE_FORMAT,
    CMD,
    META,
    SIGILL_FAULTS,
    STATIC,
    sample_path,
)
from fleetscope.core.config import Config
from fleetscope.tools.isa_budget import IsaBudget

log = logging.getLogger("fleetscope.bundle")

MAX_CONFIG_JSON_BYTES = 1024 * 1024  # the config recorded in the bundle's metadata


class RecordError(Exception):
    """The bundle cannot be written; one line for the user."""


def _run(argv: list[str], timeout: float) -> str | None:
    """A command's output, or None if it is missing, fails or hangs (killed at timeout)."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                check=False)
    except (subprocess.TimeoutExpired, OSError):
        return None
    return result.stdout if result.returncode == 0 else None


# The kernel log of a live node, in this order: the ring buffer (`dmesg`, boot stamps), else
# the journal's copy of it for this boot where reading the buffer is refused
# (kernel.dmesg_restrict, a container without CAP_SYSLOG), with wall-clock stamps that carry
# the year and zone.
KERNEL_LOG_COMMANDS = (("dmesg",),
                       ("journalctl", "-k", "-b", "-q", "--no-pager", "-o", "short-iso"))


def live_kernel_log(timeout: float) -> tuple[str | None, str | None]:
    """(the kernel's records, the command that gave them), or (None, None)."""
    for index, argv in enumerate(KERNEL_LOG_COMMANDS):
        text = _run(list(argv), timeout)
        if text and text.strip():
            if index:
                log.warning("bundle: `dmesg` gave no kernel log; static/%s is `%s`'s", DMESG,
                            " ".join(argv))
            return text, " ".join(argv)
    return None, None


TOP_CPU_PROCESSES = 20  # besides pool members: the heaviest CPU users (antagonists)


def _cpu_ticks(stat_text: str) -> int:
    fields = stat_text.rpartition(")")[2].split()
    try:
        return int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return 0


def _capture_processes(scrape: Scrape, destination: str, config: Config,
                       redactor: Redactor) -> None:
    """Per-process files for pool members and for the heaviest CPU users (a node's thousands
    of idle processes would only cost tens of thousands of files), numa_maps and fd counts for
    pool members, and the pool cgroups' CPU files."""
    reader = scrape.reader
    pool_members = pool_processes(scrape, config.pools)
    members = {p.pid for p in pool_members}
    usage = []
    for name in reader.listdir("proc"):
        if name.isdigit() and int(name) not in members:
            try:
                usage.append((_cpu_ticks(reader.read_proc(process_file(name, "stat"), True)),
                              int(name)))
            except (NotAvailable, ParseError):
                continue  # exited (in a recording: absent, refused or corrupt)
    usage.sort(reverse=True)
    chosen = sorted(members | {pid for ticks, pid in usage[:TOP_CPU_PROCESSES] if ticks > 0})
    redactor = redactor or Redactor(config.redact)
    for pid in chosen:
        base = process_dir(pid)
        if not copy_file(reader, f"{base}/stat", destination):
            continue  # exited
        for file_name in COLLECTORS.per_process():
            if file_name == "stat":
                continue
            copy_file(reader, f"{base}/{file_name}", destination,
                      redactor.cmdline if file_name == "cmdline" else None)
        try:
            fds = reader.entries(f"{base}/fd")
        except NotAvailable:
            fds = None
        if fds is not None:
            with open(os.path.join(destination, base, "fd_count"), "w") as out:
                out.write(f"{len(fds)}\n")
        else:  # a recorded tree holds the count, not the fds
            copy_file(reader, f"{base}/fd_count", destination)
        if pid in members:
            copy_file(reader, f"{base}/numa_maps", destination)
    for directory, file_names in _cgroup_files(scrape, pool_members).items():
        for file_name in file_names:
            copy_file(reader, f"{directory}/{file_name}", destination)
    capture_pods(reader, destination, config, chosen, redactor)
    _capture_memory_cgroups(destination, scrape, pool_members)
    _capture_threads(destination, scrape, pool_members)


def _cgroup_files(scrape: Scrape, pool_members) -> dict[str, tuple[str, ...]]:
    """The cgroup directories of the pool members' controllers the collectors read files of
    (their per_cgroup evidence), v1 or v2, with those files; the bundle keeps them at the
    same paths."""
    from fleetscope.collectors.cgroups import cgroup_mounts, locate, parse_hierarchies
    from fleetscope.collectors.parsers import ParseError

    declared = COLLECTORS.per_cgroup()
    controllers = tuple(dict.fromkeys(controller for controller, _ in declared))
    mounts = cgroup_mounts(scrape)
    wanted: dict[str, tuple[str, ...]] = {}
    for process in pool_members:
        try:
            hierarchies = parse_hierarchies(scrape.read_text(process_file(process.pid, "cgroup")))
        except (NotAvailable, ParseError):
            continue
        for controller in controllers:
            where = locate(mounts, hierarchies, controller)
            if where is None or where.path == "/" or (controller, where.version) not in \
                    declared:
                continue
            wanted[where.directory] = wanted.get(where.directory, ()) + declared[
                (controller, where.version)]
    return {directory: tuple(dict.fromkeys(names)) for directory, names in wanted.items()}


def capture_cgroup_mounts(reader: Reader, static_dir: str) -> None:
    """static/proc/self/mountinfo: the recorder's cgroup mounts only (where each hierarchy
    is, collectors/cgroups.py), so a bundle finds its v1 and v2 files as the node did."""
    from fleetscope.collectors.cgroups import MOUNTINFO

    try:
        data = reader.read_bytes(MOUNTINFO, MAX_FILE_BYTES)
    except NotAvailable:
        return
    # Lines as a text file yields them (universal newlines), not str.splitlines's.
    with io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace") as source:
        lines = [line for line in source if " - cgroup" in line]
    target = os.path.join(static_dir, MOUNTINFO)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w") as out:
        out.writelines(lines)


def _capture_memory_cgroups(destination: str, scrape: Scrape, pool_members) -> None:
    """The pool members' memory cgroup files (v1 and v2), at the paths the memory collector
    reads them from (collectors/memory.py)."""
    from fleetscope.collectors.memory import MEMCG_FILES, memory_cgroup_dirs

    for directory in memory_cgroup_dirs(scrape, pool_members):
        for file_name in MEMCG_FILES:
            copy_file(scrape.reader, f"{directory}/{file_name}", destination)


TASK_FILES = ("stat", "status", "schedstat", "syscall", "wchan")


def _capture_threads(destination: str, scrape: Scrape, pool_members) -> None:
    """Pool members' threads as the pools collector reads them (the same threads, in the
    same order and bound: collectors/tasks.py), and what their network waits and sockets
    need where the live node has fd links and process memory: proc/<pid>/fd_sockets ("fd
    inode [idle_ms]" lines: the socket fds of the fd links the pools collector reads, and
    those a waiting thread waits on), proc/<pid>/task/<tid>/pollfds (one polled fd a line),
    and the TCP tables."""
    from fleetscope.collectors.tasks import (
        OWN_NETWORK_NAMESPACE,
        TASKS_READ_PER_POOL,
        network_namespace,
        pool_sockets,
        process_network_waits,
        task_dir,
        task_ids,
    )

    # Waits and sockets are found in what was just recorded (so the bundle agrees with
    # itself), with the live node behind it for the fd links, the memory and the TCP tables;
    # the tables are written as they were read for that (memoised in `recorded`).
    recorded = Scrape(RecordingOf(destination, scrape.evidence), scrape.time)
    reader = scrape.reader
    budget = {p.pool.name: TASKS_READ_PER_POOL for p in pool_members}
    fd_lines: dict[int, dict[int, str]] = {}
    members: dict[str, list[tuple[int, str]]] = {}
    for process in pool_members:
        pid = process.pid
        base = process_dir(pid)
        for file_name in ("syscall", "wchan"):  # the leader's: task/<pid> is proc/<pid>
            copy_file(reader, f"{base}/{file_name}", destination)
        tids = [t for t in task_ids(scrape, pid) if t != pid][:budget[process.pool.name]]
        budget[process.pool.name] -= len(tids)
        for tid in tids:
            for file_name in TASK_FILES:
                copy_file(reader, f"{base}/task/{tid}/{file_name}", destination)
        for wait, _ in process_network_waits(recorded, pid, tids=tids):
            fd_lines.setdefault(pid, {})[wait.fd] = f"{wait.fd} {wait.inode}" + (
                "" if wait.idle_seconds is None else f" {round(wait.idle_seconds * 1000)}")
            if wait.polled:
                with open(os.path.join(destination, task_dir(pid, wait.tid), "pollfds"),
                          "w") as out:
                    out.writelines(f"{fd}\n" for fd in wait.polled)
        members.setdefault(process.pool.name, []).append(
            (pid, network_namespace(recorded, pid)))
    for pool_members_of in members.values():
        for pid, sockets in pool_sockets(recorded, pool_members_of).read.items():
            lines = fd_lines.setdefault(pid, {})
            for fd, inode in sockets.items():
                lines.setdefault(fd, f"{fd} {inode}")
    for pid, lines in fd_lines.items():
        target = os.path.join(destination, process_file(pid, "fd_sockets"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as out:
            out.writelines(f"{lines[fd]}\n" for fd in sorted(lines))
    try:
        own = os.readlink(os.path.join(scrape.roots[0], OWN_NETWORK_NAMESPACE))
    except OSError:
        own = None
    _write_tcp_tables(destination, recorded, own,
                      [member for group in members.values() for member in group])


def _write_tcp_tables(destination: str, recorded: Scrape, own: str | None,
                      members: list[tuple[int, str]]) -> None:
    """The TCP tables the waits and sockets were read from: those of the recorder's own
    network namespace (`own`) as proc/net/tcp{,6}, another's (a container's workers) as
    each of its processes' proc/<pid>/net/tcp{,6}, where a replay looks them up
    (collectors/tasks.py)."""
    from fleetscope.collectors.tasks import NETWORK_TABLES, tcp_tables

    written = set()
    for pid, namespace in members:
        directory = NETWORK_TABLES if namespace in (own, "root") else process_file(pid, "net")
        if directory in written:
            continue
        written.add(directory)
        try:
            tables = tcp_tables(recorded, pid, namespace)
        except (NotAvailable, ParseError):
            continue
        os.makedirs(os.path.join(destination, directory), exist_ok=True)
        for path, text in tables:
            with open(os.path.join(destination, directory, os.path.basename(path)), "w") as out:
                out.write(text)


def _capture_listeners(destination: str, source: EvidenceSource) -> None:
    """cmd/tcp-listeners.txt: the live node's listening sockets with their backlogs
    (sock_diag), and the owners of those whose accept queue is full (their fd links)."""
    from fleetscope.collectors.listen import LISTENERS_FILE, dump_listeners, socket_owners
    from fleetscope.collectors.parsers.listen import format_listeners_file

    if not source.live:
        return
    try:
        listeners = dump_listeners()
    except OSError:
        return
    full = {item.inode for item in listeners if item.full}
    owners = socket_owners(Scrape(source), full) if full else {}
    listeners = [item._replace(pids=tuple(owners.get(item.inode, ()))) for item in listeners]
    os.makedirs(os.path.join(destination, os.path.dirname(LISTENERS_FILE)), exist_ok=True)
    with open(os.path.join(destination, LISTENERS_FILE), "w") as out:
        out.write(format_listeners_file(listeners))


def capture_event_cgroups(reader: Reader, dmesg: str, sample_dirs: list[str]) -> None:
    """Whether the cgroups the kernel log's events name still exist, as the replay asks it:
    the file that marks each (a memory cgroup's memory.oom_control or memory.events, a pids
    cgroup's pids.max) copied into every sample where it exists when the recording ends. A
    cgroup removed before then reads as gone wherever no sample read it: its events no
    longer act. A copy a sample made at its own time stays (a pool's cgroup: its kill
    counter as it rose), never overwritten by the last one."""
    from fleetscope.collectors.fork_limits import pids_cgroup_files, rejected_cgroups
    from fleetscope.collectors.memory import (
        V1_MOUNTS,
        V2_MOUNTS,
        killed_in_cgroups,
        memcg_marker_files,
    )

    markers = [marker for path in sorted(killed_in_cgroups(dmesg))
               for marker in memcg_marker_files(path, V1_MOUNTS, V2_MOUNTS)]
    markers += [marker for path in sorted(rejected_cgroups(dmesg))
                for marker in pids_cgroup_files(path)]
    for sample_dir in sample_dirs:
        for marker in markers:
            if not os.path.exists(os.path.join(sample_dir, marker)):
                copy_file(reader, marker, sample_dir)


MAX_FAULTS = 20  # the latest distinct faulting places; each entry is under 200 bytes


def capture_sigill_faults(static_dir: str, dmesg: str, directories: tuple[str, ...] = (),
                          budget=None) -> None:
    """static/cmd/sigill-faults.json: for the latest SIGILLs in the kernel log, the bytes
    around the faulting instruction in the binary found on this node
    (fleetscope/tools/isa_fault.py), so the bundle names the instruction and its extension
    on a machine without the binary; within `budget` (fleetscope/tools/isa_budget.py)."""
    import functools

    from fleetscope.collectors.parsers import ParseError
    from fleetscope.collectors.parsers.kmsg import scan_kernel_log
    from fleetscope.tools.isa import locate_binary

    budget = budget or IsaBudget()
    # once per name: a crash loop names one binary at thousands of offsets
    locate = functools.cache(lambda name: locate_binary(name, directories=directories))
    try:
        crashes = scan_kernel_log(dmesg).crashes
    except ParseError:
        return
    entries, seen = [], set()
    for crash in reversed(crashes):  # the most recent crashes are the incident's
        key = (crash.binary, crash.offset, crash.mapping_delta)
        if key in seen or (crash.offset is None and crash.mapping_delta is None):
            continue
        seen.add(key)
        if not budget.left():
            break
        path = locate(crash.binary)
        entry = budget.capture(path, crash) if path else None
        if entry is not None:
            entries.append(entry)
        if len(entries) >= MAX_FAULTS:
            break
    if budget.reason():
        log.warning("bundle: %s", budget.reason())
    if entries:
        os.makedirs(os.path.join(static_dir, CMD), exist_ok=True)
        with open(os.path.join(static_dir, SIGILL_FAULTS), "w", encoding="utf-8") as out:
            json.dump(entries, out, indent=1)


def record(output: str, seconds: float, interval: float, config: Config,
           source: EvidenceSource, progress: Callable[[int, int], None] | None = None,
           force: bool = False) -> str:
    """Record a bundle of `source` (chosen by the command: a LiveHost runs its commands, a
    recorded tree is copied and nothing is run on its behalf); returns the path written."""
    as_tar = output.endswith((".tar.gz", ".tgz"))
    # Checked before the window is recorded: a typo must not cost a 30 s capture.
    partial = _open_archive(output, force) if as_tar else _prepare_directory(output)
    # Everything recorded is private to its owner: files 0600, directories 0700.
    umask = os.umask(0o077)
    commands = CommandOutputs(config, source)
    try:
        _record(output, seconds, interval, config, source, progress, commands, partial, force)
        partial = None
        return output
    finally:
        commands.close()
        os.umask(umask)
        if partial is not None:
            with contextlib.suppress(OSError):
                os.unlink(partial)


def _open_archive(output: str, force: bool) -> str:
    """A new private file beside `output` (its path), renamed over it once complete: the
    output is not clobbered without --force, and a symlink there is replaced, never followed."""
    if os.path.isdir(output) and not os.path.islink(output):
        raise RecordError(f"{output} is a directory; give a .tar.gz file name")
    if os.path.lexists(output) and not force:
        raise RecordError(f"{output} already exists: not overwriting it (--force replaces it)")
    directory = os.path.dirname(os.path.abspath(output))
    partial = os.path.join(directory, f".{os.path.basename(output)}.partial-{os.getpid()}")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError as err:
        raise RecordError(f"cannot write {output}: {err.strerror or err}") from None
    os.close(fd)
    return partial


def _prepare_directory(output: str) -> None:
    """A directory bundle goes into a new (or empty) real directory, made 0700."""
    if os.path.islink(output):
        raise RecordError(f"{output} is a symlink: not writing a bundle through it")
    if os.path.exists(output):
        if not os.path.isdir(output):
            raise RecordError(f"{output} already exists and is not a directory: not "
                              "overwriting it (name a new directory, or a .tar.gz file)")
        if os.listdir(output):
            raise RecordError(f"{output} exists and is not empty: name a new directory, or a "
                              "PATH.tar.gz (--force replaces an existing .tar.gz, never a "
                              "directory's contents)")
    try:
        os.makedirs(output, mode=0o700, exist_ok=True)
        os.chmod(output, 0o700)
        probe = tempfile.NamedTemporaryFile(dir=output)  # noqa: SIM115 (closed at once)
        probe.close()
    except OSError as err:
        raise RecordError(f"cannot write {output}: {err.strerror or err}") from None


def sample_count(seconds: float, interval: float) -> int:
    """The samples a recording of `seconds` at `interval` takes (one at each end)."""
    return max(1, int(seconds / interval) + 1)


def bundle_meta(interval: float, samples: list, config: Config, redactor: Redactor,
                kernel_log: str | None = None) -> dict:
    """A bundle's metadata (META): the config redacted and size-bounded, what redaction
    removed, and what static/dmesg.txt was read from (`kernel_log`, when there is one)."""
    recorded_config = redactor.config(config.raw)
    config_json = json.dumps(recorded_config)
    if len(config_json) > MAX_CONFIG_JSON_BYTES:
        raise RecordError(f"the config is over {MAX_CONFIG_JSON_BYTES // 1024} KiB as JSON: "
                          f"too large to record in {META}")
    # Pod names (namespace, pod, container, annotations) count apart from command lines: a
    # reader of `bundle show` sees that names a pool may match on were changed.
    counts = {kind: redactor.counts.get(kind, 0)
              for kind in ("cmdline_args", "config_values", "pod_names")}
    meta = {"format": BUNDLE_FORMAT, "hostname": socket.gethostname(),
            "interval_s": interval, "samples": samples, "config": recorded_config,
            "redacted": counts}
    if kernel_log is not None:
        meta["kernel_log"] = kernel_log
    return meta


def _record_meta(bundle_dir: str, interval: float, samples: list, config: Config,
                 redactor: Redactor, kernel_log: str | None = None) -> None:
    with open(os.path.join(bundle_dir, META), "w", encoding="utf-8") as out:
        json.dump(bundle_meta(interval, samples, config, redactor, kernel_log), out, indent=2)


def capture_static(source: EvidenceSource, static_dir: str) -> Reader:
    """What a bundle captures once (the collectors' `once` evidence and the cgroup mounts)
    into `static_dir`; the reader it used, for the other static captures."""
    static_reader = source.reader()
    copy_globs(static_reader, COLLECTORS.once(), static_dir)
    capture_cgroup_mounts(static_reader, static_dir)
    return static_reader


def capture_sample(source: EvidenceSource, sample_dir: str, now: float, interval: float,
                   config: Config, redactor: Redactor, commands: CommandOutputs) -> None:
    """One sample into `sample_dir` (made already): the collectors' sampled files, the
    processes', the commands' outputs and the listening sockets, as read at `now`."""
    scrape = Scrape(source, now)  # this sample's reads
    copy_globs(scrape.reader, COLLECTORS.sampled(), sample_dir)
    if os.path.isdir(os.path.join(source.roots[0], "proc")):
        _capture_processes(scrape, sample_dir, config, redactor)
    commands.sample(sample_dir, interval, scrape.reader)
    _capture_listeners(sample_dir, commands.source)


def _record(output, seconds, interval, config, source, progress, commands, partial, force):
    as_tar = partial is not None
    redactor = Redactor(config.redact)
    workdir = tempfile.mkdtemp(prefix="fleetscope-record-") if as_tar else output
    bundle_dir = os.path.join(workdir, "bundle") if as_tar else output
    try:
        os.makedirs(bundle_dir, exist_ok=True)
        static = os.path.join(bundle_dir, STATIC)
        static_reader = capture_static(source, static)
        count = sample_count(seconds, interval)
        samples = []
        start = time.monotonic()
        for index in range(count):
            delay = start + index * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            now, began = time.time(), time.monotonic()
            relative = sample_path(index)
            sample_dir = os.path.join(bundle_dir, relative)
            os.makedirs(sample_dir, exist_ok=True)
            capture_sample(source, sample_dir, now, interval, config, redactor, commands)
            samples.append({"dir": relative, "time": round(now, 3)})
            took = time.monotonic() - began
            if took > interval and index + 1 < count:
                log.warning("sample %d of %d took %.1f s, longer than the %g s interval: the "
                            "next starts late (`bundle show` gives the real gaps)",
                            index + 1, count, took, interval)
            if progress:
                progress(index + 1, count)
        # The kernel log last, so it holds what happened during the window (a crash loop's
        # SIGILLs are the incident, not history).
        dmesg, kernel_log = (live_kernel_log(config.command_timeout_seconds)
                             if commands.live else (None, None))
        if dmesg is None and DMESG in commands.source.kernel_logs:
            try:
                dmesg, kernel_log = commands.source.read_text(DMESG), DMESG
            except (NotAvailable, ParseError):
                dmesg = None
        if dmesg is not None:
            os.makedirs(static, exist_ok=True)  # a root without static files has none yet
            with open(os.path.join(static, DMESG), "w", encoding="utf-8") as out:
                out.write(dmesg)
        # The faulting instructions first: a few bytes each, the surest evidence; the
        # whole-binary checks get what is left of the budget.
        isa_budget = IsaBudget(config.isa_scan_seconds)
        if dmesg is not None and commands.own_root:
            capture_sigill_faults(static, dmesg, config.binary_dirs, isa_budget)
        commands.static(static, dmesg, isa_budget)
        commands.matrix(static, static_reader)
        if dmesg is not None:
            capture_event_cgroups(static_reader, dmesg, [os.path.join(bundle_dir, s["dir"])
                                                         for s in samples])
        _record_meta(bundle_dir, interval, samples, config, redactor, kernel_log)
        if as_tar:
            _write_archive(bundle_dir, output, partial, force)
    except OSError as err:
        raise RecordError(f"cannot write the bundle: {err}") from None
    finally:
        if as_tar:
            _remove_work_directory(workdir)


def _remove_work_directory(workdir: str) -> None:
    """The archive's work directory, gone on every way out (SIGTERM included). Once in a
    suite run a SIGTERM left it behind after one pass: a pass that finds it still there
    goes again, a bounded number of times."""
    for _ in range(5):
        shutil.rmtree(workdir, ignore_errors=True)
        if not os.path.lexists(workdir):
            return
        time.sleep(0.05)
    log.warning("bundle: could not remove the work directory %s", workdir)


def _plain_member(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """Whole-second times and no owner names: a member then needs no PAX header of its own
    (a float mtime gave every member one, doubling what a reader parses: 2.5 s to diagnose a
    60-sample bundle, 1.7 s without), and the node's user names stay behind."""
    member.mtime = int(member.mtime)
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member


def _write_archive(bundle_dir: str, output: str, partial_path: str, force: bool) -> None:
    # O_NOFOLLOW and no O_CREAT: the file made at the start, not a link planted since.
    fd = os.open(partial_path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
    # GNU format: long paths (cgroup directories) get a long-name header, nothing else does.
    with os.fdopen(fd, "wb") as handle, tarfile.open(fileobj=handle, mode="w:gz",
                                                      format=tarfile.GNU_FORMAT) as archive:
        archive.add(bundle_dir, arcname=".", filter=_plain_member)
    if force:
        os.replace(partial_path, output)  # replaces a symlink itself, not its target
        return
    try:
        os.link(partial_path, output)  # fails if anything appeared there meanwhile
    except FileExistsError:
        raise RecordError(f"{output} appeared while recording: not overwriting it") from None
    except OSError:  # a filesystem without hard links
        if os.path.lexists(output):
            raise RecordError(f"{output} appeared while recording: not overwriting it") from None
        os.replace(partial_path, output)
        return
    os.unlink(partial_path)
