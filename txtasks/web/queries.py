"""The reads (and the one write) of the dashboard that the driver's admin API has no call for.

Each is one statement along an index of `txtasks.schema.tables`, so that a page stays fast on a
hot table of millions of rows (`tests/web/test_plans.py` checks the plans): counts per queue
along the claim, lease and stage indexes, finished tasks per minute along the archive's index of
state and finish time, workers along the lease index, and pages of tasks by keyset (the primary
key for live tasks, the archive's index for finished ones). Nothing here takes SQL from a user:
filters are bound values.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, case, func, or_, select, text, update
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import FunctionElement

from txtasks.control import TaskFilter
from txtasks.driver.sql import SqlDriver
from txtasks.schema.tables import IS_READY, KEYED, UNKEYED, Timestamp, archive, tasks
from txtasks.types import FINISHED_STATES, READY_STATES, TaskRow, TaskState

#: States the hot table holds, and those of the archive.
LIVE = tuple(s.value for s in (TaskState.STAGED, *READY_STATES, TaskState.PROCESSING))
FINISHED = tuple(sorted(s.value for s in FINISHED_STATES))
PROCESSING = TaskState.PROCESSING.value
NOW = bindparam("now", type_=Timestamp)
SINCE = bindparam("since", type_=Timestamp)


class minute_of(FunctionElement[str]):  # an SQL function, named like one
    """The minute of a timestamp as text ('YYYY-MM-DD HH:MM'), on every database."""

    inherit_cache = True


@compiles(minute_of)
def _minute_generic(element: minute_of, compiler: SQLCompiler, **kw: Any) -> str:
    return f"strftime('%Y-%m-%d %H:%M', {compiler.process(element.clauses, **kw)})"


@compiles(minute_of, "postgresql")
def _minute_postgresql(element: minute_of, compiler: SQLCompiler, **kw: Any) -> str:
    return f"to_char({compiler.process(element.clauses, **kw)}, 'YYYY-MM-DD HH24:MI')"


@compiles(minute_of, "mysql")
@compiles(minute_of, "mariadb")
def _minute_mysql(element: minute_of, compiler: SQLCompiler, **kw: Any) -> str:
    return f"DATE_FORMAT({compiler.process(element.clauses, **kw)}, '%%Y-%%m-%%d %%H:%%i')"


@dataclass
class QueueDepth:
    """Live tasks of one queue: ready now, scheduled later, processing, staged."""

    queue: str
    ready: int = 0
    scheduled: int = 0
    processing: int = 0
    dead: int = 0
    #: When the longest-waiting ready task became due.
    oldest_ready: datetime | None = None


@dataclass(frozen=True)
class Worker:
    """A worker holding leases: its id, a queue it runs tasks of, how many, until when."""

    worker_id: str
    queue: str
    running: int
    lease_until: datetime


@dataclass(frozen=True)
class TaskPage:
    """One page of a task listing, and the cursor of the next one (None: the last page)."""

    rows: list[TaskRow]
    next_cursor: str | None


def stmt_ready_counts(keyed: bool) -> Any:
    """Ready tasks per queue, due now or later: along the (keyed) claim index."""
    due = func.sum(case((tasks.c.run_at <= NOW, 1), else_=0))
    oldest = func.min(case((tasks.c.run_at <= NOW, tasks.c.run_at)))
    return (
        select(tasks.c.queue, func.count(), due, oldest)
        .where(IS_READY, text(KEYED if keyed else UNKEYED))
        .group_by(tasks.c.queue)
    )


def stmt_processing_counts() -> Any:
    """Processing tasks per queue: along the lease index."""
    return (
        select(tasks.c.queue, func.count())
        .where(tasks.c.state == PROCESSING, tasks.c.lease_expires_at.is_not(None))
        .group_by(tasks.c.queue)
    )


def stmt_dead_counts() -> Any:
    """Dead letters per queue: along the archive's index of state and finish time."""
    return (
        select(archive.c.queue, func.count())
        .where(archive.c.state == TaskState.DEAD.value, archive.c.finished_at.is_not(None))
        .group_by(archive.c.queue)
    )


def stmt_finished_per_minute() -> Any:
    """Tasks finished per queue, state and minute since `since`: along the archive's index."""
    minute = minute_of(archive.c.finished_at)
    return (
        select(archive.c.queue, archive.c.state, minute, func.count())
        .where(archive.c.state.in_(FINISHED), archive.c.finished_at >= SINCE)
        .group_by(archive.c.queue, archive.c.state, minute)
    )


def stmt_workers() -> Any:
    """Workers holding an unexpired lease, per queue: along the lease index."""
    return (
        select(tasks.c.worker_id, tasks.c.queue, func.count(), func.max(tasks.c.lease_expires_at))
        .where(tasks.c.state == PROCESSING, tasks.c.lease_expires_at > NOW)
        .group_by(tasks.c.worker_id, tasks.c.queue)
        .order_by(tasks.c.worker_id, tasks.c.queue)
    )


@dataclass(frozen=True)
class TaskQuery:
    """What the task listing shows: live tasks (`state` None or a live state) or finished ones
    of one state, filtered by queue, task, key and text in the last error."""

    state: str | None = None
    queue: str | None = None
    task_name: str | None = None
    key: str | None = None
    error: str | None = None

    @property
    def live(self) -> bool:
        return self.state is None or self.state in LIVE

    def clauses(self, table: Any) -> list[Any]:
        found = TaskFilter(self.queue, self.task_name, self.key).clauses(table)
        if self.error:
            escaped = self.error.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            found.append(table.c.last_error.like(f"%{escaped}%", escape="\\"))
        return found


