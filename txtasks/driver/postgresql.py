"""PostgreSQL: ON CONFLICT for dedup, UPDATE ... RETURNING with SKIP LOCKED for claims."""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import Insert

from txtasks.driver.base import Capabilities
from txtasks.driver.sql import SqlDriver
from txtasks.schema.tables import tasks

#: SQLSTATEs worth a fresh transaction: serialization failure, deadlock.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01"})


class PostgresDriver(SqlDriver):
    """PostgreSQL 12+ through asyncpg (async) and psycopg (sync)."""

    capabilities: ClassVar[Capabilities] = Capabilities("postgresql")

    @classmethod
    def stmt_insert_dedup(cls) -> Insert:
        return (
            pg_insert(tasks)
            .on_conflict_do_nothing(index_elements=[tasks.c.dedup_key])
            .returning(tasks.c.id, tasks.c.dedup_key)
        )

    @classmethod
    def error_is_transient(cls, exc: BaseException) -> bool:
        code: Any = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        return code in TRANSIENT_SQLSTATES
