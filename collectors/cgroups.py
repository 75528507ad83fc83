"""Where a process's cgroup files are, on a cgroup v1, v2 or hybrid host.

/proc/<pid>/cgroup has one line per hierarchy the process is in (kernel/cgroup/cgroup.c
proc_cgroup_show(): "%d:%s:%s\\n", hierarchy id, its controllers comma-joined, the path):

    v2 only (cgroupfs2 at /sys/fs/cgroup):   0::/kubepods.slice/online/agent-chat
    v1 (openEuler 22.03, CentOS 7/8):        4:cpu,cpuacct:/kubepods/burstable/pod1234/c0ffee
                                             9:pids:/kubepods/burstable/pod1234/c0ffee
                                             0::/                 (hybrid: v2 without controllers)

A controller's files are in the directory where its hierarchy is mounted plus that path.
Where each hierarchy is mounted is read from /proc/self/mountinfo (Documentation/filesystems/
proc.rst 3.5: "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue":
the mount root, the mount point, then after " - " the type and the super options; a v1 cgroup
mount lists its controllers in the super options, "rw,cpu,cpuacct"). Layouts seen:

    v1 (systemd, openEuler/CentOS):  /sys/fs/cgroup/cpu,cpuacct  cgroup  rw,cpu,cpuacct
                                     (/sys/fs/cgroup/cpu and cpuacct are symlinks to it)
    v1, one controller a mount:      /sys/fs/cgroup/cpu  cgroup rw,cpu  and  .../cpuacct
    hybrid (systemd "unified"):      /sys/fs/cgroup/unified  cgroup2
    v2 only:                         /sys/fs/cgroup  cgroup2

A bundle or fixture tree without mountinfo falls back to the conventional layout seen in a
listing of sys/fs/cgroup. A controller in a v1 hierarchy is read there, else in the v2 one:
on a hybrid host the v2 line ("0::/") names a hierarchy without the controller.
"""

from __future__ import annotations

from typing import NamedTuple

from .base import NotAvailable, Scrape
from .parsers import ParseError
from .parsers.cgroup import parse_hierarchies

CGROUP_DIR = "sys/fs/cgroup"
MOUNTINFO = "proc/self/mountinfo"


class Mount(NamedTuple):
    point: str  # relative to the scrape root: "sys/fs/cgroup/cpu,cpuacct"
    root: str  # the mount's root inside its hierarchy ("/" unless bind-mounted from below)


class Mounts(NamedTuple):
    v1: dict[str, Mount]  # controller -> its hierarchy's mount
    v2: Mount | None


class Location(NamedTuple):
    """One controller's directory for a process."""

    directory: str  # relative to the scrape root
    version: int  # 1 or 2
    path: str  # the cgroup path as /proc/<pid>/cgroup prints it


def _unescape(field: str) -> str:
    # show_mountinfo() escapes space, tab, newline and backslash as \ooo.
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo_cgroups(text: str) -> Mounts:
    """The cgroup mounts of a /proc/<pid>/mountinfo.

    >>> m = parse_mountinfo_cgroups(
    ...     "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup "
    ...     "rw,cpu,cpuacct\\n41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\\n")
    >>> m.v1["cpuacct"].point, m.v2.point
    ('sys/fs/cgroup/cpu,cpuacct', 'sys/fs/cgroup/unified')
    """
    v1: dict[str, Mount] = {}
    v2 = None
    for line in text.splitlines():
        if " - cgroup" not in line:
            continue
        head, _, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if len(fields) < 5 or len(after) < 3:
            continue
        mount = Mount(_unescape(fields[4]).lstrip("/"), _unescape(fields[3]))
        if after[0] == "cgroup2":
            v2 = v2 or mount  # the first: later ones are bind mounts of parts of it
        elif after[0] == "cgroup":
            for option in after[2].split(","):
                if option not in ("rw", "ro") and "=" not in option:
                    v1.setdefault(option, mount)
    return Mounts(v1, v2)


