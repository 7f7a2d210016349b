"""MariaDB / MySQL: SKIP LOCKED claims as SELECT then UPDATE (no UPDATE ... RETURNING)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from sqlalchemy import Executable, select, update
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import Insert

from txtasks.driver.base import Capabilities
from txtasks.driver.sql import SqlDriver
from txtasks.schema.tables import tasks
from txtasks.types import TaskRow, TaskState

#: Deadlock found; lock wait timeout exceeded.
TRANSIENT_ERRNOS = frozenset({1213, 1205})


class MySQLDriver(SqlDriver):
    """MySQL 8 and MariaDB through aiomysql (async) and pymysql (sync)."""

    capabilities: ClassVar[Capabilities] = Capabilities("mysql")
    returning_insert: ClassVar[bool] = False
    returning_dedup: ClassVar[bool] = False

    @classmethod
    def plan_class(cls, dialect: Dialect) -> type[SqlDriver]:
        return MariaDBDriver if getattr(dialect, "is_mariadb", False) else MySQLDriver

    @classmethod
    def stmt_insert_dedup(cls) -> Insert:
        """A duplicate key is a no-op update: no error, the caller's transaction goes on."""
        stmt = mysql_insert(tasks)
        return stmt.on_duplicate_key_update(id=tasks.c.id)

    @classmethod
    def stmt_dedup_lookup(cls, keys: Sequence[str]) -> Executable:
        """A locking read: sees rows committed after this transaction's snapshot."""
        return (
            select(tasks.c.id, tasks.c.dedup_key)
            .where(tasks.c.dedup_key.in_(keys))
            .with_for_update(read=True)
        )

    @classmethod
    def error_is_transient(cls, exc: BaseException) -> bool:
        args: tuple[Any, ...] = getattr(exc, "args", ())
        return bool(args) and args[0] in TRANSIENT_ERRNOS

    async def _claim(
        self, conn: AsyncConnection, queues: Sequence[str], limit: int, params: dict[str, Any]
    ) -> list[TaskRow]:
        ready = self.stmt_ready(queues, limit).with_only_columns(*tasks.c)
        found = (await conn.execute(ready, params)).mappings().all()
        if not found:
            return []
        ids = [r["id"] for r in found]
        await conn.execute(
            update(tasks).where(tasks.c.id.in_(ids)).values(**self.claim_values()), params
        )
        claimed = {
            "state": TaskState.PROCESSING.value,
            "lease_expires_at": params["lease_until"],
            "worker_id": params["worker_id"],
            "started_at": params["now"],
        }
        return [TaskRow.from_row({**r, **claimed, "attempt": r["attempt"] + 1}) for r in found]


class MariaDBDriver(MySQLDriver):
    """MariaDB 10.5+: INSERT ... RETURNING is available."""

    returning_insert: ClassVar[bool] = True
