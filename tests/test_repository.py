"""Checks on the checkout itself: what a merge or an edit can leave behind unnoticed."""

import os
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Generated fixtures are rebuilt by scripts; the sources and docs are what people edit and merge.
SKIPPED = {".git", "fixtures", "node_modules", "__pycache__", ".venv", "build", "dist"}
SUFFIXES = {".md", ".py", ".yml", ".yaml", ".toml", ".json", ".service", ".cfg", ".txt", ""}
CONFLICT_MARKER = re.compile(r"^(<{7} |={7}$|>{7} )", re.MULTILINE)


def edited_files():
    stack = [ROOT]
    while stack:
        folder = stack.pop()
        for path in folder.iterdir():
            if path.is_dir():
                if path.name not in SKIPPED and not path.name.endswith(".egg-info"):
                    stack.append(path)
            elif path.suffix in SUFFIXES and path.stat().st_size < 2_000_000:
                yield path


def test_no_file_holds_a_merge_conflict_marker():
    # Reproduced: a merge committed README.md with both sides and the markers between them.
    marked = []
    for path in edited_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if CONFLICT_MARKER.search(text):
            marked.append(str(path.relative_to(ROOT)))
    assert marked == []


def test_the_marker_check_finds_a_conflict():
    assert CONFLICT_MARKER.search("text\n<<<<<<< HEAD\nours\n=======\ntheirs\n>>>>>>> branch\n")
    assert not CONFLICT_MARKER.search("Heading\n===\nthe ======= in a sentence\n")


# Documents a clone does not have: the code cites its own docs/ instead.
OUTSIDE_REFERENCE = re.compile(
    r"CONTRACT|shared/reference|\b(counters|troubleshooting|style)\.md\b")
# Another project's document is cited with its repository: `owner/name path`.
REPOSITORY_DOCUMENT = re.compile(r"(?<![`/\w])((?:docs|runbooks)/[\w.-]+\.md)\b")


def source_files():
    # Pruned while walking, not filtered after: a checkout's .git and caches hold more files
    # than the sources.
    pruned = {".git", "node_modules", "__pycache__", "build", "dist"}
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders
                         if d not in pruned and not d.endswith(".egg-info")]
        for name in names:
            path = Path(folder, name)
            if (path.suffix in {".py", ".md", ".json", ".yaml", ".yml", ".toml"}
                    and path.stat().st_size < 2_000_000):
                yield path


def test_the_code_cites_no_document_outside_the_repository():
    outside = []
    for path in source_files():
        if path.suffix != ".py" and path.parent.name not in {"fixtures", "schemas", "agent"}:
            continue  # the documents themselves may name where a format is specified
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE_REFERENCE.search(line):
                outside.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert outside == []


def test_every_document_the_code_cites_is_in_the_repository():
    missing = set()
    for path in source_files():
        if path.suffix != ".py":
            continue
        for cited in REPOSITORY_DOCUMENT.findall(path.read_text(encoding="utf-8")):
            if not (ROOT / cited).is_file() and "<" not in cited:
                missing.add(f"{path.relative_to(ROOT)}: {cited}")
    assert missing == set()


def test_the_reference_checks_find_what_they_look_for():
    assert OUTSIDE_REFERENCE.search("(CONTRACT section 3)")
    assert OUTSIDE_REFERENCE.search("see shared/reference/counters.md 4.3")
    assert not OUTSIDE_REFERENCE.search("the contract's names, kept in docs/bundle-format.md")
    assert REPOSITORY_DOCUMENT.findall("(docs/bundle-format.md, runbooks/oom-kill.md)") == [
        "docs/bundle-format.md", "runbooks/oom-kill.md"]
    assert REPOSITORY_DOCUMENT.findall("exporter-toolkit `docs/web-configuration.md`") == []


def test_only_the_bundle_reader_names_the_bundle_metadata_file():
    # Everything else asks the bundle reader (or takes the source it hands out): nothing
    # decides what a directory is by looking for the file itself.
    allowed = {ROOT / "fleetscope" / "bundle" / "read.py",
               ROOT / "fleetscope" / "core" / "bundle_format.py"}
    naming = sorted(str(path.relative_to(ROOT)) for path in source_files()
                    if path.suffix == ".py" and path not in allowed
                    and "tests" not in path.relative_to(ROOT).parts
                    and "meta.json" in path.read_text(encoding="utf-8"))
    assert naming == []


def test_the_exporter_docs_config_block_loads_as_written():
    # Reproduced: the config example (then in the README) failed its own validation ("platform.
    # memory_peak_bytes_per_second must be a positive number"): YAML 1.1 reads 409.6e9, an
    # exponent without a sign, as a string. A new user copies this block first.
    import yaml

    from fleetscope.core.config import parse_config

    text = (ROOT / "docs" / "exporter.md").read_text()
    block = re.search(r"Config \(`--config`.*?```yaml\n(.*?)```", text, re.S).group(1)
    config = parse_config(yaml.safe_load(block))
    assert config.memory_peak_bytes_per_second == 409.6e9
    assert [pool.name for pool in config.pools] == ["chat-online", "batch"]


def test_the_quick_starts_pools_load_as_written():
    # Reproduced: 22 of 30 rules "not evaluated" on a newcomer's first node, the pools block
    # that fixes it 80 lines further down: the quick start now writes one first.
    import yaml

    from fleetscope.core.config import parse_config

    text = (ROOT / "README.md").read_text()
    quick_start = text[text.index("## Quick start"):text.index("\n## ", text.index("## Quick"))]
    block = re.search(r"cat > node.yaml <<'YAML'\n(.*?)\n\s*YAML\n", quick_start, re.S).group(1)
    config = parse_config(yaml.safe_load(textwrap.dedent(block)))
    assert {pool.workload_class for pool in config.pools} == {"online", "offline"}
    assert "export FLEETSCOPE_CONFIG=$PWD/node.yaml" in quick_start


def test_every_relative_link_of_the_guides_opens_a_file_here():
    # The README was cut to a guide and its reference moved to docs/: a link that moved with
    # its section must still open, relative to the document it is in.
    broken = []
    for document in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                     *sorted((ROOT / "runbooks").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", document.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path):
                continue  # an anchor in the same page, or a URL
            if not (document.parent / path).exists():
                broken.append(f"{document.relative_to(ROOT)}: {target}")
    assert broken == []
    assert len((ROOT / "README.md").read_text().split()) < 2000  # a guide, not the reference
