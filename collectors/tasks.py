"""Every thread of a pool process, and the network call a parked thread waits in.

Per thread (task) of a process, beside the leader's own /proc/<pid>/ files:

    proc/<pid>/task/<tid>/status     State:\tR (running) / voluntary_ctxt_switches:\t912 / ...
    proc/<pid>/task/<tid>/schedstat  1540232 120022 31   (ns on CPU, ns waiting for a CPU, slices)
    proc/<pid>/task/<tid>/syscall    45 0x4 0x7f22bfb78a40 0xa 0x0 0x0 0x0 0x7f22bf97da10 0x7f..
    proc/<pid>/task/<tid>/wchan      wait_woken
    proc/<pid>/fd/<n>                -> socket:[22523]
    proc/<pid>/net/tcp, tcp6         the socket's peer, in the process's network namespace

A thread sleeping (state S or D) in recvfrom/recvmsg/read/poll/connect/sendto... whose fd is
a connected TCP socket is in a network wait. Listening sockets (a server's accept loop) and
other sockets (socketpairs of multiprocessing, unix sockets of local daemons) are not: they
are a worker's idle state, not an external call. epoll_wait and select are left out for the
same reason: an event loop with nothing to do sits in them too. poll/ppoll are what Python's
socket calls with a timeout use (sock_call_ex: poll on the one fd, then recv): the polled fds
are read from the process memory at the pollfd array address (root, as py-spy does), at most
MAX_POLLED_FDS of them.

syscall and wchan need ptrace rights on the process (root or CAP_SYS_PTRACE). Reading a task
costs about 10 us a file here: the collectors read the cheapest files first (status and
schedstat of every thread; syscall only of sleeping ones; wchan, the fd link and the TCP
table only for a network-call candidate), and at most TASKS_READ_PER_POOL threads a pool.

How long a thread has waited: the kernel does not say when a call began, but a thread
parked on a connection waits for an answer to what it last sent, so a wait first seen counts
from when the connection went silent: tcp_info's tcpi_last_data_sent/recv (what `ss -ti`
prints as lastsnd/lastrcv), asked through a sock_diag netlink query for exactly that socket
(about 30 us; the exporter's own network namespace only). Then it lasts while the thread
stays in the same call without running. A connect() whose SYN is unanswered (SYN_SENT) has
sent and received no data, and tcp_info counts those from 0 (the machine's uptime): its age
comes from the SYN's retransmission timer instead (syn_sent_age). No wait is older than its
thread (task/<tid>/stat starttime, against /proc/stat btime).

The pool's sockets and what waits on them (the pools collector's connection metrics):
proc/<pid>/net/tcp{,6} is read once per network namespace a scrape (a walk of the kernel's
whole connection hash, so never more often), the rows with something waiting kept
(parsers/net_tcp.py parse_tcp_queues); only where there are such rows are a process's fd
links read (proc/<pid>/fd/<n> -> socket:[inode], at most a pool's budget of them), to learn
which of those sockets are the pool's.

A bundle holds the same files per task (bounded the same way) plus proc/<pid>/fd_sockets
("fd inode [idle_ms]" lines: the socket fds of the fd links read, and those the waiting
threads wait on) and proc/<pid>/task/<tid>/pollfds (one polled fd a line) where the live node
has the fd links, the process memory and sock_diag.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from collections.abc import Hashable
from typing import NamedTuple

from .base import NotAvailable, Scrape
from .parsers import ParseError
from .parsers.net_tcp import (
    INET_DIAG_INFO,
    SOCK_DIAG_BY_FAMILY,
    TcpQueues,
    TcpSocket,
    parse_inet_diag_idle_ms,
    parse_net_tcp,
    parse_sockstat_inuse,
    parse_tcp_queues,
)
from .parsers.process import (
    TaskSyscall,
    parse_fd_sockets,
    parse_pid_schedstat,
    parse_pid_stat,
    parse_task_syscall,
    parse_wchan,
    socket_inode,
    status_int,
    status_state,
    status_values,
)
from .shared import proc_stat

TASKS_READ_PER_POOL = 1024  # threads whose files are read per pool per scrape (~25 ms)
FD_LINKS_READ_PER_POOL = 4096  # fd links read per pool per scrape to find its sockets
MAX_POLLED_FDS = 16
SLEEPING = ("S", "D")
NETLINK_SOCK_DIAG = 4  # include/uapi/linux/netlink.h
# A poll() interrupted by a signal or a ptrace stop (py-spy) resumes as restart_syscall with
# the original arguments still in the registers; the kernel function it sleeps in
# (poll_schedule_timeout, do_sys_poll) says it is a poll.
OWN_NETWORK_NAMESPACE = "proc/self/ns/net"  # the reader's, beside a process's
NETWORK_TABLES = "proc/net"  # the TCP tables of the reader's network namespace
RESTART = "restart_syscall"
# A thread asleep in futex(2): a mutex, semaphore or condition variable (the kernel cannot
# tell a lock from a wait for work; the pools collector counts those that keep running).
LOCK_WAIT = "futex() wait (a lock, semaphore or condition variable)"
FUTEX_CALLS = ("futex", "futex_waitv")

# The calls a thread waits in on one socket fd (arg 0), or in poll/ppoll (arg 0 the pollfd
# array, arg 1 its length); accept only ever waits on a listener (a server, not a call out).
# x86-64: arch/x86/entry/syscalls/syscall_64.tbl; arm64 uses the generic table,
# include/uapi/asm-generic/unistd.h.
SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 7: "poll", 19: "readv", 20: "writev", 42: "connect",
               43: "accept", 44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg",
               202: "futex", 219: RESTART, 271: "ppoll", 288: "accept4", 299: "recvmmsg",
               307: "sendmmsg", 449: "futex_waitv"},
    "aarch64": {63: "read", 64: "write", 65: "readv", 66: "writev", 73: "ppoll", 98: "futex",
                128: RESTART, 202: "accept", 203: "connect", 206: "sendto", 207: "recvfrom",
                211: "sendmsg", 212: "recvmsg", 242: "accept4", 243: "recvmmsg",
                269: "sendmmsg", 449: "futex_waitv"},
}
POLL_CALLS = ("poll", "ppoll")
POLL_NR = {"x86_64": 7, "aarch64": 73}


def read_proc(scrape: Scrape, relative: str, single: bool = False) -> str:
    """A per-process file through the scrape's source (collectors/source.py Reader.read_proc):
    a live host's fast path, a recorded root's checked read. `single`: the file is one
    seq_file record, so a short read is the whole file."""
    return scrape.read_proc(relative, single)


class TaskReading(NamedTuple):
    tid: int
    state: str  # R, S, D, ...
    voluntary: int
    nonvoluntary: int
    runtime_ns: int | None  # None: schedstat unreadable
    run_delay_ns: int | None
    schedstat: tuple[int, int, int] | None = None  # as read: unchanged = it has not run


TASK_STATUS_KEYS = ("State", "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")


def task_ids(scrape: Scrape, pid: int) -> list[int]:
    """The thread ids of a process in ascending order ([] when task/ is not there, as in a
    bundle recorded before threads were)."""
    try:
        names = scrape.listdir(f"proc/{pid}/task")
    except NotAvailable:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def read_task(scrape: Scrape, pid: int, tid: int,
              previous: TaskReading | None = None) -> TaskReading:
    """schedstat, then status, of one non-leader thread; NotAvailable if it exited.

    A thread whose schedstat (CPU time, wait time, times run) is the same as at the
    `previous` reading has not run since: its context switches cannot have moved and it is
    still in the state it was (or, woken and not yet run, runnable: then it is counted at
    its next reading), so its status is not read again. That halves the cost of a pool of
    parked threads.
    """
    base = f"proc/{pid}/task/{tid}"
    try:
        schedstat: tuple[int, int, int] | None = parse_pid_schedstat(
            read_proc(scrape, f"{base}/schedstat", True))
    except (NotAvailable, ParseError):
        schedstat = None
    if schedstat is not None and previous is not None and previous.schedstat == schedstat:
        return previous
    status = status_values(read_proc(scrape, f"{base}/status", True), TASK_STATUS_KEYS)
    runtime, delay = (schedstat[0], schedstat[1]) if schedstat is not None else (None, None)
    return TaskReading(tid, status_state(status), status_int(status, "voluntary_ctxt_switches"),
                       status_int(status, "nonvoluntary_ctxt_switches"), runtime, delay,
                       schedstat)


def task_dir(pid: int, tid: int) -> str:
    """The leader's files are the process's own (a single-threaded process needs no task/)."""
    return f"proc/{pid}" if tid == pid else f"proc/{pid}/task/{tid}"


def _arch(scrape: Scrape) -> str:
    def detect() -> str:
        head = _cpuinfo_head(scrape)
        if head is None:
            return os.uname().machine
        if "vendor_id" in head or "\nflags" in head:
            return "x86_64"
        if "CPU implementer" in head:
            return "aarch64"
        return "unknown"
    return scrape.memo("tasks:arch", detect)


def _cpuinfo_head(scrape: Scrape) -> str | None:
    """The first CPU's block says the architecture (parsers/cpuinfo.py); 4 KiB spare a
    256-CPU render. None: no cpuinfo under the roots."""
    return scrape.reader.read_head("proc/cpuinfo", 4096)


class NetworkWait(NamedTuple):
    pid: int
    tid: int
    call: str  # the syscall's name: recvfrom, poll, ...
    fd: int
    inode: int
    peer: str  # "127.0.0.1:8080" ("" when the TCP table has no peer for it)
    wchan: str  # the kernel function it sleeps in: wait_woken, sk_wait_data, ...
    signature: tuple  # (nr, args...): the same while it stays in the same call
    polled: tuple[int, ...] = ()  # poll/ppoll: every fd of its pollfd array
    idle_seconds: float | None = None  # how long the connection has been silent (tcp_info)


def _recorded_fd_sockets(scrape: Scrape, pid: int) -> dict[int, tuple[int, int | None]]:
    return scrape.memo(f"tasks:fd_sockets:{pid}", lambda: parse_fd_sockets(
        read_proc(scrape, f"proc/{pid}/fd_sockets")))


def _fd_socket(scrape: Scrape, pid: int, fd: int) -> tuple[int, int | None, bool] | None:
    """(socket inode, recorded idle ms or None, live) of one fd, or None: not a socket."""
    for root in scrape.roots:
        try:
            inode = socket_inode(os.readlink(os.path.join(root, f"proc/{pid}/fd/{fd}")))
            return None if inode is None else (inode, None, True)
        except FileNotFoundError:
            if os.path.isdir(os.path.join(root, f"proc/{pid}/fd")):
                return None  # closed since
            continue  # no fd/ here (a bundle): its fd_sockets
        except OSError:
            return None
    try:
        sockets = _recorded_fd_sockets(scrape, pid)
    except (NotAvailable, ParseError):
        return None
    found = sockets.get(fd)
    return None if found is None else (found[0], found[1], False)


def socket_fds(scrape: Scrape, pid: int, most: int) -> tuple[dict[int, int], int]:
    """({fd: socket inode} of the sockets among a process's first `most` fds in fd order, how
    many fd links were read): the fd links of a live node, a bundle's fd_sockets (written
    from the same links, under the same bound). NotAvailable: neither can be read (another
    user's process without root, a bundle recorded without them, or it exited)."""
    for root in scrape.roots:
        directory = os.path.join(root, f"proc/{pid}/fd")
        try:
            names = os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue  # no fd/ here (a bundle): its fd_sockets
        except OSError as err:
            raise NotAvailable(f"/proc/{pid}/fd: {err.strerror or err}") from None
        if len(names) > most:
            names = [str(fd) for fd in sorted(int(n) for n in names if n.isdigit())[:max(most, 0)]]
        sockets = {}
        for name in names:
            try:
                inode = socket_inode(os.readlink(f"{directory}/{name}"))
            except OSError:
                continue  # closed since the listing
            if inode is not None:
                sockets[int(name)] = inode
        return sockets, len(names)
    try:
        recorded = _recorded_fd_sockets(scrape, pid)
    except ParseError as err:
        raise NotAvailable(str(err)) from None
    return {fd: inode for fd, (inode, _) in recorded.items()}, len(recorded)


def tcp_idle_ms(local: str, peer: str) -> int | None:
    """How long a TCP connection of this network namespace has been silent (ms since data
    was last sent or received: tcp_info through a sock_diag netlink query for exactly that
    socket, as `ss -ti` shows lastsnd/lastrcv), or None if the kernel does not say."""
    def split(endpoint: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
        host, _, port = endpoint.rpartition(":")
        return ipaddress.ip_address(host.strip("[]")), int(port)

    try:
        (src, sport), (dst, dport) = split(local), split(peer)
    except ValueError:
        return None
    family = socket.AF_INET if src.version == 4 else socket.AF_INET6
    no_cookie = 0xFFFFFFFF
    # struct inet_diag_req_v2 with the exact socket id: one socket looked up, not a dump
    request = (struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1),
                           0, 0xFFF)
               + struct.pack("!HH", sport, dport) + src.packed.ljust(16, b"\0")
               + dst.packed.ljust(16, b"\0") + struct.pack("=III", 0, no_cookie, no_cookie))
    message = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, 1, 1, 0) + request
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as query:
            query.settimeout(1.0)
            query.sendto(message, (0, 0))
            answer = query.recv(65536)
    except OSError:
        return None
    try:
        return parse_inet_diag_idle_ms(answer)
    except ParseError:
        return None


