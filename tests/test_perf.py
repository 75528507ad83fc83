"""Collector `perf`: the `perf stat -x,` parser, event selection from sysfs, the recorded
fixtures of an Intel, an AMD and a Kunpeng 920 node, and real perf on this machine."""

from __future__ import annotations

import doctest
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetscope.collectors import COLLECTORS
from fleetscope.collectors import perf as perf_collector
from fleetscope.collectors.base import Scrape
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers import perf as perf_parsers
from fleetscope.collectors.parsers.perf import (
    NOT_COUNTED,
    NOT_SUPPORTED,
    parse_event_terms,
    parse_mbm_bytes,
    parse_perf_args,
    parse_perf_stat_csv,
    parse_scale,
    sleep_seconds,
    split_event,
    unit_bytes,
)
from fleetscope.collectors.perf import (
    PerfCollector,
    classify_event,
    perf_stat_argv,
    select_events,
    summarize,
)
from fleetscope.collectors.source import LiveHost, RecordedSample, recorded_sample
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import BUNDLES, FIXTURES, require_tool, samples, scrape_until_perf_ran
from tests.fuzzing import parser_fuzz_tests

PERF_FIXTURES = FIXTURES / "perf"
MiB = 1024 * 1024

# Verbatim from this project's Linux 6.18 x86_64 VM (perf 6.1, no hardware PMU; 2 vCPUs).
REAL_VM_LINES = {
    "per_socket_unsupported": "S0,1,<not supported>,,instructions,0,100.00,,",
    "per_socket_software": "S0,2,403.33,msec,task-clock,403327437,100.00,2.000,CPUs utilized",
    "interval": "     0.100182068,201.20,msec,task-clock,201199197,100.00,2.012,CPUs utilized",
    "interval_per_socket": "     0.100201186,S0,2,200.83,msec,task-clock,200829588,100.00,"
                           "2.008,CPUs utilized",
    "no_aggr": "CPU0,264036210,,msr/tsc/,101552052,100.00,2.600,G/sec",
    "repeat_variance": "203.48,msec,task-clock,0.16%,203477629,100.00,1.997,CPUs utilized",
    "global": "528424102,,msr/tsc/,203241042,100.00,,",
}


# ---------------------------------------------------------------------------------------
# Parser


@pytest.mark.parametrize("name, expected", [
    ("per_socket_unsupported",
     dict(event="instructions", value=None, status=NOT_SUPPORTED, aggregate="S0", cpus=1,
          run_ns=0, socket="0")),
    ("per_socket_software",
     dict(event="task-clock", value=403.33, unit="msec", aggregate="S0", cpus=2,
          run_ns=403327437, running_percent=100.0, metric_value=2.0,
          metric_unit="CPUs utilized")),
    ("interval", dict(timestamp=0.100182068, value=201.2, event="task-clock", aggregate=None)),
    ("interval_per_socket", dict(timestamp=0.100201186, aggregate="S0", cpus=2, value=200.83)),
    ("no_aggr", dict(aggregate="CPU0", cpus=None, socket=None, value=264036210.0,
                     event="msr/tsc/", metric_unit="G/sec")),
    ("repeat_variance", dict(value=203.48, event="task-clock", run_ns=203477629)),
    ("global", dict(value=528424102.0, unit="", event="msr/tsc/", metric_value=None,
                    socket=None)),
])
def test_real_perf_lines(name, expected):
    (count,) = parse_perf_stat_csv(REAL_VM_LINES[name] + "\n")
    for attribute, value in expected.items():
        assert getattr(count, attribute) == value, attribute


