"""Staged rows carry no times of their own: `run_at` only when the write names a run_at column
(NULL: due when the task is published), and no `created_at` (a task is created when it is
published; the attempt's row keeps when it staged, for the cleaner's purge).

MariaDB parses every timestamp literal of a multi-row INSERT; two per staged row were a third of
its staging time. The staged table is made again (SQLite cannot alter a column's NULL), its rows
kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    LargeBinary,
    String,
    column,
    insert,
    select,
    table,
)
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 17
NAME = "staged_times"

_ID = BigInteger().with_variant(Integer(), "sqlite")
_TS = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_BLOB = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
_KEY = String(255).with_variant(mysql.VARBINARY(255), "mysql", "mariadb")

#: The columns kept, as version 16 has them.
KEPT = ("stage", "n", "payload", "priority", "run_at", "dedup_key", "partition_key")


def _staged_columns() -> list[Column[Any]]:
    """The staged table's columns from this version on (the rows set aside too: a server that
    requires a primary key refuses a table without one)."""
    return [
        Column("stage", _ID, primary_key=True, autoincrement=False, nullable=False),
        Column("n", Integer, primary_key=True, autoincrement=False, nullable=False),
        Column("payload", _BLOB, nullable=False),
        Column("priority", Integer, nullable=False),
        Column("run_at", _TS, nullable=True),
        Column("dedup_key", _KEY, nullable=True),
        Column("partition_key", _KEY, nullable=True),
    ]


def _copy(op: Operations, source: str, target: str) -> None:
    columns: list[Any] = [column(c) for c in KEPT]
    rows = select(*columns).select_from(table(source, *columns))
    op.execute(insert(table(target, *(column(c) for c in KEPT))).from_select(KEPT, rows))


def upgrade(op: Operations) -> None:
    op.create_table("txtasks_staged_moved", *_staged_columns(), mysql_engine="InnoDB")
    _copy(op, "txtasks_staged", "txtasks_staged_moved")
    op.drop_table("txtasks_staged")
    op.create_table("txtasks_staged", *_staged_columns(), mysql_engine="InnoDB")
    _copy(op, "txtasks_staged_moved", "txtasks_staged")
    op.drop_table("txtasks_staged_moved")
