"""A node whose kernel log holds more crashing binaries than are described in detail still
names every one of them, as the exporter's series (one per binary) name them from Prometheus.

Reproduced on a long-lived machine: a live diagnosis named the latest ten binaries, the same
crashes read from Prometheus named twelve, and the two verdicts disagreed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from tests.conftest import SCENARIOS

EXTRA = 12  # more than the latest binaries whose faulting instruction is decoded


def test_every_crashing_binary_is_named_beside_the_ones_described(tmp_path):
    bundle = tmp_path / "isa-mismatch"
    shutil.copytree(SCENARIOS / "isa-mismatch", bundle)
    log = bundle / "static" / "dmesg.txt"
    lines = log.read_text().splitlines()
    # Earlier crashes of other binaries, in the arm64 form the scenario's own lines use.
    earlier = [f"[{1000000 + n}.000000] tool{n}[{4000 + n}]: unhandled exception: undefined "
               f"instruction in tool{n}[400000+1000]" for n in range(EXTRA)]
    log.write_text("\n".join(earlier + lines) + "\n")
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", "--bundle",
                             str(bundle), "--json"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    finding, = (f for f in json.loads(result.stdout)["findings"] if f["rule"] == "isa-mismatch")
    named = finding["subjects"]["binaries"]
    assert named[0] == "libagentcore.so"  # the latest crash leads
    assert sorted(named) == sorted(["libagentcore.so", *(f"tool{n}" for n in range(EXTRA))])
