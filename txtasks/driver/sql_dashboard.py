"""The dashboard's reads on a SQL database: the `Dashboard` role of `SqlDriver`. The SQL is the
dialect's (`statements/dashboard.py`), each statement along an index; this runs them on the
database's connections and puts their rows together.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.driver.base import (
    COUNT_CAP,
    SEARCH_WINDOW,
    QueueDepth,
    TaskPage,
    TaskQuery,
    WorkerBusy,
    minute_slots,
    task_cursor,
)
from txtasks.driver.database import SqlDatabase
from txtasks.driver.history import history_series
from txtasks.driver.sql_admin import stmt_newest_before
from txtasks.driver.statements.dashboard import DashboardStatements
from txtasks.driver.timings import TIMED_STATES, FinishedTimes
from txtasks.types import READY_STATES, KeyStats, RunningTask, TaskRow

#: Arrivals are counted from the newest task enqueued this many minutes before the window.
ARRIVAL_MARGIN_MINUTES = 5


def _bytes(value: Any) -> bytes | None:
    """A payload as the database driver hands it (bytes, memoryview), as bytes."""
    return None if value is None else bytes(value)


def _capped(found: dict[str, QueueDepth], cap: int) -> dict[str, QueueDepth]:
    for depth in found.values():
        depth.capped = depth.ready >= cap or depth.scheduled >= cap or depth.dead >= cap
    return found


class SqlDashboard:
    """The dashboard's statements, run on the database's connections."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db

    @property
    def sql(self) -> type[DashboardStatements]:
        return self.db.sql.dashboard

    async def depths(self, *, now: datetime, cap: int = COUNT_CAP) -> dict[str, QueueDepth]:
        """Along the claim indexes: the queues with ready tasks, a loose scan of each; bounded
        counts of each; the head of its claim order; processing tasks along the lease index."""
        if self.sql.depths_by_state:
            return await self._depths_by_state(now=now, cap=cap)
        sql = self.sql
        found: dict[str, QueueDepth] = {}
        async with self.db.connect() as conn:
            for keyed in (False, True):
                queues = (await conn.execute(sql.stmt_ready_queues(keyed))).scalars().all()
                for queue in queues:
                    depth = found.setdefault(queue, QueueDepth(queue))
                    params = {"queue": queue, "now": now, "cap": cap}
                    due = await conn.execute(sql.stmt_ready_count(keyed, due=True), params)
                    later = await conn.execute(sql.stmt_ready_count(keyed, due=False), params)
                    depth.ready += int(due.scalar_one())
                    depth.scheduled += int(later.scalar_one())
                    if not keyed:
                        head = await conn.execute(sql.stmt_ready_head(), params)
                        depth.oldest_ready = head.scalar_one_or_none()
            for queue, count in (await conn.execute(sql.stmt_processing_counts())).all():
                found.setdefault(queue, QueueDepth(queue)).processing = int(count)
            await self._dead_counts(conn, found, cap)
        return _capped(found, cap)

    async def _depths_by_state(self, *, now: datetime, cap: int) -> dict[str, QueueDepth]:
        """`depths` where the claim index holds every row without its state (MariaDB/MySQL):
        along the index of queue and state, one probe per queue to find them, then bounded
        counts of each. The oldest ready task there is the one due first, with or without a
        key."""
        sql = self.sql
        found: dict[str, QueueDepth] = {}
        async with self.db.connect() as conn:
            queue = (await conn.execute(sql.stmt_next_queue(first=True))).scalar()
            while queue is not None:
                depth = found[queue] = QueueDepth(queue)
                params: dict[str, Any] = {"queue": queue, "now": now, "cap": cap}
                due = await conn.execute(sql.stmt_state_count(due=True), params)
                later = await conn.execute(sql.stmt_state_count(due=False), params)
                depth.ready, depth.scheduled = int(due.scalar_one()), int(later.scalar_one())
                if depth.ready:
                    for state in READY_STATES:
                        params["state"] = state.value
                        first = (await conn.execute(sql.stmt_state_first(), params)).scalar()
                        if first is not None and first <= now:
                            depth.oldest_ready = min(first, depth.oldest_ready or first)
                running = await conn.execute(sql.stmt_processing_count(), params)
                depth.processing = int(running.scalar_one())
                after = await conn.execute(sql.stmt_next_queue(first=False), {"after": queue})
                queue = after.scalar()
            await self._dead_counts(conn, found, cap)
        return _capped(found, cap)

    async def _dead_counts(
        self, conn: AsyncConnection, found: dict[str, QueueDepth], cap: int
    ) -> None:
        """Each queue's dead letters, up to `cap`, one bounded count per queue that has some."""
        sql = self.sql
        queue = (await conn.execute(sql.stmt_dead_next_queue(first=True))).scalar()
        while queue is not None:
            dead = await conn.execute(sql.stmt_dead_count(), {"queue": queue, "cap": cap})
            found.setdefault(queue, QueueDepth(queue)).dead = int(dead.scalar_one())
            after = await conn.execute(sql.stmt_dead_next_queue(first=False), {"after": queue})
            queue = after.scalar()

    async def busy_keys(
        self, *, now: datetime, limit: int = 20, cap: int = COUNT_CAP
    ) -> list[KeyStats]:
        """The keys a claim will look at (the keys table, soonest first), then those with hints
        not taken yet; bounded counts of each key's tasks."""
        sql = self.sql
        found = []
        async with self.db.connect() as conn:
            waiting = (await conn.execute(sql.stmt_keys_waiting(), {"limit": limit})).all()
            hinted = (await conn.execute(sql.stmt_keys_hinted(), {"limit": limit})).all()
            starts = {(q, k): t for q, k, t in waiting}
            for q, k in hinted:
                starts.setdefault((q, k), None)
            for (queue, key), next_start in list(starts.items())[:limit]:
                params = {"queue": queue, "key": key, "cap": cap}
                ready = await conn.execute(sql.stmt_key_count(processing=False), params)
                running = await conn.execute(sql.stmt_key_count(processing=True), params)
                limited = next_start if next_start is not None and next_start > now else None
                found.append(
                    KeyStats(
                        queue, key, int(ready.scalar_one()), int(running.scalar_one()), limited
                    )
                )
        return found

    async def finished_per_minute(
        self, *, now: datetime, minutes: int = 60
    ) -> dict[str, dict[str, list[int]]]:
        start, index = minute_slots(now, minutes)
        found: dict[str, dict[str, list[int]]] = {}
        async with self.db.connect() as conn:
            rows = await conn.execute(self.sql.stmt_finished_per_minute(), {"since": start})
            for queue, state, minute, count in rows.all():
                slot = index.get(minute)
                if slot is not None:
                    series = found.setdefault(queue, {}).setdefault(state, [0] * minutes)
                    series[slot] += int(count)
        return found

    async def arrived_per_minute(self, *, now: datetime, minutes: int = 60) -> dict[str, list[int]]:
        start, index = minute_slots(now, minutes)
        # from a task enqueued a few minutes before the window: one a little out of id order
        # (concurrent transactions, clocks) still counts
        margin = start - timedelta(minutes=ARRIVAL_MARGIN_MINUTES)
        found: dict[str, list[int]] = {}
        async with self.db.connect() as conn:
            after = (await conn.execute(stmt_newest_before(margin))).scalar()
            params = {"since": start, "after": -1 if after is None else int(after)}
            rows = (await conn.execute(self.sql.stmt_arrived_per_minute(), params)).all()
        for queue, minute, count in rows:
            slot = index.get(minute)
            if slot is not None:
                found.setdefault(queue, [0] * minutes)[slot] += int(count)
        return found

    async def task_page(self, query: TaskQuery, cursor: str | None, limit: int) -> TaskPage:
        if query.searching:
            return await self._search_page(query, cursor, limit)
        async with self.db.connect() as conn:
            result = await conn.execute(self.sql.stmt_task_page(query, cursor, limit + 1))
            rows = [TaskRow.from_row(r) for r in result.mappings().all()]
        more = len(rows) > limit
        rows = rows[:limit]
        return TaskPage(rows, task_cursor(rows[-1], query.live) if more and rows else None)

    async def _search_page(self, query: TaskQuery, cursor: str | None, limit: int) -> TaskPage:
        """The ids, errors and payloads (those searched) of the next `SEARCH_WINDOW` tasks
        matching the rest of `query`, then the whole rows of those that hold the texts."""
        sql = self.sql
        columns = ["id", *(["last_error"] if query.error else [])]
        columns += [
            *(["payload"] if query.payload else []),
            *([] if query.live else ["finished_at"]),
        ]
        async with self.db.connect() as conn:
            stmt = sql.stmt_task_page(query, cursor, SEARCH_WINDOW, *columns)
            stmt = sql.along_ids(stmt) if query.live else stmt
            window = (await conn.execute(stmt)).all()
            found = [
                r
                for r in window
                if query.found(getattr(r, "last_error", None), _bytes(getattr(r, "payload", None)))
            ]
            ids = [r.id for r in found[:limit]]
            by_id = sql.stmt_tasks_by_id(query.live)
            result = await conn.execute(by_id, {"ids": ids}) if ids else None
            rows = [TaskRow.from_row(r) for r in result.mappings().all()] if result else []
        if len(found) > limit:
            return TaskPage(rows, task_cursor(found[limit - 1], query.live))
        full = len(window) == SEARCH_WINDOW
        return TaskPage(rows, task_cursor(window[-1], query.live) if full else None)

    async def finished_times(self, *, since: datetime, limit: int) -> list[FinishedTimes]:
        found: list[FinishedTimes] = []
        async with self.db.connect() as conn:
            for state in TIMED_STATES:
                params = {"state": state, "since": since, "limit": limit}
                rows = await conn.execute(self.sql.stmt_finished_times(), params)
                found += [FinishedTimes(*r) for r in rows.all()]
        return sorted(found, key=lambda r: r.finished_at, reverse=True)

    async def history_buckets(
        self, *, first: int, last: int, minutes: int
    ) -> dict[str, dict[str, list[int]]]:
        stmt = self.db.sql.history.stmt_history_buckets(minutes)
        async with self.db.connect() as conn:
            rows = (await conn.execute(stmt, {"first": first, "last": last})).all()
        return history_series(rows, first=first, last=last, minutes=minutes)

    async def running_by_worker(self, *, per_worker: int) -> dict[str, WorkerBusy]:
        params = {"per_worker": per_worker}
        async with self.db.connect() as conn:
            rows = (await conn.execute(self.sql.stmt_running(), params)).mappings().all()
        found: dict[str, WorkerBusy] = {}
        for row in rows:
            worker = row["worker_id"] or ""
            busy = found.setdefault(worker, WorkerBusy(worker, [], int(row["total"])))
            busy.tasks.append(RunningTask.from_row(row))
        return found
