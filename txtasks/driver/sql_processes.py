"""Heartbeat rows of workers and cleaners on a SQL database: the `Processes` role of
`SqlDriver`.

The table holds a row per running process, so it stays as small as a deployment; every
statement reads or writes it by primary key, or whole (`process_list`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    bindparam,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.driver.database import SqlDatabase
from txtasks.schema.tables import (
    Timestamp,
    processes,
)
from txtasks.types import (
    ProcessRow,
)


def stmt_process_update() -> Any:
    """Write the beat of process `id` over its row (what it runs may have changed)."""
    return (
        update(processes)
        .where(processes.c.id == bindparam("b_id"))
        .values(
            runs=bindparam("runs"),
            running=bindparam("running"),
            beat_at=bindparam("beat_at", type_=Timestamp),
            expires_at=bindparam("expires_at", type_=Timestamp),
        )
    )


def stmt_processes_forget() -> Any:
    """Delete the rows of processes that stopped beating before `before`."""
    return delete(processes).where(processes.c.expires_at < bindparam("before", type_=Timestamp))


class SqlProcesses:
    """Heartbeat rows of workers and cleaners on a SQL database."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db

    async def process_beat(self, process: ProcessRow, *, forget_before: datetime) -> None:
        values = {name: getattr(process, name) for name in ProcessRow.__slots__}

        async def work(conn: AsyncConnection) -> None:
            moved = ("runs", "running", "beat_at", "expires_at")  # not when it started
            beat = {"b_id": process.id, **{name: values[name] for name in moved}}
            updated = await conn.execute(stmt_process_update(), beat)
            if updated.rowcount == 0:  # its first beat (a process id is its own)
                await conn.execute(insert(processes).values(**values))

        await self.db.in_transaction(work)
        await self._processes_forget(forget_before)

    async def _processes_forget(self, before: datetime) -> None:
        """Delete the rows of processes that stopped beating before `before`: found by a read
        that locks nothing, then deleted by primary key (and still expired) in a transaction of
        their own. A delete by expiry in the beat's transaction scanned the table, waiting on the
        row another process had just written: two workers beating at once deadlocked on
        MariaDB."""
        async with self.db.connect() as conn:
            query = select(processes.c.id).where(processes.c.expires_at < before)
            expired = sorted((await conn.execute(query)).scalars())
        if not expired:
            return

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                stmt_processes_forget().where(processes.c.id.in_(expired)), {"before": before}
            )

        await self.db.in_transaction(work)

    async def process_end(self, process_id: str) -> None:
        async def work(conn: AsyncConnection) -> None:
            await conn.execute(delete(processes).where(processes.c.id == process_id))

        await self.db.in_transaction(work)

    async def process_list(self) -> list[ProcessRow]:
        stmt = select(processes).order_by(processes.c.kind, processes.c.id)
        async with self.db.connect() as conn:
            rows = (await conn.execute(stmt)).mappings().all()
        return [ProcessRow.from_row(r) for r in rows]
