"""Keys: a task may carry one, and tasks of a key share its limits (see `txtasks.keys`).

- `partition_key` on the hot table and the archive (NULL: no key).
- Claim indexes so that a claim of tasks without a key and a claim of one key's tasks each read
  only the rows they take: where the database has partial indexes, one for each (PostgreSQL
  orders an index scan only after equalities, and `partition_key IS NULL` is not one); on
  MariaDB/MySQL one, with the key after the queue. An index of each key's live rows in enqueue
  order finds the head of an ordered key (partial where the database allows it, so tasks
  without a key are not in it).
- `txtasks_keys` (a claim's view of each key, locked by claims only), `txtasks_key_hints`
  (insert-only: an enqueue never waits for a claim) and `txtasks_key_limits` (limits set at
  run time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Column, DateTime, Double, Integer, String, UniqueConstraint, text
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 7
NAME = "keys"

_ID = BigInteger().with_variant(Integer(), "sqlite")
_TS = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_QUEUE = String(128).with_variant(mysql.VARBINARY(128), "mysql", "mariadb")
_KEY = String(255).with_variant(mysql.VARBINARY(255), "mysql", "mariadb")
_READY = "state IN ('pending', 'retryable')"
_KEYED = "partition_key IS NOT NULL"
_UNKEYED = "partition_key IS NULL"


def upgrade(op: Operations) -> None:
    for table in ("txtasks_tasks", "txtasks_archive"):
        op.add_column(table, Column("partition_key", _KEY, nullable=True))
    order: list[Any] = [text("priority DESC"), "run_at", "id"]
    op.drop_index("ix_txtasks_tasks_claim", table_name="txtasks_tasks")
    if op.get_context().dialect.name in ("postgresql", "sqlite"):
        op.create_index(
            "ix_txtasks_tasks_claim",
            "txtasks_tasks",
            ["queue", *order],
            postgresql_where=text(f"{_READY} AND {_UNKEYED}"),
            sqlite_where=text(f"{_READY} AND {_UNKEYED}"),
        )
        op.create_index(
            "ix_txtasks_tasks_claim_keyed",
            "txtasks_tasks",
            ["queue", "partition_key", *order],
            postgresql_where=text(f"{_READY} AND {_KEYED}"),
            sqlite_where=text(f"{_READY} AND {_KEYED}"),
        )
    else:
        op.create_index(
            "ix_txtasks_tasks_claim", "txtasks_tasks", ["queue", "partition_key", *order]
        )
    op.create_index(
        "ix_txtasks_tasks_keyed",
        "txtasks_tasks",
        ["queue", "partition_key", "id"],
        postgresql_where=text(_KEYED),
        sqlite_where=text(_KEYED),
    )
    op.create_table(
        "txtasks_keys",
        Column("id", _ID, primary_key=True, autoincrement=True),
        Column("queue", _QUEUE, nullable=False),
        Column("partition_key", _KEY, nullable=False),
        Column("ready_at", _TS, nullable=True),
        Column("next_start_at", _TS, nullable=True),
        Column("updated_at", _TS, nullable=False),
        UniqueConstraint("queue", "partition_key", name="uq_txtasks_keys"),
        mysql_engine="InnoDB",
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_txtasks_keys_ready",
        "txtasks_keys",
        ["queue", "ready_at", "id"],
        postgresql_where=text("ready_at IS NOT NULL"),
        sqlite_where=text("ready_at IS NOT NULL"),
    )
    op.create_table(
        "txtasks_key_hints",
        Column("id", _ID, primary_key=True, autoincrement=True),
        Column("queue", _QUEUE, nullable=False),
        Column("partition_key", _KEY, nullable=False),
        Column("run_at", _TS, nullable=False),
        mysql_engine="InnoDB",
        sqlite_autoincrement=True,
    )
    op.create_index("ix_txtasks_key_hints_queue", "txtasks_key_hints", ["queue", "id"])
    op.create_table(
        "txtasks_key_limits",
        Column("queue", _QUEUE, primary_key=True),
        Column("partition_key", _KEY, primary_key=True),
        Column("concurrency", Integer, nullable=True),
        Column("ordered", Integer, nullable=True),
        Column("rate_count", Integer, nullable=True),
        Column("rate_per", Double, nullable=True),
        Column("rate_burst", Integer, nullable=True),
        Column("updated_at", _TS, nullable=False),
        mysql_engine="InnoDB",
    )
