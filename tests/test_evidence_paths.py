"""The node's files are named in collectors/ only: rules, enrichment, bundle recording and
showing, the tools and the console read them through names the collectors give
(`PROC_STAT`, `process_file(pid, "status")`, ...), so a file's path, limit and place in a bundle
are said once, where it is collected (collectors/evidence.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE_COLLECTORS = ("fleetscope", "rules", "diagnose", "dashboard")
# A path relative to the node's root as the evidence source reads it, or an absolute one.
PATH_STARTS = ("proc/", "sys/", "/proc/", "/sys/")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def named_paths(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string, or f-string's opening text, that names a /proc or /sys
    file; docstrings and prose that mentions one mid-sentence are not reads."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in node.values)
            first = node.values[0] if node.values else None
            if isinstance(first, ast.Constant) and str(first.value).startswith(PATH_STARTS):
                found.append((node.lineno, f"f{first.value!r}..."))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in skip and node.value.startswith(PATH_STARTS):
            found.append((node.lineno, repr(node.value)))
    return sorted(found)


def test_the_walk_finds_a_path_named_in_a_read():
    planted = ('"""proc/stat in a docstring is prose."""\n'
               'x = ctx.read(ctx.last, "proc/stat", boot_time)\n'
               'y = open(f"/proc/{pid}/exe")\n'
               'z = "OOM kills (/proc/vmstat oom_kill)"\n')
    assert named_paths(planted) == [(2, "'proc/stat'"), (3, "f'/proc/'...")]


def test_no_proc_or_sys_file_is_named_outside_the_collectors():
    named = [f"{path.relative_to(ROOT)}:{line}: {text}"
             for top in OUTSIDE_COLLECTORS for path in sorted((ROOT / top).rglob("*.py"))
             for line, text in named_paths(path.read_text())]
    assert named == [], "\n".join(named)
