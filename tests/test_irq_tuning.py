"""Collectors `irq` and `tuning`: the /proc/interrupts parser on real samples, both collectors
on fixture trees in the kernel's formats, and on this machine."""

from __future__ import annotations

import doctest
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetscope.collectors.irq import row_kind
from fleetscope.collectors.parsers import ParseError
from fleetscope.collectors.parsers import interrupts as interrupts_parsers
from fleetscope.collectors.parsers.interrupts import parse_interrupts
from fleetscope.collectors.tuning import SYSCTLS, sysctl_path
from fleetscope.core.config import parse_config
from fleetscope.core.exposition import render
from fleetscope.exporter import Exporter
from tests.conftest import BUNDLES, require_tool, samples
from tests.test_pools import write, write_process

# Lines verbatim (a subset of the rows) from a Linux 6.18 x86_64 KVM guest with 2 vCPUs (this
# project's CI machine); the header keeps the kernel's trailing spaces. Per-device MSI domains
# name the chip after the PCI function ("PCI-MSIX-0000:00:02.0"), wider than the %8s column.
INTERRUPTS_X86_REAL = "           CPU0       CPU1       \n" + """\
 24:          1          0  IO-APIC   5-edge      ACPI:Ged
 25:          0          1  IO-APIC   6-edge      ACPI:Ged
 26:          0         14  IO-APIC   4-edge      ttyS0
 28:          0          0 PCI-MSIX-0000:00:01.0   0-edge      virtio0-config
 31:          0        621 PCI-MSIX-0000:00:01.0   3-edge      virtio0-stats
 36:          0     117298 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0
 41:       2842          0 PCI-MSIX-0000:00:04.0   1-edge      virtio3-rx
 42:          0       7167 PCI-MSIX-0000:00:04.0   2-edge      virtio3-tx
NMI:          0          0   Non-maskable interrupts
LOC:     163045     185313   Local timer interrupts
SPU:          0          0   Spurious interrupts
RES:      16530      17018   Rescheduling interrupts
CAL:     114738      89177   Function call interrupts
TLB:      12539      12017   TLB shootdowns
HYP:         36         86   Hypervisor callback interrupts
ERR:          0
MIS:          0
PIN:          0          0   Posted-interrupt notification event
PIW:          0          0   Posted-interrupt wakeup event
"""
# arm64 with GICv3 (NXP i.MX8M, 4 cores): the numbered rows verbatim from a user's report in
# raspberrypi/linux issue #5255 (the report stripped the header's trailing spaces). The IPI
# and Err rows are NOT from that report: they follow arch/arm64/kernel/smp.c show_ipi_list()
# ("%*s%u:%s", then "%10u " per CPU, then "      %s\n") and arch_show_interrupts() ("%*s:
# %10lu\n"), with illustrative counts.
INTERRUPTS_ARM64 = """\
           CPU0       CPU1       CPU2       CPU3
  9:          0          0          0          0     GICv3  25 Level     vgic
 11:       2601       2030       1576       1614     GICv3  30 Level     arch_timer
 12:          0          0          0          0     GICv3  27 Level     kvm guest vtimer
 14:        365        540        411        424     GICv3  79 Level     timer@306a0000
 15:          0          0          0          0     GICv3  23 Level     arm-pmu
 37:          0          0          0          0     GICv3 110 Level     30280000.watchdog
IPI0:      1234        987        876        765       Rescheduling interrupts
IPI1:        12         34         56         78       Function call interrupts
Err:          0
"""


def test_interrupts_x86_real_sample():
    parsed = parse_interrupts(INTERRUPTS_X86_REAL)
    assert parsed.cpus == (0, 1)
    rows = {row.name: row for row in parsed.rows}
    assert rows["36"].counts == (0, 117298)
    assert rows["36"].chip == "PCI-MSIX-0000:00:02.0" and rows["36"].hwirq == 1
    assert rows["24"].chip == "IO-APIC" and rows["24"].hwirq == 5
    assert rows["LOC"].counts == (163045, 185313) and rows["LOC"].per_cpu
    assert rows["ERR"].counts == (0,) and not rows["ERR"].per_cpu
    assert {row_kind(rows[n]) for n in ("24", "36", "42")} == {"device"}
    assert {row_kind(rows[n]) for n in ("LOC", "RES", "PIW")} == {"local"}


