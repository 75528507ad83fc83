"""The node's processes grouped into the config's workload pools, once per scrape.

A process belongs to the first pool whose `match` it satisfies: `cgroup`, a glob on its
cgroup path from /proc/<pid>/cgroup (`0::/kubepods.slice/online/agent-chat-7d9f`), or
`cmdline`, a regex searched in its NUL-separated argv joined by spaces (in a bounded time:
fleetscope.core.patterns), or the Kubernetes
terms `namespace`, `pod`, `container` (globs) and `qos` together, on the pod the kubelet's
cgroup layout places it in (collectors/pods.py: read only when a pool names such a term).
Kernel threads (empty cmdline) match no cmdline pattern, and no cgroup glob either. Shared by
the pools, numa and irq collectors, which export per pool, never per pid.

A process may exit between the directory listing and the reads: it is skipped silently.
"""

from __future__ import annotations

import fnmatch
import os
import re
from functools import lru_cache
from typing import NamedTuple

from fleetscope.core.config import Pool
from fleetscope.core.kubernetes_config import KubernetesPaths, glob_match
from fleetscope.core.patterns import BoundedPattern

from .base import NotAvailable, Scrape
from .parsers import ParseError
from .parsers.kubepods import PodCgroup, parse_pod_cgroup
from .parsers.process import parse_cgroup, parse_cmdline, status_values
from .pods import Pod, name_pod
from .tasks import read_proc

INTERPRETERS = re.compile(r"(python[0-9.]*|pypy[0-9.]*|node|java|ruby|perl|php|bash|sh|dash|"
                          r"uv|uvx|env)")


def program_name(cmdline: str) -> str:
    """What a person calls the program: the script or module an interpreter runs
    (`python3 -m agent.worker` -> agent.worker, `/usr/bin/python3 /srv/etl_job.py` ->
    etl_job.py), else the executable's base name. Never the arguments, which may hold
    secrets."""
    words = cmdline.replace("\0", " ").split()
    if not words:
        return ""
    first = os.path.basename(words[0])
    if not INTERPRETERS.fullmatch(first):
        return first
    rest = iter(words[1:])
    for word in rest:
        if word in ("-m", "-jar"):  # python -m module, java -jar app.jar
            return os.path.basename(next(rest, first))
        if word == "-c":
            return f"{first} -c"
        if word in ("-X", "-W", "-Q", "-cp", "-classpath"):  # options with a value
            next(rest, None)
            continue
        if word.startswith("-") or "=" in word:
            continue
        return os.path.basename(word)
    return first


class PoolProcess(NamedTuple):
    pid: int
    pool: Pool
    cmdline: str
    cgroup: str  # "" when no pool matches by cgroup (the file is then not read)
    pod: Pod | None = None  # only looked up when a pool matches by Kubernetes terms


def _pod_matches(pool: Pool, pod: Pod) -> bool:
    return ((pool.qos is None or pool.qos == pod.qos)
            and glob_match(pool.namespace_glob, pod.namespace)
            and glob_match(pool.pod_glob, pod.name)
            and glob_match(pool.container_glob, pod.container))


class PoolMatcher:
    def __init__(self, pools: tuple[Pool, ...]):
        self.pools = pools
        self.needs_pod = any(p.by_pod for p in pools)
        self.needs_cgroup = any(p.cgroup_glob for p in pools) or self.needs_pod
        self._rules = [
            (
                pool,
                re.compile(fnmatch.translate(pool.cgroup_glob)) if pool.cgroup_glob else None,
                BoundedPattern(pool.cmdline_regex, f"pools[{index}].match.cmdline")
                if pool.cmdline_regex else None,
                pool.by_pod,
            )
            for index, pool in enumerate(pools)
        ]

    def match(self, cmdline: str, cgroup: str, pod: Pod | None = None) -> Pool | None:
        for pool, cgroup_pattern, cmdline_pattern, by_pod in self._rules:
            if cgroup_pattern is not None and cgroup and cgroup_pattern.match(cgroup):
                return pool
            if cmdline_pattern is not None and cmdline and cmdline_pattern.search(cmdline):
                return pool
            if by_pod and pod is not None and _pod_matches(pool, pod):
                return pool
        return None


@lru_cache(maxsize=8)
def matcher_for(pools: tuple[Pool, ...]) -> PoolMatcher:
    return PoolMatcher(pools)


# A live process's cgroup is read again after this long, or at once when its command line
# changed (an exec); a process moved between cgroups without an exec is seen this late.
CGROUP_REREAD_S = 30.0


