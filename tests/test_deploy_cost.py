"""The default deployment's cost: what is computed once per node, what is served from an
interval cache, and what is parsed only where it changed, never serving a stale answer
where the source did change."""

from __future__ import annotations

import shutil

from fleetscope.collectors import COLLECTORS
from fleetscope.collectors.irq import AFFINITY_REFRESH_SECONDS
from fleetscope.collectors.parsers.interrupts import InterruptsParser, parse_interrupts
from fleetscope.collectors.source import recorded_sample
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import BUNDLES, FIXTURES, samples
from tests.test_irq_tuning import CHAT, irq_exporter, irq_tree, write

PEAK = "fleetscope_memory_bandwidth_peak_bytes_per_second"


def test_interrupts_parser_reparses_only_changed_rows_and_equals_a_full_parse():
    before = (BUNDLES / "x86-256/samples/s0000/proc/interrupts").read_text()
    after = (BUNDLES / "x86-256/samples/s0001/proc/interrupts").read_text()
    parser = InterruptsParser()
    first = parser.parse(before)
    assert first == parse_interrupts(before)
    second = parser.parse(after)
    assert second == parse_interrupts(after)  # same records as parsing from scratch
    old = {row.name: row for row in first.rows}
    reused = [row for row in second.rows if row is old.get(row.name)]
    changed = [row for row in second.rows if row != old.get(row.name)]
    assert reused and changed  # the fixture has both kinds of rows
    assert all(row == old[row.name] for row in reused)
    assert not any(row is old.get(row.name) for row in changed)
    # Under another CPU header (a CPU hotplugged) every row is parsed again.
    header, _, rows = after.partition("\n")
    renumbered = header.replace("CPU255", "CPU256") + "\n" + rows
    third = parser.parse(renumbered)
    assert third == parse_interrupts(renumbered) and third.cpus[-1] == 256
    assert not any(row is old_row for row, old_row in zip(third.rows, second.rows, strict=True))


def test_irq_totals_match_a_fresh_exporter_after_rows_change(tmp_path):
    # A long-running exporter (parsing incrementally) and one started at the second sample
    # agree on every node's totals when the first sample's counts were zero.
    root = irq_tree(tmp_path)
    running = irq_exporter(root)
    running.collect(now=1000.0)
    text = (root / "proc/interrupts").read_text().replace(" 100 ", " 130 ")
    write(root / "proc/interrupts", text)
    got = samples(render(running.collect(now=1015.0)))
    assert got['fleetscope_irq_numa_node_interrupts_total{kind="device",numa_node="0"}'] == 130
    assert got[f"fleetscope_irq_online_pool_device_interrupts_total{CHAT}"] == 130


def test_irq_affinity_masks_are_cached_between_refreshes_but_new_irqs_read_at_once(tmp_path):
    root = irq_tree(tmp_path)  # IRQ 24 -> CPU 0 (chat-online runs on 0-1), 25 -> 2-3, 26 -> 3
    exporter = irq_exporter(root)
    overlap = f"fleetscope_irq_online_pool_overlap_cpus{CHAT}"
    assert samples(render(exporter.collect(now=1000.0)))[overlap] == 1
    write(root / "proc/irq/24/smp_affinity_list", "2\n")  # moved off the pool's CPUs
    soon = 1000.0 + AFFINITY_REFRESH_SECONDS / 2
    assert samples(render(exporter.collect(now=soon)))[overlap] == 1  # served from cache
    later = 1000.0 + AFFINITY_REFRESH_SECONDS
    assert samples(render(exporter.collect(now=later)))[overlap] == 0  # refreshed
    # A new device IRQ (a driver loading) has its mask read on the scrape that sees it.
    text = (root / "proc/interrupts").read_text()
    row = " 27:          0          0          0          0  PCI-MSIX-0000:00:05.0   1-edge" \
          "      mlx5_comp0\n"
    head, _, rest = text.partition("\n")
    write(root / "proc/interrupts", f"{head}\n{row}{rest}")
    write(root / "proc/irq/27/smp_affinity_list", "1\n")
    assert samples(render(exporter.collect(now=later + 1)))[overlap] == 1
    # Another root (a bundle's next sample) never reuses this one's masks.
    other = tmp_path / "other"
    shutil.copytree(root, other)
    write(other / "proc/irq/27/smp_affinity_list", "3\n")
    replay = exporter.collect(now=later + 2, source=recorded_sample(str(other)))
    assert samples(render(replay))[overlap] == 0


