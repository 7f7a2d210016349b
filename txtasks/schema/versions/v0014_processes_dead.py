"""Workers and cleaners keep a heartbeat row: what they run, where, since when, and when they
last beat (the dashboard's workers page lists both, and marks those that stopped beating).
And an index of the dead letters by queue (PostgreSQL, SQLite: of dead letters only; MariaDB/
MySQL: of every archived row, by state, queue and finish time), along which the dashboard finds
the queues with dead letters and counts each one's up to a cap, instead of every dead letter
with a row lookup each (10 s on MariaDB with a million dead letters). On MariaDB/MySQL the
archive's index of state and finish time also gets the queue and the creation time (in one
online ALTER), so that the tasks finished and enqueued per minute are counted from it alone;
after the id, so that pages of archived tasks (finish time, then id) still follow it unsorted.
On PostgreSQL the same index includes them (with ten million archived tasks PostgreSQL read
the whole archive for those counts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Column, DateTime, Integer, String, Text, text
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 14
NAME = "processes_dead"

_ID = String(128).with_variant(mysql.VARBINARY(128), "mysql", "mariadb")
_TIMESTAMP = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_LONG_TEXT = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")


def upgrade(op: Operations) -> None:
    op.create_table(
        "txtasks_processes",
        Column("id", _ID, primary_key=True),
        Column("kind", String(16), nullable=False),
        Column("host", String(255), nullable=False),
        Column("pid", Integer, nullable=False),
        Column("runs", _LONG_TEXT, nullable=False),
        Column("running", Integer, nullable=True),
        Column("started_at", _TIMESTAMP, nullable=False),
        Column("beat_at", _TIMESTAMP, nullable=False),
        Column("expires_at", _TIMESTAMP, nullable=False),
        mysql_engine="InnoDB",
    )
    dialect = op.get_context().dialect.name
    if dialect == "postgresql":
        op.drop_index("ix_txtasks_archive_state", table_name="txtasks_archive")
        op.create_index(
            "ix_txtasks_archive_state",
            "txtasks_archive",
            ["state", "finished_at"],
            postgresql_include=["queue", "created_at"],
        )
    if dialect in ("postgresql", "sqlite"):
        dead = text("state = 'dead'")
        op.create_index(
            "ix_txtasks_archive_dead",
            "txtasks_archive",
            ["queue", "finished_at"],
            postgresql_where=dead,
            sqlite_where=dead,
        )
    else:
        op.execute(
            "ALTER TABLE txtasks_archive DROP INDEX ix_txtasks_archive_state,"
            " ADD INDEX ix_txtasks_archive_state (state, finished_at, id, queue, created_at),"
            " ADD INDEX ix_txtasks_archive_dead (state, queue, finished_at)"
        )
