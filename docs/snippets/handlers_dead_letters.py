"""Dead letters: list them, re-drive them once the cause is fixed, or purge them."""

import asyncio
import os
import tempfile

from txtasks import App, Reject, TaskState
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("imports", database_url=DATABASE_URL)
known_customers = {"acme"}


@app.task(name="imports.order", queue="imports")
def import_order(payload: dict) -> None:
    if payload["customer"] not in known_customers:
        raise Reject(f"unknown customer {payload['customer']!r}")


async def main() -> None:
    await app.amigrate()
    task_id = await import_order.aenqueue({"customer": "globex"})
    await run_until_empty(app)

    dead = await app.driver.admin.dead_list(queue="imports")  # `txtasks dlq list --queue imports`
    assert [(r.id, r.last_error) for r in dead] == [(task_id, "unknown customer 'globex'")]

    known_customers.add("globex")  # fix the cause, then re-drive
    requeued = await app.driver.admin.dead_requeue(
        [task_id], now=app.clock()
    )  # `txtasks dlq requeue ID`
    assert requeued == [task_id]
    await run_until_empty(app)
    row = await app.driver.tasks.task_get(task_id)
    assert row.state is TaskState.COMPLETED and row.attempt == 1  # a fresh attempt budget

    assert (
        await app.driver.admin.dead_purge(queue="imports") == 0
    )  # `txtasks dlq purge --queue imports`
    await app.aclose()


asyncio.run(main())
