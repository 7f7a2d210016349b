"""Control on a SQL database: the `Control` role of `SqlDriver` (see docs/control.md). The SQL
is the dialect's (`statements/control.py`).
"""

from __future__ import annotations

from collections.abc import (
    Sequence,
)
from datetime import datetime

from sqlalchemy import (
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.clock import utcnow
from txtasks.control import TaskFilter
from txtasks.driver.database import SqlDatabase
from txtasks.driver.statements.control import QUEUE_ITSELF, override_is, override_of
from txtasks.keys import (
    KeyOverride,
    Rate,
)
from txtasks.schema.tables import (
    key_limits,
    keys,
    paused_queues,
)
from txtasks.types import (
    Cancel,
)


async def _keys_rearm(conn: AsyncConnection, key: str, queue: str | None) -> None:
    """New limits apply from the next claim: the key is looked at again now (a key put aside
    as full would otherwise wait for one of its tasks to finish)."""
    now = utcnow()
    where = keys.c.partition_key == key
    if queue is not None:
        where &= keys.c.queue == queue
    await conn.execute(update(keys).where(where).values(ready_at=now, updated_at=now))


class SqlControl:
    """Control at run time on a SQL database: cancels, run now, paused queues, stored queue
    rates and key limits. Cancel, run now, pause, resume and rates run as the dialect's plans
    (in one transaction, retried on a deadlock), the same on the async and the sync engine."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db

    async def task_cancel_many(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: TaskFilter | None = None,
        now: datetime,
        limit: int = 1000,
    ) -> list[Cancel]:
        result: list[Cancel] = await self.db.plan_async(
            lambda sql: sql.control.cancel_plan(ids, where, now, limit)
        )
        return result

    def task_cancel_many_sync(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: TaskFilter | None = None,
        now: datetime,
        limit: int = 1000,
    ) -> list[Cancel]:
        result: list[Cancel] = self.db.plan_sync(
            lambda sql: sql.control.cancel_plan(ids, where, now, limit)
        )
        return result

    async def task_run_now(self, task_id: int, *, now: datetime) -> str | None:
        queue: str | None = await self.db.plan_async(
            lambda sql: sql.control.run_now_plan(task_id, now)
        )
        return queue

    async def queue_pause(self, queue: str, *, now: datetime) -> datetime | None:
        earlier: datetime | None = await self.db.plan_async(
            lambda sql: sql.control.pause_plan(queue, now)
        )
        return earlier

    def queue_pause_sync(self, queue: str, *, now: datetime) -> datetime | None:
        earlier: datetime | None = self.db.plan_sync(lambda sql: sql.control.pause_plan(queue, now))
        return earlier

    async def queue_resume(self, queue: str) -> bool:
        return bool(await self.db.plan_async(lambda sql: sql.control.resume_plan(queue)))

    def queue_resume_sync(self, queue: str) -> bool:
        return bool(self.db.plan_sync(lambda sql: sql.control.resume_plan(queue)))

    async def queue_rate_set(self, queue: str, rate: Rate) -> None:
        await self.db.plan_async(lambda sql: sql.control.queue_rate_plan(queue, rate, utcnow()))

    def queue_rate_set_sync(self, queue: str, rate: Rate) -> None:
        self.db.plan_sync(lambda sql: sql.control.queue_rate_plan(queue, rate, utcnow()))

    async def queue_rate_clear(self, queue: str) -> bool:
        return bool(
            await self.db.plan_async(lambda sql: sql.control.queue_rate_plan(queue, None, utcnow()))
        )

    def queue_rate_clear_sync(self, queue: str) -> bool:
        return bool(
            self.db.plan_sync(lambda sql: sql.control.queue_rate_plan(queue, None, utcnow()))
        )

    async def queue_paused_list(self) -> dict[str, datetime]:
        stmt = select(paused_queues.c.queue, paused_queues.c.paused_at).order_by(
            paused_queues.c.queue
        )
        async with self.db.connect() as conn:
            return {q: at for q, at in (await conn.execute(stmt)).all()}

    async def queue_rates_stored(self) -> dict[str, Rate]:
        stmt = select(key_limits).where(key_limits.c.partition_key == QUEUE_ITSELF)
        async with self.db.connect() as conn:
            rows = (await conn.execute(stmt)).mappings().all()
        stored = {row["queue"]: override_of(row).rate for row in rows}
        return {queue: rate for queue, rate in stored.items() if rate is not None}

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

        await self.db.in_transaction(work)

    async def key_override_clear(self, key: str, queue: str | None = None) -> bool:
        async def work(conn: AsyncConnection) -> int:
            result = await conn.execute(delete(key_limits).where(override_is(key, queue)))
            await _keys_rearm(conn, key, queue)
            return int(result.rowcount)

        return await self.db.in_transaction(work) > 0

    async def key_override_list(self) -> list[KeyOverride]:
        async with self.db.connect() as conn:
            result = await conn.execute(
                select(key_limits)
                .where(key_limits.c.partition_key != QUEUE_ITSELF)
                .order_by(key_limits.c.partition_key, key_limits.c.queue)
            )
            return [override_of(row) for row in result.mappings()]
