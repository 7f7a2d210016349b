"""Staged writes in progress get a row each: staging checks it under a shared lock.

A Spark write (or streaming query) opens its row before any partition stages; the commit and
the abort close it before they read or delete staged rows. A partition attempt still running
when its write ended (a speculative loser, an attempt Spark stopped waiting for) then finds the
row gone and rolls its staging back instead of leaving rows behind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Column, DateTime, String
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 6
NAME = "open_writes"

_TS = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade(op: Operations) -> None:
    op.create_table(
        "txtasks_writes",
        Column("write_key", String(32), primary_key=True),
        Column("opened_at", _TS, nullable=False),
        mysql_engine="InnoDB",
    )
