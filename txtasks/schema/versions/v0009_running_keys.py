"""An index of the tasks of each key that are processing, where the database has partial
indexes: a claim counts a key's running tasks along it, one short probe per key (the lease
index holds every processing task, and a claim would read all of them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import text

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.operations import Operations

VERSION = 9
NAME = "running_keys"

_RUNNING = "state = 'processing' AND partition_key IS NOT NULL"


def upgrade(op: Operations) -> None:
    if op.get_context().dialect.name in ("postgresql", "sqlite"):
        op.create_index(
            "ix_txtasks_tasks_running",
            "txtasks_tasks",
            ["queue", "partition_key"],
            postgresql_where=text(_RUNNING),
            sqlite_where=text(_RUNNING),
        )
