"""Ack policies: what an unexpected exception does to the task."""

import asyncio
import os
import tempfile

from txtasks import AckPolicy, App, TaskState
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("policies", database_url=DATABASE_URL)


@app.task(name="retry")  # AckPolicy.RETRY, the default: retry with backoff, then dead-letter
def charge(payload: dict) -> None:
    raise ValueError("card processor error")


@app.task(name="dead_letter", ack_policy=AckPolicy.DEAD_LETTER)  # no retries: dead now
def import_file(payload: dict) -> None:
    raise ValueError("malformed CSV")


@app.task(name="discard", ack_policy="discard")  # best effort: archive as discarded
def warm_cache(payload: dict) -> None:
    raise ValueError("cache node down")


@app.task(name="complete", ack_policy="complete")  # count it done anyway, keep the error
def record_metric(payload: dict) -> None:
    raise ValueError("metrics backend down")


async def main() -> None:
    await app.amigrate()
    ids = {name: await app.aenqueue(name, {}) for name in app.tasks}

    await run_until_empty(app)
    states = {name: (await app.driver.tasks.task_get(i)).state for name, i in ids.items()}
    assert states == {
        "retry": TaskState.RETRYABLE,  # attempt 2 of 5 is scheduled
        "dead_letter": TaskState.DEAD,
        "discard": TaskState.DISCARDED,
        "complete": TaskState.COMPLETED,
    }
    row = await app.driver.tasks.task_get(ids["complete"])
    assert "metrics backend down" in row.last_error
    await app.aclose()


asyncio.run(main())
