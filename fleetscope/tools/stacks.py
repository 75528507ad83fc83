"""`fleetscope stacks PID...`: where agent workers' threads are, and what they wait on.

Runs `py-spy dump --pid PID --json` (py-spy reads the interpreter's memory with ptrace; the
target keeps running) and classifies each thread by its innermost frames:

    network  waiting on a socket or TLS read, write, accept or connect (a tool call or
             model endpoint that does not answer: worker-blocked-external-call)
    lock     waiting to acquire a lock, condition or semaphore
    cpu      running Python code on a CPU
    idle     parked: sleeping, waiting on an empty queue, or in a selector with nothing to do

Python frames alone miss waits whose frame names nothing network-like (a plain `sock.recv`
in the worker's own function, a C extension's call, source lines that cannot be read): each
thread is also classified from the kernel side, by the native thread id py-spy reports:
/proc/<pid>/task/<tid>/syscall and wchan, the fd's socket and its TCP peer
(collectors/tasks.py). A thread the frames call idle but the kernel finds parked in a
recv/poll/connect on a connected TCP socket is `network`, with the call and the peer; one
the frames call network but the kernel finds waiting on a listening socket (a server's
accept loop) or a local socket (a socketpair, a unix socket) is `idle`: waiting for work.

py-spy needs ptrace rights on the target: root, CAP_SYS_PTRACE, or the same user with
kernel.yama.ptrace_scope=0. Without them the error says so and how to get them.
"""

from __future__ import annotations

import json
import linecache
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

# selectors/asyncio are left out: an event loop with nothing to do sits in select() too.
NETWORK_FILES = re.compile(r"(^|/)(socket|ssl|http/client|"
                           r"urllib3/.*|requests/.*|httpx/.*|httpcore/.*|grpc/.*|aiohttp/.*|"
                           r"redis/.*|kafka/.*)\.py$")
NETWORK_FUNCTIONS = {"recv", "recv_into", "recvfrom", "readinto", "read", "readline",
                     "accept", "connect", "create_connection", "sendall", "send", "do_handshake",
                     "getresponse", "_read_status", "begin", "getaddrinfo", "_recv",
                     "wait_for_read", "sock_recv", "sock_connect"}
NETWORK_CALLS = re.compile(r"\.(recv|recv_into|recvfrom|accept|connect|sendall|getresponse|"
                           r"urlopen|request|get|post|do_handshake)\(|urlopen\(|"
                           r"create_connection\(")
LOCK_FUNCTIONS = {"acquire", "_acquire_restore", "_wait_for_tstate_lock"}
LOCK_CALLS = re.compile(r"\.acquire\(|\bwith\s+[\w.]*(lock|mutex|semaphore|cond)\w*\s*:",
                        re.IGNORECASE)


class StacksError(Exception):
    """py-spy missing, no ptrace rights, or no such process: one line for the user."""


@dataclass
class ThreadStack:
    pid: int
    thread_id: int
    thread_name: str
    state: str  # network | lock | cpu | idle
    frames: list[str] = field(default_factory=list)  # innermost first, "func (file:line)"
    blocking_call: str = ""  # the source line it waits in, where readable
    native_id: int = 0  # the kernel's thread id (/proc/<pid>/task/<tid>)
    syscall: str = ""  # kernel side: the network call it is parked in, e.g. recvfrom
    wchan: str = ""  # the kernel function it sleeps in, e.g. wait_woken
    peer: str = ""  # the TCP peer of the socket it waits on, e.g. 10.0.3.7:443


def _source(filename: str, line: int) -> str:
    return linecache.getline(filename, line).strip() if line else ""


def classify(thread: dict) -> tuple[str, str]:
    """(state, blocking source line) for one thread of py-spy's JSON dump."""
    frames = thread.get("frames") or []
    if thread.get("active"):
        return "cpu", ""
    for frame in frames[:6]:
        filename = frame.get("filename") or ""
        name = (frame.get("name") or "").rsplit(".", 1)[-1]  # py-spy 0.4: "Thread.run"
        text = _source(filename, frame.get("line") or 0)
        if NETWORK_FILES.search(filename) and name in NETWORK_FUNCTIONS:
            return "network", text
        if name in LOCK_FUNCTIONS or LOCK_CALLS.search(text):
            return "lock", text
        if NETWORK_CALLS.search(text):
            return "network", text
    top = frames[0] if frames else {}
    return "idle", _source(top.get("filename") or "", top.get("line") or 0)


def _py_spy() -> str:
    found = shutil.which("py-spy")
    if found:
        return found
    beside = shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if beside:
        return beside
    raise StacksError("py-spy is not installed: pip install 'fleetscope[stacks]'")


