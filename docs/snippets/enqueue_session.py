"""Enqueue on an ORM Session: the new order and its task commit in one transaction."""

import asyncio
import os
import tempfile

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from txtasks import App, TaskState, create_engine, migrate
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(20), default="new")


engine = create_engine(DATABASE_URL)

app = App("orders", database_url=DATABASE_URL)


@app.task
def ship_order(payload: dict) -> None:
    with Session(engine) as session, session.begin():
        order = session.get(Order, payload["order_id"])
        assert order is not None
        order.status = "shipped"


with engine.begin() as conn:
    migrate(conn)
    Base.metadata.create_all(conn)

with Session(engine) as session, session.begin():
    order = Order(customer="Ada")
    session.add(order)
    session.flush()  # assigns order.id inside the transaction
    task_id = ship_order.enqueue_tx(session, {"order_id": order.id})
    order_id = order.id


async def main() -> None:
    await run_until_empty(app)
    row = await app.driver.tasks.task_get(task_id)
    assert row is not None and row.state is TaskState.COMPLETED
    await app.aclose()


asyncio.run(main())
with Session(engine) as session:
    assert session.get(Order, order_id).status == "shipped"
engine.dispose()
