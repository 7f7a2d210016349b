"""Payloads are JSON values or bytes; anything else is refused before it is written."""

import asyncio
import os
import tempfile
from datetime import datetime

from txtasks import App, PayloadError
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("files", database_url=DATABASE_URL, max_payload_bytes=64 * 1024)
received: list[object] = []


@app.task
def store(payload: object) -> None:
    received.append(payload)


async def main() -> None:
    await app.amigrate()

    await store.aenqueue({"name": "a.txt", "size": 3, "point": (1, 2), "meta": None})
    await store.aenqueue(b"\x89PNG\r\n")  # bytes you encoded yourself pass through as they are

    for bad in ({"at": datetime(2030, 1, 1)}, float("nan"), b"x" * 100_000):
        try:
            await store.aenqueue(bad)
        except PayloadError as exc:
            print("refused:", exc)  # not JSON-serialisable / over max_payload_bytes
        else:
            raise AssertionError("should have been refused")

    await run_until_empty(app, concurrency=1)
    # JSON round trip: the tuple comes back as a list.
    assert received == [{"name": "a.txt", "size": 3, "point": [1, 2], "meta": None}, b"\x89PNG\r\n"]
    await app.aclose()


asyncio.run(main())
