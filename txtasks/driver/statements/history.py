"""The statements of the queues' history (`txtasks_history`): the cleaner's stats sweep counts
the tasks enqueued and finished in each minute that is over (as the dashboard's last hour counts
them, bounded above by the minute's end) and writes a row per minute and queue where none is;
the dashboard sums them into buckets of a day or a week. Minutes are numbers (minutes since
1970-01-01 UTC: `txtasks.driver.base.minute_number`), so that a bucket is integer arithmetic on
every database.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    Executable,
    Integer,
    bindparam,
    delete,
    func,
    literal_column,
    select,
    union_all,
)

from txtasks.driver.base import FINISHED
from txtasks.driver.statements import Statements
from txtasks.driver.statements.dashboard import minute_of
from txtasks.schema.tables import Timestamp, along_archive_state, archive, history, tasks

SINCE = bindparam("since", type_=Timestamp)
UNTIL = bindparam("until", type_=Timestamp)
#: The columns of a row of the history, in order.
HISTORY_COLUMNS = ("minute", "queue", "enqueued", "completed", "failed", "dead")


class HistoryStatements(Statements):
    """The history's writes (the stats sweep) and reads (the queue page)."""

    @staticmethod
    @functools.cache
    def stmt_history_last() -> Executable:
        """The last minute written: one probe of the primary key (minute, queue)."""
        return select(func.max(history.c.minute))

    @staticmethod
    @functools.cache
    def stmt_finished_between() -> Executable:
        """Tasks finished per queue, state and minute from `since` to `until`: along the
        archive's index of state and finish time."""
        minute = minute_of(archive.c.finished_at)
        return (
            select(archive.c.queue, archive.c.state, minute, func.count())
            .where(
                archive.c.state.in_(FINISHED),
                archive.c.finished_at >= SINCE,
                archive.c.finished_at < UNTIL,
            )
            .group_by(archive.c.queue, archive.c.state, minute)
        )

    @staticmethod
    @functools.cache
    def stmt_arrived_between() -> Executable:
        """Tasks enqueued per queue and minute from `since` to `until`, in one statement: live
        ones backwards along the primary key down to id `after`, finished ones among those
        finished since `since` (the archive's index of state and finish time); as
        `DashboardStatements.stmt_arrived_per_minute` counts the last hour."""
        live_minute = minute_of(tasks.c.created_at)
        live = (
            select(tasks.c.queue, live_minute.label("minute"), func.count().label("n"))
            .where(
                tasks.c.id > bindparam("after", type_=Integer),
                tasks.c.created_at >= SINCE,
                tasks.c.created_at < UNTIL,
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
                archive.c.created_at < UNTIL,
            )
            .group_by(archive.c.queue, done_minute)
        )
        return union_all(live, done)

    @classmethod
    @functools.cache
    def stmt_history_insert(cls) -> Executable:
        """Insert a row of the history (`HISTORY_COLUMNS`) unless one of its minute and queue
        is there: the row another cleaner (or an earlier pass) wrote stays as it is."""
        values: dict[str, Any] = {c: bindparam(c) for c in HISTORY_COLUMNS}
        stmt = cls.sql.upsert(history).values(**values)
        return stmt.on_conflict_do_nothing(index_elements=["minute", "queue"])  # type: ignore[no-any-return]

    @staticmethod
    @functools.cache
    def stmt_history_purge() -> Executable:
        """Delete the minutes before minute `before`: along the primary key."""
        return delete(history).where(history.c.minute < bindparam("before", type_=Integer))

    @staticmethod
    @functools.cache
    def stmt_history_buckets(minutes: int) -> Executable:
        """Per queue and bucket of `minutes` minutes (its first minute), the sums of the
        minutes from `first` up to `last` (minute numbers, `last` excluded): along the primary
        key."""
        size: Any = literal_column(str(int(minutes)))
        bucket = (history.c.minute - history.c.minute % size).label("bucket")
        return (
            select(
                history.c.queue,
                bucket,
                func.sum(history.c.enqueued),
                func.sum(history.c.completed),
                func.sum(history.c.failed),
                func.sum(history.c.dead),
            )
            .where(
                history.c.minute >= bindparam("first", type_=Integer),
                history.c.minute < bindparam("last", type_=Integer),
            )
            .group_by(history.c.queue, bucket)
        )
