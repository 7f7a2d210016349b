"""The CPU time a database server on this machine has used, from /proc (Linux).

PostgreSQL is a postmaster and its children (a backend per connection, the WAL writer, the
checkpointer, ...); MariaDB is one process of many threads. A server's CPU is the user and
system time of its main process, of the children that process has waited for (`cutime`,
`cstime`: the backends that exited) and of its children still running. Two readings apart give
what the server did in between, whichever backends came and went.

The server's main process is found by its pid file under the base directory of
tests/services.sh (`pg/data/postmaster.pid`, `mariadb/mysqld.pid`) or else as the process that
listens on the URL's port. /proc counts in clock ticks (10 ms): a reading is good to a few
ticks per process, so measure runs of a second or more.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from sqlalchemy.engine import make_url

PROC = Path("/proc")
#: The pid file of each server under the services' base directory.
PID_FILES = {"postgresql": "pg/data/postmaster.pid", "mysql": "mariadb/mysqld.pid"}
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}
TCP_LISTEN = "0A"


def stat_fields(text: str) -> tuple[int, int]:
    """The parent pid and the CPU ticks (utime + stime + cutime + cstime) of one
    /proc/PID/stat line. The command name, in parentheses, may hold spaces and parentheses:
    the fields are read after the last ')'."""
    fields = text[text.rindex(")") + 2 :].split()
    # after the name: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17)
    return int(fields[1]), sum(int(fields[i]) for i in (11, 12, 13, 14))


def tree_ticks(root: int, proc: Path = PROC) -> int:
    """The CPU ticks of process `root` and of its children (those exited and waited for
    included)."""
    total = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid, ticks = stat_fields((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if int(entry.name) == root or ppid == root:
            total += ticks
    return total


def tree_seconds(root: int, proc: Path = PROC) -> float:
    return tree_ticks(root, proc) / os.sysconf("SC_CLK_TCK")


def pid_file_pid(path: Path) -> int | None:
    """The pid on the first line of a pid file, when that process runs."""
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if (PROC / str(pid)).exists() else None


def listening_pid(port: int, proc: Path = PROC) -> int | None:
    """The process listening on TCP `port` on this machine (of those holding the socket, the
    one whose parent does not: PostgreSQL's children may hold it too), or None."""
    inodes = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    holders: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            links = {os.readlink(fd) for fd in (entry / "fd").iterdir()}
            if links & inodes:
                holders[int(entry.name)] = stat_fields((entry / "stat").read_text())[0]
        except (OSError, ValueError, IndexError):
            continue
    roots = [pid for pid, ppid in holders.items() if ppid not in holders]
    return min(roots) if roots else None


def server_pid(backend: str, url: str, services_base: Path | None) -> int | None:
    """The main process of the server of `url` (postgresql or mysql), None when not found on
    this machine (SQLite has none: it runs in the client's process)."""
    if backend not in PID_FILES:
        return None
    if services_base is not None:
        pid = pid_file_pid(services_base / PID_FILES[backend])
        if pid is not None:
            return pid
    parsed = make_url(url)
    if parsed.host not in (None, "localhost", "127.0.0.1", "::1"):
        return None
    return listening_pid(parsed.port or DEFAULT_PORTS[backend])


@dataclass
class Meter:
    """Over a `with` block: the wall time, this process's CPU (every thread of it) and the CPU
    of the server whose main process is `server` (None: no server, or not on this machine)."""

    server: int | None = None
    seconds: float = 0.0
    cpu: float = 0.0
    server_cpu: float | None = None

    def __enter__(self) -> Meter:
        self._server = None if self.server is None else tree_seconds(self.server)
        self._cpu = time.process_time()
        self._wall = time.perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.seconds = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu
        if self.server is not None and self._server is not None:
            self.server_cpu = tree_seconds(self.server) - self._server
