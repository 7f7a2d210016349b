"""A raw HTTP GET of a health endpoint, for the worker's and the cleaner's unit tests."""

from __future__ import annotations

import asyncio


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    """Status and body of `GET path` on 127.0.0.1:port (one request, read to the end)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body
