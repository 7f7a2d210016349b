"""Inspect one task, and list tasks by state, queue, task name or key."""

import asyncio
import os
import tempfile

from txtasks import App, TaskState

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("control", database_url=DATABASE_URL)


@app.task(queue="reports")
def report(payload: dict) -> None: ...


async def main() -> None:
    await app.amigrate()
    first = await report.aenqueue({"month": "2030-01"}, key="customer:42")
    second = await report.aenqueue({"month": "2030-02"}, key="customer:42")
    await app.control.acancel(first)

    row = await app.control.ainspect(second)  # live or archived, by id
    assert row is not None and (row.state, row.queue, row.partition_key) == (
        TaskState.PENDING,
        "reports",
        "customer:42",
    )

    waiting = await app.control.atask_list(
        queue="reports", key="customer:42"
    )  # live tasks by default
    assert [t.id for t in waiting] == [second]
    done = await app.control.atask_list(states=["cancelled"], task=report)  # from the archive
    assert [t.id for t in done] == [first]
    await app.aclose()


asyncio.run(main())
