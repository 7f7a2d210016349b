"""A process's connection budget, and the application's own engine for the same URL."""

import asyncio
import os
import tempfile

from sqlalchemy import text

from txtasks import App, TaskContext, create_async_engine
from txtasks.testing import run_until_empty

# Behind PgBouncer in transaction pooling mode the URL says so, e.g.
# postgresql://app:secret@pgbouncer:6432/app?pooler=transaction
DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

# At most 4 connections in this process, whatever the concurrency; TXTASKS_DB_CONNECTIONS
# (which `txtasks worker --db-connections N` sets) wins over it.
app = App("billing", database_url=DATABASE_URL, db_connections=4)


@app.task(name="billing.invoice")
async def invoice(payload: dict, ctx: TaskContext) -> None:
    # The handler's own transaction holds one of the 4 while it runs; the worker keeps
    # one for its claims, heartbeats and outcomes whatever the handlers do.
    async with ctx.transaction() as conn:
        await conn.execute(text("SELECT 1"))


async def main() -> None:
    await app.amigrate()
    # The application's own engine: set up for the URL (no statement kept by name behind
    # a transaction pooler).
    engine = create_async_engine(DATABASE_URL)
    async with engine.begin() as conn:
        for n in range(20):
            await invoice.aenqueue_tx(conn, {"invoice": n})
    await engine.dispose()
    stats = await run_until_empty(app, concurrency=10)
    assert stats.outcomes == {"completed": 20}
    await app.aclose()


asyncio.run(main())
