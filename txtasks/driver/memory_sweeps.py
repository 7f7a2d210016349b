"""The in-memory driver's side of the cleaner's sweeps: expired leases, overlooked ready
tasks, the archive and retention, periodic schedules (the `Sweeps` role)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from txtasks.driver.base import FINISHED, minute_label
from txtasks.driver.history import HistoryRow, history_rows
from txtasks.driver.memory_store import MemoryStore
from txtasks.types import (
    FINISHED_STATES,
    READY_STATES,
    NewTask,
    PeriodicRow,
    TaskRow,
    TaskState,
    claim_order,
)


class MemorySweeps:
    """The cleaner's sweeps over the store."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def lease_expired_list(self, *, now: datetime, limit: int) -> list[TaskRow]:
        with self.store.lock:
            expired = [
                r
                for r in self.store.live.values()
                if r.state is TaskState.PROCESSING
                and r.lease_expires_at is not None
                and r.lease_expires_at < now
            ]
        expired.sort(key=lambda r: (r.lease_expires_at or now, r.id))
        return expired[:limit]

    async def ready_list(self, queue: str, *, due_before: datetime, limit: int) -> list[int]:
        with self.store.lock:
            ready = [
                r
                for r in self.store.live.values()
                if r.queue == queue and r.state in READY_STATES and r.run_at <= due_before
            ]
        ready.sort(key=claim_order)
        return [r.id for r in ready[:limit]]

    async def finished_archive_many(self, *, now: datetime, limit: int) -> int:
        with self.store.lock:
            done = sorted(i for i, r in self.store.live.items() if r.state in FINISHED_STATES)[
                :limit
            ]
            for task_id in done:
                row = self.store.live.pop(task_id)
                self.store.archived[task_id] = row._replace(lease_expires_at=None, finished_at=now)
        return len(done)

    async def archive_purge_many(
        self,
        *,
        state: TaskState,
        before: datetime,
        limit: int,
        queues: Sequence[str] | None = None,
        exclude: Sequence[str] = (),
    ) -> int:
        with self.store.lock:
            old = sorted(
                (
                    r
                    for r in self.store.archived.values()
                    if r.state is state
                    and r.finished_at is not None
                    and r.finished_at < before
                    and (queues is None or r.queue in queues)
                    and r.queue not in exclude
                ),
                key=lambda r: (r.finished_at or before, r.id),
            )[:limit]
            for row in old:
                del self.store.archived[row.id]
        return len(old)

    async def keys_forget_many(self, *, idle_before: datetime, limit: int) -> int:
        with self.store.lock:
            live = {(r.queue, r.partition_key) for r in self.store.live.values() if r.partition_key}
            idle = [
                pair
                for pair, touched in sorted(self.store.key_touched.items())
                if touched < idle_before
                and pair not in live
                and self.store.key_next_start.get(pair, touched) < idle_before
            ][:limit]
            for pair in idle:
                for state in (
                    self.store.key_touched,
                    self.store.key_turns,
                    self.store.key_next_start,
                ):
                    state.pop(pair, None)
        return len(idle)

    async def history_last(self) -> int | None:
        with self.store.lock:
            return max((m for m, _q in self.store.history), default=None)

    async def history_count(self, *, since: datetime, until: datetime) -> list[HistoryRow]:
        with self.store.lock:
            done = [
                r
                for r in self.store.archived.values()
                if r.state.value in FINISHED and r.finished_at and r.finished_at >= since
            ]
            live = list(self.store.live.values())
        finished: dict[tuple[str, str, str], int] = {}
        for r in done:
            if r.finished_at is not None and r.finished_at < until:
                key = (r.queue, r.state.value, minute_label(r.finished_at))
                finished[key] = finished.get(key, 0) + 1
        arrived: dict[tuple[str, str], int] = {}
        for r in [*live, *done]:
            if since <= r.created_at < until:
                key2 = (r.queue, minute_label(r.created_at))
                arrived[key2] = arrived.get(key2, 0) + 1
        return history_rows(
            [(*k, n) for k, n in finished.items()], [(*k, n) for k, n in arrived.items()]
        )

    async def history_write(self, rows: Sequence[HistoryRow]) -> None:
        with self.store.lock:
            for row in rows:
                self.store.history.setdefault((row.minute, row.queue), row)

    async def history_purge(self, *, before: int) -> int:
        with self.store.lock:
            gone = [k for k in self.store.history if k[0] < before]
            for key in gone:
                del self.store.history[key]
        return len(gone)

    async def periodic_list(self) -> dict[str, PeriodicRow]:
        with self.store.lock:
            return dict(self.store.periodic)

    async def periodic_advance(
        self,
        name: str,
        *,
        schedule: str,
        expected: datetime | None,
        next_fire_at: datetime,
        fires: Sequence[NewTask],
        now: datetime,
    ) -> list[int] | None:
        with self.store.lock:
            stored = self.store.periodic.get(name)
            current = None if stored is None else stored.next_fire_at
            if current != expected:
                return None
            last = max((f.run_at for f in fires), default=None)
            self.store.periodic[name] = PeriodicRow(
                name=name,
                schedule=schedule,
                next_fire_at=next_fire_at,
                last_fire_at=last or (stored.last_fire_at if stored else None),
                updated_at=now,
            )
            return [self.store.insert(row) for row in fires]
