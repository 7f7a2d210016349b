"""Publish an event in the same transaction as your own write: every subscribed group gets one
task of its own; a rolled-back publish reaches no group."""

import asyncio
import os
import tempfile

from sqlalchemy import Column, Integer, MetaData, String, Table, insert

from txtasks import App, TaskContext, create_engine, migrate
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

metadata = MetaData()
orders = Table(
    "orders",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("item", String(64), nullable=False),
)

# Three services, each with its own handler, queue and retries; the publisher imports none.
app = App("shop", database_url=DATABASE_URL)
handled: list[tuple[str, int]] = []


@app.task(queue="billing", subscribe="order.created", max_attempts=10)
def bill(order: dict) -> None:  # its group: the task's name (module.bill)
    handled.append(("billing", order["id"]))


@app.task(queue="shipping", subscribe="order.created", group="shipping")
def ship(order: dict, ctx: TaskContext) -> None:
    assert ctx.headers["txtasks-topic"] == "order.created"
    assert ctx.headers["txtasks-group"] == "shipping"
    handled.append(("shipping", order["id"]))


@app.task(queue="analytics", subscribe=["order.created", "order.cancelled"], group="analytics")
def count(order: dict) -> None:
    handled.append(("analytics", order["id"]))


engine = create_engine(DATABASE_URL)
with engine.begin() as conn:
    migrate(conn)
    metadata.create_all(conn)


async def main() -> None:
    await app.topics.asubscribe()  # a worker of these queues does this at its start

    with engine.begin() as conn:  # the order and its event commit together
        order_id = conn.execute(insert(orders).values(item="book")).inserted_primary_key[0]
        ids = app.topics.publish_tx(conn, "order.created", {"id": order_id})
    assert len(ids) == 3  # one task per group, written by one statement

    with engine.connect() as conn, conn.begin() as tx:  # rolled back: no group ever sees it
        app.topics.publish_tx(conn, "order.created", {"id": 999})
        tx.rollback()

    await run_until_empty(app)
    assert sorted(handled) == [
        ("analytics", order_id),
        ("billing", order_id),
        ("shipping", order_id),
    ]
    await app.aclose()


asyncio.run(main())
engine.dispose()
