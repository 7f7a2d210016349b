"""Control on a SQL database (mixed into `SqlDriver`): cancel, pause and resume, and the reads
of `txtasks inspect` and `txtasks tasks`. The SQL is the dialect's (`dialect_control.py`);
cancel and pause run as plans, the same on the async and the sync engine."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine, select
from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.clock import utcnow
from txtasks.control import TaskFilter, task_list_order
from txtasks.driver.insert_plan import plan_run_async, plan_run_sync
from txtasks.keys import Rate
from txtasks.schema.tables import paused_queues
from txtasks.types import LIVE_STATES, Cancel, TaskKey, TaskRow, TaskState

if TYPE_CHECKING:
    from txtasks.driver.dialect import SqlDialect

T = TypeVar("T")


class SqlControl:
    """Control's contract methods of the SQL driver."""

    if TYPE_CHECKING:

        def connect(
            self, *, bounded: bool = True
        ) -> contextlib.AbstractAsyncContextManager[AsyncConnection]: ...

        async def in_transaction(self, work: Callable[[AsyncConnection], Awaitable[T]]) -> T: ...

        @property
        def sync_engine(self) -> Engine: ...

        sql: SqlDialect

    async def _plan_async(self, make: Callable[[SqlDialect], Any]) -> Any:
        async def work(conn: AsyncConnection) -> Any:
            return await plan_run_async(conn, make(self.sql))

        return await self.in_transaction(work)

    def _plan_sync(self, make: Callable[[SqlDialect], Any]) -> Any:
        from txtasks.driver.dialect import dialect_for

        with self.sync_engine.begin() as conn:
            return plan_run_sync(conn, make(dialect_for(conn.dialect)))

    # -- cancel -------------------------------------------------------------------------------

    async def task_cancel_many(
        self,
        ids: Sequence[int] | None = None,
        *,
        where: TaskFilter | None = None,
        now: datetime,
        limit: int = 1000,
    ) -> list[Cancel]:
        result: list[Cancel] = await self._plan_async(
            lambda sql: sql.cancel_plan(ids, where, now, limit)
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
        result: list[Cancel] = self._plan_sync(lambda sql: sql.cancel_plan(ids, where, now, limit))
        return result

    async def cancel_requested_list(self, keys: Sequence[TaskKey]) -> list[TaskKey]:
        if not keys:
            return []
        wanted = set(keys)
        async with self.connect() as conn:
            result = await conn.execute(
                self.sql.stmt_cancel_requested(), {"ids": sorted({k.id for k in keys})}
            )
            found = [TaskKey(int(i), int(a)) for i, a in result.all()]
        return [k for k in found if k in wanted]

    # -- pause --------------------------------------------------------------------------------

    async def queue_pause(self, queue: str, *, now: datetime) -> datetime | None:
        earlier: datetime | None = await self._plan_async(lambda sql: sql.pause_plan(queue, now))
        return earlier

    def queue_pause_sync(self, queue: str, *, now: datetime) -> datetime | None:
        earlier: datetime | None = self._plan_sync(lambda sql: sql.pause_plan(queue, now))
        return earlier

    async def queue_resume(self, queue: str) -> bool:
        return bool(await self._plan_async(lambda sql: sql.resume_plan(queue)))

    def queue_resume_sync(self, queue: str) -> bool:
        return bool(self._plan_sync(lambda sql: sql.resume_plan(queue)))

    async def queue_rate_set(self, queue: str, rate: Rate) -> None:
        await self._plan_async(lambda sql: sql.queue_rate_plan(queue, rate, utcnow()))

    def queue_rate_set_sync(self, queue: str, rate: Rate) -> None:
        self._plan_sync(lambda sql: sql.queue_rate_plan(queue, rate, utcnow()))

    async def queue_rate_clear(self, queue: str) -> bool:
        return bool(await self._plan_async(lambda sql: sql.queue_rate_plan(queue, None, utcnow())))

    def queue_rate_clear_sync(self, queue: str) -> bool:
        return bool(self._plan_sync(lambda sql: sql.queue_rate_plan(queue, None, utcnow())))

    async def queue_paused_list(self) -> dict[str, datetime]:
        stmt = select(paused_queues.c.queue, paused_queues.c.paused_at).order_by(
            paused_queues.c.queue
        )
        async with self.connect() as conn:
            return {q: at for q, at in (await conn.execute(stmt)).all()}

    # -- inspection ---------------------------------------------------------------------------

    async def task_list(
        self,
        *,
        states: Sequence[TaskState] | None = None,
        where: TaskFilter | None = None,
        limit: int = 100,
    ) -> list[TaskRow]:
        rows: list[TaskRow] = []
        async with self.connect() as conn:
            for stmt in self._task_list_statements(states, where):
                result = await conn.execute(stmt, {"limit": limit})
                rows += [TaskRow.from_row(r) for r in result.mappings().all()]
        return task_list_order(rows)[:limit]

    def task_list_sync(
        self,
        *,
        states: Sequence[TaskState] | None = None,
        where: TaskFilter | None = None,
        limit: int = 100,
    ) -> list[TaskRow]:
        rows: list[TaskRow] = []
        with self.sync_engine.connect() as conn:
            for stmt in self._task_list_statements(states, where):
                result = conn.execute(stmt, {"limit": limit})
                rows += [TaskRow.from_row(r) for r in result.mappings().all()]
        return task_list_order(rows)[:limit]

    def _task_list_statements(
        self, states: Sequence[TaskState] | None, where: TaskFilter | None
    ) -> list[Any]:
        """The statements of a listing: one of the live states, one per finished state."""
        chosen = set(states) if states else set(LIVE_STATES)
        flt = where or TaskFilter()
        live = sorted(s.value for s in chosen if s.is_live)
        stmts = [self.sql.stmt_live_list(live, flt)] if live else []
        for state in sorted(s.value for s in chosen if not s.is_live):
            stmts.append(self.sql.stmt_archive_list(state, flt))
        return stmts
