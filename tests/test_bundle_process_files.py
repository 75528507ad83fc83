"""Per-process files of a directory bundle are read as guarded as node files.

A bundle is recorded on this machine beside three real pool processes (they end by
themselves); then, in every sample, one process's cmdline becomes a FIFO, another's a
symlink to /dev/zero, and the third's stat a FIFO. `diagnose --bundle` must end (a child
with a timeout) within a sane memory bound, those records costed, the rest diagnosed.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.hostile_corpus import run

MARK = f"fleetscope-h-reliab-guarded-{os.getpid()}"


@pytest.fixture(scope="module")
def planted_bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("guarded")
    workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", MARK])
               for _ in range(3)]
    try:
        config = tmp / "config.yaml"
        config.write_text(yaml.safe_dump({"pools": [
            {"name": "guarded", "class": "online", "match": {"cmdline": MARK}}]}))
        bundle = tmp / "bundle"
        recorded = run(["bundle", "record", "--seconds", "1", "--interval", "1", "-o",
                        str(bundle), "--config", str(config)], timeout=300)
        assert recorded.returncode == 0, recorded.stderr
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
    fifo_cmdline, zero_cmdline, fifo_stat = (worker.pid for worker in workers)
    samples = sorted(glob.glob(str(bundle / "samples" / "*")))
    assert samples and all(os.path.exists(f"{s}/proc/{fifo_stat}/stat") for s in samples)
    for sample in samples:
        for pid, name, plant in ((fifo_cmdline, "cmdline", "fifo"),
                                 (zero_cmdline, "cmdline", "zero"),
                                 (fifo_stat, "stat", "fifo")):
            path = f"{sample}/proc/{pid}/{name}"
            os.unlink(path)
            if plant == "fifo":
                os.mkfifo(path)
            else:
                os.symlink("/dev/zero", path)
    return bundle, samples, (fifo_cmdline, zero_cmdline, fifo_stat)


READ_EACH = """
import sys
from fleetscope.collectors.base import NotAvailable, Scrape
from fleetscope.collectors.tasks import read_proc
from fleetscope.collectors.source import RecordedSample
scrape = Scrape(RecordedSample(sys.argv[1]))
for relative in sys.argv[2:]:
    try:
        read_proc(scrape, relative, True)
        print("read", relative)
    except NotAvailable as err:
        print("refused" if "refused" in str(err) else "absent", relative)
"""


def test_read_proc_refuses_a_fifo_and_a_link_out(planted_bundle):
    """In a child with a timeout: the unguarded read blocks on the FIFO for good."""
    _, samples, (fifo_cmdline, zero_cmdline, fifo_stat) = planted_bundle
    relatives = [f"proc/{fifo_cmdline}/cmdline", f"proc/{zero_cmdline}/cmdline",
                 f"proc/{fifo_stat}/stat", f"proc/{fifo_stat}/cmdline"]
    try:
        child = subprocess.run([sys.executable, "-c", READ_EACH, samples[0], *relatives],
                               capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("read_proc still reading a planted file after 60 s")
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.splitlines() == [f"refused {r}" for r in relatives[:3]] + [
        f"read {relatives[3]}"]


def test_diagnose_ends_with_those_records_costed(planted_bundle, tmp_path):
    bundle, _, _ = planted_bundle
    result = run(["diagnose", "--bundle", str(bundle), "--json"], timeout=240)
    assert result.returncode in (0, 1, 2, 3), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    document = json.loads(result.stdout)
    assert document["source"] == "bundle"
    assert result.max_rss_mib < 1024