def test_interrupts_arm64_sample():
    parsed = parse_interrupts(INTERRUPTS_ARM64)
    assert parsed.cpus == (0, 1, 2, 3)
    rows = {row.name: row for row in parsed.rows}
    assert rows["11"].chip == "GICv3" and rows["11"].hwirq == 30
    # PPIs (16-31: arch_timer, vgic, the PMU) are per-CPU; SPIs (32+) are devices.
    assert [row_kind(rows[n]) for n in ("9", "11", "12", "15")] == ["local"] * 4
    assert row_kind(rows["14"]) == "device" and row_kind(rows["37"]) == "device"
    assert row_kind(rows["IPI0"]) == "local" and rows["IPI1"].counts == (12, 34, 56, 78)
    assert not rows["Err"].per_cpu


def test_interrupts_cpu_numbers_with_gaps_and_one_cpu():
    # CPU2 offline: the header lists only online CPUs (for_each_online_cpu)
    parsed = parse_interrupts("           CPU0       CPU1       CPU3       \n"
                              "LOC:          5          6          7   Local timer interrupts\n")
    assert parsed.cpus == (0, 1, 3) and parsed.rows[0].counts == (5, 6, 7)
    one = parse_interrupts("           CPU0       \n  0:         44   IO-APIC   2-edge      timer\n"
                           "LOC:     123456   Local timer interrupts\nERR:          0\n")
    assert [(r.name, r.per_cpu) for r in one.rows] == [("0", True), ("LOC", True),
                                                       ("ERR", False)]


@pytest.mark.parametrize("text", [
    "",
    "\n",
    "foo bar\n",
    "           CPU0       CPU0\n",
    "           CPU0       CPU1\n 24:          1\n",  # a count missing
    "           CPU0       CPU1\n 24:          1          0\n",  # no chip
    "           CPU0       CPU1\n 24:          1         x0  IO-APIC   5-edge  a\n",
    "           CPU0       CPU1\nLOC          1          0   Local timer interrupts\n",
    "           CPU0\n 2 4:          1  IO-APIC   5-edge  a\n",
])
def test_interrupts_rejects_malformed(text):
    with pytest.raises(ParseError):
        parse_interrupts(text)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(max_size=300), st.text(
    alphabet=st.sampled_from(list("0123456789 \n\t:-CPULOCERRIPIGICv3edge")), max_size=300)))
def test_fuzz_interrupts_only_parse_error_escapes(text):
    try:
        parse_interrupts(text)
    except ParseError:
        pass


@pytest.mark.parametrize("sample", [INTERRUPTS_X86_REAL, INTERRUPTS_ARM64])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fuzz_interrupts_truncated_and_corrupted(sample, data):
    for text in (sample[:data.draw(st.integers(0, len(sample)))],
                 sample[:(i := data.draw(st.integers(0, len(sample) - 1)))]
                 + data.draw(st.text(max_size=3)) + sample[i + 1:]):
        try:
            parse_interrupts(text)
        except ParseError:
            pass


def test_docstring_examples():
    failures, tried = doctest.testmod(interrupts_parsers)
    assert tried > 0 and failures == 0


# ---- the irq collector on fixture trees -------------------------------------------------

def interrupts_text(cpus, device_rows, local_rows) -> str:
    """/proc/interrupts as kernel/irq/proc.c show_interrupts() and x86 arch_show_interrupts()
    print it (prec 3: fewer than 1000 IRQs)."""
    lines = [" " * 11 + "".join(f"CPU{cpu:<8d}" for cpu in cpus)]
    for irq, counts, chip, hwirq, action in device_rows:
        lines.append(f"{irq:>3d}: " + "".join(f"{n:10d} " for n in counts)
                     + f" {chip:>8s} {hwirq:>3d}-edge      {action}")
    for name, counts, text in local_rows:
        lines.append(f"{name:>3s}: " + "".join(f"{n:10d} " for n in counts) + f"  {text}")
    lines += ["ERR:          0", "MIS:          0"]
    return "\n".join(lines) + "\n"


