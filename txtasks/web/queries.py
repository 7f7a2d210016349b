"""The reads (and the one write) of the dashboard that the driver's admin API has no call for.

Each is one statement along an index of `txtasks.schema.tables`, so that a page stays fast on a
hot table of millions of rows (`tests/web/test_plans.py` checks the plans): counts per queue
along the claim, lease and stage indexes (on MariaDB/MySQL, whose claim index has no state,
along the index of queue and state), finished tasks per minute along the archive's index of
state and finish time, tasks enqueued per minute backwards along the primary key and among
those finished, and pages of tasks by keyset (the primary key for live tasks, the archive's
index for finished ones). Nothing here takes SQL from a user:
filters are bound values.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    and_,
    bindparam,
    func,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import FunctionElement

from txtasks.control import TaskFilter
from txtasks.driver.key_hints import hints_step
from txtasks.driver.sql import SqlDriver
from txtasks.driver.sql_admin import stmt_newest_before
from txtasks.schema.tables import (
    IS_DEAD,
    IS_READY,
    KEYED,
    UNKEYED,
    Timestamp,
    along_archive_order,
    along_archive_state,
    archive,
    key_hints,
    keys,
    tasks,
)
from txtasks.types import FINISHED_STATES, READY_STATES, KeyStats, TaskRow, TaskState

#: States the hot table holds, and those of the archive.
LIVE = tuple(s.value for s in (TaskState.STAGED, *READY_STATES, TaskState.PROCESSING))
FINISHED = tuple(sorted(s.value for s in FINISHED_STATES))
PROCESSING = TaskState.PROCESSING.value
NOW = bindparam("now", type_=Timestamp)
QUEUE = bindparam("queue", type_=tasks.c.queue.type)
#: Counts of ready tasks stop here: past it a page shows "at least" (counting a million rows
#: on every refresh would read them all).
COUNT_CAP = 1_000
#: The order of the claim indexes after the queue (and key).
CLAIM_ORDER = (tasks.c.priority.desc(), tasks.c.run_at, tasks.c.id)
#: Text in the error is looked for among this many tasks (matching the other filters) a page.
SEARCH_WINDOW = 5_000
SINCE = bindparam("since", type_=Timestamp)
#: Arrivals are counted from the newest task enqueued this many minutes before the window.
ARRIVAL_MARGIN_MINUTES = 5


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
    #: When the task at the head of the claim order became due (None: none is due).
    oldest_ready: datetime | None = None
    #: True when a count stopped at its cap: there are at least that many.
    capped: bool = False


@dataclass(frozen=True)
class TaskPage:
    """One page of a task listing, and the cursor of the next one (None: the last page)."""

    rows: list[TaskRow]
    next_cursor: str | None


def _ready(keyed: bool) -> list[Any]:
    """The condition of the (keyed) claim index: only rows in it are read."""
    return [IS_READY, text(KEYED if keyed else UNKEYED)]


def stmt_ready_queues(keyed: bool) -> Any:
    """The queues that may have ready tasks, one index probe each: a loose scan of the (keyed)
    claim index, which starts with the queue."""

    def after(previous: Any) -> Any:
        stmt = select(tasks.c.queue).where(*_ready(keyed))
        if previous is not None:
            stmt = stmt.where(tasks.c.queue > previous)
        return stmt.order_by(tasks.c.queue).limit(1).scalar_subquery()

    found = select(after(None).label("queue")).cte("ready_queues", recursive=True)
    found = found.union_all(select(after(found.c.queue)).where(found.c.queue.is_not(None)))
    return select(found.c.queue).where(found.c.queue.is_not(None))


def _along_dead(stmt: Any) -> Any:
    """`stmt` along the archive's index of dead letters on MariaDB/MySQL too (whose planner
    would rather follow the index of state and finish time, reading every dead letter)."""
    hint = "FORCE INDEX (ix_txtasks_archive_dead)"
    return stmt.with_hint(archive, hint, "mysql").with_hint(archive, hint, "mariadb")


def stmt_dead_next_queue(*, first: bool) -> Any:
    """The first queue with dead letters (after queue `after`): one probe of the archive's
    index of dead letters. One statement per queue: MariaDB runs the recursive form of this
    loose scan (`stmt_ready_queues`) as a scan of the index per queue."""
    stmt = select(archive.c.queue).where(IS_DEAD)
    if not first:
        stmt = stmt.where(archive.c.queue > bindparam("after", type_=archive.c.queue.type))
    return _along_dead(stmt.order_by(archive.c.queue).limit(1))


def stmt_dead_count() -> Any:
    """Dead letters of queue `queue`, up to `cap`: along the archive's index of dead letters,
    from the queue's first entry."""
    some = _along_dead(
        select(archive.c.id)
        .where(archive.c.queue == QUEUE, IS_DEAD)
        .order_by(archive.c.finished_at)
        .limit(bindparam("cap", type_=Integer))
    ).subquery()
    return select(func.count()).select_from(some)


