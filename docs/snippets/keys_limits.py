"""Keys: at most N tasks of one customer at once, across every worker, and keys taking turns."""

import asyncio
import os
import tempfile
from collections import Counter

from txtasks import App, KeyLimits, TaskContext
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("keys", database_url=DATABASE_URL)
running: Counter[str] = Counter()
most: Counter[str] = Counter()


@app.task(
    queue="exports",
    key=lambda payload: f"customer:{payload['customer']}",  # each task's key, from its payload
    key_limits=KeyLimits(concurrency=2),  # at most 2 of one key processing at once
)
async def export(payload: dict, ctx: TaskContext) -> None:
    key = ctx.key  # the task's key
    running[key] += 1
    most[key] = max(most[key], running[key])
    await asyncio.sleep(0.01)
    running[key] -= 1


async def main() -> None:
    await app.amigrate()
    for n in range(12):
        await export.aenqueue({"customer": 42, "n": n})  # one busy customer
    for customer in range(5):
        await export.aenqueue({"customer": customer})  # and five with one export each
    await export.aenqueue({"customer": 7}, key="vip")  # an enqueue may name the key itself

    await run_until_empty(app, concurrency=10)
    assert most["customer:42"] == 2  # never more, though 10 could run
    assert most["vip"] == 1 and len(most) == 7
    await app.aclose()


asyncio.run(main())