# Lines in the formats of tools/perf/util/stat-display.c that this VM cannot produce.
@pytest.mark.parametrize("line, expected", [
    # Intel IMC with --per-socket: sysfs .scale/.unit applied by perf, "%.2f".
    ("S1,1,1.00,MiB,uncore_imc_0/cas_count_read/,1000940961,100.00,,",
     dict(socket="1", value=1.0, unit="MiB", event="uncore_imc_0/cas_count_read/")),
    # perf <= 6.1: a socket with none of the uncore PMU's CPUs.
    ("S1,0,<not counted>,,hisi_sccl1_ddrc0/flux_rd/,0,100.00,,",
     dict(socket="1", cpus=0, status=NOT_COUNTED, value=None)),
    # A raw event whose terms contain the separator.
    ("S0,1,812345678,,amd_umc_0/event=0x0a,rdwrmask=0x1/,5001203377,100.00,,",
     dict(event="amd_umc_0/event=0x0a,rdwrmask=0x1/", value=812345678.0, run_ns=5001203377)),
    ("S0,8,1234,,amd_l3/event=0x04,umask=0xff/u,40000004410,87.50,,",
     dict(event="amd_l3/event=0x04,umask=0xff/u", running_percent=87.5)),
    # --per-die, --per-core, --per-node, --per-cache (perf 6.x)
    ("S0-D1,32,10,,cycles,1,100.00,,", dict(aggregate="S0-D1", socket="0", cpus=32)),
    ("S1-D0-C3,2,10,,cycles,1,100.00,,", dict(aggregate="S1-D0-C3", socket="1")),
    ("N2,32,10,,cycles,1,100.00,,", dict(aggregate="N2", socket=None, cpus=32)),
    ("S0-D0-L3-ID8,16,10,,cycles,1,100.00,,", dict(socket="0", cpus=16)),
    # perf 6.2+ interval timestamps are not padded; --summary prefix.
    ("5.001234567,S0,1,2.00,MiB,uncore_imc_1/cas_count_write/,5001000000,100.00,,",
     dict(timestamp=5.001234567, socket="0", value=2.0)),
    ("summary,100,,instructions,5000,100.00,,", dict(value=100.0, event="instructions")),
    # -G: a cgroup field after the event.
    ("77,,cycles,/online/agent,5000,100.00,,", dict(value=77.0, run_ns=5000)),
])
def test_constructed_perf_lines(line, expected):
    (count,) = parse_perf_stat_csv(line + "\n")
    for attribute, value in expected.items():
        assert getattr(count, attribute) == value, attribute


def test_continuation_comment_and_blank_lines_carry_no_counts():
    text = ("# started on Mon Jan  5 10:00:00 2026\n\n"
            "S0,48,1000,,cycles,5000,100.00,,\n"
            "S0,48,,,,,0.5,stalled cycles per insn\n"  # a second metric of the line above
            ",,,,1.23,insn per cycle\n"
            "     0.100000000,,,,,1.2,x\n")
    (count,) = parse_perf_stat_csv(text)
    assert count.event == "cycles"


@pytest.mark.parametrize("text", [
    "S0,x,1,,cycles,5,100.00,,\n",  # socket without CPU count
    "abc,,cycles,5,100.00,,\n",  # value
    "1,,cycles,,100.00,,\n",  # no run time
    "1,,cycles,5,abc,,\n",  # percentage
    "1,,cycles\n",  # truncated
    "1,,amd_umc_0/event=0x0a\n",  # unterminated pmu/.../ name
    "1,,,5,100.00,,\n",  # empty event name
    "1,,cycles,5,100.00,x1,unit\n",  # metric value
    "nan,,cycles,5,100.00,,\n",
])
def test_malformed_perf_output(text):
    with pytest.raises(ParseError):
        parse_perf_stat_csv(text)


def test_sysfs_and_args_parsers():
    assert parse_event_terms("event=0x04,umask=0x03") == {"event": 4, "umask": 3}
    assert parse_event_terms("event=0x2e,umask=0x41\n") == {"event": 0x2E, "umask": 0x41}
    assert parse_event_terms("config=0x0\n") == {"config": 0}
    assert parse_event_terms("event=0xcd,umask=0x1,ldlat=3,edge\n")["edge"] == 1
    assert parse_scale("6.103515625e-5") * unit_bytes("MiB") == 64.0
    assert unit_bytes("Joules") is None
    assert split_event("uncore_imc_0/cas_count_read/") == ("uncore_imc_0", "cas_count_read",
                                                           "")
    assert split_event("instructions") == (None, "instructions", "")
    assert sleep_seconds(parse_perf_args("perf\nstat\n-x,\n-a\n--\nsleep\n5\n")) == 5.0
    assert sleep_seconds(["perf", "stat", "--", "/bin/sleep", "1m", "30"]) == 90.0
    assert parse_mbm_bytes("Unassigned\n") is None
    assert parse_mbm_bytes("0\n") == 0
    for parser, text in ((parse_event_terms, ""), (parse_event_terms, "event=zz"),
                         (parse_event_terms, "=1"), (parse_scale, "-1"), (parse_scale, "0"),
                         (parse_scale, "inf"), (parse_perf_args, ""), (parse_mbm_bytes, "-5"),
                         (parse_mbm_bytes, "12 MB")):
        with pytest.raises(ParseError):
            parser(text)
    for args in (["perf", "stat", "--", "true"], ["perf", "stat", "--", "sleep"],
                 ["perf", "stat", "-a"], ["perf", "--", "sleep", "x"],
                 ["perf", "--", "sleep", "0"]):
        with pytest.raises(ParseError):
            sleep_seconds(args)


