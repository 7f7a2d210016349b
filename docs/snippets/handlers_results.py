"""Results and progress: keep a task's return value, wait for it, watch it run."""

import asyncio
import os
import tempfile

from txtasks import App, Reject, TaskContext, TaskFailed
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("reports", database_url=DATABASE_URL)


@app.task(name="reports.total", keep_result=True)  # the return value is kept, as JSON
async def total(payload: dict, ctx: TaskContext) -> dict:
    rows = payload["rows"]
    for done, _row in enumerate(rows, start=1):
        ctx.progress(done, len(rows), note="summing")  # stored within a second
    return {"total": sum(rows)}


@app.task(name="reports.strict", keep_result=True)
def strict(payload: dict) -> None:
    raise Reject("no rows")


async def main() -> None:
    await app.amigrate()
    task_id = await total.aenqueue({"rows": [1, 2, 3]})
    failing = await strict.aenqueue({"rows": []})

    waiting = asyncio.ensure_future(app.results.aget(task_id, timeout=30))  # woken by the outcome
    await run_until_empty(app)
    assert await waiting == {"total": 6}

    try:
        await app.results.aget(failing, timeout=30)
    except TaskFailed as exc:  # dead-lettered, failed or discarded: the task's last error
        assert (exc.state, exc.error) == ("dead", "no rows")

    row = await app.driver.tasks.task_get(task_id)  # what `txtasks inspect` shows
    assert row.result == '{"total":6}'
    await app.aclose()


asyncio.run(main())
