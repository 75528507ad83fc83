"""Broken sources: a collector fails alone, the scrape still answers with everything else."""

from __future__ import annotations

import logging
import shutil
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import BUNDLES, samples

SOURCES = ["proc/stat", "proc/loadavg", "proc/schedstat", "proc/pressure/cpu",
           "proc/pressure/memory", "proc/pressure/io",
           "sys/devices/system/node/node0/cpulist"]


def _root(tmp_path, bundle="kunpeng-128"):
    """A flat copy of a bundle's first sample with its static files merged in."""
    root = tmp_path / "root"
    shutil.copytree(BUNDLES / bundle / "static", root, dirs_exist_ok=True)
    shutil.copytree(BUNDLES / bundle / "samples" / "s0000", root, dirs_exist_ok=True)
    return root


def _scrape(root, per_core="full"):
    exporter = Exporter(str(root), parse_config({"per_core": per_core}))
    text = render(exporter.collect())
    return samples(text)


class _Crashes(logging.Handler):
    """The collector crashes the exporter records (fleetscope.exporter logs each exception that
    is not one of the parsers' own error types, ParseError or NotAvailable, as "collector %s
    crashed" with its traceback): a scrape's exit status alone cannot tell them apart."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.crashes: list[tuple[str, str]] = []

    def emit(self, record):
        if record.msg == "collector %s crashed" and record.exc_info:
            self.crashes.append((record.args[0], record.exc_info[0].__name__))


def _scrape_checked(root, per_core="full"):
    """_scrape(), and assert that every collector error recorded is a parser's own error type."""
    logger = logging.getLogger("fleetscope.exporter")
    handler, level = _Crashes(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        parsed = _scrape(root, per_core)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert not handler.crashes, f"collectors crashed, not a ParseError: {handler.crashes}"
    return parsed


def _success(parsed, collector):
    return parsed[f'fleetscope_scrape_collector_success{{collector="{collector}"}}']


def test_missing_proc_stat_fails_cpu_only(tmp_path):
    root = _root(tmp_path)
    (root / "proc" / "stat").unlink()
    parsed = _scrape(root)
    assert _success(parsed, "cpu") == 0
    from_cpu = ("fleetscope_cpu_seconds", "fleetscope_cpu_numa_node", "fleetscope_cpu_core_",
                "fleetscope_cpu_saturated", "fleetscope_cpu_busiest")
    assert not [k for k in parsed if k.startswith(from_cpu)]
    # pressure still reports PSI, schedstat and loadavg; only its /proc/stat part is gone.
    assert parsed["fleetscope_load1"] > 0
    assert 'fleetscope_pressure_stall_seconds_total{resource="io",stall="some"}' in parsed
    assert parsed['fleetscope_scrape_source_available{collector="pressure",'
                  'source="proc/stat"}'] == 0


def test_missing_optional_sources_are_not_failures(tmp_path):
    root = _root(tmp_path)
    shutil.rmtree(root / "proc" / "pressure")
    (root / "proc" / "schedstat").unlink()
    parsed = _scrape(root)
    assert _success(parsed, "pressure") == 1
    assert parsed['fleetscope_scrape_source_available{collector="pressure",'
                  'source="proc/schedstat"}'] == 0
    assert not [k for k in parsed if k.startswith("fleetscope_schedstat_")]
    assert "fleetscope_context_switches_total" in parsed


def test_truncated_file_is_a_failure_not_a_crash(tmp_path):
    root = _root(tmp_path)
    stat = (root / "proc" / "stat").read_text()
    (root / "proc" / "stat").write_text(stat[: len(stat) // 3].rsplit(" ", 1)[0])
    parsed = _scrape(root)
    # Cut mid-line: the last cpu line is short, so the file is rejected, not half-used.
    assert _success(parsed, "cpu") == 0
    assert _success(parsed, "pressure") == 0  # its /proc/stat source is corrupt too
    assert "fleetscope_load1" in parsed


def test_unreadable_directory_in_place_of_a_file(tmp_path):
    root = _root(tmp_path)
    (root / "proc" / "loadavg").unlink()
    (root / "proc" / "loadavg").mkdir()
    parsed = _scrape(root)
    assert parsed['fleetscope_scrape_source_available{collector="pressure",'
                  'source="proc/loadavg"}'] == 0
    assert _success(parsed, "cpu") == 1


def test_collector_bug_costs_only_its_own_metrics(tmp_path, monkeypatch):
    from fleetscope.collectors.pressure import PressureCollector

    def crash(self, scrape):
        raise RuntimeError("bug")
        yield

    monkeypatch.setattr(PressureCollector, "collect", crash)
    parsed = _scrape(_root(tmp_path))
    assert _success(parsed, "pressure") == 0
    assert _success(parsed, "cpu") == 1


@pytest.fixture(scope="module")
def garbage_root(tmp_path_factory):
    return _root(tmp_path_factory.mktemp("garbage"))


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(source=st.sampled_from(SOURCES), content=st.binary(max_size=300))
def test_garbage_in_any_source_never_breaks_a_scrape(garbage_root, source, content):
    _check_garbage(garbage_root, source, content)


def _check_garbage(root, source, content):
    path = root / source
    original = path.read_bytes()
    try:
        path.write_bytes(content)
        for per_core in ("full", "summary"):
            parsed = _scrape_checked(root, per_core)
            assert {_success(parsed, "cpu"), _success(parsed, "pressure")} <= {0, 1}
            assert "fleetscope_exporter_build_info{version=" in "".join(parsed)
    finally:
        path.write_bytes(original)


def test_garbage_check_catches_a_crashing_parser(garbage_root, monkeypatch):
    # The check above must fail on a parser bug: an IndexError in parse_loadavg is swallowed by
    # the exporter (the pressure collector reports success 0, as for a ParseError), so only the
    # recorded error type tells the two apart.
    from fleetscope.collectors.pressure import PressureCollector

    def crashing(text):
        return text.split()[99]  # IndexError

    monkeypatch.setattr(sys.modules[PressureCollector.__module__], "parse_loadavg", crashing)
    with pytest.raises(AssertionError, match=r"\('pressure', 'IndexError'\)"):
        _check_garbage(garbage_root, "proc/loadavg", b"0.20 0.18 0.12 1/80 11206\n")
    monkeypatch.undo()
    _check_garbage(garbage_root, "proc/loadavg", b"0.20 0.18 0.12 1/80 11206\n")