class _CgroupCache:
    """pid -> (command line, cgroup, when read, settled) of the live node's processes: a
    cgroup path rarely changes once a process runs, and re-reading it for every process on
    every scrape was a third of the scan. An entry serves only once two reads agreed (a
    supervisor may move its child into the child's cgroup just after starting it). Only live
    hosts use it: a recorded sample is read as it is."""

    def __init__(self) -> None:
        self.entries: dict[tuple[tuple[str, ...], str], tuple[str, object, float, bool]] = {}

    def get(self, key, cmdline: str, now: float):
        entry = self.entries.get(key)
        if entry is None or not entry[3] or entry[0] != cmdline or \
                not 0 <= now - entry[2] < CGROUP_REREAD_S:
            return None
        return entry[1]

    def put(self, key, cmdline: str, cgroup, now: float) -> None:
        entry = self.entries.get(key)
        settled = entry is not None and entry[0] == cmdline and entry[1] == cgroup
        self.entries[key] = (cmdline, cgroup, now, settled)

    def keep(self, roots: tuple[str, ...], names: set[str]) -> None:
        """Forget processes that exited (the dict follows the process table)."""
        for key in [k for k in self.entries if k[0] == roots and k[1] not in names]:
            self.entries.pop(key, None)  # a concurrent scrape may have gone first


_CGROUPS = _CgroupCache()


class _NoCommandLine:
    """Live pids whose command line was empty (kernel threads, zombies): skipped by the
    scan while they stay in the process table, re-read after CGROUP_REREAD_S. A kernel
    thread never execs into a workload, and a pid is only reused after it left the table;
    a 128-core node has a thousand per-CPU kernel threads, most of the scan."""

    def __init__(self) -> None:
        self.since: dict[tuple[tuple[str, ...], str], float] = {}

    def skip(self, key, now: float) -> bool:
        since = self.since.get(key)
        return since is not None and 0 <= now - since < CGROUP_REREAD_S

    def put(self, key, now: float) -> None:
        self.since[key] = now

    def keep(self, roots: tuple[str, ...], names: set[str]) -> None:
        for key in [k for k in self.since if k[0] == roots and k[1] not in names]:
            self.since.pop(key, None)


_NO_COMMAND_LINE = _NoCommandLine()


def _has_executable(scrape: Scrape, name: str) -> bool:
    """Whether a live pid has an executable: a kernel thread or a zombie has none, a process
    caught inside execve (its command line not yet written) has one."""
    for root in scrape.roots:
        try:
            os.readlink(f"{root.rstrip('/')}/proc/{name}/exe")
            return True
        except FileNotFoundError:
            continue
        except OSError:
            return True  # EACCES: a process we may not inspect is no kernel thread
    return False


def _read_cgroup(scrape: Scrape, name: str, needs_pod: bool) -> tuple[str, PodCgroup | None]:
    text = read_proc(scrape, f"proc/{name}/cgroup", True)
    return parse_cgroup(text), parse_pod_cgroup(text) if needs_pod else None


def _scan(scrape: Scrape, pools: tuple[Pool, ...]) -> list[PoolProcess]:
    if not pools:
        return []
    matcher = matcher_for(pools)
    # Where the pod names are: the config's `kubernetes:` paths, carried by its pod pools.
    kubernetes = next((p.kubernetes for p in pools if p.kubernetes), None) or KubernetesPaths()
    live = scrape.evidence.live
    cache = _CGROUPS if live and matcher.needs_cgroup else None
    found: list[PoolProcess] = []
    names = sorted((n for n in scrape.listdir("proc") if n.isdigit()), key=int)
    for name in names:
        if live and _NO_COMMAND_LINE.skip((scrape.roots, name), scrape.time):
            continue
        try:
            cmdline = parse_cmdline(read_proc(scrape, f"proc/{name}/cmdline", True))
            if live and not cmdline and not _has_executable(scrape, name):
                _NO_COMMAND_LINE.put((scrape.roots, name), scrape.time)
            # Kernel threads and zombies (empty cmdline) are no workload: their cgroup is not
            # read (a 128-core node has a thousand per-CPU kernel threads).
            cgroup, in_pod = "", None
            if matcher.needs_cgroup and cmdline:
                key = (scrape.roots, name)
                cached = cache.get(key, cmdline, scrape.time) if cache else None
                if cached is None:
                    cached = _read_cgroup(scrape, name, matcher.needs_pod)
                    if cache:
                        cache.put(key, cmdline, cached, scrape.time)
                cgroup, in_pod = cached
        except (NotAvailable, ParseError):
            continue  # exited while we looked, or a zombie
        pod = name_pod(scrape, kubernetes, in_pod) if in_pod is not None else None
        pool = matcher.match(cmdline, cgroup, pod)
        if pool is not None:
            found.append(PoolProcess(int(name), pool, cmdline, cgroup, pod))
    if live:
        present = set(names)
        _NO_COMMAND_LINE.keep(scrape.roots, present)
        if cache:
            cache.keep(scrape.roots, present)
    return found


def pool_processes(scrape: Scrape, pools: tuple[Pool, ...]) -> list[PoolProcess]:
    """Every process that belongs to a pool, in pid order."""
    return scrape.memo("pool_processes", lambda: _scan(scrape, pools))


def process_status(scrape: Scrape, pid: int) -> dict[str, str]:
    """The status fields the pool collectors need (state, context switches,
    Cpus_allowed_list), read once per scrape whichever collector asks first."""
    path = f"proc/{pid}/status"
    return scrape.memo(path, lambda: status_values(read_proc(scrape, path, True)))