def _same_network_namespace(scrape: Scrape, pid: int) -> bool:
    def own() -> str:
        try:
            return os.readlink(scrape.path(OWN_NETWORK_NAMESPACE))
        except OSError:
            return ""
    mine = scrape.memo("tasks:own_netns", own)
    try:
        return bool(mine) and os.readlink(scrape.path(f"proc/{pid}/ns/net")) == mine
    except OSError:
        return False


def polled_fds(scrape: Scrape, pid: int, tid: int, syscall: TaskSyscall) -> list[int]:
    """The fds of the pollfd array a thread in poll/ppoll waits on: struct pollfd {int fd;
    short events; short revents;} read from the process memory (live), or the bundle's
    task/<tid>/pollfds."""
    address, count = syscall.args[0], syscall.args[1]
    if not 0 < count <= MAX_POLLED_FDS:
        return []
    # Process memory is the live node's alone: a bundle's mem would be a planted file.
    for root in (r for r in scrape.roots if not scrape.reader.guarded(r)):
        try:
            fd = os.open(os.path.join(root, f"proc/{pid}/mem"), os.O_RDONLY)
        except FileNotFoundError:
            continue
        except OSError:
            return []
        try:
            data = os.pread(fd, 8 * count, address)
        except OSError:
            return []
        finally:
            os.close(fd)
        if len(data) != 8 * count:
            return []
        return [entry[0] for entry in struct.iter_unpack("=ihh", data) if entry[0] >= 0]
    try:
        text = read_proc(scrape, f"{task_dir(pid, tid)}/pollfds")
    except NotAvailable:
        return []
    return [int(line) for line in text.split() if line.isdigit()]


