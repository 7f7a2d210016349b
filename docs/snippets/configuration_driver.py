"""Give the app a driver built with your own connection pool settings."""

import asyncio
import os
import tempfile

from txtasks import App, TaskState, driver_for_url
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

driver = driver_for_url(
    DATABASE_URL,
    engine_options={"pool_size": 20, "max_overflow": 5, "pool_recycle": 1800},
)
app = App("tuned", driver=driver)


@app.task(name="tuned.noop")
async def noop(payload: dict) -> None: ...


async def main() -> None:
    await app.amigrate()
    task_id = await noop.aenqueue({})
    await run_until_empty(app, concurrency=20)
    assert (await app.driver.tasks.task_get(task_id)).state is TaskState.COMPLETED
    await app.aclose()


asyncio.run(main())
