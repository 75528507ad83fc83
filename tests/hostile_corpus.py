"""The hostile-input corpus: bundles, configs and web configs a hostile or unlucky user could
hand fleetscope, generated on demand (nothing large is committed).

    python -m tests.hostile_corpus DIR      # build the corpus in DIR and list it

Every case is built from the `kunpeng-128` fixture bundle (tests/fixtures/make_bundles.py)
with one thing broken, so whatever the case does not break still diagnoses. Each case says
what a correct fleetscope does with it: `refuse` (exit 3 and exactly one stderr line) or
`diagnose` (a diagnosis, exit 0-2, or a clean refusal), and which text must never appear in
any output (`secret`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import BUNDLES

FIXTURE = BUNDLES / "kunpeng-128"  # generated once per test session (tests/conftest.py)
OUTSIDE_SECRET = "TOPSECRET-OUTSIDE-7f3a"  # content of files outside every bundle
MIB = 1024 * 1024


@dataclass
class Case:
    name: str
    kind: str  # bundle | config | webconfig
    path: Path
    expect: str  # refuse | diagnose
    says: str = ""  # a word the refusal line must contain
    secret: str = ""  # text that must appear in no output
    root: Path | None = None  # a sample directory for `exporter --root`, when the case has one
    tags: set[str] = field(default_factory=set)


def _base(target: Path) -> Path:
    shutil.copytree(FIXTURE, target, symlinks=False)
    return target


def _meta(bundle: Path) -> dict:
    return json.loads((bundle / "meta.json").read_text())


def _write_meta(bundle: Path, meta: dict | str) -> None:
    text = meta if isinstance(meta, str) else json.dumps(meta)
    (bundle / "meta.json").write_text(text)


def _tar(source: Path, archive: Path, sparse: bool = False) -> Path:
    """A .tar.gz of `source` by GNU tar (--sparse stores a sparse file as its holes)."""
    argv = ["tar", "-czf", str(archive), "-C", str(source), "."]
    if sparse:
        argv.insert(1, "--sparse")
    subprocess.run(argv, check=True)
    shutil.rmtree(source)
    return archive


def _sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)


def _deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def build(directory: Path, big: int = 2048 * MIB) -> list[Case]:
    """Build every case under `directory`. `big` is the sparse size of the "huge" members."""
    directory.mkdir(parents=True, exist_ok=True)
    outside = directory / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "shadow").write_text(f"{OUTSIDE_SECRET}:$6$salt$hash:19000:0:99999:7:::\n")
    cases: list[Case] = []

    def bundle(name: str) -> Path:
        return _base(directory / name)

    def add(name, path, expect, says="", secret="", root=None, tags=()):
        cases.append(Case(name, "bundle", path, expect, says, secret, root, set(tags)))

    # 9.2e18 s: finite, but past every calendar (it crashed `bundle show`'s window).
    for name, value in (("meta-time-nan", "NaN"), ("meta-time-infinity", "Infinity"),
                        ("meta-time-past-year-9999", "9.223372036854776e+18")):
        b = bundle(name)
        text = json.dumps(_meta(b)).replace("1764660015.0", value, 1)
        _write_meta(b, text)
        add(name, b, "refuse", "finite")

    b = bundle("meta-nested-1000")
    meta = json.dumps(_meta(b))
    _write_meta(b, meta[:-1] + f', "junk": {_deep_json(1000)}}}')
    add("meta-nested-1000", b, "refuse", "nested", root=b / "samples" / "s0000")

    b = bundle("meta-huge")
    meta = json.dumps(_meta(b))
    _write_meta(b, meta[:-1] + ', "pad": "' + "x" * (65 * MIB) + '"}')
    add("meta-huge", b, "refuse", "MiB")

    b = bundle("meta-hostile-text")
    meta = _meta(b)
    meta["hostname"] = "evil\n\x1b[31mhost\rinjected"
    meta["config"]["pools"][0]["name"] = "x" * 5000
    _write_meta(b, meta)
    add("meta-hostile-text", b, "diagnose")

    b = bundle("meta-sample-outside")
    meta = _meta(b)
    meta["samples"][0]["dir"] = "../../../../../../etc"
    _write_meta(b, meta)
    add("meta-sample-outside", b, "refuse", "outside")

    b = bundle("meta-not-utf8")
    (b / "meta.json").write_bytes(b"\xff\xfe{\x00\x80 not json")
    add("meta-not-utf8", b, "refuse", "meta.json")

    b = bundle("meta-time-string")
    meta = _meta(b)
    meta["samples"][1]["time"] = "soon"
    _write_meta(b, meta)
    add("meta-time-string", b, "refuse", "time")

    b = bundle("meta-bad-config")
    meta = _meta(b)
    meta["config"]["pools"][0]["class"] = "urgent"
    _write_meta(b, meta)
    add("tar-invalid-config", _tar(b, directory / "tar-invalid-config.tar.gz"), "refuse",
        "config", tags={"scratch"})

    b = bundle("sparse-member")
    _sparse(b / "samples" / "s0001" / "proc" / "stat", big)
    add("tar-sparse-member", _tar(b, directory / "tar-sparse-member.tar.gz", sparse=True),
        "refuse", "limit", tags={"scratch"})

    b = bundle("sparse-total")
    for index in range(20):  # each under the member limit, together over the total
        _sparse(b / "samples" / "s0001" / "cmd" / f"pad-{index}", 60 * MIB)
    add("tar-sparse-total", _tar(b, directory / "tar-sparse-total.tar.gz", sparse=True),
        "refuse", "limit", tags={"scratch"})

    b = bundle("garbage-proc-stat")
    with open(b / "samples" / "s0001" / "proc" / "stat", "wb") as handle:
        block = os.urandom(MIB)
        for _ in range(50):
            handle.write(block)
    add("dir-garbage-proc-stat-50m", b, "diagnose", root=b / "samples" / "s0001",
        tags={"rss"})

    b = bundle("link-dev-zero")
    stat = b / "samples" / "s0001" / "proc" / "stat"
    stat.unlink()
    stat.symlink_to("/dev/zero")
    add("dir-symlink-dev-zero", b, "diagnose", root=b / "samples" / "s0001", tags={"rss"})

    b = bundle("fifo")
    loadavg = b / "samples" / "s0001" / "proc" / "loadavg"
    loadavg.unlink()
    os.mkfifo(loadavg)
    add("dir-fifo-loadavg", b, "diagnose", root=b / "samples" / "s0001")

    b = bundle("link-outside")
    for relative in ("proc/loadavg", "proc/pressure/cpu", "proc/stat"):
        target = b / "samples" / "s0001" / relative
        target.unlink()
        target.symlink_to(outside / "shadow")
    add("dir-symlink-outside", b, "diagnose", secret=OUTSIDE_SECRET,
        root=b / "samples" / "s0001")

    b = bundle("link-sample-dir")
    proc = b / "samples" / "s0001" / "proc"
    shutil.rmtree(proc)
    proc.symlink_to("/proc")  # the real host's /proc inside a bundle
    add("dir-symlink-proc-to-host", b, "diagnose", root=b / "samples" / "s0001")

    b = bundle("label-traversal")
    # A SIGILL report whose binary name climbs out of cmd/isa-check-<binary>.json.
    escape = "/" + "../" * 40 + str(outside).lstrip("/") + "/isa"
    (outside / "isa.json").write_text(json.dumps(
        {"format": "fleetscope-isa-check/1", "missing": [OUTSIDE_SECRET], "arch_mismatch": False}))
    line = (f"[ 100.000001] traps: agent[4242] trap invalid opcode ip:4005d6 sp:7ffd1 error:0 "
            f"in {escape}[400000+1000]\n")
    with open(b / "static" / "dmesg.txt", "a") as handle:
        handle.write(line * 3)
    for sample in ("s0000", "s0001"):
        (b / "samples" / sample / "cmd" / "isa-check-").mkdir(parents=True)
    add("dir-label-path-traversal", b, "diagnose", secret=OUTSIDE_SECRET)

    b = bundle("status-blank-line")
    for status in (b / "samples" / "s0001" / "proc").glob("*/status"):
        status.write_text("\n" + status.read_text())
    add("dir-status-leading-blank-line", b, "diagnose", root=b / "samples" / "s0001")

    for name, member in (("tar-member-traversal", "../escape.txt"),
                         ("tar-member-absolute", "/tmp/fleetscope-escape.txt")):
        archive = directory / f"{name}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            info = tarfile.TarInfo(member)
            info.size = 4
            import io

            tar.addfile(info, io.BytesIO(b"evil"))
        add(name, archive, "refuse", "outside")

    archive = directory / "tar-symlink-member.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("meta.json")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/shadow"
        tar.addfile(info)
    add("tar-symlink-member", archive, "refuse", "links")

    garbage = directory / "not-gzip.tar.gz"
    garbage.write_bytes(os.urandom(4096))
    add("not-gzip", garbage, "refuse", "readable")

    b = bundle("truncated")
    archive = _tar(b, directory / "truncated.tar.gz")
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2])
    add("tar-truncated", archive, "refuse", "readable", tags={"scratch"})

    empty = directory / "empty.tar.gz"
    empty.write_bytes(b"")
    add("empty-file", empty, "refuse", "")

    cases.extend(_configs(directory))
    cases.extend(_web_configs(directory))
    return cases


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A billion-laughs YAML fragment: &l8 expands to width**levels strings."""
    lines = ['  l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        items = ",".join(f"*l{level - 1}" for _ in range(width))
        lines.append(f"  l{level}: &l{level} [{items}]")
    return "\n".join(lines)


def _configs(directory: Path) -> list[Case]:
    cases = []

    def add(name, text, says, data: bytes | None = None):
        path = directory / f"{name}.yaml"
        if data is not None:
            path.write_bytes(data)
        else:
            path.write_text(text)
        cases.append(Case(name, "config", path, "refuse", says))

    add("config-nested-500", "pools: " + "[" * 500 + "]" * 500 + "\n", "nested")
    add("config-bomb-unknown-pool-key",
        "pools:\n  - name: batch\n    class: offline\n    match: {cmdline: etl}\n"
        "    extra:\n" + _alias_bomb().replace("  l", "      l") + "\n", "unknown")
    add("config-bomb-known-key", "bomb:\n" + _alias_bomb() + "\nethtool_interfaces: *l8\n",
        "unknown")
    add("config-bomb-interfaces",
        "ethtool_interfaces:\n  - &a [x, x, x, x, x, x, x, x, x]\n  - [*a, *a, *a]\n",
        "ethtool_interfaces")
    add("config-python-tag", "pools: !!python/object/apply:os.system ['true']\n", "YAML")
    add("config-not-utf8", "", "UTF-8", data=b"pools: \xff\xfe\n")
    add("config-redis-queue-extra", "redis_queues:\n  - {key: q, pool: p, huge: 1}\n",
        "unknown")
    return cases


def _web_configs(directory: Path) -> list[Case]:
    cases = []

    def add(name, text, says):
        path = directory / f"{name}.web.yaml"
        path.write_text(text)
        cases.append(Case(name, "webconfig", path, "refuse", says))

    add("web-nested-500", "basic_auth_users: " + "[" * 500 + "]" * 500 + "\n", "nested")
    add("web-bad-bcrypt", "basic_auth_users:\n  prometheus: $2b$10$short\n", "bcrypt")
    add("web-unknown-server-key", "http_server_config:\n  headers: {}\n  evil: 1\n", "unknown")
    add("web-crlf-header", 'http_server_config:\n  headers:\n    X-Frame-Options: '
        '"deny\\r\\nSet-Cookie: session=stolen"\n', "one line")
    add("web-bad-header-name", 'http_server_config:\n  headers:\n    "Bad Name:": x\n',
        "header name")
    return cases


@dataclass
class Result:
    returncode: int | None  # None: killed at the guard timeout
    stdout: str
    stderr: str
    max_rss_mib: float


ADDRESS_SPACE_LIMIT = 4096 * MIB  # a runaway probe fails here instead of eating the machine


def run(argv: list[str], env: dict | None = None, timeout: float = 60.0) -> Result:
    """Run a fleetscope command in a child, measuring its peak RSS (wait4's ru_maxrss)."""
    import tempfile
    import time

    # ru_maxrss of a child forked from this test process starts at this process's size
    # (Linux keeps the pre-exec high-water mark across exec), and a long test run grows to
    # hundreds of MiB. So a small launcher forks the command from its own fresh memory,
    # waits for it and writes the command's own peak to a file; it ends with its status.
    launcher = (
        "import os, resource, sys\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        f"    resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE_LIMIT}, "
        f"{ADDRESS_SPACE_LIMIT}))\n"
        "    os.execv(sys.executable, [sys.executable] + sys.argv[2:])\n"
        "_, status, usage = os.wait4(pid, 0)\n"
        "code = os.waitstatus_to_exitcode(status)\n"
        "with open(sys.argv[1], 'w') as out:\n"
        "    out.write(f'{usage.ru_maxrss} {code}')\n"
        "os._exit(code & 0xFF)\n")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as peak:
        proc = subprocess.Popen([sys.executable, "-c", launcher, peak.name, "-m", "fleetscope",
                                 *argv], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        deadline = time.monotonic() + timeout
        status = rusage = None
        while time.monotonic() < deadline:
            pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.05)
        else:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and the command
            _, status, rusage = os.wait4(proc.pid, 0)
            status = None
        proc.returncode = 0  # reaped by wait4 already
        out.seek(0)
        err.seek(0)
        code = os.waitstatus_to_exitcode(status) if status is not None else None
        measured = peak.read().split()
        maxrss_kib = rusage.ru_maxrss
        if code is not None and len(measured) == 2:  # the command's own peak and status
            maxrss_kib, code = int(measured[0]), int(measured[1])
        return Result(code, out.read().decode("utf-8", "replace"),
                      err.read().decode("utf-8", "replace"), maxrss_kib / 1024)