def network_namespace(scrape: Scrape, pid: int) -> str:
    """What names the process's network namespace: its ns/net link ("net:[4026531840]"),
    or in a bundle (no links) the process itself when its own TCP tables were recorded (a
    process in another namespace), else the node's."""
    for root in scrape.roots:
        try:
            return os.readlink(os.path.join(root, f"proc/{pid}/ns/net"))
        except OSError:
            continue
    try:
        own_tables = scrape.reader.entries(f"proc/{pid}/net")
    except NotAvailable:  # a process exiting as it is read: listing its net/ fails (EINVAL)
        own_tables = None
    return f"pid {pid}" if own_tables else "root"


def tcp_tables(scrape: Scrape, pid: int,
               namespace: str | None = None) -> tuple[tuple[str, str], ...]:
    """(path, text) of the TCP tables of the process's network namespace, read once per
    namespace a scrape: proc/<pid>/net/tcp{,6} (what a container's workers see), else the
    root's proc/net/tcp{,6} (a bundle). NotAvailable when neither table is there."""
    def read() -> tuple[tuple[str, str], ...]:
        tables, found = [], False
        for name, counts, protocol in (("tcp", "sockstat", "TCP"), ("tcp6", "sockstat6", "TCP6")):
            for directory in (f"proc/{pid}/net", NETWORK_TABLES):
                if _no_sockets(scrape, f"{directory}/{counts}", protocol):
                    found = True  # an empty table, and its walk spared
                    break
                relative = f"{directory}/{name}"
                try:
                    tables.append((f"/{relative}", read_proc(scrape, relative)))
                except NotAvailable:
                    continue
                found = True
                break
        if not found:
            raise NotAvailable(f"/proc/{pid}/net/tcp and /proc/net/tcp do not exist")
        return tuple(tables)
    return scrape.memo(f"tasks:tcp-text:{namespace or network_namespace(scrape, pid)}", read)


