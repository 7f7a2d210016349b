"""A tiny HTTP endpoint for Kubernetes probes: GET /livez, /readyz (and /healthz = /livez).

200 with a JSON body when the check holds, 503 with the same body when not. No framework:
one request per connection, read the request line, answer, close. Workers and the cleaner
both serve it (`--health-port`).

`Pulse` is what a liveness check reads: when a loop last turned, so that a loop stuck (in a
database call that never returns) fails `/livez` and the pod is restarted.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from txtasks.errors import cannot_listen

log = logging.getLogger("txtasks.health")

READ_TIMEOUT = 5.0
#: Path -> the key of the report that decides the answer.
PATHS = {"/livez": "live", "/healthz": "live", "/readyz": "ready"}

Report = dict[str, Any]
#: Called with "live" or "ready" (the probe asked); returns a report with that boolean key.
Check = Callable[[str], Report | Awaitable[Report]]


class Pulse:
    """When a loop last turned (`time.monotonic()`): `beat()` once per iteration."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = time.monotonic()

    def beat(self) -> None:
        self.last = time.monotonic()

    def age(self, now: float) -> float:
        """Seconds since the loop last turned."""
        return now - self.last


class HealthServer:
    """Serves the report of `check(probe)`: /livez answers by its "live", /readyz by "ready"."""

    def __init__(
        self,
        check: Check,
        host: str,
        port: int,
        *,
        logger: logging.Logger = log,
    ) -> None:
        self.check = check
        self.host = host
        self.port = port
        self.log = logger
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; returns the port (useful with port 0). A port in use is a one-line error."""
        if self._server is None:
            try:
                self._server = await asyncio.start_server(self._serve, self.host, self.port)
            except OSError as exc:
                raise cannot_listen(
                    "health checks", self.host, self.port, "--health-port", exc
                ) from exc
            self.port = self._server.sockets[0].getsockname()[1]
            self.log.info("health checks on http://%s:%d/livez and /readyz", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT)
            parts = line.decode("latin-1").split()
            path = parts[1].split("?")[0] if len(parts) >= 2 else ""
            method = parts[0] if parts else ""
            status, body = await self._answer(method, path)
            payload = json.dumps(body, default=str).encode()
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + (b"" if method == "HEAD" else payload))
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, method: str, path: str) -> tuple[str, Any]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", {"error": "use GET"}
        key = PATHS.get(path)
        if key is None:
            return "404 Not Found", {"error": f"try {', '.join(PATHS)}"}
        report = self.check(key)
        if inspect.isawaitable(report):
            report = await report
        return ("200 OK" if report[key] else "503 Service Unavailable"), report
