"""The hot table, the archive, and the migration ledger."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import BigInteger, Column, DateTime, Integer, LargeBinary, String, Text, text
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 1
NAME = "initial"

_ID = BigInteger().with_variant(Integer(), "sqlite")
_TS = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_BLOB = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
_TEXT = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")
#: Compared byte for byte: MySQL/MariaDB collations would ignore case and trailing spaces.
_QUEUE = String(128).with_variant(mysql.VARBINARY(128), "mysql", "mariadb")
_KEY = String(255).with_variant(mysql.VARBINARY(255), "mysql", "mariadb")
_READY = "state IN ('pending', 'retryable')"


def _columns() -> list[Column[object]]:
    return [
        Column("queue", _QUEUE, nullable=False),
        Column("task_name", String(255), nullable=False),
        Column("payload", _BLOB, nullable=False),
        Column("content_type", String(64), nullable=False),
        Column("state", String(16), nullable=False),
        Column("priority", Integer, nullable=False),
        Column("run_at", _TS, nullable=False),
        Column("attempt", Integer, nullable=False),
        Column("max_attempts", Integer, nullable=False),
        Column("created_at", _TS, nullable=False),
        Column("dedup_key", _KEY, nullable=True),
        Column("headers", _TEXT, nullable=True),
        Column("checkpoint", _TEXT, nullable=True),
        Column("last_error", _TEXT, nullable=True),
        Column("worker_id", String(128), nullable=True),
        Column("lease_expires_at", _TS, nullable=True),
        Column("started_at", _TS, nullable=True),
        Column("expires_at", _TS, nullable=True),
    ]


def upgrade(op: Operations) -> None:
    op.create_table(
        "txtasks_migrations",
        Column("version", Integer, primary_key=True, autoincrement=False),
        Column("name", String(255), nullable=False),
        Column("applied_at", _TS, nullable=False),
        mysql_engine="InnoDB",
    )
    op.create_table(
        "txtasks_tasks",
        Column("id", _ID, primary_key=True, autoincrement=True),
        *_columns(),
        mysql_engine="InnoDB",
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_txtasks_tasks_claim",
        "txtasks_tasks",
        ["queue", "state", "priority", "run_at"],
        postgresql_where=text(_READY),
        sqlite_where=text(_READY),
    )
    op.create_index("ix_txtasks_tasks_lease", "txtasks_tasks", ["state", "lease_expires_at"])
    op.create_index("uq_txtasks_tasks_dedup", "txtasks_tasks", ["dedup_key"], unique=True)
    op.create_table(
        "txtasks_archive",
        Column("id", _ID, primary_key=True, autoincrement=False),
        *_columns(),
        Column("finished_at", _TS, nullable=False),
        mysql_engine="InnoDB",
    )
    op.create_index(
        "ix_txtasks_archive_queue", "txtasks_archive", ["queue", "state", "finished_at"]
    )
    op.create_index("ix_txtasks_archive_finished", "txtasks_archive", ["finished_at"])