def _no_sockets(scrape: Scrape, relative: str, protocol: str) -> bool:
    """Whether the namespace's sockstat says it has no socket of `protocol`. Reading a TCP
    table walks the kernel's whole connection hash (every namespace's sockets, every empty
    bucket) even when it prints no row; sockstat prints a few counters (a bundle records the
    tables, not the counts)."""
    try:
        return parse_sockstat_inuse(read_proc(scrape, relative, True), protocol,
                                    f"/{relative}") == 0
    except (NotAvailable, ParseError):
        return False


def _tcp_table(scrape: Scrape, pid: int) -> dict[int, TcpSocket]:
    """Every TCP socket of the process's network namespace ({} when unreadable)."""
    def parse() -> dict[int, TcpSocket]:
        sockets: dict[int, TcpSocket] = {}
        try:
            tables = tcp_tables(scrape, pid)
        except NotAvailable:
            return sockets
        for what, text in tables:
            try:
                sockets.update(parse_net_tcp(text, what=what))
            except ParseError:
                pass
        return sockets
    return scrape.memo(f"tasks:tcp:{network_namespace(scrape, pid)}", parse)


def waiting_sockets(scrape: Scrape, pid: int,
                    namespace: str | None = None) -> dict[int, TcpQueues]:
    """{inode: TcpQueues} of the sockets of the process's network namespace (`namespace`,
    network_namespace() when not given) with connections or bytes waiting for the process,
    or a retransmission outstanding; memoised per namespace. NotAvailable: no TCP table;
    ParseError: a corrupt one."""
    namespace = namespace or network_namespace(scrape, pid)

    def parse() -> dict[int, TcpQueues]:
        rows: dict[int, TcpQueues] = {}
        for what, text in tcp_tables(scrape, pid, namespace):
            for inode, row in parse_tcp_queues(text, what=what).items():
                # a listener's accept queue, an established connection's unread bytes (not
                # CLOSE_WAIT's: the peer's FIN alone counts 1 there until the process reads
                # the end of the stream), a retransmission outstanding
                if row.retransmits or (row.rx_queue and row.state in ("LISTEN", "ESTABLISHED")):
                    rows[inode] = row
        return rows
    return scrape.memo(f"tasks:waiting:{namespace}", parse)