def irq_tree(tmp_path: Path) -> Path:
    """4 CPUs on 2 NUMA nodes (0-1, 2-3); an online pool process allowed on CPUs 0-1, a batch
    process on 2-3; IRQ 24 targets CPU 0, 25 CPUs 2-3, 26 CPU 3."""
    root = tmp_path / "root"
    for node, cpus in ((0, "0-1"), (1, "2-3")):
        write(root / f"sys/devices/system/node/node{node}/cpulist", cpus + "\n")
    write_process(root, 100, "python3\0-m\0agent.worker\0", "0::/k8s/online/chat\n",
                  cpus="0-1")
    write_process(root, 200, "python3\0etl_job.py\0", "0::/k8s/offline/etl\n", cpus="2-3")
    write(root / "proc/interrupts", interrupts_text(
        (0, 1, 2, 3),
        [(24, (100, 0, 0, 0), "IO-APIC", 5, "acpi"),
         (25, (0, 0, 50, 0), "PCI-MSIX-0000:00:02.0", 1, "virtio1-req.0"),
         (26, (0, 0, 0, 70), "PCI-MSIX-0000:00:03.0", 1, "virtio2-input.0")],
        [("LOC", (1000, 1000, 1000, 4294967000), "Local timer interrupts"),
         ("RES", (10, 20, 30, 40), "Rescheduling interrupts")]))
    for irq, cpus in ((24, "0"), (25, "2-3"), (26, "3")):
        write(root / f"proc/irq/{irq}/smp_affinity_list", cpus + "\n")
    return root


POOLS = [{"name": "chat-online", "class": "online", "match": {"cgroup": "*/online/*"}},
         {"name": "batch", "class": "offline", "match": {"cmdline": "etl|train"}}]
NODE = 'fleetscope_irq_numa_node_interrupts_total{{kind="{}",numa_node="{}"}}'
CHAT = '{pool="chat-online"}'


def irq_exporter(root: Path, **extra) -> Exporter:
    return Exporter(str(root), parse_config({"pools": POOLS, "collectors": ["irq"], **extra},
                                            ("irq",)))


def test_irq_summary_and_online_pool_overlap(tmp_path):
    got = samples(render(irq_exporter(irq_tree(tmp_path)).collect(now=1000.0)))
    assert got['fleetscope_scrape_collector_success{collector="irq"}'] == 1
    assert got[NODE.format("device", 0)] == 100
    assert got[NODE.format("device", 1)] == 120
    assert got[NODE.format("local", 0)] == 2030
    assert got[NODE.format("local", 1)] == 1000 + 4294967000 + 70
    assert not [k for k in got if 'cpu="' in k]  # summary mode: nothing per CPU
    assert not [k for k in got if 'irq="' in k or "batch" in k]  # never per IRQ; online only
    assert got["fleetscope_irq_device_affinity_cpus"] == 3
    assert got[f"fleetscope_irq_online_pool_cpus{CHAT}"] == 2
    assert got[f"fleetscope_irq_online_pool_overlap_cpus{CHAT}"] == 1  # CPU 0, by IRQ 24
    assert got[f"fleetscope_irq_online_pool_overlap_irqs{CHAT}"] == 1
    assert got[f"fleetscope_irq_online_pool_device_interrupts_total{CHAT}"] == 100


def test_irq_totals_survive_wraps_freed_and_reused_irqs_and_hotplug(tmp_path):
    root = irq_tree(tmp_path)
    exporter = irq_exporter(root, per_core="full")
    first = samples(render(exporter.collect(now=1000.0)))
    assert first['fleetscope_irq_interrupts_total{cpu="3",kind="local"}'] == 4294967040
    # 15 s later: IRQ 25 was freed, 26 now belongs to another device and counts from 0,
    # CPU 3's LOC count wrapped past 2^32.
    write(root / "proc/interrupts", interrupts_text(
        (0, 1, 2, 3),
        [(24, (150, 0, 0, 0), "IO-APIC", 5, "acpi"),
         (26, (0, 5, 0, 0), "PCI-MSIX-0000:00:04.0", 1, "virtio3-rx")],
        [("LOC", (1100, 1100, 1100, 100), "Local timer interrupts"),
         ("RES", (11, 21, 31, 41), "Rescheduling interrupts")]))
    write(root / "proc/irq/26/smp_affinity_list", "1\n")
    shutil.rmtree(root / "proc/irq/25")
    second = samples(render(exporter.collect(now=1015.0)))
    per_cpu = 'fleetscope_irq_interrupts_total{{cpu="{}",kind="{}"}}'
    assert [second[per_cpu.format(c, "device")] for c in range(4)] == [150, 5, 50, 70]
    assert second[per_cpu.format(3, "local")] == 4294967000 + 396 + 41
    assert second[NODE.format("device", 0)] == 155
    assert second[NODE.format("device", 1)] == 120  # freed and replaced IRQs keep their counts
    assert second[f"fleetscope_irq_online_pool_device_interrupts_total{CHAT}"] == 155
    # IRQ 26 now targets CPU 1: both online-pool CPUs are IRQ targets
    assert second[f"fleetscope_irq_online_pool_overlap_cpus{CHAT}"] == 2
    assert second[f"fleetscope_irq_online_pool_overlap_irqs{CHAT}"] == 2
    assert second["fleetscope_irq_device_affinity_cpus"] == 2
    # CPU 2 goes offline: its column disappears, node 1 keeps what CPU 2 handled
    write(root / "proc/interrupts", interrupts_text(
        (0, 1, 3),
        [(24, (160, 0, 0), "IO-APIC", 5, "acpi"),
         (26, (0, 6, 0), "PCI-MSIX-0000:00:04.0", 1, "virtio3-rx")],
        [("LOC", (1200, 1200, 200), "Local timer interrupts"),
         ("RES", (12, 22, 42), "Rescheduling interrupts")]))
    write(root / "sys/devices/system/node/node1/cpulist", "3\n")
    third = samples(render(exporter.collect(now=1030.0)))
    for key, value in second.items():
        if key.startswith("fleetscope_irq_numa_node_interrupts_total"):
            assert third[key] >= value, key
    assert third[NODE.format("local", 1)] == second[NODE.format("local", 1)] + 101
    assert per_cpu.format(2, "local") not in third


