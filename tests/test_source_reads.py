"""Every read goes through the evidence source: the paths that used to decide for
themselves (from a path, a file's size, a log file's presence) now ask the source.

    the SIGILL, OOM and fork logs     read the kernel logs the source says it has
    pools' open fds                   a recording is listed, never sized like procfs
    tasks' per-process fast path      a recorded root's checked read, links out refused
    bundle record's kernel log        read through the source, links out refused
    a bundle's diagnosis              the bundle's own per-sample sources, no path walk
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleetscope.bundle.commands import CommandOutputs
from fleetscope.bundle.read import open_bundle
from fleetscope.bundle.record import record
from fleetscope.collectors.base import NotAvailable, Scrape
from fleetscope.collectors.cpu_features import CpuFeaturesCollector
from fleetscope.collectors.pools import open_fds
from fleetscope.collectors.source import (
    DMESG,
    KMSG,
    LiveHost,
    RecordedSample,
    RefusedPath,
)
from fleetscope.collectors.tasks import read_proc
from fleetscope.core.bundle_format import META
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from tests.conftest import BUNDLES, samples

SIGILL = ("traps: ud_probe[4242] trap invalid opcode ip:55bc07eee040 sp:7fff9ef3b438 "
          "error:0 in ud_probe[55bc07eee000+1000]")


def _log_tree(tmp_path: Path) -> Path:
    """A tree holding both logs: a dev/kmsg that names `from_kmsg`, a dmesg.txt `ud_probe`."""
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    (root / "proc").mkdir()
    (root / "proc" / "stat").write_text("btime 1700000000\n")
    (root / "dev" / "kmsg").write_text("6,1,100,-;" + SIGILL.replace("ud_probe", "from_kmsg")
                                       + "\n")
    (root / DMESG).write_text(f"[  100.000000] {SIGILL}\n")
    return root


def _sigill(source) -> tuple[dict[str, float], Scrape]:
    scrape = Scrape(source)
    families = CpuFeaturesCollector(parse_config({})).collect(scrape)
    return samples(render(list(families))), scrape


def test_the_sigill_reader_reads_the_logs_the_source_has(tmp_path):
    root = _log_tree(tmp_path)
    recorded, scrape = _sigill(RecordedSample(str(root)))
    assert recorded['fleetscope_sigill_crashes_total{binary="ud_probe"}'] == 1
    assert not any("from_kmsg" in key for key in recorded)  # a recording has no ring
    assert scrape.sources[("cpu_features", DMESG)] == (True, "")
    assert ("cpu_features", KMSG) not in scrape.sources
    live, scrape = _sigill(LiveHost(str(root)))
    assert live['fleetscope_sigill_crashes_total{binary="from_kmsg"}'] == 1
    assert scrape.sources[("cpu_features", KMSG)] == (True, "")


def test_the_fork_log_reader_reads_the_logs_the_source_has(tmp_path):
    from fleetscope.collectors.fork_limits import ForkLimitsCollector

    root = _log_tree(tmp_path)
    line = "cgroup: fork rejected by pids controller in /system.slice/{}.service"
    (root / DMESG).write_text(f"[  100.000000] {line.format('recorded')}\n")
    with (root / "dev" / "kmsg").open("a") as ring:
        ring.write(f"6,2,200,-;{line.format('ring')}\n")
    for source, cgroup in ((RecordedSample(str(root)), "recorded"),
                           (LiveHost(str(root)), "ring")):
        collector = ForkLimitsCollector(parse_config({}))
        parsed = samples(render(list(collector.collect(Scrape(source)))))
        collector.close()
        assert [key for key in parsed if "fork_rejected_total" in key] == [
            f'fleetscope_pids_fork_rejected_total{{cgroup="/system.slice/{cgroup}.service"}}']


def test_a_source_without_kernel_logs_reads_none(tmp_path):
    class NoLogs(RecordedSample):
        kernel_logs = ()

    parsed, scrape = _sigill(NoLogs(str(_log_tree(tmp_path))))
    assert not any(key.startswith("fleetscope_sigill_crashes") for key in parsed)
    assert scrape.sources[("cpu_features", KMSG)][0] is False


def _process_with_fds(root: Path, pid: int, count: int) -> None:
    fd = root / "proc" / str(pid) / "fd"
    fd.mkdir(parents=True)
    for number in range(count):
        (fd / str(number)).write_text("")


def test_a_recorded_sample_lists_its_fds_whatever_its_files_sizes(tmp_path):
    # An empty proc/stat once made a tree pass for procfs, and fd/'s directory size for the
    # fd count; a recording is listed because the source says it is one.
    root = tmp_path / "sample"
    _process_with_fds(root, 42, 3)
    (root / "proc" / "stat").write_text("")
    assert os.stat(root / "proc" / "42" / "fd").st_size != 3
    assert open_fds(Scrape(RecordedSample(str(root))), 42) == 3


def test_a_bundle_sample_counts_fds_as_recorded():
    bundle = open_bundle(str(BUNDLES / "x86-256"))
    with bundle:
        scrape = Scrape(bundle.source(bundle.samples[0]))
        pids = [int(name) for name in scrape.listdir("proc") if name.isdigit()]
        counted = [pid for pid in pids if os.path.exists(
            os.path.join(bundle.samples[0].directory, f"proc/{pid}/fd_count"))]
        assert counted, "the fixture bundle records fd counts"
        recorded = Path(bundle.samples[0].directory, f"proc/{counted[0]}/fd_count")
        assert open_fds(scrape, counted[0]) == int(recorded.read_text())


def test_the_per_process_fast_path_refuses_a_link_out_of_a_recorded_root(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("Name:\tsecret\n")
    root = tmp_path / "sample"
    (root / "proc" / "7").mkdir(parents=True)
    (root / "proc" / "7" / "status").symlink_to(outside)
    (root / "proc" / "7" / "stat").symlink_to("/dev/zero")
    recorded = Scrape(RecordedSample(str(root)))
    with pytest.raises(RefusedPath, match="a link out"):
        read_proc(recorded, "proc/7/status", True)
    with pytest.raises(RefusedPath, match="not a regular file"):
        read_proc(recorded, "proc/7/stat", True)
    # The live host's root is the host's own, links included: read as it is.
    assert read_proc(Scrape(LiveHost(str(root))), "proc/7/status", True).startswith("Name:")
    assert read_proc(Scrape(LiveHost()), f"proc/{os.getpid()}/stat", True).startswith(
        str(os.getpid()))


def test_the_per_process_fast_path_says_what_is_missing(tmp_path):
    for source in (RecordedSample(str(tmp_path)), LiveHost(str(tmp_path))):
        with pytest.raises(NotAvailable, match="does not exist"):
            read_proc(Scrape(source), "proc/1/stat", True)


def _recorded_tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "stat").write_text("cpu  1 2 3 4 5 6 7 0 0 0\nbtime 1700000000\n")
    (root / "proc" / "cpuinfo").write_text("processor\t: 0\n")
    (root / "cmd").mkdir()  # a recording: nothing is run on its behalf
    return root


def test_bundle_record_reads_the_kernel_log_through_the_source(tmp_path):
    root = _recorded_tree(tmp_path)
    (root / DMESG).write_text(f"[  100.000000] {SIGILL}\n")
    out = tmp_path / "bundle"
    record(str(out), 0, 1.0, parse_config({}), RecordedSample(str(root)))
    assert (out / "static" / DMESG).read_text().endswith(f"{SIGILL}\n")


def test_bundle_record_does_not_follow_a_kernel_log_out_of_a_recorded_root(tmp_path):
    root = _recorded_tree(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("not the kernel log\n")
    (root / DMESG).symlink_to(secret)
    out = tmp_path / "bundle"
    record(str(out), 0, 1.0, parse_config({}), RecordedSample(str(root)))
    assert not (out / "static" / DMESG).exists()
    assert json.loads((out / META).read_text())["samples"]


def test_only_this_machines_own_root_checks_binaries_here(tmp_path):
    config = parse_config({})
    assert CommandOutputs(config, LiveHost("/")).own_root
    assert not CommandOutputs(config, LiveHost(str(tmp_path))).own_root
    assert not CommandOutputs(config, RecordedSample("/")).own_root


def test_a_bundle_diagnosis_enriches_from_the_bundles_own_sources(monkeypatch):
    """The enricher gets every sample's source from the bundle: it never walks up from a
    sample directory to find the bundle's metadata again."""
    from fleetscope.core import bundle_format
    from fleetscope.diagnose.bundle_diagnosis import diagnose_bundle

    bundle = open_bundle(str(BUNDLES / "x86-256"))
    opened = []
    real_load = bundle_format.load_meta
    monkeypatch.setattr(bundle_format, "load_meta",
                        lambda path: opened.append(path) or real_load(path))
    with bundle:
        diagnosed = diagnose_bundle(bundle, bundle.config())
    assert opened == []
    assert diagnosed.series.timestamps()
    assert len(diagnosed.findings) + len(diagnosed.not_evaluated) > 0
