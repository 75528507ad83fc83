"""Parser for the pids controller's kernel-log line: a fork or clone refused at a pids.max.

kernel/cgroup/pids.c pids_event() prints, once per cgroup (at its first refusal; later ones
only count in pids.events):

    pr_info("cgroup: fork rejected by pids controller in ");  pr_cont_cgroup_path(...)

seen as (dmesg, dmesg -T, journald, /dev/kmsg):

    [13964.753718] cgroup: fork rejected by pids controller in /user.slice/user-1000.slice/...
    [Fri Nov 26 18:35:56 2021] cgroup: fork rejected by pids controller in /user.slice/...
    Jun 15 20:02:45 vagrant kernel: cgroup: fork rejected by pids controller in /user.slice/...
    6,1841,5667545996,-;cgroup: fork rejected by pids controller in /fs-hcgroup-pids-1
"""

from __future__ import annotations

import re

from .kmsg import LogClock, _message

_FORK_REJECTED = re.compile(
    r"(?:\[\s*(?P<seconds>[0-9]{1,12}\.[0-9]{1,9})\]\s*)?(?:.*;)?"
    r"cgroup: fork rejected by pids controller in (?P<path>/\S{0,4096})")
_KMSG_TIME = re.compile(r"[0-9]{1,3},[0-9]{1,20},(?P<usec>[0-9]{1,20}),")


def fork_rejections(text: str, clock: LogClock | None = None
                    ) -> list[tuple[str, float | None]]:
    """(cgroup path, seconds since boot or None) of each fork-rejected line of a kernel log
    (`clock` times the lines that carry a wall-clock stamp).

    >>> fork_rejections("[13964.753718] cgroup: fork rejected by pids controller in "
    ...                 "/user.slice/user-1000.slice/session-7.scope\\n")
    [('/user.slice/user-1000.slice/session-7.scope', 13964.753718)]
    """
    found = []
    for line in text.splitlines():
        if "fork rejected by pids controller" not in line:
            continue
        match = _FORK_REJECTED.search(line)
        if not match:
            continue
        seconds = float(match.group("seconds")) if match.group("seconds") else None
        kmsg = _KMSG_TIME.match(line)
        if seconds is None and kmsg:
            seconds = int(kmsg.group("usec")) / 1e6
        if seconds is None and clock is not None:
            parsed = _message(line, clock)
            seconds = parsed[1] if parsed else None
        found.append((match.group("path"), seconds))
    return found