class PoolSockets(NamedTuple):
    waiting: dict[int, TcpQueues]  # inode -> row: the pool's sockets something waits on
    known: bool  # some process's sockets were read, or none could hold a waiting one
    read: dict[int, dict[int, int]]  # pid -> {fd: socket inode} of the fd links read


def pool_sockets(scrape: Scrape, members: list[tuple[int, str]],
                 budget: int = FD_LINKS_READ_PER_POOL, tables=None, links=None) -> PoolSockets:
    """The sockets of one pool's processes (pid, network namespace), in this order, that
    something waits on (waiting_sockets). A process whose namespace has no such row needs no
    fd read; the others' fd links are read up to `budget` links in all, and no more in a
    namespace once every waiting socket of it is found to be the pool's. `tables` and
    `links` tally how each source fared (.ok, .fail(err)). The recorder writes `read` as the
    processes' fd_sockets, so a bundle replays the same reads."""
    waiting: dict[int, TcpQueues] = {}
    read: dict[int, dict[int, int]] = {}
    known = False
    for pid, namespace in members:
        try:
            rows = waiting_sockets(scrape, pid, namespace)
        except (NotAvailable, ParseError) as err:
            if tables is not None:
                tables.fail(err)
            continue
        if tables is not None:
            tables.ok += 1
        if not rows or rows.keys() <= waiting.keys():
            known = True  # nothing waits that it could add to the pool's
            continue
        if budget <= 0:
            continue
        try:
            sockets, count = socket_fds(scrape, pid, budget)
        except NotAvailable as err:
            if links is not None:
                links.fail(err)
            continue
        if links is not None:
            links.ok += 1
        budget -= count
        known = True
        read[pid] = sockets
        for inode in sockets.values():
            row = rows.get(inode)
            if row is not None:
                waiting[inode] = row
    return PoolSockets(waiting, known, read)


