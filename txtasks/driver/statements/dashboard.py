"""The dashboard's statements (the `Dashboard` role), each along an index of
`txtasks.schema.tables` so that a page stays fast on a hot table of millions of rows
(`tests/web/test_plans.py` checks the plans): counts per queue along the claim, lease and stage
indexes, the tasks each worker runs along the lease index (where the claim index holds no state, `depths_by_state`: along the index of queue and
state), finished tasks per minute along the archive's index of state and finish time, tasks
enqueued per minute backwards along the primary key and among those finished, and pages of tasks
by keyset (the primary key for live tasks, the archive's index for finished ones). Nothing here
takes SQL from a user: filters are bound values.

`minute_of` is an SQL function of every database: the generic form (SQLite's `strftime`) is
here, PostgreSQL's and MySQL's are registered by their dialect modules.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    Executable,
    Integer,
    Select,
    and_,
    bindparam,
    func,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import FunctionElement

from txtasks.driver.base import FINISHED, LIVE, TaskQuery, finished_cursor
from txtasks.driver.statements import Statements
from txtasks.schema.tables import (
    IS_DEAD,
    IS_READY,
    KEYED,
    PROCESSING,
    UNKEYED,
    Timestamp,
    along_archive_order,
    along_archive_state,
    archive,
    key_hints,
    keys,
    tasks,
)
from txtasks.types import RunningTask

NOW = bindparam("now", type_=Timestamp)
QUEUE = bindparam("queue", type_=tasks.c.queue.type)
SINCE = bindparam("since", type_=Timestamp)
#: The order of the claim indexes after the queue (and key).
CLAIM_ORDER = (tasks.c.priority.desc(), tasks.c.run_at, tasks.c.id)


class minute_of(FunctionElement[str]):  # an SQL function, named like one
    """The minute of a timestamp as text ('YYYY-MM-DD HH:MM', as
    `txtasks.driver.base.minute_label` writes it), on every database: PostgreSQL's and MySQL's
    forms are compiled by their dialect modules."""

    inherit_cache = True


@compiles(minute_of)
def _minute_generic(element: minute_of, compiler: SQLCompiler, **kw: Any) -> str:
    return f"strftime('%Y-%m-%d %H:%M', {compiler.process(element.clauses, **kw)})"


def _ready(keyed: bool) -> list[Any]:
    """The condition of the (keyed) claim index: only rows in it are read."""
    return [IS_READY, text(KEYED if keyed else UNKEYED)]


def _select(table: Any, columns: tuple[str, ...]) -> Any:
    return select(*[table.c[c] for c in columns]) if columns else select(table)


def _after(cursor: str) -> ColumnElement[bool]:
    """The finished tasks after `cursor` in the order of a page (last finished first)."""
    at, task_id = finished_cursor(cursor)
    return or_(
        archive.c.finished_at < at,
        and_(archive.c.finished_at == at, archive.c.id < task_id),
    )


def finished_per_minute(*until: Any) -> Select[Any]:
    """Tasks finished per queue, state and minute since `since` (and before `until`, a
    bound parameter, if given): along the archive's index of state and finish time."""
    minute = minute_of(archive.c.finished_at)
    return (
        select(archive.c.queue, archive.c.state, minute, func.count())
        .where(
            archive.c.state.in_(FINISHED),
            archive.c.finished_at >= SINCE,
            *[archive.c.finished_at < bound for bound in until],
        )
        .group_by(archive.c.queue, archive.c.state, minute)
    )


def arrived_per_minute(*until: Any) -> CompoundSelect[Any]:
    """Tasks enqueued per queue and minute since `since` (and before `until`, a bound
    parameter, if given), in one statement (one snapshot, so that a task finishing meanwhile
    counts once): live ones backwards along the primary key from the newest down to id
    `after` (ids follow enqueue times closely), finished ones among those finished since
    (along the archive's index of state and finish time)."""
    live_minute = minute_of(tasks.c.created_at)
    live = (
        select(tasks.c.queue, live_minute.label("minute"), func.count().label("n"))
        .where(
            tasks.c.id > bindparam("after", type_=Integer),
            tasks.c.created_at >= SINCE,
            *[tasks.c.created_at < bound for bound in until],
        )
        .group_by(tasks.c.queue, live_minute)
    )
    done_minute = minute_of(archive.c.created_at)
    done = along_archive_state(
        select(archive.c.queue, done_minute.label("minute"), func.count().label("n"))
        .where(
            archive.c.state.in_(FINISHED),
            archive.c.finished_at >= SINCE,
            archive.c.created_at >= SINCE,
            *[archive.c.created_at < bound for bound in until],
        )
        .group_by(archive.c.queue, done_minute)
    )
    return union_all(live, done)


