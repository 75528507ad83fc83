"""Checks on the checkout itself: what a merge or an edit can leave behind unnoticed."""

import re
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