# ---------------------------------------------------------------------------------------
# Fuzzing: every parser returns records or raises ParseError, nothing else.

perfish = st.text(alphabet=st.sampled_from(list("0123456789.,/=-_%:<> \n\tSDCNxabcdefmu"
                                                "instructioncyclesnotsupportedcounted"
                                                "MiB#\u00b2\u00e9")), max_size=400)
REAL_CSV = "\n".join(REAL_VM_LINES.values()) + "\n" + (
    "S0,1,812345678,,amd_umc_0/event=0x0a,rdwrmask=0x1/,5001203377,100.00,,\n"
    "S1,0,<not counted>,,hisi_sccl1_ddrc0/flux_rd/,0,100.00,,\n")
FUZZED = {
    "perf_stat_csv": (parse_perf_stat_csv, REAL_CSV),
    "event_terms": (parse_event_terms, "event=0x04,umask=0x03"),
    "scale": (parse_scale, "6.103515625e-5"),
    "args": (lambda text: sleep_seconds(parse_perf_args(text)),
             "perf\nstat\n-x,\n-a\n-e\ncycles\n--\nsleep\n5\n"),
    "mbm": (parse_mbm_bytes, "8123981938688\n"),
}



test_fuzz_garbage, test_fuzz_cut_and_corrupted = parser_fuzz_tests(FUZZED, perfish)


@settings(max_examples=300, deadline=None)
@given(name=st.text(max_size=60))
def test_fuzz_classify_never_raises(name):
    classify_event(name)


@pytest.mark.parametrize("module", [perf_parsers, perf_collector])
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0


# ---------------------------------------------------------------------------------------
# Classification and selection


@pytest.mark.parametrize("name, expected", [
    ("uncore_imc_3/cas_count_write/", ("memory_bandwidth", "write", "uncore_imc")),
    ("uncore_imc/cas_count_read/", ("memory_bandwidth", "read", "uncore_imc")),
    ("amd_umc_7/event=0x0a,rdwrmask=0x2/", ("memory_bandwidth", "write", "amd_umc")),
    ("amd_umc_7/event=0xa,rdwrmask=0x1/u", ("memory_bandwidth", "read", "amd_umc")),
    ("hisi_sccl5_ddrc2_0/flux_rd/", ("memory_bandwidth", "read", "hisi_ddrc")),
    ("hisi_sccl3_l3c4/rd_hit_cpipe/", ("llc", "hits", "hisi_l3c")),
    ("amd_l3/event=0x04,umask=0x01/", ("llc", "misses", "amd_l3")),
    ("cpu/cache-references/", ("llc", "accesses", "cpu_llc")),
    ("armv8_pmuv3_0/ll_cache_miss_rd/", ("llc", "misses", "arm_ll_cache")),
    ("armv8_pmuv3_0/l3d_cache/", ("llc", "accesses", "arm_l3d")),
    ("LLC-load-misses", ("llc", "misses", "generic_llc")),
    ("cycles:u", ("instructions", "cycles", "generic")),
    ("armv8_pmuv3_0/inst_retired/", ("instructions", "instructions", "core_pmu")),
    ("cache-misses", None),  # L1D refills on arm64, L2 misses on AMD
    ("amd_umc_0/event=0x0a,rdwrmask=0x3/", None),
    ("amd_umc_0/event=0x0b,rdwrmask=0x1/", None),
    ("amd_l3/event=0x04,umask=0xff,threadmask=0x1/", None),  # one thread only: not the L3
    ("hisi_sccl1_l3c0/rd_spipe/", None),
    ("msr/tsc/", None),
    ("task-clock", None),
])
def test_classify_event(name, expected):
    role = classify_event(name)
    assert (role and (role.group, role.role, role.source)) == expected