def stmt_ready_count(keyed: bool, *, due: bool) -> Any:
    """Ready tasks of queue `queue` due by `now` (or later), up to `cap`: along the claim
    index, from the queue's first entry (in its order, so that no plan reads the table for
    them however many of its rows match)."""
    when = tasks.c.run_at <= NOW if due else tasks.c.run_at > NOW
    some = (
        select(tasks.c.id)
        .where(tasks.c.queue == QUEUE, *_ready(keyed), when)
        .order_by(*([tasks.c.partition_key] if keyed else []), *CLAIM_ORDER)
        .limit(bindparam("cap", type_=Integer))
        .subquery()
    )
    return select(func.count()).select_from(some)


def stmt_ready_head() -> Any:
    """When the task at the head of queue `queue`'s claim order (of tasks without a key)
    became due: one probe of the claim index."""
    return (
        select(tasks.c.run_at)
        .where(tasks.c.queue == QUEUE, *_ready(False), tasks.c.run_at <= NOW)
        .order_by(*CLAIM_ORDER)
        .limit(1)
    )


def stmt_next_queue(*, first: bool) -> Any:
    """The first queue with live tasks (after queue `after`): one probe of the index of queue
    and state (MariaDB/MySQL), whose every entry is a live task."""
    stmt = select(tasks.c.queue)
    if not first:
        stmt = stmt.where(tasks.c.queue > bindparam("after", type_=tasks.c.queue.type))
    return stmt.order_by(tasks.c.queue).limit(1)


def stmt_state_count(*, due: bool) -> Any:
    """Ready tasks of queue `queue` due by `now` (or later), up to `cap`: along the index of
    queue and state (MariaDB/MySQL), one range per ready state, reading no row."""
    when = tasks.c.run_at <= NOW if due else tasks.c.run_at > NOW
    some = (
        select(tasks.c.id)
        .where(tasks.c.queue == QUEUE, IS_READY, when)
        .limit(bindparam("cap", type_=Integer))
        .subquery()
    )
    return select(func.count()).select_from(some)


def stmt_state_first() -> Any:
    """When the task of queue `queue` in state `state` that is due first became due: one probe
    of the index of queue and state (MariaDB/MySQL)."""
    state = tasks.c.state == bindparam("state", type_=tasks.c.state.type)
    return select(func.min(tasks.c.run_at)).where(tasks.c.queue == QUEUE, state)


def stmt_processing_count() -> Any:
    """Processing tasks of queue `queue`: along the index of queue and state (MariaDB/MySQL)."""
    return select(func.count()).where(tasks.c.queue == QUEUE, tasks.c.state == PROCESSING)


def stmt_keys_waiting() -> Any:
    """Keys with work a claim will look at, soonest first (the keys table, not the tasks)."""
    return (
        select(keys.c.queue, keys.c.partition_key, keys.c.next_start_at)
        .where(keys.c.ready_at.is_not(None), keys.c.partition_key != "")
        .order_by(keys.c.ready_at, keys.c.id)
        .limit(bindparam("limit", type_=Integer))
    )


def stmt_keys_hinted() -> Any:
    """Keys whose tasks were enqueued since a claim last looked (hints not taken yet)."""
    return (
        select(key_hints.c.queue, key_hints.c.partition_key)
        .group_by(key_hints.c.queue, key_hints.c.partition_key)
        .order_by(func.min(key_hints.c.id))
        .limit(bindparam("limit", type_=Integer))
    )


def stmt_key_count(*, processing: bool) -> Any:
    """Tasks of key `key` in queue `queue` processing (along the running index) or waiting
    (along the keyed index), up to `cap`."""
    key = tasks.c.partition_key == bindparam("key", type_=tasks.c.partition_key.type)
    state = tasks.c.state == PROCESSING if processing else IS_READY
    some = (
        select(tasks.c.id)
        .where(tasks.c.queue == QUEUE, key, state, text(KEYED))
        .limit(bindparam("cap", type_=Integer))
        .subquery()
    )
    return select(func.count()).select_from(some)