def _tcp_row(scrape: Scrape, pid: int, inode: int) -> TcpQueues | None:
    try:
        for what, text in tcp_tables(scrape, pid):
            row = parse_tcp_queues(text, {inode}, what).get(inode)
            if row is not None:
                return row
    except (NotAvailable, ParseError):
        pass
    return None


# include/net/tcp.h: a SYN's first retransmission timeout (RFC 6298), and the most a timeout
# grows to; icsk_retransmits is a u8.
TCP_TIMEOUT_INIT_S = 1.0
TCP_RTO_MAX_S = 120.0
MAX_RETRANSMITS = 255
SYN_LINEAR_TIMEOUTS = "proc/sys/net/ipv4/tcp_syn_linear_timeouts"


def syn_sent_age(row: TcpQueues, linear_timeouts: int, ticks_per_second: float) -> float | None:
    """Seconds since a connect() sent its first SYN, from its SYN_SENT row: the retransmit
    timer's schedule is the kernel's own (net/ipv4/tcp_timer.c tcp_retransmit_timer()): the
    first SYN waits TCP_TIMEOUT_INIT, each retransmission `retrnsmt` sets the timer again,
    to the same timeout for the first tcp_syn_linear_timeouts retransmissions (Linux 6.5+,
    default 4; 0 before) and doubled after each one past them (up to TCP_RTO_MAX). So after
    k retransmissions the timer fires at the sum of the k + 1 timeouts, and the SYN is that
    sum minus the timer's time left old. None when the row does not fit that schedule: no
    retransmit timer, or more time left than the timeout (an initial timeout a BPF program
    changed). A TCP_USER_TIMEOUT that cut the last timer short makes it older by the cut.

    >>> row = TcpQueues("SYN_SENT", 0, 5, 1, 99)  # 5 retransmissions, 0.99 s to the sixth
    >>> round(syn_sent_age(row, 4, 100), 2)       # timeouts 1, 1, 1, 1, 1, then 2
    6.01
    >>> round(syn_sent_age(row, 0, 100), 2)       # before 6.5: 1, 2, 4, 8, 16, then 32
    62.01
    """
    if row.timer != 1 or not 0 <= row.retransmits <= MAX_RETRANSMITS:
        return None
    elapsed, timeout = 0.0, TCP_TIMEOUT_INIT_S
    for sent in range(1, row.retransmits + 1):
        elapsed += timeout
        if sent > linear_timeouts:
            timeout = min(timeout * 2, TCP_RTO_MAX_S)
    left = row.timer_ticks / ticks_per_second
    if left > timeout:
        return None
    return elapsed + timeout - left


