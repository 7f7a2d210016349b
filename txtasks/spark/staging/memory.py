"""The in-memory driver's staging: it stages no writes, but its hot table may hold rows in
state `staged` (written by hand, as older SQL versions staged there), which the cleaner's
archiver purges like any backend's."""

from __future__ import annotations

from datetime import datetime

from txtasks.driver.memory import MemoryDriver
from txtasks.spark.staging import Backlog, Published
from txtasks.types import TaskState


class MemoryStaging:
    """The archiver's purge on the in-memory driver."""

    def __init__(self, driver: MemoryDriver) -> None:
        self.driver = driver

    async def purge(self, *, before: datetime, limit: int) -> int:
        """Delete up to `limit` hot rows in state `staged` created before `before`."""
        store = self.driver.store
        with store.lock:
            stale = sorted(
                i
                for i, r in store.live.items()
                if r.state is TaskState.STAGED and r.created_at < before
            )[:limit]
            for task_id in stale:
                del store.live[task_id]
        return len(stale)

    async def publish(self, *, limit: int, now: datetime) -> Published | None:
        """Nothing to publish: the in-memory driver stages no writes."""
        return None

    async def backlog(self) -> Backlog:
        """Nothing waits: the in-memory driver stages no writes."""
        return Backlog()
