"""An ordered key: one task at a time, in enqueue order; a retried task keeps its place."""

import asyncio
import os
import tempfile

from txtasks import App, Constant, KeyLimits, TaskContext
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("ledger", database_url=DATABASE_URL)
applied: list[tuple[str, int]] = []


@app.task(
    queue="ledger",
    key=lambda entry: entry["account"],
    key_limits=KeyLimits(ordered=True),
    retry=Constant(0.05),
)
def post(entry: dict, ctx: TaskContext) -> None:
    if entry["n"] == 1 and ctx.attempt == 1:
        raise ConnectionError("ledger busy")  # retried: entries 2 and 3 wait for it
    applied.append((entry["account"], entry["n"]))


async def main() -> None:
    await app.amigrate()
    for n in range(1, 4):
        for account in ("A", "B"):
            await post.aenqueue({"account": account, "n": n})

    await run_until_empty(app, concurrency=10, burst_horizon=1)
    for account in ("A", "B"):
        assert [n for a, n in applied if a == account] == [1, 2, 3]
    await app.aclose()


asyncio.run(main())