def commands(case: Case, base_bundle: Path) -> dict[str, list[str]]:
    """The commands a case is run against, by label."""
    if case.kind == "bundle":
        return {"diagnose": ["diagnose", "--bundle", str(case.path), "--json"],
                "bundle show": ["bundle", "show", str(case.path)]}
    if case.kind == "config":
        return {"diagnose": ["diagnose", "--bundle", str(base_bundle), "--config",
                             str(case.path)],
                "exporter": ["exporter", "--listen", "127.0.0.1:0", "--config", str(case.path)],
                "bundle record": ["bundle", "record", "--seconds", "0", "-o",
                                  str(case.path) + ".out.tar.gz", "--config", str(case.path)]}
    return {"exporter": ["exporter", "--listen", "127.0.0.1:0", "--web-config", str(case.path)]}


def verdict(case: Case, result: Result) -> str:
    """'ok', or what is wrong with a command's result for this case."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.returncode is None:
        return "hung (killed at the guard timeout)"
    if "Traceback" in result.stderr:
        return f"traceback, exit {result.returncode}: {lines[-1][:100] if lines else ''}"
    if case.secret and (case.secret in result.stdout or case.secret in result.stderr):
        return "printed content of a file outside the bundle"
    if case.expect == "refuse" or result.returncode == 3:
        if result.returncode != 3:
            return f"exit {result.returncode}, expected 3"
        if len(lines) != 1:
            return f"{len(lines)} stderr lines, expected 1"
        if case.expect == "refuse" and case.says and case.says.lower() not in lines[0].lower():
            return f"refusal does not say {case.says!r}: {lines[0][:100]}"
        return "ok"
    if result.returncode not in (0, 1, 2):
        return f"exit {result.returncode}"
    return "ok"


if __name__ == "__main__":
    # A before/after table: every case through every command.
    import tempfile

    from tests import fixture_trees

    if not FIXTURE.is_dir():
        fixture_trees.generate(BUNDLES.parent)
    with tempfile.TemporaryDirectory(prefix="hostile-") as scratch:
        corpus = build(Path(scratch) / "corpus", big=int(os.environ.get("HOSTILE_BIG", 2048 * MIB)))
        shm = Path(scratch) / "shm"
        shm.mkdir()
        def in_shm() -> set[str]:
            return {n for n in os.listdir("/dev/shm") if n.startswith("fleetscope-")}

        for case in corpus:
            for label, argv in commands(case, FIXTURE).items():
                before = in_shm()
                result = run(argv, {"FLEETSCOPE_SCRATCH_DIR": str(shm)},
                             timeout=8 if label == "exporter" else 30)
                left = sum(1 for _ in shm.iterdir()) + len(in_shm() - before)
                line = (result.stderr.strip().splitlines() or [""])[-1][:90]
                print(f"{case.name:<32} {label:<14} exit={result.returncode!s:<5} "
                      f"rss={result.max_rss_mib:6.0f}M left={left} {verdict(case, result):<40}"
                      f" | {line}", flush=True)
                for entry in shm.iterdir():
                    shutil.rmtree(entry, ignore_errors=True)
