"""Every table txtasks uses, declared once as SQLAlchemy Core.

The migrations in `txtasks.schema.versions` must produce exactly this; a test compares them.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects import mysql

metadata = MetaData()

#: Primary keys: BIGINT everywhere; SQLite needs INTEGER PRIMARY KEY for its rowid alias.
Id = BigInteger().with_variant(Integer(), "sqlite")
#: Timestamps are naive UTC with microseconds (MySQL/MariaDB need an explicit fsp).
Timestamp = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: Payloads up to the configured limit (BLOB is only 64 KiB on MySQL/MariaDB).
Blob = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
#: Long text (TEXT is only 64 KiB on MySQL/MariaDB).
LongText = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")

READY = "state IN ('pending', 'retryable')"


def _task_columns() -> list[Column[object]]:
    """Columns shared by the hot table and the archive."""
    return [
        Column("queue", String(128), nullable=False),
        Column("task_name", String(255), nullable=False),
        Column("payload", Blob, nullable=False),
        Column("content_type", String(64), nullable=False),
        Column("state", String(16), nullable=False),
        Column("priority", Integer, nullable=False),
        Column("run_at", Timestamp, nullable=False),
        Column("attempt", Integer, nullable=False),
        Column("max_attempts", Integer, nullable=False),
        Column("created_at", Timestamp, nullable=False),
        Column("dedup_key", String(255), nullable=True),
        Column("headers", LongText, nullable=True),
        Column("checkpoint", LongText, nullable=True),
        Column("last_error", LongText, nullable=True),
        Column("worker_id", String(128), nullable=True),
        Column("lease_expires_at", Timestamp, nullable=True),
        Column("started_at", Timestamp, nullable=True),
        Column("expires_at", Timestamp, nullable=True),
    ]


tasks = Table(
    "txtasks_tasks",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    *_task_columns(),
    mysql_engine="InnoDB",
    # ids are never reused: an archived task keeps its id (SQLite would reuse the highest).
    sqlite_autoincrement=True,
)
Index(
    "ix_txtasks_tasks_claim",
    tasks.c.queue,
    tasks.c.state,
    tasks.c.priority,
    tasks.c.run_at,
    postgresql_where=text(READY),
    sqlite_where=text(READY),
)
Index("ix_txtasks_tasks_lease", tasks.c.state, tasks.c.lease_expires_at)
Index("uq_txtasks_tasks_dedup", tasks.c.dedup_key, unique=True)

archive = Table(
    "txtasks_archive",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=False),
    *_task_columns(),
    Column("finished_at", Timestamp, nullable=False),
    mysql_engine="InnoDB",
)
Index("ix_txtasks_archive_queue", archive.c.queue, archive.c.state, archive.c.finished_at)
Index("ix_txtasks_archive_finished", archive.c.finished_at)

migrations = Table(
    "txtasks_migrations",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("name", String(255), nullable=False),
    Column("applied_at", Timestamp, nullable=False),
    mysql_engine="InnoDB",
)

#: Columns of the hot table, in order, as copied into the archive.
TASK_COLUMNS = tuple(c.name for c in tasks.columns)