def _listed_mounts(scrape: Scrape) -> Mounts:
    """Without mountinfo: the conventional layout found by listing sys/fs/cgroup."""
    try:  # a v2 root has its own files: no listing needed
        scrape.read_text(f"{CGROUP_DIR}/cgroup.controllers")
        return Mounts({}, Mount(CGROUP_DIR, "/"))
    except NotAvailable:
        pass
    try:
        names = set(scrape.listdir(CGROUP_DIR))
    except NotAvailable:
        names = set()
    v1: dict[str, Mount] = {}
    for name in sorted(names, key=lambda n: -n.count(",")):  # "cpu,cpuacct" before "cpu"
        if name == "unified" or "." in name:
            continue
        for controller in name.split(","):
            v1.setdefault(controller, Mount(f"{CGROUP_DIR}/{name}", "/"))
    if "cgroup.controllers" in names or not names:
        return Mounts({}, Mount(CGROUP_DIR, "/"))  # v2 only (a v2 root lists its own files)
    unified = Mount(f"{CGROUP_DIR}/unified", "/") if "unified" in names else None
    return Mounts(v1, unified or Mount(CGROUP_DIR, "/"))


# A live host's cgroup mounts are read again after this long (mountinfo is generated on
# every read, and a Kubernetes node's has hundreds of lines; cgroup mounts do not move).
MOUNTS_REREAD_S = 60.0
_LIVE_MOUNTS: dict[tuple[str, ...], tuple[float, Mounts]] = {}


def cgroup_mounts(scrape: Scrape) -> Mounts:
    """The cgroup mounts seen by the reader, once per scrape (live: once a minute)."""
    def read() -> Mounts:
        live = scrape.evidence.live
        cached = _LIVE_MOUNTS.get(scrape.roots) if live else None
        if cached is not None and 0 <= scrape.time - cached[0] < MOUNTS_REREAD_S:
            return cached[1]
        try:
            mounts = parse_mountinfo_cgroups(scrape.read_text(MOUNTINFO))
        except NotAvailable:
            mounts = Mounts({}, None)
        if not (mounts.v1 or mounts.v2):
            mounts = _listed_mounts(scrape)
        if live:
            _LIVE_MOUNTS[scrape.roots] = (scrape.time, mounts)
        return mounts
    return scrape.memo("cgroup_mounts", read)


def _join(mount: Mount, path: str) -> str | None:
    root = mount.root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None  # the cgroup is outside what this mount shows
    rest = path[len(root):]
    return f"{mount.point}{rest}".rstrip("/") if rest != "/" else mount.point


def locate(mounts: Mounts, hierarchies, controller: str) -> Location | None:
    """The directory holding `controller`'s files for a process, v1 first (a hybrid host's
    v2 line names a hierarchy without controllers), else its v2 directory."""
    for _, controllers, path in hierarchies:
        if controller in controllers:
            mount = mounts.v1.get(controller)
            directory = _join(mount, path) if mount else None
            return Location(directory, 1, path) if directory else None
    for hierarchy, controllers, path in hierarchies:
        if hierarchy == "0" and not controllers and mounts.v2 is not None:
            directory = _join(mounts.v2, path)
            return Location(directory, 2, path) if directory else None
    return None


def process_cgroups(scrape: Scrape, pids, controller: str) -> dict[str, Location]:
    """directory -> location of `controller` for the given processes (the cgroup root, the
    whole machine, left out); for naming a pool's cgroups in a finding."""
    mounts = cgroup_mounts(scrape)
    found: dict[str, Location] = {}
    for pid in pids:
        try:
            hierarchies = parse_hierarchies(scrape.read_text(f"proc/{pid}/cgroup"))
        except (NotAvailable, ParseError):
            continue
        where = locate(mounts, hierarchies, controller)
        if where is not None and where.path not in ("", "/"):
            found.setdefault(where.directory, where)
    return found
