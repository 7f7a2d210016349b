"""The application `txtasks demo` runs: orders whose processing is a task.

Each order row and its task are written in one transaction. Processing records an effect row,
so the demo can check from the database that every committed task took effect exactly once.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    insert,
)

from txtasks.app import ENV_DATABASE_URL, App
from txtasks.engines import create_engine
from txtasks.retry import Constant
from txtasks.worker.context import TaskContext

QUEUE = "txtasks-demo"
MAX_ATTEMPTS = 3

metadata = MetaData()
orders = Table(
    "txtasks_demo_orders",
    metadata,
    Column("order_no", Integer, primary_key=True, autoincrement=False),
    Column("kind", String(16), nullable=False),
)
effects = Table(
    "txtasks_demo_effects",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("order_no", Integer, nullable=False),
    Column("task_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
)

app = App("txtasks-demo", default_queue=QUEUE)


@cache
def effects_engine() -> Engine:
    """The handler's own connection to the demo database (one per worker process)."""
    url = os.environ[ENV_DATABASE_URL]
    return create_engine(url, pool_size=8)


@app.task(name="demo.process_order", max_attempts=MAX_ATTEMPTS, retry=Constant(0.2))
def process_order(payload: dict[str, Any], ctx: TaskContext) -> None:
    """ok: succeeds; flaky: fails on attempt 1, then succeeds; poison: always fails."""
    kind = payload["kind"]
    if kind == "poison":
        raise RuntimeError(f"order {payload['order_no']} is poison")
    if kind == "flaky" and ctx.attempt == 1:
        raise ConnectionError(f"order {payload['order_no']}: a passing failure, retry me")
    with effects_engine().begin() as conn:
        conn.execute(
            insert(effects).values(
                order_no=payload["order_no"], task_id=ctx.task_id, attempt=ctx.attempt
            )
        )
