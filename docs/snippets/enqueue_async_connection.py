"""Enqueue on an AsyncConnection, in the same transaction as your own write."""

import asyncio
import os
import tempfile

from sqlalchemy import Column, Integer, MetaData, String, Table, insert

from txtasks import App, TaskState, create_async_engine
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

metadata = MetaData()
invoices = Table(
    "invoices",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("customer", String(100), nullable=False),
    Column("amount_cents", Integer, nullable=False),
)

app = App("billing", database_url=DATABASE_URL)
rendered: list[int] = []


@app.task(queue="billing")
async def render_invoice_pdf(payload: dict) -> None:
    rendered.append(payload["invoice_id"])


async def main() -> None:
    engine = create_async_engine(DATABASE_URL)

    await app.amigrate()  # the txtasks tables, as `txtasks migrate` does
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)

    async with engine.begin() as conn:
        result = await conn.execute(insert(invoices).values(customer="Ada", amount_cents=4200))
        invoice_id = result.inserted_primary_key[0]
        task_id = await render_invoice_pdf.aenqueue_tx(conn, {"invoice_id": invoice_id})

    await run_until_empty(app)
    row = await app.driver.tasks.task_get(task_id)
    assert row is not None and row.state is TaskState.COMPLETED
    assert rendered == [invoice_id]

    await app.aclose()
    await engine.dispose()


asyncio.run(main())
