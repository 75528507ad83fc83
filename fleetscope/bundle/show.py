"""`fleetscope bundle show PATH`: what a bundle holds, one row a line.

    format                      fleetscope-bundle/1
    hostname                    n17
    samples                     7, one every 5 s asked; gaps 5.0 to 5.1 s, 30.0 s in all
    window                      2025-12-01 09:20:00 .. 09:20:30 UTC (30 s)
    ...
    perf memory bandwidth / L3  yes
    redacted                    2 cmdline args, 0 config values, 1 pod names

Times are local wall-clock time with its zone (fleetscope/core/units.py, the formatting the
console uses too).
"""

from __future__ import annotations

import fnmatch
import os

from fleetscope.bundle.read import Bundle, BundleError, one_line
from fleetscope.collectors.parsers.perf import parse_perf_stat_csv
from fleetscope.core.bundle_format import (
    ACCELERATOR_MATRIX,
    BUNDLE_FORMAT,
    CMD,
    DMESG,
    PERF_STAT,
    STATIC,
)
from fleetscope.core.units import time_window

MAX_PERF_TEXT = 1 << 20  # one perf stat output: a few hundred lines at most



def describe(bundle: Bundle) -> list[tuple[str, str]]:
    """(what, value) rows summarising a bundle."""
    first, last = bundle.samples[0], bundle.samples[-1]
    rows = [
        ("format", BUNDLE_FORMAT),
        ("hostname", bundle.hostname),
        ("samples", _cadence(bundle)),
        ("window", time_window(first.time, last.time)),
        ("window, unix seconds", f"{first.time:.3f} .. {last.time:.3f}"),
    ]
    pools = bundle.config_raw.get("pools") or []
    pools = pools if isinstance(pools, list) else []
    rows.append(("pools", one_line(", ".join(
        f"{p.get('name')} ({p.get('class')})" for p in pools[:50] if isinstance(p, dict)),
        400) or "none configured"))
    processes = [n for n in os.listdir(os.path.join(last.directory, "proc"))
                 if n.isdigit()] if os.path.isdir(os.path.join(last.directory, "proc")) else []
    rows.append(("processes in last sample", str(len(processes))))
    try:
        bundle.config()
        rows.append(("recorded config", "valid"))
    except BundleError as err:
        rows.append(("recorded config", one_line(str(err), 200)))
    static = os.path.join(bundle.root, STATIC)
    from fleetscope.collectors import COLLECTORS

    # what a sample may hold, and what each part is evidence for, as the collectors say
    for relative, what in COLLECTORS.described():
        present = os.path.exists(os.path.join(last.directory, relative)) or \
            os.path.exists(os.path.join(static, relative))
        if present and relative == PERF_STAT:
            rows.append((what, _perf_counted(bundle)))
            continue
        rows.append((what, "yes" if present else "absent"))
    rows.append(("accelerator outputs", _accelerator_outputs(last.directory)))
    rows.append(("accelerator matrix", "yes" if os.path.isfile(
        os.path.join(static, ACCELERATOR_MATRIX)) else "absent"))
    rows.append((f"kernel log ({DMESG})",
                 "yes" if os.path.isfile(os.path.join(static, DMESG)) else "absent"))
    rows.append(("redacted", describe_redactions(bundle.redacted)))
    return rows


def _accelerator_outputs(sample_dir: str) -> str:
    """The last sample's accelerator files (docs/bundle-format.md), or "absent"."""
    from fleetscope.bundle.commands import ACCELERATOR_GLOBS

    directory = os.path.join(sample_dir, CMD)
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    kept = [name for name in names
            if any(fnmatch.fnmatchcase(f"{CMD}/{name}", pattern) for pattern in ACCELERATOR_GLOBS)]
    return one_line(", ".join(kept), 200) or "absent"


def _perf_counted(bundle: Bundle) -> str:
    """Whether perf counted anything: a perf that cannot open its events (no PMU in a VM,
    perf_event_paranoid) still writes a line per event, valued `<not supported>`."""
    events = counted = 0
    for sample in bundle.samples:
        try:
            with open(os.path.join(sample.directory, PERF_STAT), encoding="utf-8",
                      errors="replace") as handle:
                counts = parse_perf_stat_csv(handle.read(MAX_PERF_TEXT))
        except OSError:
            continue
        events += len(counts)
        counted += sum(count.value is not None for count in counts)
    if counted:
        return "yes"
    if events:
        return "recorded, but perf counted no event (<not supported>: no PMU access here)"
    return "recorded, but empty"


def describe_redactions(redacted: dict) -> str:
    """`bundle show`'s line on what `bundle record` redacted (older bundles: not recorded)."""
    if not redacted:
        return "not recorded (bundle made before redaction, or by another tool)"
    counts = [f"{int(n)} {kind.replace('_', ' ')}" for kind, n in sorted(redacted.items())]
    return ", ".join(counts) if any(redacted.values()) else "nothing (no secret found)"


# A gap this many intervals long or more: a sample that overran (a busy node, a slow read)
# and delayed the next one.
LATE_GAP_INTERVALS = 1.5


def _cadence(bundle: Bundle) -> str:
    """The samples as asked and as taken: the real gaps, and how many came late."""
    times = [sample.time for sample in bundle.samples]
    asked = f"{len(times)}, one every {bundle.interval_s:g} s asked"
    if len(times) < 2:
        return asked
    gaps = [times[i + 1] - times[i] for i in range(len(times) - 1)]
    late = sum(gap >= LATE_GAP_INTERVALS * bundle.interval_s for gap in gaps)
    taken = f"; gaps {min(gaps):.1f} to {max(gaps):.1f} s"
    if late:
        taken += (f", {late} of {len(gaps)} late (a sample overran its interval and "
                  "delayed the next)")
    return f"{asked}{taken}, {times[-1] - times[0]:.1f} s in all"
