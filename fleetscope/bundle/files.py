"""Copying /proc and /sys files into a bundle byte for byte (docs/bundle-format.md), for
`bundle record` (record.py) and the network files beside its command outputs (commands.py).

    copy_globs("/", ("proc/stat", "sys/devices/system/node/node*/numastat"), "samples/s0000")
        -> samples/s0000/proc/stat, samples/s0000/sys/devices/system/node/node0/numastat
"""

from __future__ import annotations

import glob
import os

from fleetscope.core.bundle_format import DEFAULT_READ_LIMIT

# numa_maps of a huge process can be big; a file is cut at what a bundle reader accepts.
MAX_FILE_BYTES = DEFAULT_READ_LIMIT


def copy_file(root: str, relative: str, destination: str) -> bool:
    """Copy one /proc or /sys file as read (they report size 0: read, don't copy)."""
    try:
        with open(os.path.join(root, relative), "rb") as source:
            data = source.read(MAX_FILE_BYTES)
    except OSError:
        return False  # absent on this node, unreadable, or the process exited
    target = os.path.join(destination, relative)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as out:
        out.write(data)
    return True


def copy_globs(root: str, patterns, destination: str) -> None:
    """Every regular file under `root` matching one of `patterns`, copied to `destination`."""
    for pattern in patterns:
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            if os.path.isfile(path):
                copy_file(root, os.path.relpath(path, root), destination)
