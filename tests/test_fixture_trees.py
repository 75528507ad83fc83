"""The generated fixture trees (tests/fixture_trees.py) against the committed hash manifest
tests/fixtures/generated.sha256: the generators reproduce every file, byte for byte."""

from __future__ import annotations

from tests import fixture_trees
from tests.conftest import GENERATED, SCENARIOS


# Slow: reads and hashes every generated file, tens of thousands of them.
def test_generators_reproduce_the_manifest_exactly():
    expected, written = fixture_trees.read_manifest(), fixture_trees.hashes(GENERATED)
    missing = sorted(expected.keys() - written.keys())
    extra = sorted(written.keys() - expected.keys())
    changed = sorted(p for p in expected.keys() & written.keys() if expected[p] != written[p])
    assert not (missing or extra or changed), (
        f"the generated fixtures differ from {fixture_trees.MANIFEST.name}: "
        f"{len(missing)} missing {missing[:5]}, {len(extra)} new {extra[:5]}, "
        f"{len(changed)} changed {changed[:5]}. If the change to make_bundles.py or "
        f"make_scenarios.py is meant, refresh the manifest with `{fixture_trees.REFRESH}` and "
        "commit it with the generator change; otherwise the generator is not deterministic.")


def test_manifest_scenario_names_are_the_generated_bundles():
    # tests parametrised at collection time take the scenario names from the manifest
    generated = sorted(p.name for p in SCENARIOS.iterdir() if (p / "meta.json").is_file())
    assert fixture_trees.scenario_names() == generated
    assert len(generated) > 2


def test_manifest_is_sorted_sha256sum_lines():
    lines = fixture_trees.MANIFEST.read_text().splitlines()
    paths = [line.split("  ", 1)[1] for line in lines]
    assert paths == sorted(paths) and len(set(paths)) == len(paths)
    assert all(len(line.split("  ", 1)[0]) == 64 for line in lines)
    assert {p.split("/", 1)[0] for p in paths} == set(fixture_trees.GENERATORS)


def test_the_bench_waits_for_a_tree_another_process_is_writing(tmp_path):
    # Reproduces a CI failure: the session's servers (through the bench) wrote the scenarios in
    # place while the parallel group's generate_once built its own and renamed it over them;
    # the servers then read a bundle that was gone. The bench now goes through the same lock.
    import fcntl
    import json
    import os
    import shutil
    import subprocess
    import sys
    import time

    out = tmp_path / "generated"
    out.mkdir()
    probe = ("import json, sys; sys.path.insert(0, 'bench'); import fleet_prometheus as b; "
             "print(json.dumps([p.name for p in b._scenario_dirs()]))")
    with open(fixture_trees.lock_path(out), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process is generating
        bench = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE,
                                 text=True, cwd=fixture_trees.FIXTURES.parent.parent,
                                 env={**os.environ, "FLEETSCOPE_TEST_GENERATED": str(out)})
        try:
            time.sleep(3)
            assert bench.poll() is None, "the bench did not wait for the lock"
            assert not (out / "scenarios").exists(), "the bench wrote under a held lock"
            # the other process finishes its tree (the session's, copied) and lets go
            shutil.copytree(SCENARIOS, out / "scenarios")
            (out / "scenarios" / "written-by-the-other").write_text("")
        except BaseException:
            bench.kill()
            bench.wait()
            raise
    stdout, _ = bench.communicate(timeout=120)
    assert bench.returncode == 0
    assert json.loads(stdout) == fixture_trees.scenario_names()
    assert (out / "scenarios" / "written-by-the-other").exists(), "the bench rewrote the tree"
