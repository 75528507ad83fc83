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
