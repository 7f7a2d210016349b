"""Checkpoints: save progress in one attempt, resume from it in the next."""

import asyncio
import os
import tempfile

from txtasks import App, Constant, TaskContext, TaskState
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("exports", database_url=DATABASE_URL)
exported: list[int] = []


@app.task(name="exports.pages", retry=Constant(0.1))
def export_pages(payload: dict, ctx: TaskContext) -> None:
    start = ctx.checkpoint or 0  # None on the first attempt
    for page in range(start, payload["pages"]):
        if page == 6 and ctx.attempt == 1:
            raise ConnectionError("object storage timed out")
        exported.append(page)
        ctx.save_checkpoint(page + 1)  # any JSON value; stored when the attempt is retried


async def main() -> None:
    await app.amigrate()
    task_id = await export_pages.aenqueue({"pages": 10})

    await run_until_empty(app, burst_horizon=1)
    row = await app.driver.tasks.task_get(task_id)
    assert row.state is TaskState.COMPLETED and row.attempt == 2
    assert exported == list(range(10))  # pages 0-5, then 6-9: none twice
    await app.aclose()


asyncio.run(main())