def _syn_linear_timeouts(scrape: Scrape) -> int:
    """net.ipv4.tcp_syn_linear_timeouts (the node's, the exporter's network namespace);
    0 where the file is not there: kernels before 6.5 back off from the first SYN."""
    def read() -> int:
        try:
            value = scrape.read_text(SYN_LINEAR_TIMEOUTS).strip()
        except NotAvailable:
            return 0
        return int(value) if value.isdigit() and value.isascii() else 0
    return scrape.memo("tasks:syn_linear_timeouts", read)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def thread_age(scrape: Scrape, pid: int, tid: int) -> float | None:
    """Seconds the thread has existed at the scrape's time: its starttime (task/<tid>/stat
    field 22, clock ticks after boot) against /proc/stat btime. btime is whole seconds
    rounded down, so this errs long by under a second, never short. None: unreadable."""
    try:
        start = parse_pid_stat(read_proc(scrape, f"{task_dir(pid, tid)}/stat", True))
        btime = proc_stat(scrape).scalars["btime"]
    except (NotAvailable, ParseError, KeyError):
        return None
    return scrape.time - btime - start.starttime_ticks / CLOCK_TICKS


def _wchan(scrape: Scrape, pid: int, tid: int) -> str:
    try:
        return parse_wchan(read_proc(scrape, f"{task_dir(pid, tid)}/wchan", True))
    except NotAvailable:
        return ""


def network_wait(scrape: Scrape, pid: int, tid: int) -> NetworkWait | None:
    """The network call a sleeping thread waits in, or None (another call, or not a
    connected TCP socket). NotAvailable/ParseError: its syscall file cannot be read."""
    wait = socket_wait(scrape, pid, tid)
    return wait if isinstance(wait, NetworkWait) else None


def socket_wait(scrape: Scrape, pid: int, tid: int) -> NetworkWait | str | None:
    """What a sleeping thread's socket call waits on: a NetworkWait (a connected TCP
    socket), a description when it is a local wait ("accept() on a listening socket",
    "recvfrom() on a local socket": a server or a worker waiting for work), or None (not a
    socket call, or unknown)."""
    syscall = parse_task_syscall(read_proc(scrape, f"{task_dir(pid, tid)}/syscall", True))
    if syscall is None:
        return None
    arch = _arch(scrape)
    call = SYSCALLS.get(arch, {}).get(syscall.nr)
    if call is None:
        return None
    if call in FUTEX_CALLS:
        return LOCK_WAIT
    wchan = None
    if call == RESTART:
        wchan = _wchan(scrape, pid, tid)
        if "futex" in wchan:
            return LOCK_WAIT
        if "poll" not in wchan:
            return None  # a restarted sleep
        call = "poll"
        syscall = syscall._replace(nr=POLL_NR.get(arch, syscall.nr))
    polled = tuple(polled_fds(scrape, pid, tid, syscall)) if call in POLL_CALLS else ()
    if call in POLL_CALLS and not polled:
        return None  # too many fds to be one call's socket, or the memory is unreadable
    local = None
    for fd in polled or (syscall.args[0],):
        found = _fd_socket(scrape, pid, fd)
        if found is None:
            continue
        inode, idle_ms, live = found
        tcp = _tcp_table(scrape, pid).get(inode)
        if tcp is None or tcp.state == "LISTEN":
            kind = "a listening" if tcp is not None else "a local"
            local = local or f"{call}() on {kind} socket (fd {fd})"
            continue
        if wchan is None:
            wchan = _wchan(scrape, pid, tid)
        idle = None if idle_ms is None else idle_ms / 1000
        if tcp.state == "SYN_SENT":
            # tcp_info's last data sent/received count from 0 on a socket that never
            # carried any: the SYN's own timer says how long the connect() has waited
            row = _tcp_row(scrape, pid, inode)
            idle = None if row is None else syn_sent_age(row, _syn_linear_timeouts(scrape),
                                                         CLOCK_TICKS)
        elif live and tcp.peer and _same_network_namespace(scrape, pid):
            idle_ms = tcp_idle_ms(tcp.local, tcp.peer)
            idle = None if idle_ms is None else idle_ms / 1000
        if idle is not None:
            # a connection older than the thread (a pooled one) is not the thread's wait
            age = thread_age(scrape, pid, tid)
            idle = idle if age is None else max(0.0, min(idle, age))
        return NetworkWait(pid, tid, call, fd, inode, tcp.peer, wchan, syscall.signature,
                           polled, idle)
    return local


