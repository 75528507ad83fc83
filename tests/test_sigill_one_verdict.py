"""One SIGILL verdict in every mode: real crashes of a binary this CPU cannot run, read by a
live diagnosis, a bundle recorded here, and a real Prometheus scraping the exporter (the
query engine evaluating the rules, `--fleet`, and every series fetched and evaluated here,
`--evaluate local`): the same rule, severity and binaries from each.

The crashes happen before the diagnoses' windows (as when a crash-looping binary was last
restarted a minute ago): inside the 15-minute look-back, the incident in every mode.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time

import pytest

from fleetscope.collectors.parsers.kmsg import scan_kernel_log
from tests.conftest import require_tool
from tests.test_cpu_features import CANDIDATES, _build, _cpu_flags
from tests.test_prometheus_scrape import (
    _wait_for,
    prometheus,  # noqa: F401 (a fixture)
)

CRASHES = 3


def _no_core_dump() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _kernel_log_binaries() -> set[str]:
    text = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30).stdout
    return {crash.binary for crash in scan_kernel_log(text).crashes}


def _diagnose(*args: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "fleetscope", "diagnose", *args, "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1, 2), result.stderr[-2000:]
    return json.loads(result.stdout)


def _verdict(document: dict, node: str | None = None) -> tuple[str, list[str]]:
    found = [f for f in document["findings"] if f["rule"] == "isa-mismatch"
             and (node is None or f["node"] == node)]
    assert len(found) == 1, document["findings"]
    return found[0]["severity"], sorted(found[0]["subjects"]["binaries"])


@pytest.mark.live
def test_the_same_sigills_read_the_same_in_every_mode(tmp_path, exporter_factory,
                                                      prometheus):  # noqa: F811
    if platform.machine() != "x86_64":
        pytest.skip("the SIGILL binary is built as x86-64 code")
    if os.geteuid() != 0:
        pytest.skip("the kernel log needs root here")
    if open("/proc/sys/debug/exception-trace").read().strip() == "0":
        pytest.skip("the kernel does not log user-space traps (debug.exception-trace=0)")
    gcc = require_tool("gcc")
    flags = _cpu_flags()
    name = f"fs_verdict_{os.getpid() % 10**6}"
    for gcc_flags, cpu_flag, _extension, macro, body in CANDIDATES:
        if cpu_flag not in flags:
            try:
                binary = _build(gcc, tmp_path, name, gcc_flags, macro, body)
                break
            except RuntimeError:
                continue
    else:
        pytest.skip("this CPU has every extension the test can compile for")
    before = _kernel_log_binaries()
    for _ in range(CRASHES):
        crash = subprocess.run([str(binary)], capture_output=True, timeout=30,
                               preexec_fn=_no_core_dump)
        assert crash.returncode == -4  # SIGILL
    deadline = time.monotonic() + 30
    while binary.name not in _kernel_log_binaries():
        assert time.monotonic() < deadline, "the crashes never reached the kernel log"
        time.sleep(0.5)

    exporter = exporter_factory("/", {"collectors": ["cpu_features"]})
    target = exporter.url.removeprefix("http://").removesuffix("/metrics")
    base = prometheus(target)
    _wait_for(base, f'count_over_time(fleetscope_sigill_crashes_total{{binary="{name}"}}[1m])'
              " >= 3")

    fleet = _diagnose("--prometheus", base, "--fleet", "--seconds", "60")
    verdicts = {
        "live": _verdict(_diagnose("--seconds", "3")),
        "bundle": None,
        "prometheus --fleet": _verdict(fleet, target),
        "prometheus --evaluate local": _verdict(_diagnose(
            "--prometheus", base, "--node", target, "--evaluate", "local", "--seconds", "60")),
    }
    bundle = tmp_path / "node.tar.gz"
    recorded = subprocess.run([sys.executable, "-m", "fleetscope", "bundle", "record",
                               "--seconds", "2", "--interval", "1", "-o", str(bundle)],
                              capture_output=True, text=True, timeout=180)
    assert recorded.returncode == 0, recorded.stderr
    verdicts["bundle"] = _verdict(_diagnose("--bundle", str(bundle)))

    # Another program's SIGILL while the modes ran is named by those that read after it.
    arrived = _kernel_log_binaries() - before - {name}
    for mode, (severity, binaries) in verdicts.items():
        assert severity == "critical", (mode, verdicts)
        assert name in binaries, (mode, verdicts)
    # This exporter has no pools: that is the reason given, not ptrace rights.
    reason, = (r["reason"] for r in fleet["not_evaluated"]
               if r["rule"] == "worker-blocked-external-call")
    assert "no workload pools in the config" in reason and "CAP_SYS_PTRACE" not in reason
    named = {mode: sorted(set(binaries) - arrived) for mode, (_, binaries) in verdicts.items()}
    assert len({tuple(b) for b in named.values()}) == 1, named
