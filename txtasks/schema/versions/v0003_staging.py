"""Staged writes (Spark): which write staged a row, and the ledger of committed writes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Column, DateTime, Integer, String, text
from sqlalchemy.dialects import mysql

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 3
NAME = "staging"

_TS = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_COMMIT = String(255).with_variant(mysql.VARBINARY(255), "mysql", "mariadb")
_STAGED = "stage_id IS NOT NULL"


def upgrade(op: Operations) -> None:
    op.add_column("txtasks_tasks", Column("stage_id", String(64), nullable=True))
    op.add_column("txtasks_archive", Column("stage_id", String(64), nullable=True))
    op.create_index(
        "ix_txtasks_tasks_stage",
        "txtasks_tasks",
        ["stage_id"],
        postgresql_where=text(_STAGED),
        sqlite_where=text(_STAGED),
    )
    op.create_table(
        "txtasks_commits",
        Column("commit_id", _COMMIT, primary_key=True),
        Column("committed_at", _TS, nullable=False),
        Column("tasks", Integer, nullable=False),
        mysql_engine="InnoDB",
    )
