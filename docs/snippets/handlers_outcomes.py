"""Choosing the outcome from a handler: return, Retry, Drop, Reject."""

import asyncio
import os
import tempfile
from datetime import timedelta

from txtasks import App, Drop, Reject, Retry, TaskState
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("sync", database_url=DATABASE_URL)


@app.task(name="crm.push_contact")
def push_contact(payload: dict) -> None:
    if payload["case"] == "rate limited":
        raise Retry("partner API answered 429", delay=30)  # try again in 30 s
    if payload["case"] == "deleted":
        raise Drop("the contact was deleted meanwhile")  # nothing to do, ever
    if payload["case"] == "invalid":
        raise Reject("no e-mail address")  # needs a human: dead-letter now
    # returning normally completes the task


async def main() -> None:
    await app.amigrate()
    cases = ["ok", "rate limited", "deleted", "invalid"]
    ids = {case: await push_contact.aenqueue({"case": case}) for case in cases}

    await run_until_empty(app)
    rows = {case: await app.driver.tasks.task_get(task_id) for case, task_id in ids.items()}
    assert rows["ok"].state is TaskState.COMPLETED
    assert rows["deleted"].state is TaskState.DISCARDED
    assert rows["invalid"].state is TaskState.DEAD
    assert rows["invalid"].last_error == "no e-mail address"

    retry = rows["rate limited"]
    assert retry.state is TaskState.RETRYABLE and retry.attempt == 1
    assert retry.run_at - retry.started_at >= timedelta(seconds=30)
    assert retry.last_error == "partner API answered 429"
    await app.aclose()


asyncio.run(main())
