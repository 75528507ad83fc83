"""NUMA collector: numastat, distances, node memory, and per-pool remote-memory share."""

from __future__ import annotations

import pytest

from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers.sysfs import (
    parse_distance,
    parse_node_meminfo,
    parse_numastat,
)
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import samples

# Verbatim from a 6.18 x86_64 VM (kernel Documentation/admin-guide/numastat.rst).
NUMASTAT_REAL = ("numa_hit 1196169\nnuma_miss 0\nnuma_foreign 0\ninterleave_hit 1136\n"
                 "local_node 1196169\nother_node 0\n")
MEMINFO_REAL = ("Node 0 MemTotal:        4417308 kB\nNode 0 MemFree:         3937848 kB\n"
                "Node 0 AnonPages:         58128 kB\nNode 0 HugePages_Total:     0\n")


def test_node_file_parsers_on_real_samples():
    assert parse_numastat(NUMASTAT_REAL)["interleave_hit"] == 1136
    assert parse_distance("10 12 20 22\n") == [10, 12, 20, 22]
    memory = parse_node_meminfo(MEMINFO_REAL)
    assert memory == {"MemTotal": 4417308 * 1024, "MemFree": 3937848 * 1024,
                      "AnonPages": 58128 * 1024}


@pytest.mark.parametrize(
    "parser, text",
    [(parse_numastat, ""), (parse_numastat, "numa_hit\n"), (parse_numastat, "numa_hit -1\n"),
     (parse_numastat, "numa_miss 4\n"), (parse_distance, ""), (parse_distance, "10 x\n"),
     (parse_node_meminfo, "MemTotal: 5 kB\n"), (parse_node_meminfo, "Node 0 MemFree: 5 kB\n")],
)
def test_node_file_parsers_reject_malformed(parser, text):
    with pytest.raises(ParseError):
        parser(text)


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _node_tree(tmp_path):
    """Two nodes, CPUs 0-1 on node 0 and 2-3 on node 1, and three processes: an online worker
    pinned to node 0 with 3/4 of its memory on node 1, an unpinned batch job, and sshd."""
    root = tmp_path / "root"
    node = root / "sys/devices/system/node"
    for n, cpus, dist in ((0, "0-1", "10 21"), (1, "2-3", "21 10")):
        _write(node / f"node{n}/cpulist", cpus + "\n")
        _write(node / f"node{n}/distance", dist + "\n")
        _write(node / f"node{n}/numastat", NUMASTAT_REAL.replace("other_node 0",
                                                                  f"other_node {n * 500}"))
        _write(node / f"node{n}/meminfo", MEMINFO_REAL.replace("Node 0", f"Node {n}"))
    processes = {
        100: ("python3\0-m\0agent.worker\0", "0::/k8s/online/chat\n", "0-1",
              "7f00 default anon=100 dirty=100 N0=25 N1=75 kernelpagesize_kB=4\n"),
        200: ("python3\0etl_job.py\0", "0::/k8s/offline/etl\n", "0-3",
              "7f00 default anon=10 N0=5 N1=5 kernelpagesize_kB=4\n"),
        300: ("sshd\0", "0::/system.slice/ssh.service\n", "0-3",
              "7f00 default anon=1 N0=1 kernelpagesize_kB=4\n"),
    }
    for pid, (cmdline, cgroup, allowed, numa_maps) in processes.items():
        base = root / f"proc/{pid}"
        _write(base / "cmdline", cmdline)
        _write(base / "cgroup", cgroup)
        _write(base / "status", f"Name:\tx\nThreads:\t4\nCpus_allowed_list:\t{allowed}\n")
        _write(base / "numa_maps", numa_maps)
    return root


POOLS = [{"name": "chat-online", "class": "online", "match": {"cgroup": "*/online/*"}},
         {"name": "batch", "class": "offline", "match": {"cmdline": "etl|train"}}]


def test_pool_remote_memory_share(tmp_path):
    root = _node_tree(tmp_path)
    exporter = Exporter(str(root), parse_config({"pools": POOLS,
                                                 "numa_maps_min_interval_seconds": 0}))
    parsed = samples(render(exporter.collect()))
    online = 'class="online",pool="chat-online"'
    assert parsed[f"fleetscope_pool_numa_remote_memory_ratio{{{online}}}"] == 0.75
    memory = 'fleetscope_pool_memory_bytes{{class="online",locality="{}",pool="chat-online"}}'
    assert parsed[memory.format("remote")] == 75 * 4096
    assert parsed[memory.format("local")] == 25 * 4096
    # The batch job may run on every node: none of its memory is remote by that definition.
    assert parsed['fleetscope_pool_numa_remote_memory_ratio{class="offline",pool="batch"}'] == 0
    assert not [k for k in parsed if "sshd" in k]
    assert parsed['fleetscope_numastat_pages_total{field="other_node",numa_node="1"}'] == 500
    assert parsed['fleetscope_numa_node_distance{numa_node="0",to_numa_node="1"}'] == 21
    assert parsed['fleetscope_scrape_collector_success{collector="numa"}'] == 1


def test_exited_process_is_skipped_and_numa_maps_reading_is_rate_limited(tmp_path):
    root = _node_tree(tmp_path)
    (root / "proc/200/numa_maps").unlink()  # exited between listing and reading
    exporter = Exporter(str(root), parse_config({"pools": POOLS}))
    first = samples(render(exporter.collect(now=1000.0)))
    assert 'fleetscope_pool_numa_remote_memory_ratio{class="offline",pool="batch"}' not in first
    assert first['fleetscope_scrape_collector_success{collector="numa"}'] == 1
    # Within numa_maps_min_interval_seconds (30 s default) the last reading is served.
    (root / "proc/100/numa_maps").write_text("7f00 default N0=100 kernelpagesize_kB=4\n")
    second = samples(render(exporter.collect(now=1010.0)))
    ratio = 'fleetscope_pool_numa_remote_memory_ratio{class="online",pool="chat-online"}'
    assert second[ratio] == 0.75
    assert second["fleetscope_pool_numa_maps_age_seconds"] == 10.0
    third = samples(render(exporter.collect(now=1031.0)))
    assert third[ratio] == 0.0


def test_machine_without_numa_reports_not_available(tmp_path):
    (tmp_path / "proc").mkdir()
    exporter = Exporter(str(tmp_path), parse_config({"collectors": ["numa"]}, ("numa",)))
    parsed = samples(render(exporter.collect()))
    # Absence is not an error (the success help says so): the source says what is missing.
    assert parsed['fleetscope_scrape_collector_success{collector="numa"}'] == 1
    assert parsed['fleetscope_scrape_source_available{collector="numa",'
                  'source="sys/devices/system/node"}'] == 0
