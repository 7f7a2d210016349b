"""The periodic schedule ledger: one row per schedule, holding its next fire time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Column, DateTime, String
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 2
NAME = "periodic"

_TS = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_NAME = String(255).with_variant(mysql.VARBINARY(255), "mysql", "mariadb")


def upgrade(op: Operations) -> None:
    op.create_table(
        "txtasks_periodic",
        Column("name", _NAME, primary_key=True),
        Column("schedule", String(255), nullable=False),
        Column("next_fire_at", _TS, nullable=False),
        Column("last_fire_at", _TS, nullable=True),
        Column("updated_at", _TS, nullable=False),
        mysql_engine="InnoDB",
    )
