"""A worker dies holding a task; once the lease runs out, the cleaner's rescuer retries it."""

import asyncio
import os
import tempfile
from datetime import datetime, timedelta

from txtasks import App, TaskState
from txtasks.cleaner import Cleaner, CleanerConfig
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)


class Clock:
    """A clock the example moves by hand (naive UTC, like every txtasks timestamp)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


clock = Clock(datetime(2030, 1, 1, 12, 0))
app = App("reports", database_url=DATABASE_URL, clock=clock)
LEASE = timedelta(seconds=30)  # the worker's lease (WorkerConfig.lease, --lease)


@app.task(name="reports.build", max_attempts=3, retry=0)
def build_report(payload: dict) -> None: ...


async def main() -> None:
    await app.amigrate()
    task_id = await build_report.aenqueue({"month": "2029-12"})

    # What a worker's claim does; then its process is killed, and nothing extends the lease.
    [claimed] = await app.driver.claims.task_claim_many(
        ["default"], 1, now=clock(), lease_until=clock() + LEASE, worker_id="host-1:4242:dead"
    )
    assert (claimed.id, claimed.attempt) == (task_id, 1)

    cleaner = Cleaner(app, CleanerConfig())

    clock.now += timedelta(seconds=20)  # the lease is still valid: left alone
    assert (await cleaner.run_once())["rescuer"].retried == 0
    assert (await app.driver.tasks.task_get(task_id)).state is TaskState.PROCESSING

    clock.now += timedelta(seconds=15)  # 5 s past the lease: rescued
    assert (await cleaner.run_once())["rescuer"].retried == 1
    row = await app.driver.tasks.task_get(task_id)
    assert (row.state, row.attempt, row.worker_id) == (TaskState.RETRYABLE, 1, None)
    assert "lease expired" in row.last_error

    stats = await run_until_empty(app)  # any live worker runs it again: attempt 2
    assert stats.outcomes == {"completed": 1}
    assert (await app.driver.tasks.task_get(task_id)).attempt == 2
    await app.aclose()


asyncio.run(main())
