"""Tasks on a SQL database: the `Tasks` role of `SqlDriver`."""

from __future__ import annotations

from collections.abc import (
    Sequence,
)
from datetime import datetime
from typing import Any

from sqlalchemy import (
    and_,
    func,
    select,
    true,
)

from txtasks.control import TaskFilter, task_list_order
from txtasks.driver.database import SqlDatabase
from txtasks.driver.dialect import (
    dialect_for,
)
from txtasks.driver.insert_plan import plan_run_sync
from txtasks.schema.tables import (
    IS_READY,
    PROCESSING,
    archive,
    paused_queues,
    tasks,
)
from txtasks.types import (
    LIVE_STATES,
    NewTask,
    TaskRow,
    TaskState,
)


class SqlTasks:
    """The application's tasks on a SQL database: an enqueue in a transaction of the driver's
    own, a task or a list of them read, what is left to do counted."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db

    async def task_insert_many(self, rows: Sequence[NewTask]) -> list[int]:
        if not rows:
            return []
        return await self.db.in_transaction(lambda conn: self.db.insert_on(conn, rows))

    def task_insert_many_sync(self, rows: Sequence[NewTask]) -> list[int]:
        if not rows:
            return []
        with self.db.sync_engine.begin() as conn:
            return plan_run_sync(conn, dialect_for(conn.dialect).enqueue.enqueue_plan(rows))

    async def task_get(self, task_id: int) -> TaskRow | None:
        async with self.db.connect() as conn:
            for table in (tasks, archive):
                row = (await conn.execute(select(table).where(table.c.id == task_id))).mappings()
                found = row.first()
                if found is not None:
                    return TaskRow.from_row(found)
        return None

    def task_get_sync(self, task_id: int) -> TaskRow | None:
        with self.db.sync_engine.connect() as conn:
            for table in (tasks, archive):
                found = conn.execute(select(table).where(table.c.id == task_id)).mappings().first()
                if found is not None:
                    return TaskRow.from_row(found)
        return None

    async def task_list(
        self,
        *,
        states: Sequence[TaskState] | None = None,
        where: TaskFilter | None = None,
        limit: int = 100,
    ) -> list[TaskRow]:
        rows: list[TaskRow] = []
        async with self.db.connect() as conn:
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
        with self.db.sync_engine.connect() as conn:
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
        stmts = [self.db.sql.control.stmt_live_list(live, flt)] if live else []
        for state in sorted(s.value for s in chosen if not s.is_live):
            stmts.append(self.db.sql.control.stmt_archive_list(state, flt))
        return stmts

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
        async with self.db.connect() as conn:
            found = int((await conn.execute(select(counts[0] + counts[1]))).scalar_one())
        return found if at_most is None else min(found, at_most)
