"""Control: cancelling a running task, and pausing a queue.

- `cancel_requested_at` on the hot table and the archive: set when a cancel is asked for while
  a task is processing; its worker notices, and its outcome is recorded as cancelled. Nullable,
  so adding it rewrites no row (PostgreSQL, MariaDB 10.3+ and SQLite add it in place).
- `txtasks_paused_queues`: one row per paused queue; every claim skips those queues.

No index is added: a cancel finds its tasks by primary key, and the claims read the paused
queues by theirs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Column, DateTime, String
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 11
NAME = "control"

_TS = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_NAME = String(128).with_variant(mysql.VARBINARY(128), "mysql", "mariadb")


def upgrade(op: Operations) -> None:
    for table in ("txtasks_tasks", "txtasks_archive"):
        op.add_column(table, Column("cancel_requested_at", _TS, nullable=True))
    op.create_table(
        "txtasks_paused_queues",
        Column("queue", _NAME, primary_key=True),
        Column("paused_at", _TS, nullable=False),
        mysql_engine="InnoDB",
    )