def stmt_processing_counts() -> Any:
    """Processing tasks per queue: along the lease index."""
    return (
        select(tasks.c.queue, func.count())
        .where(tasks.c.state == PROCESSING, tasks.c.lease_expires_at.is_not(None))
        .group_by(tasks.c.queue)
    )


def stmt_finished_per_minute() -> Any:
    """Tasks finished per queue, state and minute since `since`: along the archive's index."""
    minute = minute_of(archive.c.finished_at)
    return (
        select(archive.c.queue, archive.c.state, minute, func.count())
        .where(archive.c.state.in_(FINISHED), archive.c.finished_at >= SINCE)
        .group_by(archive.c.queue, archive.c.state, minute)
    )


def stmt_arrived_per_minute() -> Any:
    """Tasks enqueued per queue and minute since `since`, in one statement (one snapshot, so
    that a task finishing meanwhile counts once): live ones backwards along the primary key
    from the newest down to id `after` (ids follow enqueue times closely), finished ones among
    those finished since (along the archive's index of state and finish time)."""
    live_minute = minute_of(tasks.c.created_at)
    live = (
        select(tasks.c.queue, live_minute.label("minute"), func.count().label("n"))
        .where(tasks.c.id > bindparam("after", type_=Integer), tasks.c.created_at >= SINCE)
        .group_by(tasks.c.queue, live_minute)
    )
    done_minute = minute_of(archive.c.created_at)
    done = along_archive_state(
        select(archive.c.queue, done_minute.label("minute"), func.count().label("n"))
        .where(
            archive.c.state.in_(FINISHED),
            archive.c.finished_at >= SINCE,
            archive.c.created_at >= SINCE,
        )
        .group_by(archive.c.queue, done_minute)
    )
    return union_all(live, done)


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
        """The filters but the error text, which `Reads.task_page` looks for itself."""
        return TaskFilter(self.queue, self.task_name, self.key).clauses(table)


def stmt_task_page(query: TaskQuery, cursor: str | None, limit: int, *columns: str) -> Any:
    """A page of tasks after `cursor` (their `columns`, default all): live ones newest first
    along the primary key, finished ones last finished first along the archive's index of
    state and finish time."""
    if query.live:
        states = [query.state] if query.state else list(LIVE)
        stmt = _select(tasks, columns).where(tasks.c.state.in_(states), *query.clauses(tasks))
        if cursor:
            stmt = stmt.where(tasks.c.id < int(cursor))
        return stmt.order_by(tasks.c.id.desc()).limit(limit)
    stmt = _select(archive, columns).where(archive.c.state == query.state, *query.clauses(archive))
    if cursor:
        stmt = stmt.where(_after(cursor))
    stmt = stmt.order_by(archive.c.finished_at.desc(), archive.c.id.desc()).limit(limit)
    return along_archive_order(stmt, by_queue=query.queue is not None)


def _minutes(now: datetime, minutes: int) -> tuple[datetime, dict[str, int]]:
    """The start of the first of the last `minutes` minutes, and each minute's slot by label
    (as `minute_of` writes it)."""
    start = (now - timedelta(minutes=minutes - 1)).replace(second=0, microsecond=0)
    labels = [(start + timedelta(minutes=i)).strftime("%Y-%m-%d %H:%M") for i in range(minutes)]
    return start, {label: i for i, label in enumerate(labels)}


def _select(table: Any, columns: tuple[str, ...]) -> Any:
    return select(*[table.c[c] for c in columns]) if columns else select(table)


def stmt_tasks_by_id(live: bool) -> Any:
    """Tasks by id (`ids`), in the order of a page: along the primary key."""
    table = tasks if live else archive
    order = [table.c.id.desc()] if live else [archive.c.finished_at.desc(), archive.c.id.desc()]
    return select(table).where(table.c.id.in_(bindparam("ids", expanding=True))).order_by(*order)


def _after(cursor: str) -> ColumnElement[bool]:
    at_text, _, id_text = cursor.partition("~")
    at, task_id = datetime.fromisoformat(at_text), int(id_text)
    return or_(
        archive.c.finished_at < at,
        and_(archive.c.finished_at == at, archive.c.id < task_id),
    )


