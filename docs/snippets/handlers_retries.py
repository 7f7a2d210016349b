"""Retry strategies, max_attempts, and the dead-letter state at the end of them."""

import asyncio
import os
import tempfile
from datetime import timedelta

from txtasks import App, Constant, Custom, Exponential, Linear, TaskState
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

# The delay before attempt n + 1, after attempt n failed:
assert [Exponential(jitter=False).delay(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 8]
assert 0 <= Exponential().delay(4) <= 8  # the default: full jitter, below the same ceiling
assert [Linear(base=5, step=10).delay(n) for n in (1, 2, 3)] == [5, 15, 25]
assert Constant(30).delay(7) == 30
assert Custom(lambda n: [10, 60, 600][min(n, 3) - 1]).delay(5) == 600

app = App("retries", database_url=DATABASE_URL)


@app.task(retry=Exponential(base=2, cap=600), max_attempts=10)  # 2, 4, 8 ... up to 600 s
def sync_inventory(payload: dict) -> None: ...


@app.task(retry=30, deadline=timedelta(hours=1))  # a number means Constant(30)
def send_sms(payload: dict) -> None: ...


@app.task(retry=lambda n: [10, 60, 600][min(n, 3) - 1])  # any callable: Custom
def refresh_token(payload: dict) -> None: ...


@app.task(name="ledger.post", max_attempts=3, retry=Constant(0.1))
def post_to_ledger(payload: dict) -> None:
    raise ConnectionError("ledger unreachable")


async def main() -> None:
    await app.amigrate()
    task_id = await post_to_ledger.aenqueue({"entry": 1})

    # burst_horizon: keep going while a retry is due within a second.
    stats = await run_until_empty(app, burst_horizon=1)
    assert stats.outcomes == {"retryable": 2, "dead": 1}

    row = await app.driver.tasks.task_get(task_id)
    assert row.state is TaskState.DEAD and row.attempt == 3
    assert "ConnectionError: ledger unreachable" in row.last_error
    assert "(attempt 3 of 3)" in row.last_error
    await app.aclose()


asyncio.run(main())