class DashboardStatements(Statements):
    """The dashboard's reads: depths, busy keys, counts per minute, pages of tasks."""

    #: The claim index holds every ready row without its state (MariaDB/MySQL, which have no
    #: partial indexes): `depths` then goes along the index of queue and state instead.
    depths_by_state: ClassVar[bool] = False

    @staticmethod
    def along_dead(stmt: Any) -> Any:
        """`stmt` (of dead letters) along the archive's index of dead letters: the planner's
        own choice, but on MariaDB/MySQL (see mysql.py)."""
        return stmt

    @staticmethod
    def along_ids(stmt: Any) -> Any:
        """`stmt` (a window of live tasks a search reads, newest first) backwards along the
        primary key: the planner's own choice, but on MariaDB/MySQL (see mysql.py)."""
        return stmt

    @staticmethod
    @functools.cache
    def stmt_ready_queues(keyed: bool) -> Executable:
        """The queues that may have ready tasks, one index probe each: a loose scan of the
        (keyed) claim index, which starts with the queue."""

        def after(previous: Any) -> Any:
            stmt = select(tasks.c.queue).where(*_ready(keyed))
            if previous is not None:
                stmt = stmt.where(tasks.c.queue > previous)
            return stmt.order_by(tasks.c.queue).limit(1).scalar_subquery()

        found = select(after(None).label("queue")).cte("ready_queues", recursive=True)
        found = found.union_all(select(after(found.c.queue)).where(found.c.queue.is_not(None)))
        return select(found.c.queue).where(found.c.queue.is_not(None))

    @classmethod
    @functools.cache
    def stmt_dead_next_queue(cls, *, first: bool) -> Executable:
        """The first queue with dead letters (after queue `after`): one probe of the archive's
        index of dead letters. One statement per queue: MariaDB runs the recursive form of this
        loose scan (`stmt_ready_queues`) as a scan of the index per queue."""
        stmt = select(archive.c.queue).where(IS_DEAD)
        if not first:
            stmt = stmt.where(archive.c.queue > bindparam("after", type_=archive.c.queue.type))
        return cls.along_dead(stmt.order_by(archive.c.queue).limit(1))  # type: ignore[no-any-return]

    @classmethod
    @functools.cache
    def stmt_dead_count(cls) -> Executable:
        """Dead letters of queue `queue`, up to `cap`: along the archive's index of dead
        letters, from the queue's first entry."""
        some = cls.along_dead(
            select(archive.c.id)
            .where(archive.c.queue == QUEUE, IS_DEAD)
            .order_by(archive.c.finished_at)
            .limit(bindparam("cap", type_=Integer))
        ).subquery()
        return select(func.count()).select_from(some)

    @staticmethod
    @functools.cache
    def stmt_ready_count(keyed: bool, *, due: bool) -> Executable:
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

    @staticmethod
    @functools.cache
    def stmt_ready_head() -> Executable:
        """When the task at the head of queue `queue`'s claim order (of tasks without a key)
        became due: one probe of the claim index."""
        return (
            select(tasks.c.run_at)
            .where(tasks.c.queue == QUEUE, *_ready(False), tasks.c.run_at <= NOW)
            .order_by(*CLAIM_ORDER)
            .limit(1)
        )

    @staticmethod
    @functools.cache
    def stmt_next_queue(*, first: bool) -> Executable:
        """The first queue with live tasks (after queue `after`): one probe of the index of
        queue and state (`depths_by_state`), whose every entry is a live task."""
        stmt = select(tasks.c.queue)
        if not first:
            stmt = stmt.where(tasks.c.queue > bindparam("after", type_=tasks.c.queue.type))
        return stmt.order_by(tasks.c.queue).limit(1)

    @staticmethod
    @functools.cache
    def stmt_state_count(*, due: bool) -> Executable:
        """Ready tasks of queue `queue` due by `now` (or later), up to `cap`: along the index
        of queue and state (`depths_by_state`), one range per ready state, reading no row."""
        when = tasks.c.run_at <= NOW if due else tasks.c.run_at > NOW
        some = (
            select(tasks.c.id)
            .where(tasks.c.queue == QUEUE, IS_READY, when)
            .limit(bindparam("cap", type_=Integer))
            .subquery()
        )
        return select(func.count()).select_from(some)

    @staticmethod
    @functools.cache
    def stmt_state_first() -> Executable:
        """When the task of queue `queue` in state `state` that is due first became due: one
        probe of the index of queue and state (`depths_by_state`)."""
        state = tasks.c.state == bindparam("state", type_=tasks.c.state.type)
        return select(func.min(tasks.c.run_at)).where(tasks.c.queue == QUEUE, state)

    @staticmethod
    @functools.cache
    def stmt_processing_count() -> Executable:
        """Processing tasks of queue `queue`: along the index of queue and state
        (`depths_by_state`)."""
        return select(func.count()).where(tasks.c.queue == QUEUE, tasks.c.state == PROCESSING)

    @staticmethod
    @functools.cache
    def stmt_processing_counts() -> Executable:
        """Processing tasks per queue: along the lease index."""
        return (
            select(tasks.c.queue, func.count())
            .where(tasks.c.state == PROCESSING, tasks.c.lease_expires_at.is_not(None))
            .group_by(tasks.c.queue)
        )

    @staticmethod
    @functools.cache
    def stmt_running() -> Executable:
        """Processing tasks, the first `per_worker` each worker started and how many it runs
        (`total`): along the lease index, which holds only the tasks running now."""
        by_worker = tasks.c.worker_id
        place = func.row_number().over(
            partition_by=by_worker, order_by=(tasks.c.started_at, tasks.c.id)
        )
        running = (
            select(
                *[tasks.c[c] for c in RunningTask.__slots__],
                place.label("place"),
                func.count().over(partition_by=by_worker).label("total"),
            )
            .where(tasks.c.state == PROCESSING, tasks.c.lease_expires_at.is_not(None))
            .subquery("running")
        )
        return (
            select(running)
            .where(running.c.place <= bindparam("per_worker", type_=Integer))
            .order_by(running.c.worker_id, running.c.place)
        )

    @staticmethod
    @functools.cache
    def stmt_keys_waiting() -> Executable:
        """Keys with work a claim will look at, soonest first (the keys table, not the
        tasks)."""
        return (
            select(keys.c.queue, keys.c.partition_key, keys.c.next_start_at)
            .where(keys.c.ready_at.is_not(None), keys.c.partition_key != "")
            .order_by(keys.c.ready_at, keys.c.id)
            .limit(bindparam("limit", type_=Integer))
        )

    @staticmethod
    @functools.cache
    def stmt_keys_hinted() -> Executable:
        """Keys whose tasks were enqueued since a claim last looked (hints not taken yet)."""
        return (
            select(key_hints.c.queue, key_hints.c.partition_key)
            .group_by(key_hints.c.queue, key_hints.c.partition_key)
            .order_by(func.min(key_hints.c.id))
            .limit(bindparam("limit", type_=Integer))
        )

    @staticmethod
    @functools.cache
    def stmt_key_count(*, processing: bool) -> Executable:
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

    @staticmethod
    @functools.cache
    def stmt_finished_per_minute() -> Executable:
        """Tasks finished per queue, state and minute since `since`: along the archive's
        index."""
        return finished_per_minute()

    @staticmethod
    @functools.cache
    def stmt_arrived_per_minute() -> Executable:
        """Tasks enqueued per queue and minute since `since` (`arrived_per_minute`)."""
        return arrived_per_minute()

    @staticmethod
    @functools.cache
    def stmt_finished_times() -> Executable:
        """The last `limit` tasks finished in state `state` since `since`: their task and
        times, last finished first, along the archive's index of state and finish time (at
        most `limit` entries and rows read)."""
        state = archive.c.state == bindparam("state", type_=archive.c.state.type)
        stmt = (
            select(
                archive.c.task_name,
                archive.c.state,
                archive.c.run_at,
                archive.c.started_at,
                archive.c.finished_at,
            )
            .where(state, archive.c.finished_at >= SINCE)
            .order_by(archive.c.finished_at.desc())
            .limit(bindparam("limit", type_=Integer))
        )
        return along_archive_state(stmt)  # type: ignore[no-any-return]

    @staticmethod
    def stmt_task_page(
        query: TaskQuery, cursor: str | None, limit: int, *columns: str
    ) -> Executable:
        """A page of tasks after `cursor` (their `columns`, default all): live ones newest
        first along the primary key, finished ones last finished first along the archive's
        index of state and finish time."""
        if query.live:
            states = [query.state] if query.state else list(LIVE)
            stmt = _select(tasks, columns).where(
                tasks.c.state.in_(states), *query.where.clauses(tasks)
            )
            if cursor:
                stmt = stmt.where(tasks.c.id < int(cursor))
            return stmt.order_by(tasks.c.id.desc()).limit(limit)  # type: ignore[no-any-return]
        stmt = _select(archive, columns).where(
            archive.c.state == query.state, *query.where.clauses(archive)
        )
        if cursor:
            stmt = stmt.where(_after(cursor))
        stmt = stmt.order_by(archive.c.finished_at.desc(), archive.c.id.desc()).limit(limit)
        return along_archive_order(stmt, by_queue=query.queue is not None)  # type: ignore[no-any-return]

    @staticmethod
    @functools.cache
    def stmt_tasks_by_id(live: bool) -> Executable:
        """Tasks by id (`ids`), in the order of a page: along the primary key."""
        table = tasks if live else archive
        order = [table.c.id.desc()] if live else [archive.c.finished_at.desc(), archive.c.id.desc()]
        return (
            select(table).where(table.c.id.in_(bindparam("ids", expanding=True))).order_by(*order)
        )
