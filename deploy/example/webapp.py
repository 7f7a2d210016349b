"""The example's web application: POST /orders stores an order and enqueues its shipping.

The order row and the task row are inserted in ONE SQLAlchemy transaction: when the request
fails before the commit, neither exists; once it commits, a worker will ship the order.

Run it with uvicorn from the repository root (or /app in the image):

    TXTASKS_DATABASE_URL=postgresql://... uvicorn deploy.example.webapp:api --port 8000

- POST /orders {"item": "book", "quantity": 2} -> 201 {"id": 1, "task_id": 7, "status": "new"}
- GET /orders/{id} -> the order, with its status ("new", then "shipped")
- GET /healthz -> 200 while the database answers
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field
from sqlalchemy import insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from deploy.example.shop import app as tasks_app
from deploy.example.shop import database_url, metadata, orders, ship_order, utcnow
from txtasks import create_async_engine


class NewOrder(BaseModel):
    item: str = Field(min_length=1, max_length=200)
    quantity: int = Field(default=1, ge=1)


def make_engine() -> AsyncEngine:
    return create_async_engine(database_url(), pool_pre_ping=True)


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    engine = make_engine()
    async with engine.begin() as conn:  # the shop's own table; txtasks' come from `migrate`
        await conn.run_sync(metadata.create_all)
    api.state.engine = engine
    try:
        yield
    finally:
        await tasks_app.aclose()  # the wake-up publisher, when a broker is set
        await engine.dispose()


api = FastAPI(title="txtasks example shop", lifespan=lifespan)


def engine_of(api_: FastAPI) -> AsyncEngine:
    engine: AsyncEngine = api_.state.engine
    return engine


@api.post("/orders", status_code=201)
async def create_order(order: NewOrder) -> dict[str, Any]:
    async with engine_of(api).begin() as conn:  # one transaction: the order and its task
        result = await conn.execute(
            insert(orders).values(
                item=order.item, quantity=order.quantity, status="new", created_at=utcnow()
            )
        )
        key = result.inserted_primary_key
        assert key is not None
        order_id = int(key[0])
        task_id = await ship_order.aenqueue_tx(conn, {"order_id": order_id})
        await conn.execute(update(orders).where(orders.c.id == order_id).values(task_id=task_id))
    return {"id": order_id, "task_id": task_id, "status": "new"}


@api.get("/orders/{order_id}")
async def get_order(order_id: int) -> dict[str, Any]:
    async with engine_of(api).connect() as conn:
        row = (await conn.execute(select(orders).where(orders.c.id == order_id))).first()
    if row is None:
        raise HTTPException(status_code=404, detail=f"no order {order_id}")
    found = dict(row._mapping)
    for key in ("created_at", "shipped_at"):
        if found[key] is not None:
            found[key] = found[key].isoformat()
    return found


@api.get("/healthz")
async def healthz() -> dict[str, str]:
    async with engine_of(api).connect() as conn:
        await conn.execute(text("SELECT 1"))
    return {"status": "ok"}