def dump(pid: int, timeout: float = 20.0) -> list[ThreadStack]:
    """Every Python thread of a process, classified."""
    if pid <= 0:  # 0 and below name process groups, never one process
        raise StacksError(f"no such process: {pid}")
    try:
        os.kill(pid, 0)  # signal 0: is there such a process (ours or not)
    except (ProcessLookupError, OverflowError):  # gone, or past any pid a kernel gives
        raise StacksError(f"no such process: {pid}") from None
    except PermissionError:
        pass  # another user's: py-spy says whether it may read it
    try:
        result = subprocess.run([_py_spy(), "dump", "--pid", str(pid), "--json"],
                                capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise StacksError(f"py-spy did not finish within {timeout:g} s on pid {pid}") from None
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip().splitlines()
        # py-spy prints "Error: ..." then a backtrace; the first line is the reason.
        errors = [line.removeprefix("Error:").strip() for line in message
                  if line.startswith("Error")]
        detail = errors[0] if errors else (message[0] if message else
                                           f"exit code {result.returncode}")
        if "ermission" in detail or "ptrace" in detail.lower():
            raise StacksError(
                f"no ptrace rights on pid {pid}: run as root or with CAP_SYS_PTRACE "
                "(e.g. kubectl debug --profile=sysadmin, docker --cap-add SYS_PTRACE), or set "
                "kernel.yama.ptrace_scope=0 for the same user")
        if "No such" in detail or "not found" in detail.lower() or "exist" in detail:
            raise StacksError(f"no such process: {pid}")
        if "python version" in detail:
            raise StacksError(f"pid {pid} is not a Python process py-spy can read ({detail})")
        raise StacksError(f"py-spy failed on pid {pid}: {detail}")
    try:
        threads = json.loads(result.stdout)
    except ValueError:
        raise StacksError(f"py-spy printed something that is not JSON for pid {pid}") from None
    stacks = []
    for thread in threads:
        state, line = classify(thread)
        frames = [f"{f.get('name')} ({f.get('short_filename') or f.get('filename')}:"
                  f"{f.get('line')})" for f in thread.get("frames") or []]
        stack = ThreadStack(pid, int(thread.get("thread_id") or 0),
                            thread.get("thread_name") or "", state, frames, line,
                            int(thread.get("os_thread_id") or 0))
        _kernel_side(stack)
        stacks.append(stack)
    return stacks


def _kernel_side(stack: ThreadStack) -> None:
    """Fill the kernel's view of a thread's wait; an idle-looking thread parked in a network
    call becomes `network`."""
    from fleetscope.collectors.base import NotAvailable, Scrape
    from fleetscope.collectors.parsers import ParseError
    from fleetscope.collectors.source import LiveHost
    from fleetscope.collectors.tasks import LOCK_WAIT, socket_wait

    if not stack.native_id or stack.state == "cpu":
        return
    try:
        wait = socket_wait(Scrape(LiveHost()), stack.pid, stack.native_id)
    except (NotAvailable, ParseError):
        return  # exited, or no rights on its syscall file: the frames' verdict stands
    if wait == LOCK_WAIT:  # a lock or a wait for work: the frames say which
        stack.syscall = "futex"
        return
    if isinstance(wait, str):  # a server's accept, a socketpair: waiting for work, not out
        if stack.state == "network":
            stack.state = "idle"
            stack.blocking_call = (f"{stack.blocking_call}  [{wait}]" if stack.blocking_call
                                   else wait)
        return
    if wait is None:
        return
    stack.syscall, stack.wchan, stack.peer = wait.call, wait.wchan, wait.peer
    if stack.state == "idle":
        stack.state = "network"
        where = f"{wait.call}() on fd {wait.fd}" + (f" to {wait.peer}" if wait.peer else "")
        stack.blocking_call = (f"{stack.blocking_call}  [{where}]" if stack.blocking_call
                               else where)


def run_stacks(pids: list[int], as_json: bool) -> int:
    """The `fleetscope stacks` command: 0 all dumped, 3 if any could not be."""
    failures = 0
    everything = []
    for pid in pids:
        try:
            everything.extend(dump(pid))
        except StacksError as err:
            print(f"fleetscope stacks: error: {err}", file=sys.stderr)
            failures += 1
    if as_json:
        json.dump([stack.__dict__ for stack in everything], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for stack in everything:
            print(f"pid {stack.pid} thread {stack.thread_name or stack.thread_id}: "
                  f"{stack.state.upper()}")
            if stack.blocking_call:
                print(f"    waiting in: {stack.blocking_call}")
            if stack.syscall:
                print(f"    kernel: {stack.syscall}() in {stack.wchan or '?'}"
                      + (f", peer {stack.peer}" if stack.peer else ""))
            for frame in stack.frames[:8]:
                print(f"    {frame}")
    return 3 if failures else 0
