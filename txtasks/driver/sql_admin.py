"""Statistics and dead letters on a SQL database: the `Admin` role of `SqlDriver`."""

from __future__ import annotations

from collections.abc import (
    Sequence,
)
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    String,
    case,
    delete,
    func,
    insert,
    literal,
    select,
    text,
    union_all,
)

from txtasks.driver.base import (
    queue_stats_list,
    requeue_choice,
)
from txtasks.driver.database import SqlDatabase
from txtasks.driver.statements.key_hints import hints_step
from txtasks.schema.tables import (
    IS_READY,
    KEYED,
    PROCESSING,
    TASK_COLUMNS,
    UNKEYED,
    Timestamp,
    along_archive_order,
    along_archive_state,
    archive,
    keys,
    paused_queues,
    tasks,
)
from txtasks.types import (
    FINISHED_STATES,
    KeyStats,
    QueueRates,
    QueueStats,
    TaskRow,
    TaskState,
)

FINISHED_VALUES = frozenset(s.value for s in FINISHED_STATES)


def stmt_ready_due(now: datetime) -> Any:
    """Per queue: the earliest run_at and the count of ready, due tasks; tasks without a key
    and with one apart (each part served by its claim index where indexes are partial)."""
    parts = [
        select(tasks.c.queue, func.min(tasks.c.run_at), func.count())
        .where(IS_READY, text(keyed), tasks.c.run_at <= now)
        .group_by(tasks.c.queue)
        for keyed in (UNKEYED, KEYED)
    ]
    return union_all(*parts)


def stmt_newest_before(since: datetime) -> Any:
    """The newest live task enqueued at or before `since`: read backwards along the primary
    key, so it reads only the tasks enqueued since (ids follow enqueue times closely)."""
    return (
        select(tasks.c.id).where(tasks.c.created_at <= since).order_by(tasks.c.id.desc()).limit(1)
    )


def stmt_arrivals_and_finishes(since: datetime, before_id: int) -> Any:
    """Per queue (and final state): tasks enqueued after `since` (live ones after
    `before_id` along the primary key, archived ones among those finished since) and tasks
    finished after `since` (the archive's state index); one statement, one snapshot."""
    live = (
        select(
            tasks.c.queue,
            literal(None, String).label("state"),
            func.count().label("arrived"),
            literal(0).label("finished"),
        )
        .where(tasks.c.id > before_id, tasks.c.created_at > since)
        .group_by(tasks.c.queue)
    )
    arrived = func.sum(case((archive.c.created_at > since, 1), else_=0))
    finished = (
        select(archive.c.queue, archive.c.state, arrived, func.count())
        .where(archive.c.state.in_(sorted(FINISHED_VALUES)), archive.c.finished_at > since)
        .group_by(archive.c.queue, archive.c.state)
    )
    return union_all(live, finished)