def cursor_of(row: Any, live: bool) -> str:
    """Where the page after `row` (a task, or a row with its id and finished_at) starts."""
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

    async def depths(self, *, now: datetime, cap: int = COUNT_CAP) -> dict[str, QueueDepth]:
        """Per queue: ready tasks due now and scheduled later (each up to `cap`), when the head
        of its claim order became due, processing tasks and dead letters."""
        if self.driver.db.engine.dialect.name in ("mysql", "mariadb"):
            return await self._depths_by_state(now=now, cap=cap)
        found: dict[str, QueueDepth] = {}
        async with self.driver.db.connect() as conn:
            for keyed in (False, True):
                queues = (await conn.execute(stmt_ready_queues(keyed))).scalars().all()
                for queue in queues:
                    depth = found.setdefault(queue, QueueDepth(queue))
                    params = {"queue": queue, "now": now, "cap": cap}
                    due = await conn.execute(stmt_ready_count(keyed, due=True), params)
                    later = await conn.execute(stmt_ready_count(keyed, due=False), params)
                    depth.ready += int(due.scalar_one())
                    depth.scheduled += int(later.scalar_one())
                    if not keyed:
                        head = await conn.execute(stmt_ready_head(), params)
                        depth.oldest_ready = head.scalar_one_or_none()
            for queue, count in (await conn.execute(stmt_processing_counts())).all():
                found.setdefault(queue, QueueDepth(queue)).processing = int(count)
            await self._dead_counts(conn, found, cap)
        for depth in found.values():
            depth.capped = depth.ready >= cap or depth.scheduled >= cap or depth.dead >= cap
        return found

    async def _depths_by_state(self, *, now: datetime, cap: int) -> dict[str, QueueDepth]:
        """`depths` where the claim index holds every row without its state (MariaDB/MySQL):
        along the index of queue and state, one probe per queue to find them, then bounded
        counts of each. The oldest ready task there is the one due first, with or without a
        key."""
        found: dict[str, QueueDepth] = {}
        async with self.driver.db.connect() as conn:
            queue = (await conn.execute(stmt_next_queue(first=True))).scalar()
            while queue is not None:
                depth = found[queue] = QueueDepth(queue)
                params = {"queue": queue, "now": now, "cap": cap}
                due = await conn.execute(stmt_state_count(due=True), params)
                later = await conn.execute(stmt_state_count(due=False), params)
                depth.ready, depth.scheduled = int(due.scalar_one()), int(later.scalar_one())
                if depth.ready:
                    for state in READY_STATES:
                        params["state"] = state.value
                        first = (await conn.execute(stmt_state_first(), params)).scalar()
                        if first is not None and first <= now:
                            depth.oldest_ready = min(first, depth.oldest_ready or first)
                running = await conn.execute(stmt_processing_count(), params)
                depth.processing = int(running.scalar_one())
                after = await conn.execute(stmt_next_queue(first=False), {"after": queue})
                queue = after.scalar()
            await self._dead_counts(conn, found, cap)
        for depth in found.values():
            depth.capped = depth.ready >= cap or depth.scheduled >= cap or depth.dead >= cap
        return found

    async def _dead_counts(self, conn: Any, found: dict[str, QueueDepth], cap: int) -> None:
        """Each queue's dead letters, up to `cap`, one bounded count per queue that has some."""
        queue = (await conn.execute(stmt_dead_next_queue(first=True))).scalar()
        while queue is not None:
            dead = await conn.execute(stmt_dead_count(), {"queue": queue, "cap": cap})
            found.setdefault(queue, QueueDepth(queue)).dead = int(dead.scalar_one())
            after = await conn.execute(stmt_dead_next_queue(first=False), {"after": queue})
            queue = after.scalar()

    async def busy_keys(
        self, *, now: datetime, limit: int = 20, cap: int = COUNT_CAP
    ) -> list[KeyStats]:
        """Up to `limit` keys with tasks waiting, soonest first, with their tasks waiting and
        processing (each up to `cap`) and when their rate lets the next one start."""
        found = []
        async with self.driver.db.connect() as conn:
            waiting = (await conn.execute(stmt_keys_waiting(), {"limit": limit})).all()
            hinted = (await conn.execute(stmt_keys_hinted(), {"limit": limit})).all()
            starts = {(q, k): t for q, k, t in waiting}
            for q, k in hinted:
                starts.setdefault((q, k), None)
            for (queue, key), next_start in list(starts.items())[:limit]:
                params = {"queue": queue, "key": key, "cap": cap}
                ready = await conn.execute(stmt_key_count(processing=False), params)
                running = await conn.execute(stmt_key_count(processing=True), params)
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
        """Per queue and state, the tasks finished in each of the last `minutes` minutes
        (oldest first)."""
        start, index = _minutes(now, minutes)
        found: dict[str, dict[str, list[int]]] = {}
        async with self.driver.db.connect() as conn:
            rows = await conn.execute(stmt_finished_per_minute(), {"since": start})
            for queue, state, minute, count in rows.all():
                slot = index.get(minute)
                if slot is not None:
                    series = found.setdefault(queue, {}).setdefault(state, [0] * minutes)
                    series[slot] += int(count)
        return found

    async def arrived_per_minute(self, *, now: datetime, minutes: int = 60) -> dict[str, list[int]]:
        """Per queue, the tasks enqueued in each of the last `minutes` minutes (oldest first),
        live or finished since."""
        start, index = _minutes(now, minutes)
        # from a task enqueued a few minutes before the window: one a little out of id order
        # (concurrent transactions, clocks) still counts
        margin = start - timedelta(minutes=ARRIVAL_MARGIN_MINUTES)
        found: dict[str, list[int]] = {}
        async with self.driver.db.connect() as conn:
            after = (await conn.execute(stmt_newest_before(margin))).scalar()
            params = {"since": start, "after": -1 if after is None else int(after)}
            rows = (await conn.execute(stmt_arrived_per_minute(), params)).all()
        for queue, minute, count in rows:
            slot = index.get(minute)
            if slot is not None:
                found.setdefault(queue, [0] * minutes)[slot] += int(count)
        return found

    async def task_page(self, query: TaskQuery, cursor: str | None, limit: int) -> TaskPage:
        """A page of tasks matching `query` after `cursor`. Text in the error is looked for
        among the next `SEARCH_WINDOW` tasks matching the rest (case-insensitive): a page may
        then hold fewer tasks than `limit` and still have a next one."""
        if query.error:
            return await self._error_page(query, cursor, limit)
        async with self.driver.db.connect() as conn:
            result = await conn.execute(stmt_task_page(query, cursor, limit + 1))
            rows = [TaskRow.from_row(r) for r in result.mappings().all()]
        more = len(rows) > limit
        rows = rows[:limit]
        return TaskPage(rows, cursor_of(rows[-1], query.live) if more and rows else None)

    async def _error_page(self, query: TaskQuery, cursor: str | None, limit: int) -> TaskPage:
        needle = (query.error or "").lower()
        columns = ("id", "last_error") if query.live else ("id", "last_error", "finished_at")
        async with self.driver.db.connect() as conn:
            window = (
                await conn.execute(stmt_task_page(query, cursor, SEARCH_WINDOW, *columns))
            ).all()
            found = [r for r in window if needle in (r.last_error or "").lower()]
            ids = [r.id for r in found[:limit]]
            result = await conn.execute(stmt_tasks_by_id(query.live), {"ids": ids}) if ids else None
            rows = [TaskRow.from_row(r) for r in result.mappings().all()] if result else []
        if len(found) > limit:
            return TaskPage(rows, cursor_of(found[limit - 1], query.live))
        full = len(window) == SEARCH_WINDOW
        return TaskPage(rows, cursor_of(window[-1], query.live) if full else None)

    async def task_run_now(self, task_id: int, *, now: datetime) -> str | None:
        """Make a waiting task (pending or retryable) due now; its queue, or None when it is not
        waiting any more. A task with a key leaves a hint, so that claims look at its key now
        rather than when its next task was due."""
        ready = [s.value for s in READY_STATES]
        waiting = (tasks.c.id == task_id, tasks.c.state.in_(ready))
        async with self.driver.db.begin() as conn:
            found = await conn.execute(select(tasks.c.queue, tasks.c.partition_key).where(*waiting))
            row = found.first()
            if row is None:
                return None
            await conn.execute(update(tasks).where(*waiting).values(run_at=now))
            hints = hints_step([(row.queue, row.partition_key, now)])
            if hints:
                await conn.execute(*hints)
        return str(row.queue)
