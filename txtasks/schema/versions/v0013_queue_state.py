"""The hot table's tasks by queue and state on MariaDB/MySQL, for counts that read no row.

There the claim index holds every row of a queue without its state (the database has no
partial index), so counting a queue's ready, scheduled or processing tasks looked up a row per
index entry, and read a whole queue when few of its tasks matched. The index
(queue, state, run_at) answers each of those counts from as many index entries as it counts,
and finds the queues with live tasks by one probe each. PostgreSQL and SQLite count along
their partial claim indexes and get no new index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 13
NAME = "queue_state"


def upgrade(op: Operations) -> None:
    if op.get_context().dialect.name in ("mysql", "mariadb"):
        op.create_index("ix_txtasks_tasks_state", "txtasks_tasks", ["queue", "state", "run_at"])
