"""The example's txtasks application: one task that ships an order.

Workers and the cleaner load it as `deploy.example.shop:app` (the repository root, or /app in
the image, is the working directory). The database comes from TXTASKS_DATABASE_URL, the
optional RabbitMQ broker from TXTASKS_BROKER_URL.

The handler's effect is observable in the same database: the order's status becomes
"shipped", with the time and the worker process that shipped it. The handler writes it in a
transaction that also records the task's completion (`ctx.transaction_sync()`): the order is
shipped exactly when the task completes, and an attempt whose lease was lost (rescued while
it ran) writes nothing.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone
from functools import cache

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    update,
)

from txtasks import App, TaskContext, create_engine

QUEUE = "orders"

metadata = MetaData()
orders = Table(
    "shop_orders",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("item", String(200), nullable=False),
    Column("quantity", Integer, nullable=False),
    Column("status", String(20), nullable=False, default="new"),
    Column("created_at", DateTime, nullable=False),
    Column("shipped_at", DateTime, nullable=True),
    Column("shipped_by", String(200), nullable=True),
    Column("task_id", BigInteger, nullable=True),
)

app = App("shop", default_queue=QUEUE)


def database_url() -> str:
    url = os.environ.get("TXTASKS_DATABASE_URL")
    if not url:
        raise RuntimeError("set TXTASKS_DATABASE_URL to the database of the example")
    return url


@cache
def engine() -> Engine:
    """A connection to the shop's database for the web side (one engine per process)."""
    return create_engine(database_url(), pool_pre_ping=True)


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


@app.task(name="shop.ship_order", max_attempts=5)
def ship_order(payload: dict[str, int], ctx: TaskContext) -> None:
    """Mark the order shipped, in the transaction that completes the task."""
    with ctx.transaction_sync() as conn:
        conn.execute(
            update(orders)
            .where(orders.c.id == payload["order_id"], orders.c.status == "new")
            .values(
                status="shipped",
                shipped_at=utcnow(),
                shipped_by=f"{socket.gethostname()}:{os.getpid()}",
                task_id=ctx.task_id,
            )
        )
