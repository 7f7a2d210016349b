"""A private PostgreSQL that one test may crash (`pg_ctl stop -m immediate`) and start again:
the shared servers of tests/run.sh must stay up for the other tests.

    with PrivatePostgres.running() as pg:       # tests/services.sh SERVICES=pg, a free port
        pg.crash()                              # as a power cut would, to the server process
        pg.start()                              # same directory and port: recovery, then up

It runs with PostgreSQL's durable defaults (PG_FAST=0): with synchronous_commit off, a crash
would lose commits the clients were told about, and the suite would blame txtasks for it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import free_port_block, in_ci, local_binaries, services_sh

START_ATTEMPTS = 3  # a port picked as free can be taken before the server binds it


class PrivatePostgres:
    """One PostgreSQL cluster in `base`, listening on 127.0.0.1:`port`."""

    def __init__(self, base: Path, port: int) -> None:
        self.base = base
        self.port = port

    @property
    def url(self) -> str:
        return f"postgresql://app:app@127.0.0.1:{self.port}/appdb"

    def _services(self, command: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, SERVICES="pg", PG_PORT=str(self.port), PG_FAST="0")
        env.pop("SVC_BASE", None)
        return subprocess.run(
            ["bash", str(services_sh()), command, str(self.base)],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=int(env.get("SVC_TIMEOUT", "60")) + 30,
            check=False,
        )

    def start(self) -> None:
        """Start (or restart after a crash) and wait until it accepts connections."""
        result = self._services("start")
        if result.returncode != 0:
            tail = "\n".join(result.stderr.strip().splitlines()[-30:])
            raise RuntimeError(
                f"private PostgreSQL did not start (rc {result.returncode}):\n{tail}"
            )

    def crash(self) -> None:
        """`pg_ctl stop -m immediate`: every backend killed, no checkpoint, recovery at start."""
        pgbin = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
        command = [
            f"{pgbin}/pg_ctl",
            "-D",
            str(self.base / "pg" / "data"),
            "stop",
            "-m",
            "immediate",
        ]
        if os.getuid() == 0:  # the cluster belongs to the postgres user
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)

    def stop(self) -> None:
        self._services("stop")

    @classmethod
    @contextlib.contextmanager
    def running(cls) -> Iterator[PrivatePostgres]:
        if not local_binaries()["postgresql"] or not services_sh().is_file():
            message = "a private PostgreSQL needs the server binaries (bash tests/install-deps.sh)"
            if in_ci():
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        base = Path(tempfile.mkdtemp(prefix="txtasks-chaos-pg.", dir="/tmp"))  # not 0700
        server: PrivatePostgres | None = None
        try:
            for attempt in range(1, START_ATTEMPTS + 1):
                server = cls(base, free_port_block(1))
                try:
                    server.start()
                    break
                except RuntimeError as exc:
                    server.stop()
                    if "busy" not in str(exc) or attempt == START_ATTEMPTS:
                        raise
            assert server is not None
            yield server
        finally:
            if server is not None:
                server.stop()
            shutil.rmtree(base, ignore_errors=True)
