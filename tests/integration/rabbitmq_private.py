"""A private RabbitMQ that one test may stop and start again (the shared one must stay up).

    with PrivateRabbitMQ.running() as broker:   # started by tests/services.sh on free ports
        url = broker.url
        await asyncio.to_thread(broker.stop)    # off the event loop: stopping takes ~1 s
        await asyncio.to_thread(broker.start)   # same directory and ports; booting takes ~5-10 s

It needs the Debian RabbitMQ binaries (tests/install-deps.sh): without them the test is skipped,
or fails when CI is set, as for the shared servers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import free_port_block, in_ci, local_binaries, services_sh

START_ATTEMPTS = 3  # a port picked as free can be taken before the broker binds it


class PrivateRabbitMQ:
    """One RabbitMQ node in `base`, listening on 127.0.0.1:`port` (and port+1, port+2)."""

    def __init__(self, base: Path, port: int) -> None:
        self.base = base
        self.port = port
        self.running_now = False

    @property
    def url(self) -> str:
        return f"amqp://app:app@127.0.0.1:{self.port}/"

    def _run(self, command: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, SERVICES="rabbitmq", RMQ_PORT=str(self.port))
        env.pop("SVC_BASE", None)
        timeout = int(env.get("SVC_TIMEOUT", "60")) + 30
        return subprocess.run(
            ["bash", str(services_sh()), command, str(self.base)],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self) -> None:
        """Start the broker and wait until it accepts AMQP connections."""
        result = self._run("start")
        if result.returncode != 0:
            tail = "\n".join(result.stderr.strip().splitlines()[-30:])
            raise RuntimeError(f"private RabbitMQ did not start (rc {result.returncode}):\n{tail}")
        self.running_now = True

    def stop(self) -> None:
        """Stop the broker (its data directory stays, so `start` brings the same node back)."""
        result = self._run("stop")
        self.running_now = False
        if result.returncode != 0:
            raise RuntimeError(f"private RabbitMQ did not stop cleanly:\n{result.stderr}")

    @classmethod
    @contextlib.contextmanager
    def running(cls) -> Iterator[PrivateRabbitMQ]:
        if not local_binaries()["amqp"] or not services_sh().is_file():
            message = "a private RabbitMQ needs the server binaries (bash tests/install-deps.sh)"
            if in_ci():
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        base = Path(tempfile.mkdtemp(prefix="txtasks-rmq.", dir="/tmp"))  # not pytest's 0700 dir
        broker: PrivateRabbitMQ | None = None
        try:
            for attempt in range(1, START_ATTEMPTS + 1):
                broker = cls(base, free_port_block(3))
                try:
                    broker.start()
                    break
                except RuntimeError as exc:
                    broker.stop()
                    if "busy" not in str(exc) or attempt == START_ATTEMPTS:
                        raise
            assert broker is not None
            yield broker
        finally:
            if broker is not None:
                with contextlib.suppress(Exception):
                    broker.stop()
            shutil.rmtree(base, ignore_errors=True)
