"""Enqueue options: delay, run_at, priority, headers and queue."""

import asyncio
import os
import tempfile
from datetime import datetime, timedelta, timezone

from txtasks import App, TaskContext, TaskState, create_engine, migrate
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("reports", database_url=DATABASE_URL)
ran: list[str] = []


@app.task(queue="reports")
def build_report(payload: dict, ctx: TaskContext) -> None:
    ran.append(payload["name"])
    if payload["name"] == "traced":
        assert ctx.headers == {"trace-id": "4bf92f35"}


engine = create_engine(DATABASE_URL)
with engine.begin() as conn:
    migrate(conn)

with engine.begin() as conn:
    build_report.enqueue_tx(conn, {"name": "routine"})
    build_report.enqueue_tx(conn, {"name": "urgent"}, priority=10)  # higher runs first
    build_report.enqueue_tx(conn, {"name": "traced"}, headers={"trace-id": "4bf92f35"})
    build_report.enqueue_tx(conn, {"name": "bulk"}, queue="reports-low")  # not the task's queue
    later = build_report.enqueue_tx(conn, {"name": "in an hour"}, delay=timedelta(hours=1))
    on_date = build_report.enqueue_tx(
        conn, {"name": "new year"}, run_at=datetime(2100, 1, 1, tzinfo=timezone.utc)
    )


async def main() -> None:
    # One at a time, so the order shows: priority first, then due time, then id.
    await run_until_empty(app, queues=["reports", "reports-low"], concurrency=1)
    assert ran == ["urgent", "routine", "traced", "bulk"]

    for task_id in (later, on_date):  # not due yet: they wait, pending
        row = await app.driver.tasks.task_get(task_id)
        assert row is not None and row.state is TaskState.PENDING
    row = await app.driver.tasks.task_get(on_date)
    assert row.run_at == datetime(2100, 1, 1)  # stored as naive UTC
    await app.aclose()


asyncio.run(main())
engine.dispose()
