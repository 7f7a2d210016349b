"""Pause a queue: no worker starts its tasks until it is resumed; enqueues go on."""

import asyncio
import os
import tempfile

from txtasks import App
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("control", database_url=DATABASE_URL)
sent: list[str] = []


@app.task(queue="emails")
def send(payload: str) -> None:
    sent.append(payload)


async def main() -> None:
    await app.amigrate()
    await app.control.apause("emails")  # stored in the database: every worker sees it
    await send.aenqueue("welcome")  # still accepted, waiting
    await run_until_empty(app)  # a burst worker does not wait for a paused queue
    assert sent == []

    stats = {s.queue: s for s in await app.driver.admin.queue_stats(now=app.clock())}
    assert stats["emails"].paused_at is not None  # `txtasks status` shows it

    await app.control.aresume("emails")  # with a broker, the workers are woken at once
    await run_until_empty(app)
    assert sent == ["welcome"]
    await app.aclose()


asyncio.run(main())
