"""Timeouts: an attempt that runs too long fails like any other error."""

import asyncio
import os
import tempfile

from txtasks import App, TaskState
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("partners", database_url=DATABASE_URL)


@app.task(name="partners.fetch", timeout=0.5, max_attempts=2, retry=0)
async def fetch_quote(payload: dict) -> None:
    await asyncio.sleep(payload["takes"])  # stands in for a slow network call


async def main() -> None:
    await app.amigrate()
    fast = await fetch_quote.aenqueue({"takes": 0})
    slow = await fetch_quote.aenqueue({"takes": 60})

    await run_until_empty(app)
    assert (await app.driver.tasks.task_get(fast)).state is TaskState.COMPLETED
    row = await app.driver.tasks.task_get(slow)
    assert row.state is TaskState.DEAD and row.attempt == 2  # timed out twice
    assert "TimeoutError" in row.last_error
    await app.aclose()


asyncio.run(main())