@pytest.mark.parametrize("fixture", ["intel-2s", "amd-2s", "kunpeng-2s"])
def test_selection_from_sysfs_is_the_recorded_command(fixture):
    """The fixture's perf command line is exactly what the collector asks perf for when it
    reads the fixture's /sys/bus/event_source tree: the selection covers each platform."""
    root = PERF_FIXTURES / fixture
    selection = select_events(Scrape(RecordedSample(str(root))))
    recorded = parse_perf_args((root / "cmd/perf-stat.args").read_text())
    assert perf_stat_argv("perf", selection.events, 5.0) == recorded
    assert selection.reasons == {}
    assert selection.core_pmu == {"intel-2s": "cpu", "amd-2s": "cpu",
                                  "kunpeng-2s": "armv8_pmuv3_0"}[fixture]
    if fixture == "intel-2s":  # from uncore_imc_N/events/cas_count_*.scale and .unit
        assert set(selection.bytes_per_count.values()) == {64.0}
        assert len(selection.bytes_per_count) == 12


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_selection_on_other_cores_and_without_pmus(tmp_path):
    pmus = tmp_path / "sys/bus/event_source/devices"
    # A Neoverse core PMU with the architected last-level events, no uncore.
    for event, code in (("inst_retired", 8), ("cpu_cycles", 0x11), ("ll_cache_rd", 0x36),
                        ("ll_cache_miss_rd", 0x37), ("l3d_cache", 0x2B),
                        ("l3d_cache_refill", 0x2A)):
        _write(pmus / f"armv8_pmuv3_0/events/{event}", f"event=0x{code:04x}\n")
    selection = select_events(Scrape(RecordedSample(str(tmp_path))))
    assert selection.events[-2:] == ["armv8_pmuv3_0/ll_cache_rd/",
                                     "armv8_pmuv3_0/ll_cache_miss_rd/"]
    assert "uncore_imc_*" in selection.reasons["memory_bandwidth"]
    # An AMD host without amd_umc: the reason points at resctrl.
    _write(pmus / "amd_df/format/event", "config:0-7,32-35,59-60\n")
    selection = select_events(Scrape(RecordedSample(str(tmp_path))))
    assert "amd_umc" in selection.reasons["memory_bandwidth"]
    # AMD's cpu/cache-misses is an L2 event: never taken for the LLC.
    shutil.rmtree(pmus / "armv8_pmuv3_0")
    _write(pmus / "cpu/events/cache-misses", "event=0x64,umask=0x09\n")
    _write(pmus / "cpu/events/cache-references", "event=0x60,umask=0xff\n")
    selection = select_events(Scrape(RecordedSample(str(tmp_path))))
    assert "llc" in selection.reasons and selection.core_pmu == "cpu"
    # No sysfs at all: the generic events are still asked for (perf says <not supported>).
    empty = select_events(Scrape(RecordedSample(str(tmp_path / "none"))))
    assert empty.events == ["instructions", "cycles"] and empty.core_pmu is None


# ---------------------------------------------------------------------------------------
# The collector on the recorded fixtures


def _scrape(root, config=None, source=None):
    exporter = Exporter(str(root), parse_config({"collectors": ["perf"], **(config or {})},
                                                tuple(COLLECTORS)))
    return samples(render(exporter.collect(source=source)))


def _bandwidth(parsed, socket, direction):
    return parsed[f'fleetscope_memory_bandwidth_bytes_per_second{{direction="{direction}",'
                  f'socket="{socket}"}}']


def _per_socket(parsed, metric, socket):
    return parsed[f'{metric}{{socket="{socket}"}}']


