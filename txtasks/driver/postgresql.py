"""PostgreSQL: ON CONFLICT for dedup, UPDATE ... RETURNING with SKIP LOCKED for claims."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import Connection
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import Insert

from txtasks.driver.base import Capabilities
from txtasks.driver.sql import SqlDriver, claim_order
from txtasks.driver.sql_staging import STAGED_COLUMNS
from txtasks.schema.tables import READY, TASK_COLUMNS, tasks
from txtasks.types import TaskRow

#: SQLSTATEs worth a fresh transaction: serialization failure, deadlock.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01"})


#: The claim as one autocommit statement, sent straight to asyncpg: one round trip, no
#: BEGIN/COMMIT, no SQLAlchemy row processing on the latency-critical path.
CLAIM_SQL = f"""
UPDATE txtasks_tasks SET state = 'processing', attempt = attempt + 1,
       lease_expires_at = $1, worker_id = $2, started_at = $3
 WHERE id IN (SELECT id FROM txtasks_tasks
               WHERE queue = ANY($4::varchar[]) AND {READY} AND run_at <= $3
               ORDER BY priority DESC, run_at, id
               LIMIT $5
               FOR UPDATE SKIP LOCKED)
RETURNING {", ".join(TASK_COLUMNS)}
"""


#: Staged rows go in with COPY, as CSV that Arrow writes: no per-row work in Python.
COPY_STAGED = "COPY txtasks_staged ({}) FROM STDIN (FORMAT csv)".format(", ".join(STAGED_COLUMNS))


def staged_csv(batch: Any) -> bytes:
    """An Arrow table of staged rows as COPY CSV. Payloads are `bytea` in escape format:
    their bytes as they are, backslashes doubled (a JSON object never starts with `\\x`)."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.compute as pc  # type: ignore[import-untyped]
    import pyarrow.csv as pa_csv  # type: ignore[import-untyped]

    where = batch.schema.get_field_index("payload")
    text = pc.replace_substring(batch.column(where).cast(pa.large_string()), "\\", "\\\\")
    out = pa.BufferOutputStream()
    options = pa_csv.WriteOptions(include_header=False, quoting_style="all_valid")
    pa_csv.write_csv(batch.set_column(where, "payload", text), out, options)
    return bytes(out.getvalue())


class PostgresDriver(SqlDriver):
    """PostgreSQL 12+ through asyncpg (async) and psycopg (sync).

    Claims go straight to asyncpg through a small pool of their own whose sessions run with
    `synchronous_commit = off`: one round trip, and no wait for the WAL flush. A claim lost in a
    database crash only leaves its task pending, to be claimed again; enqueues and outcomes
    keep the server's durability setting.
    """

    capabilities: ClassVar[Capabilities] = Capabilities("postgresql")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._claims: tuple[asyncio.AbstractEventLoop, Any] | None = None

    async def claim_pool(self) -> Any:
        """asyncpg connections for claims (one pool per event loop), outside SQLAlchemy."""
        import asyncpg  # the postgres extra

        loop = asyncio.get_running_loop()
        if self._claims is None or self._claims[0] is not loop:
            dsn = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
            pool = await asyncpg.create_pool(
                dsn,
                min_size=1,
                max_size=2,
                server_settings={"synchronous_commit": "off"},
            )
            self._claims = (loop, pool)
        return self._claims[1]

    async def close(self) -> None:
        claims, self._claims = self._claims, None
        if claims is not None and claims[0] is asyncio.get_running_loop():
            await claims[1].close()
        await super().close()

    async def task_claim_many(
        self,
        queues: Sequence[str],
        limit: int,
        *,
        now: datetime,
        lease_until: datetime,
        worker_id: str,
    ) -> list[TaskRow]:
        pool = await self.claim_pool()
        records = await pool.fetch(CLAIM_SQL, lease_until, worker_id, now, list(queues), limit)
        rows = [TaskRow.from_row(r) for r in records]
        rows.sort(key=claim_order)
        return rows

    @classmethod
    def stmt_insert_dedup(cls) -> Insert:
        return (
            pg_insert(tasks)
            .on_conflict_do_nothing(index_elements=[tasks.c.dedup_key])
            .returning(tasks.c.id, tasks.c.dedup_key)
        )

    def stage_batch(self, conn: Connection, batch: Any) -> None:
        """COPY through psycopg; other DB-API drivers take the generic path."""
        raw: Any = conn.connection.driver_connection
        with raw.cursor() as cursor:
            if not hasattr(cursor, "copy"):  # not psycopg 3
                super().stage_batch(conn, batch)
                return
            with cursor.copy(COPY_STAGED) as copy:
                copy.write(staged_csv(batch))

    @classmethod
    def error_is_transient(cls, exc: BaseException) -> bool:
        code: Any = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        return code in TRANSIENT_SQLSTATES