def test_irq_without_pools_without_affinity_and_without_interrupts(tmp_path):
    root = irq_tree(tmp_path)
    bare = Exporter(str(root), parse_config({"collectors": ["irq"]}, ("irq",)))
    got = samples(render(bare.collect(now=1000.0)))
    assert got[NODE.format("device", 0)] == 100
    assert not [k for k in got if "pool" in k]
    shutil.rmtree(root / "proc/irq")
    got = samples(render(irq_exporter(root).collect(now=1000.0)))
    assert got['fleetscope_scrape_collector_success{collector="irq"}'] == 1
    affinity = ('fleetscope_scrape_source_available{collector="irq",'
                'source="proc/irq/<n>/smp_affinity_list"}')
    assert got[affinity] == 0
    assert f"fleetscope_irq_online_pool_overlap_cpus{CHAT}" not in got
    assert got[f"fleetscope_irq_online_pool_cpus{CHAT}"] == 2
    (root / "proc/interrupts").unlink()  # the required source
    got = samples(render(irq_exporter(root).collect(now=1000.0)))
    assert got['fleetscope_scrape_collector_success{collector="irq"}'] == 0
    assert not [k for k in got if k.startswith("fleetscope_irq_")]


def test_promtool_accepts_the_irq_and_tuning_metrics(tmp_path):
    promtool = require_tool("promtool")
    root = irq_tree(tmp_path)
    write_sysctls(root)
    config = parse_config({"pools": POOLS, "per_core": "full", "collectors": ["irq", "tuning"]},
                          ("irq", "tuning"))
    text = render(Exporter(str(root), config).collect(now=1000.0))
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


# ---- tuning -----------------------------------------------------------------------------

SYSCTL_VALUES = {"net.core.somaxconn": 4096, "net.ipv4.tcp_tw_reuse": 2,
                 "net.core.rmem_max": 212992, "net.core.wmem_max": 212992,
                 "kernel.threads-max": 127868, "vm.max_map_count": 65530}


def write_sysctls(root: Path) -> None:
    for name, value in SYSCTL_VALUES.items():
        write(root / sysctl_path(name), f"{value}\n")  # proc_dointvec: "%d\n"


def tuning_collect(root: Path) -> dict[str, float]:
    exporter = Exporter(str(root), parse_config({"collectors": ["tuning"]}, ("tuning",)))
    return samples(render(exporter.collect(now=1000.0)))


def test_sysctls_on_a_fixture_tree(tmp_path):
    write_sysctls(tmp_path)
    got = tuning_collect(tmp_path)
    for name, value in SYSCTL_VALUES.items():
        assert got[f'fleetscope_sysctl{{name="{name}"}}'] == value
    assert sysctl_path("kernel.threads-max") == "proc/sys/kernel/threads-max"


