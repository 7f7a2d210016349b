"""Tasks enqueued and finished per queue and minute, kept a week (`txtasks_history`): the
cleaner's stats sweep writes each minute once it is over, and the dashboard's queue page charts
the last day or week from it. One row per (minute, queue), its primary key, so that a second
cleaner's insert of a minute already written does nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Column, Integer, String
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 18
NAME = "history"

_QUEUE = String(128).with_variant(mysql.VARBINARY(128), "mysql", "mariadb")


def upgrade(op: Operations) -> None:
    op.create_table(
        "txtasks_history",
        Column("minute", Integer, primary_key=True, autoincrement=False),
        Column("queue", _QUEUE, primary_key=True),
        Column("enqueued", Integer, nullable=False),
        Column("completed", Integer, nullable=False),
        Column("failed", Integer, nullable=False),
        Column("dead", Integer, nullable=False),
        mysql_engine="InnoDB",
    )
