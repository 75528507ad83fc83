"""Parser for /proc/locks: the file locks held on the node, and the requests blocked on them.

Format (fs/locks.c locks_show() / lock_get_status()), as this machine's 6.18 kernel printed
it for three `flock` commands on one file and two lockf() callers on another:

    1: FLOCK  ADVISORY  WRITE 10868 fe:00:2146322 0 EOF
    1: -> FLOCK  ADVISORY  WRITE 10865 fe:00:2146322 0 EOF
    1:  -> FLOCK  ADVISORY  WRITE 10866 fe:00:2146322 0 EOF
    1: POSIX  ADVISORY  WRITE 11025 fe:00:2146769 0 EOF
    1: -> POSIX  ADVISORY  WRITE 11066 fe:00:2146769 0 EOF

A row is `<id>: ` then, for a blocked request, `->` indented one space per level of the tree
of requests blocked behind the lock (a request can wait behind another waiter that conflicts
with it), then the class (FLOCK, POSIX, OFDLCK, ACCESS, LEASE, DELEG), its mode (ADVISORY,
MANDATORY, *NOINODE*; ACTIVE/BREAKING/BREAKER for leases), READ/WRITE/UNLCK, the owner's pid
in the reader's pid namespace (-1 for OFD locks, which belong to an open file, not a process),
`major:minor:inode` of the file (hex device numbers; `<none>:0` without an inode) and the
range (`start end` or `start EOF`; flock and leases print `0 EOF`). Every row of one id is
one lock: the first, without `->`, holds it; the rows after it wait, whoever they wait behind.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_ROW = re.compile(
    r"(?P<id>[0-9]{1,20}):(?P<arrow> +->)? (?P<kind>[A-Z]{4,8}) +(?P<mode>\S{1,16}) +"
    r"(?P<access>READ|WRITE|UNLCK|RW|NONE)? *(?P<pid>-?[0-9]{1,10}) "
    r"(?P<device>[0-9a-f]{1,8}:[0-9a-f]{1,8}|<none>):(?P<inode>[0-9]{1,20}) (?P<range>.{1,60})",
    re.ASCII,
)


class FileLock(NamedTuple):
    id: int  # the row number the kernel gives the lock and its waiters
    kind: str  # FLOCK, POSIX, OFDLCK, LEASE ...
    access: str  # READ, WRITE ...
    pid: int  # owner (holder or waiter); -1 for OFD locks
    device: str  # "fe:00" (hex major:minor), "" when the kernel printed none
    inode: int
    waiting: bool  # a blocked request (a "->" row)
    holder: int | None  # for a waiter: the pid holding the lock it waits for


def parse_proc_locks(text: str) -> list[FileLock]:
    """Every row of /proc/locks; a row that does not parse costs itself only.

    >>> rows = parse_proc_locks("1: FLOCK  ADVISORY  WRITE 10868 fe:00:2146322 0 EOF\\n"
    ...                         "1: -> FLOCK  ADVISORY  WRITE 10865 fe:00:2146322 0 EOF\\n")
    >>> [(r.pid, r.waiting, r.holder) for r in rows]
    [(10868, False, None), (10865, True, 10868)]
    """
    rows: list[FileLock] = []
    holders: dict[int, int] = {}
    for line in text.splitlines():
        match = _ROW.fullmatch(line.rstrip())
        if match is None:
            continue
        lock_id, pid = int(match.group("id")), int(match.group("pid"))
        waiting = match.group("arrow") is not None
        if not waiting:
            holders[lock_id] = pid
        device = match.group("device")
        rows.append(FileLock(lock_id, match.group("kind"), match.group("access") or "", pid,
                             "" if device == "<none>" else device, int(match.group("inode")),
                             waiting, holders.get(lock_id) if waiting else None))
    return rows
