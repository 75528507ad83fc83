"""The layers read from the tree (issue 12 section 3), and the command line loads a
sub-command's modules only when that sub-command runs.

Layers, lowest first; a layer imports only layers below it (every import counts, the ones
inside functions too: a cycle hidden in a function is still a cycle):

    core, fleetscope/__init__   the exposition format, the config, units, the bundle format
    agent_runtime               the agent metric schema and the OpenTelemetry helpers
    collectors                  /proc, /sys and command readers (top-level collectors/)
    exporter, tools             the HTTP exporter; isa check, stacks
    rules                       PromQL and the catalog, each rule's module (its enrichment
                                names a crash's instruction with the isa tool)
    bundle                      bundle record, show, read
    diagnose                    the engine, evidence, enrichment, report, Prometheus clients
    dashboard                   the console and the simulated fleet
    cli                         fleetscope/cli.py, fleetscope/__main__.py
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BUNDLES

REPO = Path(__file__).resolve().parents[1]
ROOT = BUNDLES / "x86-256" / "samples" / "s0000"

LAYERS = (
    {"fleetscope", "core"},
    {"agent_runtime"},
    {"collectors"},
    {"exporter", "tools"},
    {"rules"},
    {"bundle"},
    {"diagnose"},
    {"dashboard"},
    {"cli"},
)
# Modules directly in fleetscope/ and the layer they belong to.
TOP_MODULES = {"cli": "cli", "__main__": "cli", "exporter": "exporter",
               "webconfig": "exporter", "agent_signals": "agent_runtime"}
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


@functools.cache
def package_dirs() -> dict[str, Path]:
    """pyproject's package-dir: dotted package -> its folder (the top-level folders the
    contract fixes install as fleetscope.collectors, fleetscope.rules, ...)."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    block = re.search(r"^package-dir\s*=\s*\{(.*?)\}", text, re.M | re.S).group(1)
    return {name: REPO / folder for name, folder in re.findall(r'"([\w.]+)"\s*=\s*"([^"]+)"',
                                                                block)}


