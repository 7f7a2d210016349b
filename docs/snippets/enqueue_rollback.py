"""A rolled-back transaction leaves no task behind: it never exists and never runs."""

import asyncio
import os
import tempfile

from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select

from txtasks import App, create_engine, migrate
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

metadata = MetaData()
payments = Table(
    "payments",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("order_id", Integer, nullable=False),
    Column("status", String(20), nullable=False),
)

app = App("payments", database_url=DATABASE_URL)
captured: list[int] = []


@app.task
def capture_payment(payload: dict) -> None:
    captured.append(payload["payment_id"])


class CardDeclined(Exception):
    pass


engine = create_engine(DATABASE_URL)
with engine.begin() as conn:
    migrate(conn)
    metadata.create_all(conn)

try:
    with engine.begin() as conn:
        result = conn.execute(insert(payments).values(order_id=7, status="authorized"))
        payment_id = result.inserted_primary_key[0]
        task_id = capture_payment.enqueue_tx(conn, {"payment_id": payment_id})
        raise CardDeclined("the bank said no")  # any exception rolls the block back
except CardDeclined:
    pass


async def main() -> None:
    stats = await run_until_empty(app)
    assert stats.claimed == 0  # nothing to run
    assert await app.driver.tasks.task_get(task_id) is None  # the task never existed
    assert captured == []
    await app.aclose()


asyncio.run(main())
with engine.connect() as conn:
    assert conn.execute(select(func.count()).select_from(payments)).scalar_one() == 0
engine.dispose()