def process_network_waits(scrape: Scrape, pid: int, limit: int = TASKS_READ_PER_POOL,
                          tids: list[int] | None = None) -> list[tuple[NetworkWait, int | None]]:
    """(wait, CPU ns) of every thread of a process in a network wait now: the leader, then
    up to `limit` other threads in tid order (the order and bound the pools collector uses),
    or the given `tids`. For subjects and bundles; the collector walks the threads itself as
    it counts them."""
    found: list[tuple[NetworkWait, int | None]] = []

    def check(tid: int, state: str, runtime: int | None) -> None:
        if state not in SLEEPING:
            return
        try:
            wait = network_wait(scrape, pid, tid)
        except (NotAvailable, ParseError):
            return
        if wait is not None:
            found.append((wait, runtime))

    try:
        stat_text = read_proc(scrape, f"proc/{pid}/stat", True)
    except NotAvailable:
        return found  # exited
    try:
        runtime: int | None = parse_pid_schedstat(
            read_proc(scrape, f"proc/{pid}/schedstat", True))[0]
    except (NotAvailable, ParseError):
        runtime = None
    check(pid, stat_text[stat_text.rfind(")") + 2:][:1], runtime)
    if tids is None:
        tids = [t for t in task_ids(scrape, pid) if t != pid][:limit]
    for tid in tids:
        try:
            task = read_task(scrape, pid, tid)
        except (NotAvailable, ParseError):
            continue
        check(tid, task.state, task.runtime_ns)
    return found


class WaitTracker:
    """How long each thread has stayed in the same network wait: the same call with the same
    arguments, and no CPU time used in between (schedstat field 1 unchanged), across
    observations. A wait first seen (or seen again after the thread ran) counts from when its
    connection went silent where the kernel says it (tcp_info: the thread waits for an
    answer to what it last sent), else from that observation."""

    def __init__(self) -> None:
        self._since: dict[Hashable, tuple[tuple, int | None, float]] = {}

    def observe(self, waits: dict[Hashable, tuple], now: float) -> dict[Hashable, float]:
        """{thread key: (signature, runtime ns[, connection idle seconds])} of the threads
        waiting now -> seconds each has waited. Threads not in `waits` are forgotten."""
        previous, current = self._since, {}
        for key, (signature, runtime, *idle) in waits.items():
            old = previous.get(key)
            same = (old is not None and old[0] == signature and old[1] == runtime
                    and runtime is not None)
            if same:
                since = old[2]
            else:
                since = now - idle[0] if idle and idle[0] is not None else now
            current[key] = (signature, runtime, since)
        self._since = current
        return {key: max(0.0, now - since) for key, (_, _, since) in current.items()}
