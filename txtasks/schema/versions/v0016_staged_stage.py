"""Staged rows keyed by their partition attempt's number and their own: `(stage, n)`.

A partition attempt draws a number once (its row of the new `txtasks_stages`, which keeps its
write key and stage id once), and numbers its rows 0, 1, ...: the staged table's primary key is
`(stage, n)`, its one index, with no sequence drawn per row and no write key or stage id in each
row. A deferred commit's attempts (`txtasks_deferred`) are keyed by that number too.

Rows staged before (of open writes, and of deferred commits not yet published) are moved: each
attempt gets its number, its rows their numbers in staging order; a deferred attempt left with
no row (its last batch not yet taken) had nothing more to publish and is dropped.
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
    Text,
    column,
    func,
    insert,
    literal_column,
    select,
    table,
)
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 16
NAME = "staged_stage"

_ID = BigInteger().with_variant(Integer(), "sqlite")
_TS = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_BLOB = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
_KEY = String(255).with_variant(mysql.VARBINARY(255), "mysql", "mariadb")
_COMMIT = String(255).with_variant(mysql.VARBINARY(255), "mysql", "mariadb")

#: The staged table's columns besides its key, as version 15 has them.
ROW_COLUMNS = ("payload", "priority", "run_at", "dedup_key", "created_at", "partition_key")
DEFERRED_COLUMNS = ("commit_id", "target", "committed_at")

old_staged = table(
    "txtasks_staged", *(column(c) for c in ("id", "write_key", "stage_id", *ROW_COLUMNS))
)
old_deferred = table(
    "txtasks_deferred", *(column(c) for c in ("stage_id", "write_key", *DEFERRED_COLUMNS))
)
stages = table("txtasks_stages", column("id"), column("write_key"), column("stage_id"))
new_stages = table("txtasks_stages", column("write_key"), column("stage_id"), column("created_at"))
moved_staged = table("txtasks_staged_moved", *(column(c) for c in ("stage", "n", *ROW_COLUMNS)))
moved_deferred = table("txtasks_deferred_moved", *(column(c) for c in ("stage", *DEFERRED_COLUMNS)))


def _staged_columns() -> list[Column[Any]]:
    """The staged table's columns, keyed by `(stage, n)` (the rows set aside too: a server that
    requires a primary key, MySQL's `sql_require_primary_key` or MariaDB's
    `innodb_force_primary_key`, refuses a table without one)."""
    return [
        Column("stage", _ID, primary_key=True, autoincrement=False, nullable=False),
        Column("n", Integer, primary_key=True, autoincrement=False, nullable=False),
        Column("payload", _BLOB, nullable=False),
        Column("priority", Integer, nullable=False),
        Column("run_at", _TS, nullable=False),
        Column("dedup_key", _KEY, nullable=True),
        Column("created_at", _TS, nullable=False),
        Column("partition_key", _KEY, nullable=True),
    ]


def _deferred_columns() -> list[Column[Any]]:
    """The deferred attempts' columns, keyed by `stage` (the rows set aside too)."""
    return [
        Column("stage", _ID, primary_key=True, autoincrement=False, nullable=False),
        Column("commit_id", _COMMIT, nullable=False),
        Column("target", Text, nullable=False),
        Column("committed_at", _TS, nullable=False),
    ]


def _copy(op: Operations, source: Any, name: str, names: tuple[str, ...]) -> None:
    target = table(name, *(column(n) for n in names))
    op.execute(insert(target).from_select(names, select(*(source.c[n] for n in names))))


def upgrade(op: Operations) -> None:
    op.create_table(
        "txtasks_stages",
        Column("id", _ID, primary_key=True, autoincrement=True),
        Column("write_key", String(32), nullable=False),
        Column("stage_id", String(64), nullable=False),
        Column("created_at", _TS, nullable=False),
        mysql_engine="InnoDB",
        sqlite_autoincrement=True,
    )
    op.create_index("ix_txtasks_stages_write", "txtasks_stages", ["write_key"])

    # every attempt with staged rows gets its number (in the order its rows were staged)
    s = old_staged.c
    attempts = (
        select(s.write_key, s.stage_id, func.min(s.created_at))
        .group_by(s.write_key, s.stage_id)
        .order_by(func.min(s.id))
    )
    op.execute(insert(new_stages).from_select(["write_key", "stage_id", "created_at"], attempts))

    # the rows, numbered within their attempt, set aside while the table is made again
    op.create_table("txtasks_staged_moved", *_staged_columns(), mysql_engine="InnoDB")
    number = func.row_number().over(partition_by=stages.c.id, order_by=s.id) - literal_column("1")
    joined = old_staged.join(
        stages, (stages.c.write_key == s.write_key) & (stages.c.stage_id == s.stage_id)
    )
    rows = select(stages.c.id, number, *(s[c] for c in ROW_COLUMNS)).select_from(joined)
    op.execute(insert(moved_staged).from_select(["stage", "n", *ROW_COLUMNS], rows))
    op.drop_index("ix_txtasks_staged_write", table_name="txtasks_staged")
    op.drop_table("txtasks_staged")
    op.create_table("txtasks_staged", *_staged_columns(), mysql_engine="InnoDB")
    _copy(op, moved_staged, "txtasks_staged", ("stage", "n", *ROW_COLUMNS))
    op.drop_table("txtasks_staged_moved")

    # deferred attempts: keyed by their number
    d = old_deferred.c
    op.create_table("txtasks_deferred_moved", *_deferred_columns(), mysql_engine="InnoDB")
    joined = old_deferred.join(
        stages, (stages.c.write_key == d.write_key) & (stages.c.stage_id == d.stage_id)
    )
    rows = select(stages.c.id, *(d[c] for c in DEFERRED_COLUMNS)).select_from(joined)
    op.execute(insert(moved_deferred).from_select(["stage", *DEFERRED_COLUMNS], rows))
    op.drop_index("ix_txtasks_deferred_write", table_name="txtasks_deferred")
    op.drop_table("txtasks_deferred")
    op.create_table("txtasks_deferred", *_deferred_columns(), mysql_engine="InnoDB")
    names = ("stage", *DEFERRED_COLUMNS)
    _copy(op, moved_deferred, "txtasks_deferred", names)
    op.drop_table("txtasks_deferred_moved")
