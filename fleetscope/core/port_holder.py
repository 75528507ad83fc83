"""Which program listens on a TCP port: the line that refuses `--listen` on a taken port
names it ("prometheus (pid 812)"), rather than guessing it is another exporter.

Read from this host's /proc, not through an evidence source: it is the command's own
listening socket, on the host it runs on, never evidence of a node. Only on that error path,
and bounded: a host with many processes and sockets costs at most MAX_FD_ENTRIES reads.
"""

from __future__ import annotations

import os

LISTEN_STATE = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
MAX_FD_ENTRIES = 200_000


def listening_inodes(port: int, proc: str = "/proc") -> set[str]:
    """The socket inodes listening on `port` (any address, IPv4 or IPv6)."""
    inodes = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            with open(os.path.join(proc, table)) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != LISTEN_STATE:
                continue
            _, _, hex_port = fields[1].rpartition(":")
            try:
                if int(hex_port, 16) == port and fields[9] != "0":
                    inodes.add(fields[9])
            except ValueError:
                continue
    return inodes


def port_holder(port: int, proc: str = "/proc") -> str | None:
    """"COMM (pid N)" of the first process holding a socket that listens on `port`, or None
    where no such socket is seen or its owner cannot be read (another user's process)."""
    wanted = {f"socket:[{inode}]" for inode in listening_inodes(port, proc)}
    if not wanted:
        return None
    budget = MAX_FD_ENTRIES
    for pid in sorted((p for p in os.listdir(proc) if p.isdigit()), key=int):
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            budget -= 1
            if budget < 0:
                return None
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in wanted:
                    return f"{_comm(proc, pid)} (pid {pid})"
            except OSError:
                continue
    return None


def _comm(proc: str, pid: str) -> str:
    try:
        with open(os.path.join(proc, pid, "comm")) as handle:
            comm = handle.read().strip()
    except OSError:
        return "a process"
    return "".join(c if c.isprintable() else "?" for c in comm)[:32] or "a process"