def stmt_task_page(query: TaskQuery, cursor: str | None, limit: int) -> Any:
    """A page of tasks after `cursor`: live ones newest first along the primary key, finished
    ones last finished first along the archive's index of state and finish time."""
    if query.live:
        states = [query.state] if query.state else list(LIVE)
        stmt = select(tasks).where(tasks.c.state.in_(states), *query.clauses(tasks))
        if cursor:
            stmt = stmt.where(tasks.c.id < int(cursor))
        return stmt.order_by(tasks.c.id.desc()).limit(limit)
    stmt = select(archive).where(archive.c.state == query.state, *query.clauses(archive))
    if cursor:
        stmt = stmt.where(_after(cursor))
    return stmt.order_by(archive.c.finished_at.desc(), archive.c.id.desc()).limit(limit)


def _after(cursor: str) -> ColumnElement[bool]:
    at_text, _, id_text = cursor.partition("~")
    at, task_id = datetime.fromisoformat(at_text), int(id_text)
    return or_(
        archive.c.finished_at < at,
        and_(archive.c.finished_at == at, archive.c.id < task_id),
    )


def cursor_of(row: TaskRow, live: bool) -> str:
    """Where the page after `row` starts (see `stmt_task_page`)."""
    if live:
        return str(row.id)
    assert row.finished_at is not None
    return f"{row.finished_at.isoformat()}~{row.id}"


def check_cursor(cursor: str | None, live: bool) -> str | None:
    """A cursor from a URL, or a ValueError saying what is wrong with it."""
    if not cursor:
        return None
    try:
        if live:
            int(cursor)
        else:
            _after(cursor)
    except ValueError:
        raise ValueError(f"cursor: not a cursor of this listing: {cursor!r}") from None
    return cursor


class Reads:
    """The dashboard's own statements, run on a SQL driver's connections."""

    def __init__(self, driver: SqlDriver) -> None:
        self.driver = driver

    async def depths(self, *, now: datetime) -> dict[str, QueueDepth]:
        found: dict[str, QueueDepth] = {}
        async with self.driver.connect() as conn:
            for keyed in (False, True):
                rows = await conn.execute(stmt_ready_counts(keyed), {"now": now})
                for queue, count, due, oldest in rows.all():
                    depth = found.setdefault(queue, QueueDepth(queue))
                    depth.ready += int(due or 0)
                    depth.scheduled += int(count) - int(due or 0)
                    if oldest is not None and (depth.oldest_ready or oldest) >= oldest:
                        depth.oldest_ready = oldest
            for queue, count in (await conn.execute(stmt_processing_counts())).all():
                found.setdefault(queue, QueueDepth(queue)).processing = int(count)
            for queue, count in (await conn.execute(stmt_dead_counts())).all():
                found.setdefault(queue, QueueDepth(queue)).dead = int(count)
        return found

    async def finished_per_minute(
        self, *, now: datetime, minutes: int = 60
    ) -> dict[str, dict[str, list[int]]]:
        """Per queue and state, the tasks finished in each of the last `minutes` minutes
        (oldest first)."""
        start = (now - timedelta(minutes=minutes - 1)).replace(second=0, microsecond=0)
        labels = [(start + timedelta(minutes=i)).strftime("%Y-%m-%d %H:%M") for i in range(minutes)]
        index = {label: i for i, label in enumerate(labels)}
        found: dict[str, dict[str, list[int]]] = {}
        async with self.driver.connect() as conn:
            rows = await conn.execute(stmt_finished_per_minute(), {"since": start})
            for queue, state, minute, count in rows.all():
                slot = index.get(minute)
                if slot is not None:
                    series = found.setdefault(queue, {}).setdefault(state, [0] * minutes)
                    series[slot] += int(count)
        return found

    async def workers(self, *, now: datetime) -> list[Worker]:
        async with self.driver.connect() as conn:
            rows = (await conn.execute(stmt_workers(), {"now": now})).all()
        return [Worker(w or "?", q, int(n), until) for w, q, n, until in rows]

    async def task_page(self, query: TaskQuery, cursor: str | None, limit: int) -> TaskPage:
        async with self.driver.connect() as conn:
            result = await conn.execute(stmt_task_page(query, cursor, limit + 1))
            rows = [TaskRow.from_row(r) for r in result.mappings().all()]
        more = len(rows) > limit
        rows = rows[:limit]
        return TaskPage(rows, cursor_of(rows[-1], query.live) if more and rows else None)

    async def task_run_now(self, task_id: int, *, now: datetime) -> str | None:
        """Make a waiting task (pending or retryable) due now; its queue, or None when it is not
        waiting any more."""
        ready = [s.value for s in READY_STATES]
        async with self.driver.begin() as conn:
            queue = (
                await conn.execute(
                    select(tasks.c.queue).where(tasks.c.id == task_id, tasks.c.state.in_(ready))
                )
            ).scalar_one_or_none()
            if queue is None:
                return None
            await conn.execute(
                update(tasks)
                .where(tasks.c.id == task_id, tasks.c.state.in_(ready))
                .values(run_at=now)
            )
        return str(queue)
