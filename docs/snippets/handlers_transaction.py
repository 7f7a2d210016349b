"""Transactional completion: the handler's writes and its task's completion commit together."""

import asyncio
import os
import tempfile

from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select

from txtasks import App, TaskContext, TaskState
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

metadata = MetaData()
payments = Table(
    "payments",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("order_id", String(32), nullable=False, unique=True),
)
app = App("billing", database_url=DATABASE_URL)


@app.task(name="billing.receipt")
def send_receipt(payload: dict) -> None:
    """The follow-up: enqueued in the payment's transaction, it exists once that commits."""


@app.task(name="billing.charge")
async def charge(payload: dict, ctx: TaskContext) -> None:
    async with ctx.transaction() as conn:  # locks this attempt first; LeaseLost if taken over
        await conn.execute(insert(payments), {"order_id": payload["order"]})
        await send_receipt.aenqueue_tx(conn, {"order": payload["order"]})
    # committed: the payment, the receipt task and this task's completion, all or nothing


@app.task(name="billing.refund")
def refund(payload: dict, ctx: TaskContext) -> None:
    with ctx.transaction_sync() as conn:  # sync handlers get a sync Connection
        conn.execute(payments.delete().where(payments.c.order_id == payload["order"]))


async def main() -> None:
    await app.amigrate()
    async with app.driver.engine.begin() as conn:  # the application's own table
        await conn.run_sync(metadata.create_all)
    charged = await charge.aenqueue({"order": "A-1"})
    await run_until_empty(app)  # runs the charge, then the receipt it enqueued

    async with app.driver.engine.connect() as conn:
        assert (await conn.execute(select(payments.c.order_id))).scalars().all() == ["A-1"]
    assert (await app.driver.tasks.task_get(charged)).state is TaskState.COMPLETED

    await refund.aenqueue({"order": "A-1"})
    await run_until_empty(app)
    async with app.driver.engine.connect() as conn:
        assert (await conn.execute(select(payments.c.order_id))).scalars().all() == []
    await app.aclose()


asyncio.run(main())
