"""A service of your own: background work that workers and cleaners host alike."""

import asyncio
import os
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from typing import ClassVar

from txtasks import App
from txtasks.cleaner import Cleaner, CleanerConfig
from txtasks.services import ServiceConfig, ServiceHost, ServiceResult
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)
app = App("mail", database_url=DATABASE_URL)
inbox: list[str] = []  # stands for a mailbox, a bucket, another system's outbox table
handled: list[str] = []


@app.task(name="mail.handle", queue="mail")
def handle(payload: dict) -> None:
    handled.append(payload["subject"])


@dataclass(frozen=True)
class Polled(ServiceResult):
    """What a pass did: its counters are logged and counted as a sweep's are."""

    taken: int = 0


@dataclass(frozen=True)
class InboxPoller(ServiceConfig):
    """Turns the messages of the inbox into tasks; its fields are its settings."""

    name: ClassVar[str] = "inbox"
    hosts: ClassVar[Collection[str]] = ("worker", "cleaner")
    activity: ClassVar[str] = "polling the inbox"  # "polling the inbox failed: ..."

    interval: float = 5.0  # seconds between passes
    batch_size: int = 100

    async def run_once(self, host: ServiceHost) -> Polled:
        taken = inbox[: self.batch_size]
        del inbox[: len(taken)]
        for subject in taken:
            await host.app.aenqueue("mail.handle", {"subject": subject})
        if taken:
            host.wake("mail")  # its workers claim now rather than at their next poll
        return Polled(taken=len(taken))


async def main() -> None:
    await app.amigrate()
    inbox.extend(["hello", "invoice"])
    # A worker in burst mode runs its services whenever its queues look empty.
    stats = await run_until_empty(app, services={"inbox": InboxPoller()})
    assert stats.outcomes == {"completed": 2}

    inbox.append("reminder")
    cleaner = Cleaner(app, CleanerConfig(services={"inbox": InboxPoller(interval=1)}))
    # the sweeps, then the services: those installed first, then this one
    assert list(cleaner.sweeps)[-3:] == ["publisher", "staged_purge", "inbox"]
    results = await cleaner.run_once()  # a service is one more sweep of the cleaner
    assert results["inbox"] == Polled(taken=1)
    await run_until_empty(app, services={"publisher": None})  # no service at all: only tasks
    assert sorted(handled) == ["hello", "invoice", "reminder"]  # the first two ran at once
    await app.aclose()


asyncio.run(main())
