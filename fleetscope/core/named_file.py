"""Reading a file a user names on the command line or in the config (`--config`,
`--web-config`, `accelerator_matrix: /etc/fleetscope/accelerator-matrix.yaml`).

open(2) of a FIFO blocks until a writer appears, and a device such as /dev/zero never ends:
the file is opened with O_NONBLOCK (no wait), must be a regular file (fstat), and is read up
to a limit (issue #37).
"""

from __future__ import annotations

import errno
import os
import stat

MIB = 1024 * 1024


def read_named_file(path: str, limit: int) -> bytes:
    """The file's bytes; OSError (with strerror for the user) when it cannot be opened, is
    not a regular file or is over `limit` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or directory)")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit // MIB} MiB" if limit >= MIB
                      else f"larger than {limit} bytes")
    return data
