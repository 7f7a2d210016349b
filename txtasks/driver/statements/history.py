"""The statements of the queues' history (`txtasks_history`): the cleaner's stats sweep counts
the tasks enqueued and finished in each minute that is over (as the dashboard's last hour counts
them, bounded above by the minute's end) and writes a row per minute and queue where none is;
the dashboard sums them into buckets of a day or a week. Minutes are numbers (minutes since
1970-01-01 UTC: `txtasks.driver.history.minute_number`), so that a bucket is integer arithmetic on
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
)

from txtasks.driver.statements import Statements
from txtasks.driver.statements.dashboard import arrived_per_minute, finished_per_minute
from txtasks.schema.tables import Timestamp, history

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
        """Tasks finished per queue, state and minute from `since` to `until`, as the
        dashboard's last hour counts them (`finished_per_minute`)."""
        return finished_per_minute(UNTIL)

    @staticmethod
    @functools.cache
    def stmt_arrived_between() -> Executable:
        """Tasks enqueued per queue and minute from `since` to `until`, as the dashboard's
        last hour counts them (`arrived_per_minute`)."""
        return arrived_per_minute(UNTIL)

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
