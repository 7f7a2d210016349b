"""A tiny HTTP endpoint for Kubernetes probes: GET /livez, /readyz (and /healthz = /livez).

200 with a JSON body when the check holds, 503 with the same body when not. No framework:
one request per connection, read the request line, answer, close.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("cleaner")

READ_TIMEOUT = 5.0
PATHS = {"/livez": "live", "/healthz": "live", "/readyz": "ready"}


class HealthServer:
    """Serves the result of `check()` (a dict with boolean "live" and "ready")."""

    def __init__(self, check: Callable[[], dict[str, Any]], host: str, port: int) -> None:
        self.check = check
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; returns the port (useful with port 0)."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
            self.port = self._server.sockets[0].getsockname()[1]
            log.info("health checks on http://%s:%d/livez and /readyz", self.host, self.port)
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
            status, body = self._answer(method, path)
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

    def _answer(self, method: str, path: str) -> tuple[str, Any]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", {"error": "use GET"}
        key = PATHS.get(path)
        if key is None:
            return "404 Not Found", {"error": f"try {', '.join(PATHS)}"}
        report = self.check()
        return ("200 OK" if report[key] else "503 Service Unavailable"), report
