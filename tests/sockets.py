"""How many TCP connections a process holds to a port: read from /proc (Linux), as the
kernel sees them, whatever the pools inside the process believe."""

from __future__ import annotations

import contextlib
import os


def tcp_connections(pid: int | str, port: int) -> int:
    """The established TCP connections of process `pid` (`"self"` for this one) to `port`
    on any address; 0 when the process is gone."""
    inodes = set()
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as lines:
                next(lines)  # the header
                for line in lines:
                    fields = line.split()
                    remote, state, inode = fields[2], fields[3], fields[9]
                    established = state == "01"
                    if established and int(remote.rsplit(":", 1)[1], 16) == port:
                        count += inode in inodes
        except (FileNotFoundError, ProcessLookupError):
            return 0
    return count
