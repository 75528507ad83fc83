"""The generated fixture trees: written once per test session, proven by a hash manifest.

    python -m tests.fixture_trees DIR              # write bundles/ and scenarios/ into DIR
    python -m tests.fixture_trees --manifest       # rewrite tests/fixtures/generated.sha256

`tests/fixtures/make_bundles.py` writes the two `fleetscope-bundle/1` fixtures (x86-256,
kunpeng-128) and `tests/fixtures/make_scenarios.py` one scenario bundle per rule; neither tree is
committed. The test session writes both into a temporary directory (the session fixture in
tests/conftest.py, once for all of a run's processes: `generate_once`);
`tests/fixtures/generated.sha256` holds one line per generated file, in the
format of `sha256sum` (`<sha256>  <path>`, paths relative to that directory, sorted), and
tests/test_fixture_trees.py checks that the generators reproduce it exactly.

The other trees beside the generators stay committed, each with its origin note: verbatim
public samples and real captures (agent/, ethtool/, kmsg/, capture/), small constructed
trees (rdma/, perf/) and the golden outputs (e2e/).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MANIFEST = FIXTURES / "generated.sha256"
GENERATORS = {"bundles": FIXTURES / "make_bundles.py",
              "scenarios": FIXTURES / "make_scenarios.py"}
REFRESH = "python -m tests.fixture_trees --manifest"


def load_generator(tree: str, name: str):
    """A generator module (make_bundles / make_scenarios) loaded in this process under
    `name`, as the generator runs it: a probe of its tables and kit, nothing written."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, GENERATORS[tree])
    module = importlib.util.module_from_spec(spec)
    # dataclasses resolves string annotations through sys.modules[cls.__module__]
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def generate(out: Path, trees=tuple(GENERATORS)) -> Path:
    """Run the generators of `trees` (each in its own interpreter, as a user runs it) into
    out/<tree>."""
    out.mkdir(parents=True, exist_ok=True)
    for tree in trees:
        script = GENERATORS[tree]
        result = subprocess.run([sys.executable, str(script), "--out", str(out / tree)],
                                capture_output=True, text=True, timeout=1200)
        if result.returncode != 0:
            raise RuntimeError(f"{script.name} failed:\n{result.stderr[-4000:]}")
    return out


def generate_once(out: Path, trees=tuple(GENERATORS)) -> Path:
    """The trees in out/<tree>, generated unless already there. Safe for the processes of one
    run at once (pytest-xdist's workers, the session's servers and the bench share `out`): the
    first takes an exclusive lock beside `out`, generates into a scratch directory beside it
    and renames each finished tree into place, so a tree under `out` is always whole; the
    others wait on the lock, then find them."""
    out.mkdir(parents=True, exist_ok=True)
    with open(lock_path(out), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        missing = [tree for tree in trees if not (out / tree / "README.md").is_file()]
        if missing:
            scratch = Path(tempfile.mkdtemp(prefix=out.name + ".building-", dir=out.parent))
            try:
                generate(scratch, missing)
                for tree in missing:
                    shutil.rmtree(out / tree, ignore_errors=True)  # an interrupted older run's
                    os.rename(scratch / tree, out / tree)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    return out


def lock_path(out: Path) -> Path:
    """The lock `generate_once` holds while it writes under `out`."""
    return out.with_name(out.name + ".lock")


def hashes(root: Path) -> dict[str, str]:
    """{path relative to root: sha256 hex} of every file under root."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def render_manifest(table: dict[str, str]) -> str:
    return "".join(f"{digest}  {path}\n" for path, digest in sorted(table.items()))


def read_manifest(path: Path = MANIFEST) -> dict[str, str]:
    table = {}
    for line in path.read_text().splitlines():
        digest, name = line.split("  ", 1)
        table[name] = digest
    return table


def scenario_names(path: Path = MANIFEST) -> list[str]:
    """The scenario bundles the generator writes, from the manifest (no generation needed, so
    tests can be parametrised with them at collection time)."""
    return sorted({name.split("/")[1] for name in read_manifest(path)
                   if name.startswith("scenarios/") and name.count("/") == 2
                   and name.endswith("/meta.json")})


def scenario_cases() -> dict:
    """The rules' further scenarios (Proof.cases) by bundle name: the verdict each must give."""
    from fleetscope.rules.catalog import CATALOG

    return {case.name: case for rule in CATALOG if rule.proof is not None
            for case in rule.proof.cases}


def main(argv: list[str] | None = None) -> None:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, help="directory to write the trees into")
    parser.add_argument("--manifest", action="store_true",
                        help=f"regenerate into a temporary directory and rewrite {MANIFEST.name}")
    args = parser.parse_args(argv)
    if args.manifest:
        with tempfile.TemporaryDirectory(prefix="fleetscope-fixtures-") as tmp:
            MANIFEST.write_text(render_manifest(hashes(generate(Path(tmp)))))
        print(f"wrote {MANIFEST}: {len(read_manifest())} files")
    elif args.out:
        generate(args.out)
        print(f"wrote {len(hashes(args.out))} files into {args.out}")
    else:
        parser.error("give DIR or --manifest")


if __name__ == "__main__":
    main()
