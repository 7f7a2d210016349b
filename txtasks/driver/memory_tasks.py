"""The in-memory driver's tasks: inserts, reads, lists and the count of what is left to do
(the `Tasks` role)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import datetime

from txtasks.control import TaskFilter, task_list_order
from txtasks.driver.memory_store import MemoryStore, matches
from txtasks.types import LIVE_STATES, READY_STATES, NewTask, TaskRow, TaskState


class MemoryTasks:
    """Tasks written, read and counted in the store."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def task_insert_many(self, rows: Sequence[NewTask]) -> list[int]:
        return self.task_insert_many_sync(rows)

    def task_insert_many_sync(self, rows: Sequence[NewTask]) -> list[int]:
        with self.store.lock:
            return [self.store.insert(row) for row in rows]

    async def task_get(self, task_id: int) -> TaskRow | None:
        return self.task_get_sync(task_id)

    def task_get_sync(self, task_id: int) -> TaskRow | None:
        return self.store.live.get(task_id) or self.store.archived.get(task_id)

    async def task_list(
        self,
        *,
        states: Sequence[TaskState] | None = None,
        where: TaskFilter | None = None,
        limit: int = 100,
    ) -> list[TaskRow]:
        return self.task_list_sync(states=states, where=where, limit=limit)

    def task_list_sync(
        self,
        *,
        states: Sequence[TaskState] | None = None,
        where: TaskFilter | None = None,
        limit: int = 100,
    ) -> list[TaskRow]:
        chosen = set(states) if states else set(LIVE_STATES)
        flt = where or TaskFilter()
        with self.store.lock:
            rows = [
                r
                for r in itertools.chain(self.store.live.values(), self.store.archived.values())
                if r.state in chosen and matches(r, flt)
            ]
        return task_list_order(rows)[:limit]

    async def live_count(
        self,
        queues: Sequence[str] | None,
        *,
        now: datetime,
        due_before: datetime,
        at_most: int | None = None,
    ) -> int:
        with self.store.lock:
            live = (
                r
                for r in self.store.live.values()
                if (queues is None or r.queue in queues)
                and (
                    (
                        r.state in READY_STATES
                        and r.run_at <= due_before
                        and r.queue not in self.store.paused
                    )
                    or (
                        r.state is TaskState.PROCESSING
                        and r.lease_expires_at is not None
                        and r.lease_expires_at > now
                    )
                )
            )
            return sum(1 for _ in itertools.islice(live, at_most))
