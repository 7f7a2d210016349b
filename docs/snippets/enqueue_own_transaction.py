"""Enqueue in a transaction of its own, when there is no write of yours to share it with."""

import asyncio
import os
import tempfile

from txtasks import App
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("digests", database_url=DATABASE_URL)
sent: list[int] = []


@app.task(name="digests.send")
def send_digest(payload: dict) -> None:
    sent.append(payload["user_id"])


async def main() -> None:
    await app.amigrate()  # once, as `txtasks migrate` does

    await send_digest.aenqueue({"user_id": 1})  # committed when it returns
    await app.aenqueue("digests.send", {"user_id": 2})  # by task name
    await app.aenqueue_many([send_digest.new({"user_id": n}) for n in (3, 4)])
    # Synchronous code (a script, a cron job) calls send_digest.enqueue(...) directly.
    await asyncio.to_thread(send_digest.enqueue, {"user_id": 5})

    await run_until_empty(app)
    assert sorted(sent) == [1, 2, 3, 4, 5]
    await app.aclose()


asyncio.run(main())
