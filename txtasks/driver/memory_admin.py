"""The in-memory driver's inspection and dead letters (the `Admin` role)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import datetime, timedelta

from txtasks.driver.base import queue_stats_list, requeue_choice
from txtasks.driver.memory_store import MemoryStore
from txtasks.types import READY_STATES, KeyStats, QueueRates, QueueStats, TaskRow, TaskState


class MemoryAdmin:
    """Statistics and dead letters read from the store."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def queue_stats(self, *, now: datetime, archived: bool = True) -> list[QueueStats]:
        stats: dict[str, QueueStats] = {}
        oldest: dict[str, datetime] = {}
        ready: dict[str, int] = {}
        with self.store.lock:
            finished = self.store.archived.values() if archived else ()
            for row in itertools.chain(self.store.live.values(), finished):
                counts = stats.setdefault(row.queue, QueueStats(row.queue)).counts
                counts[row.state.value] = counts.get(row.state.value, 0) + 1
                if row.state in READY_STATES and row.run_at <= now:
                    oldest[row.queue] = min(oldest.get(row.queue, row.run_at), row.run_at)
                    ready[row.queue] = ready.get(row.queue, 0) + 1
            paused = dict(self.store.paused)
        return queue_stats_list(stats, oldest, paused, ready, now)

    async def queue_rates(self, *, now: datetime, window: float = 60.0) -> list[QueueRates]:
        since = now - timedelta(seconds=window)
        enqueued: dict[str, int] = {}
        finished: dict[str, dict[str, int]] = {}
        with self.store.lock:
            for row in itertools.chain(self.store.live.values(), self.store.archived.values()):
                done = row.finished_at is not None and row.finished_at > since
                if row.created_at > since:
                    enqueued[row.queue] = enqueued.get(row.queue, 0) + 1
                elif done:
                    enqueued.setdefault(row.queue, 0)
                if done:
                    counts = finished.setdefault(row.queue, {})
                    counts[row.state.value] = counts.get(row.state.value, 0) + 1
        return [QueueRates(q, window, enqueued[q], finished.get(q, {})) for q in sorted(enqueued)]

    async def key_stats(self, *, now: datetime, limit: int = 10) -> list[KeyStats]:
        with self.store.lock:
            counts: dict[tuple[str, str], list[int]] = {}
            for r in self.store.live.values():
                if r.partition_key is None:
                    continue
                c = counts.setdefault((r.queue, r.partition_key), [0, 0])
                if r.state is TaskState.PROCESSING:
                    c[1] += 1
                elif r.state in READY_STATES and r.run_at <= now:
                    c[0] += 1
            busiest = sorted(counts.items(), key=lambda kv: (-sum(kv[1]), kv[0]))[:limit]
            return [
                KeyStats(
                    q,
                    k,
                    w,
                    p,
                    next_at
                    if (next_at := self.store.key_next_start.get((q, k))) and next_at > now
                    else None,
                )
                for (q, k), (w, p) in busiest
                if w or p
            ]

    def _dead(
        self,
        ids: Sequence[int] | None,
        queue: str | None,
        states: Sequence[TaskState] = (TaskState.DEAD,),
    ) -> list[TaskRow]:
        return [
            r
            for r in self.store.archived.values()
            if r.state in states
            and (ids is None or r.id in ids)
            and (queue is None or r.queue == queue)
        ]

    async def dead_list(self, *, queue: str | None = None, limit: int = 100) -> list[TaskRow]:
        with self.store.lock:
            rows = self._dead(None, queue)
        rows.sort(key=lambda r: (r.finished_at or datetime.min, r.id), reverse=True)
        return rows[:limit]

    async def dead_requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        queue: str | None = None,
        now: datetime,
        states: Sequence[TaskState] = (TaskState.DEAD,),
    ) -> list[int]:
        with self.store.lock:
            live_keys = {r.dedup_key for r in self.store.live.values() if r.dedup_key}
            dead = {r.id: r for r in self._dead(ids, queue, states)}
            picked = requeue_choice([(r.id, r.dedup_key) for r in dead.values()], live_keys)
            chosen = [dead[i] for i in picked]
            for row in chosen:
                del self.store.archived[row.id]
                self.store.live[row.id] = row._replace(
                    state=TaskState.PENDING,
                    attempt=0,
                    run_at=now,
                    finished_at=None,
                    worker_id=None,
                    lease_expires_at=None,
                    started_at=None,
                    cancel_requested_at=None,
                )
        return sorted(r.id for r in chosen)

    async def dead_purge(
        self,
        ids: Sequence[int] | None = None,
        *,
        queue: str | None = None,
        states: Sequence[TaskState] = (TaskState.DEAD,),
    ) -> int:
        with self.store.lock:
            chosen = self._dead(ids, queue, states)
            for row in chosen:
                del self.store.archived[row.id]
        return len(chosen)
