"""Staged writes (Spark) committed in deferred mode: the attempts whose rows wait to be published.

A deferred commit records one row per attempt it commits (its stage id, its write, the commit id
and the publish target) instead of copying the rows into the hot table; publishers (workers and
the cleaner) move those rows in batches and delete the attempt's row with its last batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Column, DateTime, String, Text
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 15
NAME = "deferred_publish"

_TS = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_COMMIT = String(255).with_variant(mysql.VARBINARY(255), "mysql", "mariadb")


def upgrade(op: Operations) -> None:
    op.create_table(
        "txtasks_deferred",
        Column("stage_id", String(64), primary_key=True),
        Column("write_key", String(32), nullable=False),
        Column("commit_id", _COMMIT, nullable=False),
        Column("target", Text, nullable=False),
        Column("committed_at", _TS, nullable=False),
        mysql_engine="InnoDB",
    )
    op.create_index("ix_txtasks_deferred_write", "txtasks_deferred", ["write_key"])
