"""Topics: the groups subscribed to each topic, and the publishes that found none.

- `txtasks_subscriptions`: one row per (topic, group) with the task name, queue, priority and
  attempts of the group's deliveries; a publish is one INSERT ... SELECT from it.
- `txtasks_topic_drops`: insert-only, one row per publish that found no subscriber, forgotten
  by the cleaner's retention sweep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import BigInteger, Column, DateTime, Integer, String
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 10
NAME = "topics"

_ID = BigInteger().with_variant(Integer(), "sqlite")
_TS = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_NAME = String(128).with_variant(mysql.VARBINARY(128), "mysql", "mariadb")


def upgrade(op: Operations) -> None:
    op.create_table(
        "txtasks_subscriptions",
        Column("topic", _NAME, primary_key=True),
        Column("group_name", _NAME, primary_key=True),
        Column("task_name", String(255), nullable=False),
        Column("queue", _NAME, nullable=False),
        Column("priority", Integer, nullable=False),
        Column("max_attempts", Integer, nullable=False),
        Column("created_at", _TS, nullable=False),
        Column("updated_at", _TS, nullable=False),
        mysql_engine="InnoDB",
    )
    op.create_table(
        "txtasks_topic_drops",
        Column("id", _ID, primary_key=True, autoincrement=True),
        Column("topic", _NAME, nullable=False),
        Column("dropped_at", _TS, nullable=False),
        mysql_engine="InnoDB",
        sqlite_autoincrement=True,
    )
    op.create_index("ix_txtasks_topic_drops_topic", "txtasks_topic_drops", ["topic", "dropped_at"])
    op.create_index("ix_txtasks_topic_drops_at", "txtasks_topic_drops", ["dropped_at"])