class SqlAdmin:
    """Statistics and dead letters on a SQL database: what `txtasks status`, `txtasks dlq` and
    the cleaner's statistics read; every method one short transaction over a bounded batch."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db

    async def queue_stats(self, *, now: datetime, archived: bool = True) -> list[QueueStats]:
        stats: dict[str, QueueStats] = {}
        async with self.db.connect() as conn:
            for table in (tasks, archive) if archived else (tasks,):
                counts = select(table.c.queue, table.c.state, func.count()).group_by(
                    table.c.queue, table.c.state
                )
                for queue, state, count in (await conn.execute(counts)).all():
                    stats.setdefault(queue, QueueStats(queue)).counts[state] = int(count)
            oldest: dict[str, datetime] = {}
            ready: dict[str, int] = {}
            for queue, first, count in (await conn.execute(stmt_ready_due(now))).all():
                oldest[queue] = min(first, oldest.get(queue, first))
                ready[queue] = ready.get(queue, 0) + int(count)
            paused_stmt = select(paused_queues.c.queue, paused_queues.c.paused_at)
            paused = {q: at for q, at in (await conn.execute(paused_stmt)).all()}
        return queue_stats_list(stats, oldest, paused, ready, now)

    async def queue_rates(self, *, now: datetime, window: float = 60.0) -> list[QueueRates]:
        since = now - timedelta(seconds=window)
        enqueued: dict[str, int] = {}
        finished: dict[str, dict[str, int]] = {}
        async with self.db.connect() as conn:
            # ids follow enqueue times, not exactly (concurrent transactions, clocks): counting
            # from a task enqueued a window earlier still, a task a little out of order counts.
            before = (await conn.execute(stmt_newest_before(since - (now - since)))).scalar()
            stmt = stmt_arrivals_and_finishes(since, -1 if before is None else int(before))
            for queue, state, arrived, count in (await conn.execute(stmt)).all():
                enqueued[queue] = enqueued.get(queue, 0) + int(arrived or 0)
                if state is not None:
                    finished.setdefault(queue, {})[state] = int(count)
        return [QueueRates(q, window, enqueued[q], finished.get(q, {})) for q in sorted(enqueued)]

    async def key_stats(self, *, now: datetime, limit: int = 10) -> list[KeyStats]:
        waiting = func.sum(case((IS_READY & (tasks.c.run_at <= now), 1), else_=0))
        processing = func.sum(case((tasks.c.state == PROCESSING, 1), else_=0))
        busiest = (
            select(tasks.c.queue, tasks.c.partition_key, waiting, processing)
            .where(tasks.c.partition_key.is_not(None))
            .group_by(tasks.c.queue, tasks.c.partition_key)
            .order_by((waiting + processing).desc(), tasks.c.queue, tasks.c.partition_key)
            .limit(limit)
        )
        async with self.db.connect() as conn:
            rows = (await conn.execute(busiest)).all()
            names = sorted({r[1] for r in rows})
            limited = select(keys.c.queue, keys.c.partition_key, keys.c.next_start_at).where(
                keys.c.partition_key.in_(names), keys.c.next_start_at > now
            )
            until = {(q, k): t for q, k, t in (await conn.execute(limited)).all()} if names else {}
        return [
            KeyStats(q, k, int(w or 0), int(p or 0), until.get((q, k)))
            for q, k, w, p in rows
            if (w or p)
        ]

    @staticmethod
    def _dead_where(
        ids: Sequence[int] | None,
        queue: str | None,
        states: Sequence[TaskState] = (TaskState.DEAD,),
    ) -> list[Any]:
        if len(states) == 1:
            where = [archive.c.state == states[0].value]
        else:
            where = [archive.c.state.in_(sorted(s.value for s in states))]
        if ids is not None:
            where.append(archive.c.id.in_(ids))
        if queue is not None:
            where.append(archive.c.queue == queue)
        return where

    async def dead_list(self, *, queue: str | None = None, limit: int = 100) -> list[TaskRow]:
        stmt = along_archive_order(
            select(archive)
            .where(*self._dead_where(None, queue))
            .order_by(archive.c.finished_at.desc(), archive.c.id.desc())
            .limit(limit),
            by_queue=queue is not None,
        )
        async with self.db.connect() as conn:
            return [TaskRow.from_row(r) for r in (await conn.execute(stmt)).mappings().all()]

    async def dead_requeue(
        self,
        ids: Sequence[int] | None = None,
        *,
        queue: str | None = None,
        now: datetime,
        states: Sequence[TaskState] = (TaskState.DEAD,),
    ) -> list[int]:
        async with self.db.begin() as conn:
            where = self._dead_where(ids, queue, states)
            dead = select(archive.c.id, archive.c.dedup_key).where(*where)
            if ids is None:
                dead = along_archive_state(dead)
            rows = (await conn.execute(dead.with_for_update())).all()
            keys = [r.dedup_key for r in rows if r.dedup_key]
            taken = select(tasks.c.dedup_key).where(tasks.c.dedup_key.in_(keys))
            live_keys = set((await conn.execute(taken)).scalars()) if keys else set()
            chosen = requeue_choice([(r.id, r.dedup_key) for r in rows], live_keys)
            if not chosen:
                return []
            fresh: dict[str, Any] = {
                "state": literal(TaskState.PENDING.value),
                "attempt": literal(0),
                "run_at": literal(now, Timestamp),
                "worker_id": literal(None, String),
                "lease_expires_at": literal(None, Timestamp),
                "started_at": literal(None, Timestamp),
                "cancel_requested_at": literal(None, Timestamp),
            }
            cols = [c for c in TASK_COLUMNS if c not in fresh]
            source = select(
                *[archive.c[c] for c in cols], *[v.label(k) for k, v in fresh.items()]
            ).where(archive.c.id.in_(chosen))
            await conn.execute(insert(tasks).from_select([*cols, *fresh], source))
            await conn.execute(delete(archive).where(archive.c.id.in_(chosen)))
            keyed = select(tasks.c.queue, tasks.c.partition_key).where(
                tasks.c.id.in_(chosen), tasks.c.partition_key.is_not(None)
            )
            hints = hints_step((q, k, now) for q, k in await conn.execute(keyed))
            if hints:  # their keys are looked at again
                await conn.execute(*hints)
        return chosen

    async def dead_purge(
        self,
        ids: Sequence[int] | None = None,
        *,
        queue: str | None = None,
        states: Sequence[TaskState] = (TaskState.DEAD,),
    ) -> int:
        where = self._dead_where(ids, queue, states)
        async with self.db.begin() as conn:
            result = await conn.execute(delete(archive).where(*where))
        return int(result.rowcount)
