"""Copying /proc and /sys files into a bundle byte for byte (docs/bundle-format.md), for
`bundle record` (record.py) and the network files beside its command outputs (commands.py).

Every file is read through the evidence source's reader, so recording a recorded tree (a
bundle sample, a fixture) copies only its regular files inside the root, as a scrape of it
reads them; a live host's files are read as they are.

    copy_globs(LiveHost("/").reader(), ("proc/stat", "sys/devices/system/node/node*/numastat"),
               "samples/s0000")
        -> samples/s0000/proc/stat, samples/s0000/sys/devices/system/node/node0/numastat
"""

from __future__ import annotations

import os
from collections.abc import Callable

from fleetscope.collectors.source import NotAvailable, Reader
from fleetscope.core.bundle_format import DEFAULT_READ_LIMIT

# numa_maps of a huge process can be big; a file is cut at what a bundle reader accepts.
MAX_FILE_BYTES = DEFAULT_READ_LIMIT


def copy_file(reader: Reader, relative: str, destination: str,
              rewrite: Callable[[bytes], bytes] | None = None) -> bool:
    """Copy one /proc or /sys file as read (they report size 0: read, don't copy), through
    `rewrite` when given (a cmdline's redaction). False when the file is not copied: absent
    on this node, unreadable, the process exited, or refused (a link out of a recorded root,
    a FIFO)."""
    try:
        data = reader.read_bytes(relative, MAX_FILE_BYTES)
    except NotAvailable:  # RefusedPath too: absent from the bundle like a file the node lacks
        return False
    target = os.path.join(destination, relative)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as out:
        out.write(data if rewrite is None else rewrite(data))
    return True


def copy_globs(reader: Reader, patterns, destination: str) -> None:
    """Every file the reader finds matching one of `patterns`, copied to `destination`."""
    for pattern in patterns:
        for relative in reader.files_matching(pattern):
            copy_file(reader, relative, destination)
