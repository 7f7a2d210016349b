"""The in-memory driver's dashboard reads (the `Dashboard` role): the answers of the SQL
drivers' statements, read from the store's rows."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from txtasks.driver.base import (
    COUNT_CAP,
    FINISHED,
    LIVE,
    SEARCH_WINDOW,
    QueueDepth,
    TaskPage,
    TaskQuery,
    WorkerBusy,
    finished_cursor,
    minute_label,
    minute_slots,
    task_cursor,
)
from txtasks.driver.history import history_series
from txtasks.driver.memory_store import MemoryStore, matches
from txtasks.driver.timings import TIMED_STATES, FinishedTimes
from txtasks.types import (
    READY_STATES,
    KeyStats,
    RunningTask,
    TaskRow,
    TaskState,
    claim_order,
)


class MemoryDashboard:
    """Depths, busy keys, counts per minute and pages of tasks, read from the store."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def depths(self, *, now: datetime, cap: int = COUNT_CAP) -> dict[str, QueueDepth]:
        found: dict[str, QueueDepth] = {}
        heads: dict[str, TaskRow] = {}
        with self.store.lock:
            for row in self.store.live.values():
                if row.state in READY_STATES:
                    depth = found.setdefault(row.queue, QueueDepth(row.queue))
                    if row.run_at <= now:
                        depth.ready += 1
                        head = heads.get(row.queue)
                        if row.partition_key is None and (
                            head is None or claim_order(row) < claim_order(head)
                        ):
                            heads[row.queue] = row
                    else:
                        depth.scheduled += 1
                elif row.state is TaskState.PROCESSING and row.lease_expires_at is not None:
                    found.setdefault(row.queue, QueueDepth(row.queue)).processing += 1
            for row in self.store.archived.values():
                if row.state is TaskState.DEAD:
                    found.setdefault(row.queue, QueueDepth(row.queue)).dead += 1
        for queue, depth in found.items():
            depth.ready, depth.scheduled = min(depth.ready, cap), min(depth.scheduled, cap)
            depth.dead = min(depth.dead, cap)
            depth.capped = depth.ready >= cap or depth.scheduled >= cap or depth.dead >= cap
            depth.oldest_ready = heads[queue].run_at if queue in heads else None
        return found

    async def busy_keys(
        self, *, now: datetime, limit: int = 20, cap: int = COUNT_CAP
    ) -> list[KeyStats]:
        """The keys with tasks waiting, by when their first one is due (then by the first
        enqueued)."""
        first: dict[tuple[str, str], tuple[datetime, int]] = {}
        waiting: dict[tuple[str, str], int] = {}
        running: dict[tuple[str, str], int] = {}
        with self.store.lock:
            for row in self.store.live.values():
                if row.partition_key is None:
                    continue
                key = (row.queue, row.partition_key)
                if row.state in READY_STATES:
                    waiting[key] = waiting.get(key, 0) + 1
                    first[key] = min(first.get(key, (row.run_at, row.id)), (row.run_at, row.id))
                elif row.state is TaskState.PROCESSING:
                    running[key] = running.get(key, 0) + 1
            starts = dict(self.store.key_next_start)
        chosen = sorted(first, key=lambda k: first[k])[:limit]
        return [
            KeyStats(
                queue,
                key,
                min(waiting[(queue, key)], cap),
                min(running.get((queue, key), 0), cap),
                next_at if (next_at := starts.get((queue, key))) and next_at > now else None,
            )
            for queue, key in chosen
        ]

    async def finished_per_minute(
        self, *, now: datetime, minutes: int = 60
    ) -> dict[str, dict[str, list[int]]]:
        start, index = minute_slots(now, minutes)
        found: dict[str, dict[str, list[int]]] = {}
        for row in self._finished_since(start):
            assert row.finished_at is not None
            slot = index.get(minute_label(row.finished_at))
            if slot is not None:
                series = found.setdefault(row.queue, {}).setdefault(row.state.value, [0] * minutes)
                series[slot] += 1
        return found

    async def arrived_per_minute(self, *, now: datetime, minutes: int = 60) -> dict[str, list[int]]:
        start, index = minute_slots(now, minutes)
        with self.store.lock:
            live = list(self.store.live.values())
        found: dict[str, list[int]] = {}
        for row in [*live, *self._finished_since(start)]:
            slot = index.get(minute_label(row.created_at)) if row.created_at >= start else None
            if slot is not None:
                found.setdefault(row.queue, [0] * minutes)[slot] += 1
        return found

    def _finished_since(self, start: datetime) -> list[TaskRow]:
        """The archived tasks finished since `start`."""
        with self.store.lock:
            return [
                r
                for r in self.store.archived.values()
                if r.state.value in FINISHED and r.finished_at and r.finished_at >= start
            ]

    async def task_page(self, query: TaskQuery, cursor: str | None, limit: int) -> TaskPage:
        rows = self._listing(query, cursor)
        if not query.searching:
            more = len(rows) > limit
            rows = rows[:limit]
            return TaskPage(rows, task_cursor(rows[-1], query.live) if more and rows else None)
        window = rows[:SEARCH_WINDOW]
        found = [r for r in window if query.found(r.last_error, r.payload)]
        if len(found) > limit:
            return TaskPage(found[:limit], task_cursor(found[limit - 1], query.live))
        full = len(window) == SEARCH_WINDOW
        return TaskPage(found, task_cursor(window[-1], query.live) if full else None)

    def _listing(self, query: TaskQuery, cursor: str | None) -> list[TaskRow]:
        """Every task matching `query` but its texts after `cursor`, in the order of a
        page: live ones newest first, finished ones last finished first."""
        where = query.where
        with self.store.lock:
            if query.live:
                states = {query.state} if query.state else set(LIVE)
                after = int(cursor) if cursor else None
                live: Iterable[TaskRow] = (
                    r
                    for r in self.store.live.values()
                    if r.state.value in states
                    and matches(r, where)
                    and (after is None or r.id < after)
                )
                return sorted(live, key=lambda r: r.id, reverse=True)
            bound = finished_cursor(cursor) if cursor else None
            done = [
                r
                for r in self.store.archived.values()
                if r.state.value == query.state
                and matches(r, where)
                and r.finished_at is not None
                and (bound is None or (r.finished_at, r.id) < bound)
            ]
        return sorted(done, key=lambda r: (r.finished_at, r.id), reverse=True)

    async def finished_times(self, *, since: datetime, limit: int) -> list[FinishedTimes]:
        found: list[FinishedTimes] = []
        for state in TIMED_STATES:
            rows = [r for r in self._finished_since(since) if r.state.value == state]
            rows.sort(key=lambda r: r.finished_at or since, reverse=True)
            found += [
                FinishedTimes(r.task_name, state, r.run_at, r.started_at, r.finished_at or since)
                for r in rows[:limit]
            ]
        return sorted(found, key=lambda r: r.finished_at, reverse=True)

    async def history_buckets(
        self, *, first: int, last: int, minutes: int
    ) -> dict[str, dict[str, list[int]]]:
        sums: dict[tuple[str, int], list[int]] = {}
        with self.store.lock:
            rows = [r for (m, _q), r in self.store.history.items() if first <= m < last]
        for r in rows:
            counts = sums.setdefault((r.queue, r.minute - r.minute % minutes), [0, 0, 0, 0])
            for i, n in enumerate((r.enqueued, r.completed, r.failed, r.dead)):
                counts[i] += n
        found = [(q, b, *counts) for (q, b), counts in sums.items()]
        return history_series(found, first=first, last=last, minutes=minutes)

    async def running_by_worker(self, *, per_worker: int) -> dict[str, WorkerBusy]:
        with self.store.lock:
            running = [
                r
                for r in self.store.live.values()
                if r.state is TaskState.PROCESSING and r.lease_expires_at is not None
            ]
        by_worker: dict[str, list[TaskRow]] = {}
        for row in running:
            by_worker.setdefault(row.worker_id or "", []).append(row)
        found = {}
        for worker in sorted(by_worker):
            rows = sorted(by_worker[worker], key=lambda r: (r.started_at or r.run_at, r.id))
            shown = [_running(r) for r in rows[:per_worker]]
            found[worker] = WorkerBusy(worker, shown, len(rows))
        return found


def _running(row: TaskRow) -> RunningTask:
    return RunningTask(**{name: getattr(row, name) for name in RunningTask.__slots__})
