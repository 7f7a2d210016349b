"""Handlers: sync or async, taking the payload and optionally the task context."""

import asyncio
import os
import tempfile

from txtasks import App, TaskContext, TaskState
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("handlers", database_url=DATABASE_URL)
seen: dict[str, object] = {}


@app.task(name="images.resize")
def resize(payload: dict) -> None:
    """Sync: runs in the worker's thread pool, so blocking calls are fine."""
    seen["resize"] = payload["width"]


@app.task(name="webhooks.deliver", queue="webhooks", max_attempts=8)
async def deliver(payload: dict, ctx: TaskContext) -> None:
    """Async: runs on the worker's event loop; never block it."""
    ctx.logger.info("delivering %s (attempt %d)", payload["url"], ctx.attempt)
    seen["deliver"] = {
        "task_id": ctx.task_id,
        "attempt": ctx.attempt,  # 1 on the first run
        "max_attempts": ctx.max_attempts,
        "queue": ctx.queue,
        "headers": ctx.headers,
    }


async def main() -> None:
    await app.amigrate()
    await resize.aenqueue({"width": 640})
    task_id = await deliver.aenqueue({"url": "https://example.com/hook"}, headers={"tenant": "7"})

    await run_until_empty(app)  # serves both queues: "default" and "webhooks"
    assert seen["resize"] == 640
    assert seen["deliver"] == {
        "task_id": task_id,
        "attempt": 1,
        "max_attempts": 8,
        "queue": "webhooks",
        "headers": {"tenant": "7"},
    }
    row = await app.driver.tasks.task_get(task_id)
    assert row.state is TaskState.COMPLETED  # returning normally completes the task
    await app.aclose()


asyncio.run(main())
