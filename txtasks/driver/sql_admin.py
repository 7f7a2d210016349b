"""Inspection and maintenance queries of the SQL driver: status, dead letters, and what the
cleaner's sweeps run (expired leases, stale ready rows, archiving, retention, periodic fires).

`SqlDriver` inherits these; every method is one short transaction over a bounded batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import (
    String,
    and_,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    select,
    text,
    true,
    union_all,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.driver.base import queue_stats_list, requeue_choice
from txtasks.driver.dialect_control import QUEUE_ITSELF, override_is
from txtasks.driver.key_hints import hints_step

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from txtasks.driver.dialect import SqlDialect
from txtasks.clock import utcnow
from txtasks.keys import KeyOverride, Rate
from txtasks.schema.tables import (
    IS_READY,
    KEYED,
    TASK_COLUMNS,
    UNKEYED,
    Timestamp,
    along_archive_order,
    along_archive_state,
    archive,
    key_limits,
    keys,
    paused_queues,
    periodic,
    tasks,
)
from txtasks.types import (
    FINISHED_STATES,
    KeyStats,
    NewTask,
    PeriodicRow,
    QueueRates,
    QueueStats,
    TaskRow,
    TaskState,
)

T = TypeVar("T")
FINISHED_VALUES = frozenset(s.value for s in FINISHED_STATES)
PROCESSING = TaskState.PROCESSING.value


#: The key of a queue's own rate (see `SqlAdmin.queue_rate_set`).


def override_of(row: Any) -> KeyOverride:
    """A `txtasks_key_limits` row as the override it stores."""
    rate = None
    if row["rate_count"] is not None and row["rate_per"] is not None:
        rate = Rate(int(row["rate_count"]), float(row["rate_per"]), int(row["rate_burst"] or 1))
    ordered = row["ordered"]
    return KeyOverride(
        key=row["partition_key"],
        queue=None if row["queue"] == "*" else row["queue"],
        concurrency=row["concurrency"],
        ordered=None if ordered is None else bool(ordered),
        rate=rate,
    )


async def _keys_rearm(conn: AsyncConnection, key: str, queue: str | None) -> None:
    """New limits apply from the next claim: the key is looked at again now (a key put aside
    as full would otherwise wait for one of its tasks to finish)."""
    now = utcnow()
    where = keys.c.partition_key == key
    if queue is not None:
        where &= keys.c.queue == queue
    await conn.execute(update(keys).where(where).values(ready_at=now, updated_at=now))


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
    """Status, dead-letter and maintenance queries (mixed into `SqlDriver`)."""

    if TYPE_CHECKING:

        def connect(
            self, *, bounded: bool = True
        ) -> contextlib.AbstractAsyncContextManager[AsyncConnection]: ...

        def begin(
            self, *, bounded: bool = True
        ) -> contextlib.AbstractAsyncContextManager[AsyncConnection]: ...

        async def in_transaction(self, work: Callable[[AsyncConnection], Awaitable[T]]) -> T: ...

        async def insert_on(self, conn: AsyncConnection, rows: Sequence[NewTask]) -> list[int]: ...

        sql: SqlDialect

        @property
        def sync_engine(self) -> Engine: ...

    # -- inspection ---------------------------------------------------------------------------

    async def ping(self) -> None:
        """`SELECT 1` on a pooled connection, bounded by the command timeout."""
        async with self.connect() as conn:
            await conn.execute(select(literal(1)))

    async def live_count(
        self,
        queues: Sequence[str] | None,
        *,
        now: datetime,
        due_before: datetime,
        at_most: int | None = None,
    ) -> int:
        """Ready tasks and running ones counted apart, each count stopping at `at_most` (in
        the keyed burn-down on MariaDB, `at_most=1` read 31 rows a call where the full count
        read 49,000)."""
        in_queues = tasks.c.queue.in_(queues) if queues is not None else true()
        ready = and_(
            in_queues,
            IS_READY,
            tasks.c.run_at <= due_before,
            tasks.c.queue.not_in(select(paused_queues.c.queue)),
        )
        running = and_(tasks.c.state == PROCESSING, tasks.c.lease_expires_at > now, in_queues)
        parts = [select(tasks.c.id).where(where).limit(at_most) for where in (ready, running)]
        counts = [select(func.count()).select_from(p.subquery()).scalar_subquery() for p in parts]
        async with self.connect() as conn:
            found = int((await conn.execute(select(counts[0] + counts[1]))).scalar_one())
        return found if at_most is None else min(found, at_most)

    async def task_get(self, task_id: int) -> TaskRow | None:
        async with self.connect() as conn:
            for table in (tasks, archive):
                row = (await conn.execute(select(table).where(table.c.id == task_id))).mappings()
                found = row.first()
                if found is not None:
                    return TaskRow.from_row(found)
        return None

    def task_get_sync(self, task_id: int) -> TaskRow | None:
        with self.sync_engine.connect() as conn:
            for table in (tasks, archive):
                found = conn.execute(select(table).where(table.c.id == task_id)).mappings().first()
                if found is not None:
                    return TaskRow.from_row(found)
        return None

    async def queue_stats(self, *, now: datetime, archived: bool = True) -> list[QueueStats]:
        stats: dict[str, QueueStats] = {}
        async with self.connect() as conn:
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
        async with self.connect() as conn:
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
        async with self.connect() as conn:
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

    # -- dead letters -------------------------------------------------------------------------

    @staticmethod
    def _dead_where(ids: Sequence[int] | None, queue: str | None) -> list[Any]:
        where = [archive.c.state == TaskState.DEAD.value]
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
        async with self.connect() as conn:
            return [TaskRow.from_row(r) for r in (await conn.execute(stmt)).mappings().all()]

    async def dead_requeue(
        self, ids: Sequence[int] | None = None, *, queue: str | None = None, now: datetime
    ) -> list[int]:
        async with self.begin() as conn:
            dead = select(archive.c.id, archive.c.dedup_key).where(*self._dead_where(ids, queue))
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

    # -- key limits set at run time -----------------------------------------------------------

    async def key_override_set(self, override: KeyOverride) -> None:
        rate = override.rate
        row = {
            "queue": override.queue or "*",
            "partition_key": override.key,
            "concurrency": override.concurrency,
            "ordered": None if override.ordered is None else int(override.ordered),
            "rate_count": None if rate is None else rate.count,
            "rate_per": None if rate is None else rate.per,
            "rate_burst": None if rate is None else rate.burst,
            "updated_at": utcnow(),
        }

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(delete(key_limits).where(override_is(override.key, override.queue)))
            await conn.execute(insert(key_limits), row)
            await _keys_rearm(conn, override.key, override.queue)

        await self.in_transaction(work)

    async def key_override_clear(self, key: str, queue: str | None = None) -> bool:
        async def work(conn: AsyncConnection) -> int:
            result = await conn.execute(delete(key_limits).where(override_is(key, queue)))
            await _keys_rearm(conn, key, queue)
            return int(result.rowcount)

        return await self.in_transaction(work) > 0

    async def key_override_list(self) -> list[KeyOverride]:
        async with self.connect() as conn:
            result = await conn.execute(
                select(key_limits)
                .where(key_limits.c.partition_key != QUEUE_ITSELF)
                .order_by(key_limits.c.partition_key, key_limits.c.queue)
            )
            return [override_of(row) for row in result.mappings()]

    # A queue's own rate is stored as the limits of the key '' (no task's key: keys have 1 to
    # 255 bytes) in that queue, as the claims keep its next start in the key row ''.

    async def queue_rates_stored(self) -> dict[str, Rate]:
        stmt = select(key_limits).where(key_limits.c.partition_key == QUEUE_ITSELF)
        async with self.connect() as conn:
            rows = (await conn.execute(stmt)).mappings().all()
        stored = {row["queue"]: override_of(row).rate for row in rows}
        return {queue: rate for queue, rate in stored.items() if rate is not None}

    async def dead_purge(
        self, ids: Sequence[int] | None = None, *, queue: str | None = None
    ) -> int:
        async with self.begin() as conn:
            result = await conn.execute(delete(archive).where(*self._dead_where(ids, queue)))
        return int(result.rowcount)

    # -- cleaner: rescue ----------------------------------------------------------------------

    async def lease_expired_list(self, *, now: datetime, limit: int) -> list[TaskRow]:
        stmt = (
            select(tasks)
            .where(tasks.c.state == PROCESSING, tasks.c.lease_expires_at < now)
            .order_by(tasks.c.lease_expires_at, tasks.c.id)
            .limit(limit)
        )
        async with self.connect() as conn:
            return [TaskRow.from_row(r) for r in (await conn.execute(stmt)).mappings().all()]

    # -- cleaner: re-announce -----------------------------------------------------------------

    async def ready_list(self, queue: str, *, due_before: datetime, limit: int) -> list[int]:
        stmt = (
            select(tasks.c.id)
            .where(tasks.c.queue == queue, IS_READY, tasks.c.run_at <= due_before)
            .order_by(tasks.c.priority.desc(), tasks.c.run_at, tasks.c.id)
            .limit(limit)
        )
        async with self.connect() as conn:
            return [int(i) for i in (await conn.execute(stmt)).scalars().all()]

    # -- cleaner: archive and retention -------------------------------------------------------

    async def finished_archive_many(self, *, now: datetime, limit: int) -> int:
        finished = [s.value for s in FINISHED_STATES]
        pick = (
            select(tasks.c.id, tasks.c.state)
            .where(tasks.c.state.in_(finished))
            .order_by(tasks.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )

        async def work(conn: AsyncConnection) -> int:
            rows = (await conn.execute(pick)).all()
            for state in {r.state for r in rows}:
                ids = [r.id for r in rows if r.state == state]
                params = {"ids": ids, "state": state, "now": now}
                await conn.execute(self.sql.stmt_archive_copy(), params)
            if rows:
                await conn.execute(self.sql.stmt_delete(), {"ids": [r.id for r in rows]})
            return len(rows)

        return await self.in_transaction(work)

    async def archive_purge_many(
        self,
        *,
        state: TaskState,
        before: datetime,
        limit: int,
        queues: Sequence[str] | None = None,
        exclude: Sequence[str] = (),
    ) -> int:
        pick = (
            select(archive.c.id)
            .where(archive.c.state == state.value, archive.c.finished_at < before)
            .order_by(archive.c.finished_at, archive.c.id)
            .limit(limit)
        )
        if queues is not None:
            pick = pick.where(archive.c.queue.in_(queues))
        if exclude:
            pick = pick.where(archive.c.queue.not_in(exclude))

        async def work(conn: AsyncConnection) -> int:
            ids = list((await conn.execute(pick)).scalars())
            if not ids:
                return 0
            result = await conn.execute(delete(archive).where(archive.c.id.in_(ids)))
            return int(result.rowcount)

        return await self.in_transaction(work)

    async def keys_forget_many(self, *, idle_before: datetime, limit: int) -> int:
        quiet = (
            keys.c.partition_key != "",  # a queue's own rate
            keys.c.ready_at.is_(None),
            keys.c.updated_at < idle_before,
            keys.c.next_start_at.is_(None) | (keys.c.next_start_at < idle_before),
        )
        live = exists().where(
            tasks.c.queue == keys.c.queue, tasks.c.partition_key == keys.c.partition_key
        )
        pick = (
            select(keys.c.id)
            .where(*quiet, ~live)
            .order_by(keys.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )

        async def work(conn: AsyncConnection) -> int:
            ids = list((await conn.execute(pick)).scalars())
            if not ids:
                return 0
            gone = await conn.execute(delete(keys).where(keys.c.id.in_(ids), *quiet))
            return int(gone.rowcount)

        return await self.in_transaction(work)

    # -- cleaner: periodic --------------------------------------------------------------------

    async def periodic_list(self) -> dict[str, PeriodicRow]:
        async with self.connect() as conn:
            rows = (await conn.execute(select(periodic))).mappings().all()
        return {r["name"]: PeriodicRow.from_row(r) for r in rows}

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
        values = {"schedule": schedule, "next_fire_at": next_fire_at, "updated_at": now}
        if fires:
            values["last_fire_at"] = max(f.run_at for f in fires)

        async def work(conn: AsyncConnection) -> list[int] | None:
            if expected is None:
                await conn.execute(insert(periodic).values(name=name, **values))
            else:
                moved = await conn.execute(
                    update(periodic)
                    .where(periodic.c.name == name, periodic.c.next_fire_at == expected)
                    .values(**values)
                )
                if moved.rowcount != 1:
                    return None  # another cleaner fired it first
            return await self.insert_on(conn, fires) if fires else []

        try:
            return await self.in_transaction(work)
        except IntegrityError:  # another cleaner stored this schedule first
            return None