# Expected per socket over the 5 s window: (read B/s, write B/s, LLC accesses/s,
# LLC misses/s, miss ratio, instructions/s, IPC), worked out from the fixture's totals
# (make_fixtures.py): e.g. Intel socket 0 reads 30720 MiB in 6 channels; Kunpeng socket 0
# counts 1e9 DDRC read fluxes of 32 bytes; AMD socket 0 1.2e9 read CAS of 64 bytes.
EXPECTED = {
    "intel-2s": {
        "0": (30720 * MiB / 5, 6144 * MiB / 5, 4e8, 1e8, 0.25, 3e10, 1.5),
        "1": (15360 * MiB / 5, 3072 * MiB / 5, 2e8, 2e7, 0.1, 1e10, 0.625),
    },
    "amd-2s": {
        "0": (1.2e9 * 64 / 5, 4e8 * 64 / 5, 6e8, 1.2e8, 0.2, 8e10, 0.8),
        "1": (6e8 * 64 / 5, 2e8 * 64 / 5, 2e8, 6e7, 0.3, 2e10, 0.5),
    },
    "kunpeng-2s": {
        "0": (1e9 * 32 / 5, 2.5e8 * 32 / 5, 4e8, 1e8, 0.25, 4e10, 0.8),
        "1": (5e8 * 32 / 5, 1.25e8 * 32 / 5, 2e8, 2e7, 0.1, 2e10, 0.5),
    },
}
EVENTS = {"intel-2s": ("uncore_imc", 12, "cpu_llc", 2),
          "amd-2s": ("amd_umc", 48, "amd_l3", 2),
          "kunpeng-2s": ("hisi_ddrc", 32, "hisi_l3c", 64)}


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_recorded_fixture_bandwidth_llc_and_ipc(fixture):
    parsed = _scrape(PERF_FIXTURES / fixture)
    for socket, (read, write, accesses, misses, ratio, instr, ipc) in \
            EXPECTED[fixture].items():
        assert _bandwidth(parsed, socket, "read") == pytest.approx(read, abs=0.01)
        assert _bandwidth(parsed, socket, "write") == pytest.approx(write, abs=0.01)
        assert _per_socket(parsed, "fleetscope_llc_accesses_per_second", socket) == accesses
        assert _per_socket(parsed, "fleetscope_llc_misses_per_second", socket) == misses
        assert _per_socket(parsed, "fleetscope_llc_miss_ratio", socket) == ratio
        assert _per_socket(parsed, "fleetscope_instructions_per_second", socket) == instr
        assert _per_socket(parsed, "fleetscope_instructions_per_cycle", socket) == ipc
    assert not [k for k in parsed if 'socket="all"' in k or 'socket="2"' in k]
    memory, memory_events, llc, llc_events = EVENTS[fixture]
    assert parsed[f'fleetscope_perf_events{{event_group="memory_bandwidth",pmu="{memory}"}}'] \
        == memory_events
    assert parsed[f'fleetscope_perf_events{{event_group="llc",pmu="{llc}"}}'] == llc_events
    for group in ("memory_bandwidth", "llc", "instructions"):
        assert parsed[f'fleetscope_perf_available{{event_group="{group}"}}'] == 1
        assert parsed[f'fleetscope_perf_running_ratio{{event_group="{group}"}}'] == 1
    assert parsed["fleetscope_perf_window_seconds"] == 5
    assert parsed["fleetscope_perf_window_age_seconds"] == 0
    assert "fleetscope_perf_runs_total" not in str(parsed)  # perf never runs on a recording
    assert parsed['fleetscope_scrape_collector_success{collector="perf"}'] == 1
    assert parsed['fleetscope_scrape_source_available{collector="perf",'
                  'source="cmd/perf-stat.csv"}'] == 1


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_fixture_output_passes_promtool(fixture):
    promtool = require_tool("promtool")
    exporter = Exporter(str(PERF_FIXTURES / fixture), parse_config(
        {"collectors": ["perf"], "platform": {"memory_peak_bytes_per_second": 4e11}},
        tuple(COLLECTORS)))
    lint = subprocess.run([promtool, "check", "metrics"], input=render(exporter.collect()),
                          capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_resctrl_byte_counters_on_the_intel_fixture():
    parsed = _scrape(PERF_FIXTURES / "intel-2s")
    mbm = 'fleetscope_resctrl_mbm_bytes_total{{event="{}",l3_domain="{}"}}'
    assert parsed[mbm.format("mbm_total_bytes", "00")] == 8123981938688
    assert parsed[mbm.format("mbm_local_bytes", "00")] == 7011223879680
    assert parsed[mbm.format("mbm_total_bytes", "01")] == 3998811144192
    assert mbm.format("mbm_local_bytes", "01") not in parsed  # "Unavailable": no value
    kunpeng = _scrape(PERF_FIXTURES / "kunpeng-2s")
    assert kunpeng['fleetscope_scrape_source_available{collector="perf",'
                   'source="sys/fs/resctrl/mon_data"}'] == 0


def test_ddrc_bytes_per_count_and_platform_peak_come_from_the_config():
    parsed = _scrape(PERF_FIXTURES / "kunpeng-2s",
                     {"platform": {"ddrc_bytes_per_count": 64,
                                   "memory_peak_bytes_per_second": 4e10}})
    assert _bandwidth(parsed, "0", "read") == 1e9 * 64 / 5
    assert parsed['fleetscope_memory_bandwidth_peak_bytes_per_second{source="config"}'] == 4e10
    # read + write of both sockets at 64 bytes per count: 2.4e10 B/s over a 4e10 peak
    assert parsed["fleetscope_memory_bandwidth_utilization_ratio"] == pytest.approx(0.6)
    # Without the config and without cpuinfo in the root there is nothing to derive it from.
    assert not [k for k in _scrape(PERF_FIXTURES / "kunpeng-2s")
                if k.startswith("fleetscope_memory_bandwidth_peak")]


def _bundle(tmp_path, csv: str, interval=10.0) -> Path:
    bundle = tmp_path / "bundle"
    sample = bundle / "samples/s0000"
    _write(sample / "cmd/perf-stat.csv", csv)
    (bundle / "static").mkdir()
    (bundle / "meta.json").write_text(json.dumps({
        "format": "fleetscope-bundle/1", "hostname": "n1", "interval_s": interval,
        "samples": [{"dir": "samples/s0000", "time": 1764660000.0}], "config": {}}))
    return sample


def test_bundle_sample_takes_the_window_from_meta_json(tmp_path):
    csv = (PERF_FIXTURES / "amd-2s/cmd/perf-stat.csv").read_text()
    sample = _bundle(tmp_path, csv, interval=10.0)
    parsed = _scrape(sample, source=recorded_sample(str(sample)))
    assert parsed["fleetscope_perf_window_seconds"] == 10
    assert _bandwidth(parsed, "0", "read") == pytest.approx(1.2e9 * 64 / 10)


def test_contract_command_without_per_socket_gives_node_totals(tmp_path):
    """The documented plain `perf stat -x, -a -e ...` has no socket column: one series."""
    csv = ("150000000000,,instructions,200002196540,100.00,1.50,insn per cycle\n"
           "100000000000,,cycles,200002196541,100.00,,\n"
           "30720.00,MiB,uncore_imc_0/cas_count_read/,10001862824,100.00,,\n"
           "6144.00,MiB,uncore_imc_0/cas_count_write/,10001862824,100.00,,\n")
    sample = _bundle(tmp_path, csv, interval=5.0)
    parsed = _scrape(sample, source=recorded_sample(str(sample)))
    assert _bandwidth(parsed, "all", "read") == 30720 * MiB / 5
    assert parsed['fleetscope_instructions_per_cycle{socket="all"}'] == 1.5
    assert parsed['fleetscope_perf_available{event_group="llc"}'] == 0
    assert parsed['fleetscope_scrape_source_available{collector="perf",source="perf/llc"}'] == 0


def test_missing_or_corrupt_recording(tmp_path):
    (tmp_path / "proc").mkdir()
    parsed = _scrape(tmp_path)
    assert parsed['fleetscope_scrape_collector_success{collector="perf"}'] == 1
    assert parsed['fleetscope_scrape_source_available{collector="perf",'
                  'source="cmd/perf-stat.csv"}'] == 0
    for group in ("memory_bandwidth", "llc", "instructions"):
        assert parsed[f'fleetscope_perf_available{{event_group="{group}"}}'] == 0
    _write(tmp_path / "cmd/perf-stat.csv", "this is not perf output\n")
    (tmp_path / "cmd/perf-stat.args").write_text("perf\nstat\n--\nsleep\n5\n")
    parsed = _scrape(tmp_path)
    assert parsed['fleetscope_scrape_collector_success{collector="perf"}'] == 0
    # a CSV without any window length
    _write(tmp_path / "cmd/perf-stat.csv", "1,,cycles,5,100.00,,\n")
    (tmp_path / "cmd/perf-stat.args").unlink()
    parsed = _scrape(tmp_path)
    assert parsed['fleetscope_scrape_source_available{collector="perf",'
                  'source="cmd/perf-stat.csv"}'] == 0


def test_summary_refuses_partial_groups_and_reports_multiplexing():
    counts = parse_perf_stat_csv(
        "S0,48,100,,instructions,1,50.00,,\n"
        "S0,48,200,,cycles,1,100.00,,\n"
        "S0,1,1.00,MiB,uncore_imc_0/cas_count_read/,1,100.00,,\n"
        "S1,1,<not counted>,,uncore_imc_0/cas_count_read/,0,100.00,,\n"
        "S0,1,1.00,MiB,uncore_imc_0/cas_count_write/,1,100.00,,\n"
        "S0,1,1,,amd_l3/event=0x04,umask=0xff/,1,100.00,,\n")
    results = summarize(counts, 32.0)
    assert results["instructions"].ok and results["instructions"].running == 0.5
    memory = results["memory_bandwidth"]
    assert not memory.ok and memory.failed_status == NOT_COUNTED
    assert "uncore_imc_0/cas_count_read/" in memory.reason
    assert not results["llc"].ok and "hits/misses" in results["llc"].reason
    odd_unit = summarize(parse_perf_stat_csv(
        "1,Joules,uncore_imc_0/cas_count_read/,1,100.00,,\n"
        "1,,uncore_imc_0/cas_count_write/,1,100.00,,\n"), 32.0)["memory_bandwidth"]
    assert not odd_unit.ok and "Joules" in odd_unit.reason


# ---------------------------------------------------------------------------------------
# Live: real perf on this machine, a hung perf, no perf


def _live_collector(config: dict) -> PerfCollector:
    return PerfCollector(parse_config(config))


def _collect(collector) -> tuple[dict, Scrape]:
    scrape = Scrape(LiveHost("/"))
    return samples(render(list(collector.collect(scrape)))), scrape


def _stop(collector) -> None:
    if collector._live and collector._live.sampler:
        collector._live.sampler.stop()


def _hardware_events_work(perf: str) -> bool:
    result = subprocess.run([perf, "stat", "-x,", "-e", "instructions", "true"],
                            capture_output=True, text=True, timeout=30,
                            env=dict(os.environ, LC_ALL="C"))
    return result.returncode == 0 and "<not supported>" not in result.stderr


@pytest.mark.live
def test_real_perf_runs_and_the_exporter_serves_everything_else(exporter_factory):
    perf = require_tool("perf")
    hardware = _hardware_events_work(perf)
    exporter = exporter_factory("/", {"perf_window_seconds": 0.2})
    parsed, runs = scrape_until_perf_ran(exporter)
    assert runs >= 1, "perf stat never completed a run"
    # The rest of the exporter is untouched.
    assert parsed['fleetscope_scrape_collector_success{collector="cpu"}'] == 1
    assert "fleetscope_load1" in parsed
    assert parsed['fleetscope_scrape_collector_success{collector="perf"}'] == 1
    assert parsed['fleetscope_scrape_source_available{collector="perf",source="perf stat"}'] \
        == 1
    instructions = parsed['fleetscope_perf_available{event_group="instructions"}']
    if parsed['fleetscope_perf_runs_total{outcome="ok"}'] >= 1:
        assert parsed["fleetscope_perf_window_seconds"] == 0.2
        assert 0 <= parsed["fleetscope_perf_window_age_seconds"] < 20
        assert instructions == (1 if hardware else 0)
        if hardware:
            assert [k for k in parsed if k.startswith("fleetscope_instructions_per_cycle")]
        else:  # this VM: only software events
            assert not [k for k in parsed if k.startswith("fleetscope_instructions_per")]
            log = exporter.stderr()
            assert "perf reports instructions <not supported>" in log
            assert log.count("source perf/instructions not available") == 1
    else:  # perf ran but failed (perf_event_paranoid in an unprivileged container)
        assert instructions == 0


@pytest.mark.live
def test_hung_perf_is_killed_at_its_timeout_and_reported(tmp_path, monkeypatch, caplog):
    fake = tmp_path / "bin" / "perf"
    fake.parent.mkdir()
    pidfile = tmp_path / "perf.pid"
    fake.write_text(f"#!{sys.executable}\nimport os, time\n"
                    f"open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
                    "while True:\n    time.sleep(3600)\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.delenv(perf_collector.PERF_ENV, raising=False)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    caplog.set_level(logging.WARNING, logger="fleetscope.collectors.perf")
    collector = _live_collector({"perf_window_seconds": 0.2, "command_timeout_seconds": 0.5})
    try:
        started = time.monotonic()
        parsed, _ = _collect(collector)
        assert time.monotonic() - started < 0.5  # the scrape never waits for perf
        assert parsed['fleetscope_perf_runs_total{outcome="timeout"}'] == 0
        deadline = time.monotonic() + 15
        while parsed['fleetscope_perf_runs_total{outcome="timeout"}'] == 0 \
                and time.monotonic() < deadline:
            time.sleep(0.1)
            parsed, _ = _collect(collector)
        assert parsed['fleetscope_perf_runs_total{outcome="timeout"}'] == 1
        assert parsed['fleetscope_perf_runs_total{outcome="ok"}'] == 0
        assert "fleetscope_perf_window_seconds" not in parsed  # no window to serve
        pid = int(pidfile.read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "did not finish within 0.5 s" in warnings[0]
        parsed, scrape = _collect(collector)  # scraping again logs nothing new
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
        assert parsed['fleetscope_perf_available{event_group="instructions"}'] == 0
        # ... and no source of its own: the sampler's line is the one log line.
        assert ("perf", "perf/instructions") not in scrape.sources
        assert scrape.sources[("perf", "perf stat")] == (True, "")
    finally:
        _stop(collector)


def test_no_perf_installed(tmp_path, monkeypatch):
    monkeypatch.delenv(perf_collector.PERF_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    collector = _live_collector({})
    parsed, scrape = _collect(collector)
    assert scrape.sources[("perf", "perf stat")][0] is False
    assert "linux-perf" in scrape.sources[("perf", "perf stat")][1]
    for group in ("memory_bandwidth", "llc", "instructions"):
        assert parsed[f'fleetscope_perf_available{{event_group="{group}"}}'] == 0
    assert collector._live.sampler is None
    monkeypatch.setenv(perf_collector.PERF_ENV, str(tmp_path / "missing-perf"))
    collector = _live_collector({})
    _, scrape = _collect(collector)
    assert "is not an executable" in scrape.sources[("perf", "perf stat")][1]


def test_platform_peak_is_derived_from_the_cpu_model_without_config(tmp_path):
    # The Kunpeng fixture bundle: 2 sockets (physical_package_id) of Kunpeng 920, whose 8
    # DDR4-2933 channels per socket give 2 x 8 x 2933e6 x 8 bytes/s.
    from fleetscope.collectors.base import Scrape
    from fleetscope.collectors.platform import derived_peak

    sample = BUNDLES / "kunpeng-128" / "samples" / "s0000"
    peak, origin = derived_peak(Scrape(recorded_sample(str(sample))))
    assert peak == 2 * 8 * 2933e6 * 8
    assert origin.startswith("2 socket(s) x HiSilicon Kunpeng 920")
    # An unknown CPU model derives nothing (the config must say).
    root = tmp_path / "root"
    _write(root / "proc/cpuinfo", "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
           "model\t\t: 1\nmodel name\t: Some CPU\nflags\t\t: fpu\n\n")
    assert derived_peak(Scrape(RecordedSample(str(root)))) is None