def test_missing_and_corrupt_sysctls(tmp_path):
    write_sysctls(tmp_path)
    (tmp_path / sysctl_path("net.ipv4.tcp_tw_reuse")).unlink()  # a kernel without IPv4
    got = tuning_collect(tmp_path)
    source = 'fleetscope_scrape_source_available{{collector="tuning",source="{}"}}'
    assert got[source.format("proc/sys/net/ipv4/tcp_tw_reuse")] == 0
    assert got['fleetscope_scrape_collector_success{collector="tuning"}'] == 1
    assert len([k for k in got if k.startswith("fleetscope_sysctl{")]) == 5
    write(tmp_path / sysctl_path("vm.max_map_count"), "lots\n")
    got = tuning_collect(tmp_path)
    assert got['fleetscope_scrape_collector_success{collector="tuning"}'] == 0
    assert got['fleetscope_sysctl{name="net.core.somaxconn"}'] == 4096
    empty = tmp_path / "empty"
    empty.mkdir()
    got = tuning_collect(empty)
    assert not [k for k in got if k.startswith("fleetscope_sysctl")]
    assert got['fleetscope_scrape_collector_success{collector="tuning"}'] == 1


# ---- the fixture bundles ----------------------------------------------------------------

@pytest.mark.parametrize("bundle", ["x86-256", "kunpeng-128"])
def test_fixture_bundles(exporter_factory, tmp_path, bundle):
    meta = json.loads((BUNDLES / bundle / "meta.json").read_text())
    sample = BUNDLES / bundle / meta["samples"][0]["dir"]
    if not (sample / "proc/interrupts").exists():
        pytest.skip(f"fixture bundle {bundle} has no proc/interrupts yet")
    copy = tmp_path / bundle
    shutil.copytree(BUNDLES / bundle, copy)
    live = copy / "samples" / "live"
    live.symlink_to("s0000")
    config = {**(meta.get("config") or {}), "collectors": ["irq", "tuning"]}
    exporter = exporter_factory(live, config)
    first = samples(exporter.text())
    live.unlink()
    live.symlink_to("s0001")
    second = samples(exporter.text())
    assert second['fleetscope_scrape_collector_success{collector="irq"}'] == 1
    assert second['fleetscope_scrape_collector_success{collector="tuning"}'] == 1
    nodes = [k for k in second if k.startswith("fleetscope_irq_numa_node_interrupts_total")]
    assert nodes and all(second[k] >= first[k] for k in nodes)
    online = [p["name"] for p in config.get("pools", []) if p["class"] == "online"]
    for pool in online:
        assert f'fleetscope_irq_online_pool_cpus{{pool="{pool}"}}' in second


# ---- this machine -----------------------------------------------------------------------

PINNED = """
import os, sys, time
os.sched_setaffinity(0, {0})
print("ready", flush=True)
time.sleep(30)
"""


@pytest.mark.live
def test_irq_and_tuning_on_this_machine(exporter_factory):
    marker = f"fleetscope-irq-test-{os.getpid()}"
    child = subprocess.Popen([sys.executable, "-c", PINNED, marker], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        config = {"per_core": "full", "collectors": ["irq", "tuning"], "pools": [
            {"name": "agents", "class": "online", "match": {"cmdline": marker}}]}
        before = parse_interrupts(Path("/proc/interrupts").read_text())
        got = samples(exporter_factory("/", config).text())
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert got['fleetscope_scrape_collector_success{collector="irq"}'] == 1
    for cpu_index, cpu in enumerate(before.cpus):
        seen = sum(got[f'fleetscope_irq_interrupts_total{{cpu="{cpu}",kind="{kind}"}}']
                   for kind in ("device", "local"))
        listed = sum(row.counts[cpu_index] for row in before.rows if row.per_cpu)
        assert seen >= listed  # the exporter read later; counts only grow
    assert got['fleetscope_irq_online_pool_cpus{pool="agents"}'] == 1
    targets: set[int] = set()
    for row in before.rows:
        path = Path(f"/proc/irq/{row.name}/smp_affinity_list")
        if row.per_cpu and row_kind(row) == "device" and path.exists():
            for part in path.read_text().strip().split(","):
                first, _, last = part.partition("-")
                targets.update(range(int(first), int(last or first) + 1))
    if targets:
        expected = 1 if 0 in targets else 0
        assert got['fleetscope_irq_online_pool_overlap_cpus{pool="agents"}'] == expected
    for name in SYSCTLS:
        value = int(Path("/" + sysctl_path(name)).read_text())
        assert got[f'fleetscope_sysctl{{name="{name}"}}'] == value
