"""The in-memory driver's control at run time: cancels, paused queues, stored queue rates
and key limits (the `Control` role)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from txtasks.control import CANCELLABLE, TaskFilter, cancels_of
from txtasks.driver.memory_store import MemoryStore, matches
from txtasks.keys import KeyOverride, Rate
from txtasks.types import READY_STATES, Cancel, TaskRow, TaskState


class MemoryControl:
    """Cancels, run now, pauses and limits set at run time, in the store."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def task_cancel_many(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: TaskFilter | None = None,
        now: datetime,
        limit: int = 1000,
    ) -> list[Cancel]:
        return self.task_cancel_many_sync(ids, where=where, now=now, limit=limit)

    def task_cancel_many_sync(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: TaskFilter | None = None,
        now: datetime,
        limit: int = 1000,
    ) -> list[Cancel]:
        with self.store.lock:
            if ids is None:
                assert where is not None
                ids = sorted(
                    r.id
                    for r in self.store.live.values()
                    if r.state.value in CANCELLABLE
                    and r.cancel_requested_at is None
                    and matches(r, where)
                )[:limit]
            found = [self._cancel(task_id, now) for task_id in dict.fromkeys(ids)]
        live = [
            (f.id, f.state.value, f.queue, f.partition_key, f.cancel_requested_at)
            for f in found
            if f
        ]
        archived = {i: r.state.value for i, r in self.store.archived.items() if i in set(ids)}
        return cancels_of(list(dict.fromkeys(ids)), live, archived)

    def _cancel(self, task_id: int, now: datetime) -> TaskRow | None:
        """Cancel one live task; the row as it was found (None: not live, or staged)."""
        row = self.store.live.get(task_id)
        if row is None or row.state.value not in CANCELLABLE:
            return None
        if row.state in READY_STATES:
            del self.store.live[task_id]
            self.store.archived[task_id] = row._replace(state=TaskState.CANCELLED, finished_at=now)
        elif row.cancel_requested_at is None:
            self.store.live[task_id] = row._replace(cancel_requested_at=now)
        return row

    async def task_run_now(self, task_id: int, *, now: datetime) -> str | None:
        """A waiting task made due; claims read every task of the store, so a key needs no
        hint."""
        with self.store.lock:
            row = self.store.live.get(task_id)
            if row is None or row.state not in READY_STATES:
                return None
            self.store.live[task_id] = row._replace(run_at=now)
            return row.queue

    async def queue_pause(self, queue: str, *, now: datetime) -> datetime | None:
        return self.queue_pause_sync(queue, now=now)

    def queue_pause_sync(self, queue: str, *, now: datetime) -> datetime | None:
        with self.store.lock:
            earlier = self.store.paused.get(queue)
            self.store.paused.setdefault(queue, now)
            return earlier

    async def queue_resume(self, queue: str) -> bool:
        return self.queue_resume_sync(queue)

    def queue_resume_sync(self, queue: str) -> bool:
        with self.store.lock:
            return self.store.paused.pop(queue, None) is not None

    async def queue_paused_list(self) -> dict[str, datetime]:
        with self.store.lock:
            return dict(sorted(self.store.paused.items()))

    async def queue_rate_set(self, queue: str, rate: Rate) -> None:
        self.queue_rate_set_sync(queue, rate)

    def queue_rate_set_sync(self, queue: str, rate: Rate) -> None:
        with self.store.lock:
            self.store.queue_rates[queue] = rate

    async def queue_rate_clear(self, queue: str) -> bool:
        return self.queue_rate_clear_sync(queue)

    def queue_rate_clear_sync(self, queue: str) -> bool:
        with self.store.lock:
            return self.store.queue_rates.pop(queue, None) is not None

    async def queue_rates_stored(self) -> dict[str, Rate]:
        with self.store.lock:
            return dict(self.store.queue_rates)

    async def key_override_set(self, override: KeyOverride) -> None:
        with self.store.lock:
            self.store.key_overrides[(override.queue, override.key)] = override

    async def key_override_clear(self, key: str, queue: str | None = None) -> bool:
        with self.store.lock:
            return self.store.key_overrides.pop((queue, key), None) is not None

    async def key_override_list(self) -> list[KeyOverride]:
        with self.store.lock:
            return sorted(self.store.key_overrides.values(), key=lambda o: (o.key, o.queue or ""))
