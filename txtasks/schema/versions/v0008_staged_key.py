"""Staged writes (Spark) carry each task's key: `partition_key` on the staged table (NULL: no
key), which the commit copies into the hot table and leaves a key hint for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Column, String
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 8
NAME = "staged_key"

_KEY = String(255).with_variant(mysql.VARBINARY(255), "mysql", "mariadb")


def upgrade(op: Operations) -> None:
    op.add_column("txtasks_staged", Column("partition_key", _KEY, nullable=True))