def test_derived_peak_is_computed_once_per_root(tmp_path):
    bundle = tmp_path / "kunpeng-128"
    shutil.copytree(BUNDLES / "kunpeng-128", bundle)
    sample = bundle / "samples" / "s0000"
    config = parse_config({"collectors": ["perf"]}, tuple(COLLECTORS))
    exporter = Exporter(str(sample), config)
    peak = samples(render(exporter.collect()))
    key = next(k for k in peak if k.startswith(PEAK))
    assert peak[key] == 2 * 8 * 2933e6 * 8
    # The CPU model cannot change under a running node: the file is not read again.
    (bundle / "static/proc/cpuinfo").write_text("processor\t: 0\nmodel name\t: Other\n\n")
    assert samples(render(exporter.collect()))[key] == peak[key]
    # A new exporter (a restart) derives it again, and finds no known model now.
    fresh = samples(render(Exporter(str(sample), config).collect()))
    assert not [k for k in fresh if k.startswith(PEAK)]


def test_recorded_perf_window_is_parsed_again_when_the_file_changes(tmp_path):
    root = tmp_path / "kunpeng-2s"
    shutil.copytree(FIXTURES / "perf" / "kunpeng-2s", root)
    exporter = Exporter(str(root), parse_config({"collectors": ["perf"]}, tuple(COLLECTORS)))
    ipc = 'fleetscope_instructions_per_cycle{socket="0"}'
    first = samples(render(exporter.collect()))
    assert samples(render(exporter.collect()))[ipc] == first[ipc]
    csv = root / "cmd/perf-stat.csv"
    lines = csv.read_text().splitlines(keepends=True)
    # Double socket 0's cycles: its IPC halves on the next scrape.
    edited = []
    for line in lines:
        fields = line.split(",")
        if len(fields) > 3 and fields[0] == "S0" and fields[4] == "cycles":
            fields[2] = str(int(float(fields[2]) * 2))
        edited.append(",".join(fields))
    csv.write_text("".join(edited))
    assert samples(render(exporter.collect()))[ipc] == first[ipc] / 2


def test_numa_distances_are_read_once_per_root_and_node_set(tmp_path):
    bundle = tmp_path / "kunpeng-128"
    shutil.copytree(BUNDLES / "kunpeng-128", bundle)
    nodes = bundle / "static/sys/devices/system/node"
    exporter = Exporter(str(bundle / "samples" / "s0000"),
                        parse_config({"collectors": ["numa"]}, tuple(COLLECTORS)))
    far = 'fleetscope_numa_node_distance{numa_node="0",to_numa_node="3"}'
    assert samples(render(exporter.collect()))[far] == 22
    (nodes / "node0/distance").write_text("10 12 20 99\n")  # firmware tables do not change
    assert samples(render(exporter.collect()))[far] == 22
    # A node that appears (memory hotplug) makes a new reading, the edited row included.
    shutil.copytree(nodes / "node3", nodes / "node4")
    for node in range(4):
        path = nodes / f"node{node}/distance"
        path.write_text(path.read_text().strip() + " 30\n")
    (nodes / "node4/distance").write_text("30 30 30 30 10\n")
    (nodes / "node4/cpulist").write_text("\n")
    got = samples(render(exporter.collect()))
    assert got[far] == 99
    assert got['fleetscope_numa_node_distance{numa_node="4",to_numa_node="4"}'] == 10
