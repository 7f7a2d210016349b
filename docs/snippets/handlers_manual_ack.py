"""Manual acknowledgement: the handler decides with ctx.ack / nack / reject / drop."""

import asyncio
import os
import tempfile

from txtasks import App, TaskContext, TaskState
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("settlement", database_url=DATABASE_URL)


@app.task(name="payments.settle", ack_policy="manual")
def settle(payload: dict, ctx: TaskContext) -> None:
    status = payload["status"]
    if status == "settled":
        ctx.ack()
        raise RuntimeError("audit log unavailable")  # after ack: the task stays completed
    if status == "pending":
        ctx.nack("not settled yet", delay=300)  # retry in 5 minutes
    elif status == "fraud":
        ctx.reject("flagged as fraud")  # dead-letter now
    elif status == "cancelled":
        ctx.drop("order cancelled")  # archive as discarded
    # no decision at all: treated as a nack with the retry strategy


async def main() -> None:
    await app.amigrate()
    statuses = ["settled", "pending", "fraud", "cancelled", "unknown"]
    ids = {s: await settle.aenqueue({"status": s}) for s in statuses}

    await run_until_empty(app)
    rows = {s: await app.driver.tasks.task_get(i) for s, i in ids.items()}
    assert rows["settled"].state is TaskState.COMPLETED
    assert rows["pending"].state is TaskState.RETRYABLE
    assert rows["fraud"].state is TaskState.DEAD
    assert rows["cancelled"].state is TaskState.DISCARDED
    assert rows["unknown"].state is TaskState.RETRYABLE
    assert "without ack/nack/reject" in rows["unknown"].last_error
    await app.aclose()


asyncio.run(main())
