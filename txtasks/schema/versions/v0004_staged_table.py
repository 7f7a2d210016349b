"""Staged writes (Spark) get a table of their own: the commit copies them into the hot table.

The staged table has one index (the write and its attempts) and none of the hot table's, so
staging is cheap, and the commit inserts each row once instead of rewriting it in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import BigInteger, Column, DateTime, Integer, LargeBinary, String
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 4
NAME = "staged_table"

_ID = BigInteger().with_variant(Integer(), "sqlite")
_TS = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_BLOB = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
_KEY = String(255).with_variant(mysql.VARBINARY(255), "mysql", "mariadb")


def upgrade(op: Operations) -> None:
    op.create_table(
        "txtasks_staged",
        Column("id", _ID, primary_key=True, autoincrement=True),
        Column("write_key", String(32), nullable=False),
        Column("stage_id", String(64), nullable=False),
        Column("payload", _BLOB, nullable=False),
        Column("priority", Integer, nullable=False),
        Column("run_at", _TS, nullable=False),
        Column("dedup_key", _KEY, nullable=True),
        Column("created_at", _TS, nullable=False),
        mysql_engine="InnoDB",
        sqlite_autoincrement=True,
    )
    op.create_index("ix_txtasks_staged_write", "txtasks_staged", ["write_key", "stage_id"])
