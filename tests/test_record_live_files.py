"""A live recording carries the files the exporter reads live, /proc/sys included.

Reproduced: every live bundle lacked proc/sys/* (somaxconn, threads-max, pid_max, ...): one
16 MiB read of a /proc/sys file fails with ENOMEM (the handler allocates what is asked), and
the copy took the error for an absent file, so a bundle's tuning and fork-limit rules read
less than the live node's.
"""

from __future__ import annotations

import os

from tests.hostile_corpus import run

TUNABLES = ("proc/sys/net/core/somaxconn", "proc/sys/kernel/threads-max",
            "proc/sys/kernel/pid_max")


def test_a_live_bundle_holds_the_proc_sys_files_as_the_kernel_prints_them(tmp_path):
    present = [name for name in TUNABLES if os.path.exists(f"/{name}")]
    assert present, "no /proc/sys tunable on this machine"
    bundle = tmp_path / "bundle"
    recorded = run(["bundle", "record", "--seconds", "1", "--interval", "1", "-o",
                    str(bundle)], timeout=300)
    assert recorded.returncode == 0, recorded.stderr
    sample = bundle / "samples" / "s0000"
    for name in present:
        with open(f"/{name}", "rb") as live:
            expected = live.read(4096)  # a page: what /proc/sys serves in one read
        assert (sample / name).read_bytes() == expected, name
