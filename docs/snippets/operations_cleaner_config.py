"""A cleaner configured in Python: retention per queue, one sweep off, one pass run here."""

import asyncio
import os
import tempfile
from datetime import datetime, timedelta

from txtasks import App
from txtasks.cleaner import Cleaner, CleanerConfig, Keep, RescuerConfig, RetentionConfig
from txtasks.testing import run_until_empty

# `txtasks cleaner APP --config operations_cleaner_config:config` starts from this.
config = CleanerConfig(
    rescuer=RescuerConfig(interval=2, grace=1),
    reannouncer=None,  # off: no broker, nothing to re-announce
    retention=RetentionConfig(
        keep=Keep(completed=timedelta(days=1)),  # the other states keep their defaults
        queues={"audit": Keep(completed=timedelta(days=365), dead=timedelta(days=90))},
    ),
)


class Clock:
    """A clock the example moves by hand (naive UTC, like every txtasks timestamp)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)
clock = Clock(datetime(2030, 1, 1, 12, 0))
app = App("billing", database_url=DATABASE_URL, clock=clock)


@app.task(name="emails.send", queue="emails")
def send_email(payload: dict) -> None: ...


@app.task(name="audit.record", queue="audit")
def record(payload: dict) -> None: ...


async def main() -> None:
    await app.amigrate()
    email_id = await send_email.aenqueue({})
    audit_id = await record.aenqueue({})
    await run_until_empty(app)  # both complete at 12:00 and move to the archive

    cleaner = Cleaner(app, config)
    # the sweeps that are on (stats: the queues' history), then the services (txtasks.spark's:
    # its publisher and purge)
    sweeps = ["rescuer", "archiver", "retention", "periodic", "stats", "publisher", "staged_purge"]
    assert list(cleaner.sweeps) == sweeps

    clock.now += timedelta(days=2)
    results = await cleaner.run_once()  # one pass of each sweep that is on, in order

    assert list(results) == sweeps
    assert results["retention"].purged == {"completed": 1}
    assert await app.driver.tasks.task_get(email_id) is None  # completed 2 days ago: deleted
    assert await app.driver.tasks.task_get(audit_id) is not None  # the audit queue keeps a year
    await app.aclose()


if __name__ == "__main__":
    asyncio.run(main())
