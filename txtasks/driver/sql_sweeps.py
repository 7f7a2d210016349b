"""The cleaner's sweeps on a SQL database: the `Sweeps` role of `SqlDriver`."""

from __future__ import annotations

import dataclasses
from collections.abc import (
    Sequence,
)
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    delete,
    exists,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.driver.database import SqlDatabase
from txtasks.driver.history import HistoryRow, history_rows
from txtasks.driver.sql_admin import stmt_newest_before
from txtasks.driver.sql_dashboard import ARRIVAL_MARGIN_MINUTES
from txtasks.schema.tables import (
    IS_READY,
    PROCESSING,
    archive,
    keys,
    periodic,
    tasks,
)
from txtasks.types import (
    FINISHED_STATES,
    NewTask,
    PeriodicRow,
    TaskRow,
    TaskState,
)


class SqlSweeps:
    """The cleaner's sweeps on a SQL database: expired leases, overlooked ready tasks, the
    archive and retention, periodic schedules, the queues' history (its statements:
    `statements/history.py`); each one short transaction over a bounded batch."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db

    async def lease_expired_list(self, *, now: datetime, limit: int) -> list[TaskRow]:
        stmt = (
            select(tasks)
            .where(tasks.c.state == PROCESSING, tasks.c.lease_expires_at < now)
            .order_by(tasks.c.lease_expires_at, tasks.c.id)
            .limit(limit)
        )
        async with self.db.connect() as conn:
            return [TaskRow.from_row(r) for r in (await conn.execute(stmt)).mappings().all()]

    async def ready_list(self, queue: str, *, due_before: datetime, limit: int) -> list[int]:
        stmt = (
            select(tasks.c.id)
            .where(tasks.c.queue == queue, IS_READY, tasks.c.run_at <= due_before)
            .order_by(tasks.c.priority.desc(), tasks.c.run_at, tasks.c.id)
            .limit(limit)
        )
        async with self.db.connect() as conn:
            return [int(i) for i in (await conn.execute(stmt)).scalars().all()]

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
                await conn.execute(self.db.sql.outcomes.stmt_archive_copy(), params)
            if rows:
                await conn.execute(
                    self.db.sql.outcomes.stmt_delete(), {"ids": [r.id for r in rows]}
                )
            return len(rows)

        return await self.db.in_transaction(work)

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

        return await self.db.in_transaction(work)

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

        return await self.db.in_transaction(work)

    async def history_last(self) -> int | None:
        async with self.db.connect() as conn:
            last = (await conn.execute(self.db.sql.history.stmt_history_last())).scalar()
        return None if last is None else int(last)

    async def history_count(self, *, since: datetime, until: datetime) -> list[HistoryRow]:
        sql = self.db.sql.history
        # live tasks from one enqueued a few minutes before `since`: one a little out of id
        # order (concurrent transactions, clocks) still counts
        margin = since - timedelta(minutes=ARRIVAL_MARGIN_MINUTES)
        async with self.db.connect() as conn:
            params: dict[str, Any] = {"since": since, "until": until}
            finished = (await conn.execute(sql.stmt_finished_between(), params)).all()
            after = (await conn.execute(stmt_newest_before(margin))).scalar()
            params["after"] = -1 if after is None else int(after)
            arrived = (await conn.execute(sql.stmt_arrived_between(), params)).all()
        return history_rows(finished, arrived)

    async def history_write(self, rows: Sequence[HistoryRow]) -> None:
        if not rows:
            return
        values = [dataclasses.asdict(r) for r in rows]

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(self.db.sql.history.stmt_history_insert(), values)

        await self.db.in_transaction(work)

    async def history_purge(self, *, before: int) -> int:
        async def work(conn: AsyncConnection) -> int:
            gone = await conn.execute(self.db.sql.history.stmt_history_purge(), {"before": before})
            return int(gone.rowcount)

        return await self.db.in_transaction(work)

    async def periodic_list(self) -> dict[str, PeriodicRow]:
        async with self.db.connect() as conn:
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
            return await self.db.insert_on(conn, fires) if fires else []

        try:
            return await self.db.in_transaction(work)
        except IntegrityError:  # another cleaner stored this schedule first
            return None