def source_modules() -> dict[str, Path]:
    """Every module of the installed packages, by dotted name, from the source tree."""
    roots = package_dirs()
    modules: dict[str, Path] = {}
    for package in sorted(roots, key=len):
        for path in sorted(roots[package].rglob("*.py")):
            relative = path.relative_to(roots[package]).with_suffix("")
            parts = list(relative.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            # A folder mapped on its own (collectors/parsers) is found under its parent too.
            modules.setdefault(name, path)
    return modules


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported fleetscope module, line) for every import in the file, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from fleetscope.tools import isa` imports the module fleetscope.tools.isa.
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known
                       else module for alias in node.names]
        else:
            continue
        found.extend((target, node.lineno) for target in targets
                     if target.split(".")[0] == "fleetscope")
    return found


def unit_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "fleetscope"
    if f"fleetscope.{parts[1]}" in package_dirs() or \
            (REPO / "fleetscope" / parts[1] / "__init__.py").is_file():
        return parts[1]
    return TOP_MODULES.get(parts[1], parts[1])


def unit_edges() -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> the import sites, `file:line imports module`."""
    modules = source_modules()
    known = set(modules)
    edges: dict[tuple[str, str], list[str]] = {}
    for name, path in modules.items():
        for target, line in imports_of(name, path, known):
            source, sink = unit_of(name), unit_of(target)
            if source != sink:
                site = f"{path.relative_to(REPO)}:{line} imports {target}"
                edges.setdefault((source, sink), []).append(site)
    return edges


def find_cycle(edges) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    graph: dict[str, set[str]] = {}
    for source, sink in edges:
        graph.setdefault(source, set()).add(sink)
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_walk_sees_every_package_and_the_imports_inside_functions():
    modules = source_modules()
    for name in ("fleetscope.core.exposition", "fleetscope.collectors.parsers.procfs",
                 "fleetscope.rules.catalog", "fleetscope.diagnose.engine",
                 "fleetscope.dashboard.views.fleet", "fleetscope.bundle.record",
                 "fleetscope.tools.isa", "fleetscope.agent_runtime.schema"):
        assert name in modules, name
    # cli.py imports the diagnose command inside a function only.
    found = imports_of("fleetscope.cli", modules["fleetscope.cli"], set(modules))
    assert "fleetscope.diagnose.command" in {target for target, _ in found}
    # relative imports resolve against the module's package
    found = imports_of("fleetscope.collectors.cpu", modules["fleetscope.collectors.cpu"],
                       set(modules))
    assert "fleetscope.collectors.base" in {target for target, _ in found}


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({("a", "b"): [], ("b", "c"): [], ("c", "a"): []}) == ["a", "b", "c", "a"]
    assert find_cycle({("a", "b"): [], ("b", "c"): [], ("a", "c"): []}) is None


def test_no_import_cycle_between_layers():
    edges = unit_edges()
    cycle = find_cycle(edges)
    sites = [site for a, b in zip(cycle or [], (cycle or [])[1:], strict=False)
             for site in edges[(a, b)][:3]]
    assert cycle is None, f"import cycle {' -> '.join(cycle)}:\n" + "\n".join(sites)


def test_no_import_cycle_between_modules():
    # Inside a layer too: two modules that import each other (one of them inside a function,
    # to dodge the import-time error) are one module split in two.
    modules = source_modules()
    edges = {(name, target): [f"{path.relative_to(REPO)}:{line} imports {target}"]
             for name, path in modules.items()
             for target, line in imports_of(name, path, set(modules)) if target != name}
    cycle = find_cycle(edges)
    sites = [site for a, b in zip(cycle or [], (cycle or [])[1:], strict=False)
             for site in edges[(a, b)]]
    assert cycle is None, f"import cycle {' -> '.join(cycle)}:\n" + "\n".join(sites)


def test_every_package_has_its_layer():
    units = {unit_of(name) for name in source_modules()}
    assert units <= set(RANK), f"place these in LAYERS: {sorted(units - set(RANK))}"


def test_each_layer_imports_only_layers_below_it():
    upward = [site for (source, sink), sites in unit_edges().items()
              if RANK.get(sink, 99) >= RANK.get(source, -1) for site in sites]
    assert upward == [], "imports at or above their own layer:\n" + "\n".join(upward)


def test_core_imports_nothing_above_it():
    modules = source_modules()
    above = [f"{path.relative_to(REPO)}:{line} imports {target}"
             for name, path in modules.items() if unit_of(name) == "core"
             for target, line in imports_of(name, path, set(modules))
             if unit_of(target) not in ("core", "fleetscope")]
    assert above == []


def test_bundle_record_and_its_command_outputs_do_not_import_each_other():
    modules = source_modules()
    record = {t for t, _ in imports_of("fleetscope.bundle.record",
                                       modules["fleetscope.bundle.record"], set(modules))}
    commands = {t for t, _ in imports_of("fleetscope.bundle.commands",
                                         modules["fleetscope.bundle.commands"], set(modules))}
    assert "fleetscope.bundle.commands" in record
    assert "fleetscope.bundle.record" not in commands


# -- the command line loads what the sub-command runs, nothing more ------------------------

CENTRAL = ("pandas", "streamlit", "plotly")
DIAGNOSE_ENGINE = ("fleetscope.diagnose.engine", "fleetscope.diagnose.command",
                   "fleetscope.diagnose.enrich", "fleetscope.rules.catalog")


def _loaded_after(argv: list[str], before: str = "") -> set[str]:
    """The modules loaded once `fleetscope <argv>` has run (in a fresh interpreter)."""
    probe = (
        "import sys\n"
        f"{before}\n"
        "from fleetscope.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stdout.flush()\n"
        "print('\\nMODULES ' + ' '.join(sorted(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    line = result.stdout.rpartition("\nMODULES ")[2]
    return set(line.split())


@pytest.mark.parametrize("argv", [["exporter", "--help"], ["--help"],
                                  ["bundle", "record", "--help"], ["stacks", "--help"],
                                  ["rules", "list", "--help"], ["console", "--help"]])
def test_help_imports_no_sub_command(argv):
    loaded = _loaded_after(argv)
    assert "fleetscope.cli" in loaded
    heavy = sorted(m for m in loaded if m in DIAGNOSE_ENGINE or m.split(".")[0] in CENTRAL
                   or m.startswith(("fleetscope.collectors", "fleetscope.dashboard", "rich",
                                    "fleetscope.exporter", "fleetscope.tools")))
    assert heavy == []


def test_the_probe_sees_what_a_sub_command_imports():
    loaded = _loaded_after(["rules", "list"])
    assert "fleetscope.rules.catalog" in loaded


def test_the_exporter_does_not_import_the_diagnose_engine():
    # The whole `fleetscope exporter` path up to serving, then one scrape rendered.
    # The stub takes whatever the CLI passes and binds it to the real serve's signature, so
    # a call that no longer fits fails here instead of in a handler that swallows it; the
    # rendered scrape leaves a marker among the modules.
    stub = ("import inspect, sys\n"
            "import fleetscope.exporter as e\n"
            "real = inspect.signature(e.serve)\n"
            "def serve(*args, **kwargs):\n"
            "    given = real.bind(*args, **kwargs).arguments\n"
            "    text = e.Exporter(given['root'], given['config']).render()\n"
            "    if b'fleetscope_scrape_collector_success' in text:\n"
            "        sys.modules['probe_one_scrape_rendered'] = None\n"
            "e.serve = serve")
    loaded = _loaded_after(["exporter", "--listen", "127.0.0.1:0", "--root", str(ROOT)],
                           before=stub)
    assert "probe_one_scrape_rendered" in loaded  # the exporter ran and rendered a scrape
    assert sorted(m for m in loaded if m in DIAGNOSE_ENGINE or m.split(".")[0] in CENTRAL
                  or m.startswith(("fleetscope.diagnose", "fleetscope.dashboard",
                                   "fleetscope.bundle", "rich"))) == []


def test_bundle_record_does_not_import_the_central_side(tmp_path):
    loaded = _loaded_after(["bundle", "record", "--seconds", "0", "--root", str(ROOT),
                            "-o", str(tmp_path / "b")])
    assert (tmp_path / "b" / "meta.json").is_file()  # the bundle was recorded
    assert sorted(m for m in loaded if m in DIAGNOSE_ENGINE or m.split(".")[0] in CENTRAL
                  or m.startswith(("fleetscope.diagnose", "fleetscope.dashboard"))) == []
