"""Cancel: a waiting task never starts; a running one is stopped and recorded as cancelled."""

import asyncio
import os
import tempfile

from txtasks import App, TaskContext, TaskState, Worker, WorkerConfig
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("control", database_url=DATABASE_URL)
started = asyncio.Event()


@app.task(queue="exports")
async def export(payload: dict, ctx: TaskContext) -> None:
    started.set()
    try:
        await asyncio.sleep(3600)  # a long export: CancelledError arrives at an await
    except asyncio.CancelledError:
        assert ctx.cancelled  # the cancel of this task (not a shutdown)
        raise  # clean up here, then let it go


@app.task(queue="exports")
def import_rows(payload: dict, ctx: TaskContext) -> None:
    for _ in range(payload["batches"]):
        if ctx.cancelled:  # a sync handler polls: it cannot be interrupted
            return
        ...  # one batch of work


async def main() -> None:
    await app.amigrate()

    # a waiting task: archived as cancelled at once, it never starts
    waiting = await import_rows.aenqueue({"batches": 10})
    result = await app.control.acancel(waiting)
    print(result.describe())  # task 1: cancelled (was pending); it will never start

    # a running task: its worker stops it (here within its 0.1 s heartbeat)
    running = await export.aenqueue({"customer": 42})
    worker = Worker(app, WorkerConfig(heartbeat=0.1, poll_interval=0.1))
    serving = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    print((await app.control.acancel(running)).describe())  # ... running; cancel requested ...
    for _ in range(100):
        row = await app.control.ainspect(running)
        if row is not None and row.state is TaskState.CANCELLED:
            break
        await asyncio.sleep(0.05)
    worker.stop()
    await serving
    assert row is not None and row.state is TaskState.CANCELLED

    # a finished task: nothing to cancel, and it says so
    print((await app.control.acancel(running)).describe())  # ... already finished (cancelled) ...

    # every live task of a queue (or a task name, or a key), in batches
    await import_rows.aenqueue({"batches": 1})
    cancelled = await app.control.acancel_many(queue="exports")
    assert [c.result.value for c in cancelled] == ["cancelled"]
    await run_until_empty(app)  # nothing left to run
    await app.aclose()


asyncio.run(main())
