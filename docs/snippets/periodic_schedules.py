"""Periodic schedules, fired by the cleaner's periodic sweep on a clock the example moves."""

import asyncio
import os
import tempfile
from datetime import datetime, timedelta

from txtasks import App, TaskContext
from txtasks.cleaner import Periodic, PeriodicConfig
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


clock = Clock(datetime(2030, 1, 7, 6, 58))  # a Monday, 07:58 in Paris
app = App("reports", database_url=DATABASE_URL, clock=clock)
runs: list[tuple[str, str]] = []


@app.task(name="reports.digest")
def digest(payload: dict, ctx: TaskContext) -> None:
    runs.append((ctx.headers["txtasks-periodic"], ctx.headers["txtasks-fire-time"]))


@app.task(name="cache.refresh")
def refresh(payload: dict, ctx: TaskContext) -> None:
    runs.append((ctx.headers["txtasks-periodic"], ctx.headers["txtasks-fire-time"]))


# Every hour from 08:00 to 18:00, Paris time, Monday to Friday.
app.periodic(
    digest,
    cron="0 8-18 * * mon-fri",
    timezone="Europe/Paris",
    name="digest-hourly",
    payload={"edition": "hourly"},
)
# Every 30 minutes; after an outage, enqueue every fire time that was missed.
app.periodic(refresh, every=timedelta(minutes=30), name="refresh-all", catch_up="all")
# Every 5 minutes; after an outage, skip what was missed.
app.periodic(refresh, every=300, name="refresh-skip", catch_up="skip", queue="fast")


async def fire(at: datetime) -> list[tuple[str, str]]:
    """Move the clock, run one periodic pass, run what it enqueued; return what ran."""
    clock.now = at
    await Periodic(app, PeriodicConfig()).run_once()
    runs.clear()
    await run_until_empty(app, queues=["default", "fast"])
    return sorted(runs)


async def main() -> None:
    await app.amigrate()

    # The first pass stores each schedule and its next fire time: nothing is due yet.
    result = await Periodic(app, PeriodicConfig()).run_once()
    assert (result.registered, result.fired) == (3, 0)

    # 07:00 UTC is 08:00 in Paris; interval fire times are multiples of the interval.
    assert await fire(datetime(2030, 1, 7, 7, 0, 0, 500000)) == [
        ("digest-hourly", "2030-01-07T07:00:00"),
        ("refresh-all", "2030-01-07T07:00:00"),
        ("refresh-skip", "2030-01-07T07:00:00"),
    ]

    # A second pass at the same moment, by this cleaner or any other, enqueues nothing.
    assert (await Periodic(app, PeriodicConfig()).run_once()).fired == 0

    # No cleaner ran from 07:00 to 09:32. Each schedule applies its catch-up rule.
    assert await fire(datetime(2030, 1, 7, 9, 32)) == [
        ("digest-hourly", "2030-01-07T09:00:00"),  # "latest", the default: once
        ("refresh-all", "2030-01-07T07:30:00"),  # "all": every missed time
        ("refresh-all", "2030-01-07T08:00:00"),
        ("refresh-all", "2030-01-07T08:30:00"),
        ("refresh-all", "2030-01-07T09:00:00"),
        ("refresh-all", "2030-01-07T09:30:00"),
        # "skip": 09:30 is 120 s late, more than misfire_grace (60 s): nothing
    ]

    # The next fire, a few seconds late, is on time for every schedule.
    assert await fire(datetime(2030, 1, 7, 9, 35, 5)) == [("refresh-skip", "2030-01-07T09:35:00")]
    await app.aclose()


asyncio.run(main())
