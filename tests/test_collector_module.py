"""A collector's module declares its evidence: a throwaway collector module
(tests/fixtures/throwaway_collector.py), imported for a test, is run by the exporter, copied by
`bundle record`, replayed from the bundle within its declared read limit, explained when its
signal is absent and titled in the console, with no other file changed (as
tests/test_fleet_rule_module.py shows for a rule module)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import pytest

from fleetscope import cli
from fleetscope.collectors import COLLECTORS
from fleetscope.collectors.source import LiveHost, recorded_sample
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from fleetscope.rules.catalog import CATALOG
from fleetscope.rules.model import Evidence, Rule
from fleetscope.rules.promql import Max, Selector

from .conftest import samples

MODULE = Path(__file__).resolve().parent / "fixtures" / "throwaway_collector.py"
SUCCESS = 'fleetscope_scrape_collector_success{collector="throwaway_entropy"}'


@pytest.fixture
def throwaway():
    """The module imported (which registers its collector), and the registry as it was
    afterwards."""
    before = dict(COLLECTORS)
    spec = importlib.util.spec_from_file_location("throwaway_collector", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        COLLECTORS.pop(module.ThrowawayEntropyCollector.name, None)
    assert dict(COLLECTORS) == before


def _tree(path: Path, entropy: str | None) -> Path:
    """A node's root holding the throwaway's file (or not) and a /proc/stat."""
    (path / "proc" / "sys" / "kernel" / "random").mkdir(parents=True)
    (path / "proc" / "stat").write_text("cpu  10 0 10 100 0 0 0 0 0 0\n"
                                        "cpu0 10 0 10 100 0 0 0 0 0 0\nbtime 1764660000\n")
    if entropy is not None:
        (path / "proc" / "sys" / "kernel" / "random" / "entropy_avail").write_text(entropy)
    return path


def _scrape(source) -> dict[str, float]:
    return samples(render(Exporter(source, parse_config({}, tuple(COLLECTORS))).collect()))


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(list(argv))
    return code, out.getvalue()


def _record(root: Path, out: Path) -> Path:
    code, _ = _cli("bundle", "record", "--root", str(root), "--seconds", "0", "--interval", "1",
                   "-o", str(out))
    assert code == 0
    return out


def test_a_collector_module_registers_itself_when_imported(throwaway):
    collector = throwaway.ThrowawayEntropyCollector
    assert COLLECTORS[collector.name] is collector
    assert throwaway.ENTROPY in COLLECTORS.sampled()
    assert COLLECTORS.read_limit(throwaway.ENTROPY) == 64
    assert COLLECTORS.signal(throwaway.FAMILY).unit == "bits"


def test_gone_with_its_module(tmp_path):
    """Without the module nothing knows the signal: the checks below can fail."""
    assert "throwaway_entropy" not in COLLECTORS
    parsed = _scrape(LiveHost(str(_tree(tmp_path / "node", "256\n"))))
    assert "fleetscope_throwaway_entropy_bits" not in parsed
    assert COLLECTORS.signal("fleetscope_throwaway_entropy_bits") is None


def test_the_exporter_runs_it_and_the_bundle_copies_and_replays_it(throwaway, tmp_path):
    node = _tree(tmp_path / "node", "256\n")
    parsed = _scrape(LiveHost(str(node)))
    assert parsed[throwaway.FAMILY] == 256
    assert parsed[SUCCESS] == 1

    bundle = _record(node, tmp_path / "bundle")
    copied = bundle / "samples" / "s0000" / throwaway.ENTROPY
    assert copied.read_text() == "256\n"
    assert _scrape(recorded_sample(str(bundle / "samples" / "s0000")))[throwaway.FAMILY] == 256

    # past its declared limit a recorded file is refused: the collector's source says why,
    # its success is 0, and the other collectors' series are still there
    copied.write_text("2" * 65)
    parsed = _scrape(recorded_sample(str(bundle / "samples" / "s0000")))
    assert throwaway.FAMILY + "" not in parsed
    assert parsed[SUCCESS] == 0
    assert parsed['fleetscope_scrape_collector_success{collector="cpu"}'] == 1


def test_its_absent_signal_is_explained_and_titled(throwaway, tmp_path):
    from fleetscope.dashboard import fleet_frames

    node = _tree(tmp_path / "node", None)  # a kernel without the file
    bundle = _record(node, tmp_path / "bundle")
    assert not (bundle / "samples" / "s0000" / throwaway.ENTROPY).exists()
    entropy = Max(Selector(throwaway.FAMILY), by=("instance",))
    rule = Rule(id="throwaway-entropy-low", severity="warning", symptom="entropy starved",
                cause="c", action="a", summary="{value:g} bits", condition=entropy < 64,
                evidence=(Evidence("entropy", entropy, 64, "bits"),))
    with CATALOG.registered(rule):
        code, out = _cli("diagnose", "--bundle", str(bundle), "--json")
    assert code == 3, out  # no rule of the catalog has its signals on this bare tree
    item = next(i for i in json.loads(out)["not_evaluated"] if i["rule"] == rule.id)
    assert "this kernel has no proc/sys/kernel/random/entropy_avail" in item["reason"]
    table = fleet_frames.not_evaluated_table([item])
    assert table["signals"].tolist() == [
        "entropy in the kernel's input pool (fleetscope_throwaway_entropy_bits, bits)"]


def test_every_signal_a_rule_reads_is_declared_and_titled():
    """The console titles any signal a rule lacks: each one some collector writes is
    declared there, with a title and a unit."""
    read = {name for rule in CATALOG for side in rule.alternatives() for name in side}
    read.discard("ALERTS")  # the engine's own alerts (rules on rules)
    assert len(read) > 50  # the catalog reads some 75
    undeclared = sorted(name for name in read if COLLECTORS.signal(name) is None)
    assert undeclared == []
    untitled = sorted(name for name in read if not COLLECTORS.signal(name).title)
    assert untitled == []
