"""The enqueue half of the throughput benchmark: txtasks' enqueue paths against the same
inserts written by hand (see tests/benchmarks/README.md)."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.benchmarks import throughput_apps as apps
from tests.benchmarks.latency import asyncpg_dsn
from tests.benchmarks.throughput_report import BACKENDS
from txtasks.driver.sqlite import sqlite_connection_setup
from txtasks.driver.urls import url_async

#: Rows per transaction when preloading, and in the bulk enqueue.
CHUNK = 5000
INSERT_COLUMNS = (
    "queue, task_name, payload, content_type, state, priority, run_at, attempt, max_attempts, "
    "created_at"
)
RAW_INSERT = (
    f"INSERT INTO txtasks_tasks ({INSERT_COLUMNS}) "
    "VALUES ($1, $2, $3, 'application/json', 'pending', 0, $4, 0, 3, $4) RETURNING id"
)
RAW_INSERT_MANY = (
    f"INSERT INTO txtasks_tasks ({INSERT_COLUMNS}) "
    "VALUES ($1, $2, $3, 'application/json', 'pending', 0, $4, 0, 3, $4)"
)


@contextlib.asynccontextmanager
async def application(url: str) -> AsyncIterator[tuple[Any, Any, Any]]:
    """An application's own AsyncEngine (SQLite set up as the docs say), an App on the same
    database and its no-op task."""
    engine = create_async_engine(url_async(url))
    if url.startswith("sqlite"):
        sqlite_connection_setup(engine.sync_engine)
    app = type(apps.app)("throughput-enqueue", database_url=url)
    task = app.task(name=apps.TASK, queue=apps.QUEUE)(apps.noop.handler)
    try:
        yield engine, app, task
    finally:
        await engine.dispose()
        await app.aclose()


async def enqueue_single_txtasks(url: str, m: int) -> float:
    """`aenqueue_tx` in an AsyncConnection transaction of the application's own, m times."""
    async with application(url) as (engine, _app, task):
        started = time.perf_counter()
        for i in range(m):
            async with engine.begin() as conn:
                await task.aenqueue_tx(conn, {"n": i})
        return m / (time.perf_counter() - started)


async def enqueue_bulk_txtasks(url: str, n: int) -> float:
    """`aenqueue_many_tx` of CHUNK rows per application transaction, n rows in all."""
    async with application(url) as (engine, app, task):
        started = time.perf_counter()
        for start in range(0, n, CHUNK):
            rows = [task.new({"n": i}) for i in range(start, min(n, start + CHUNK))]
            async with engine.begin() as conn:
                await app.aenqueue_many_tx(conn, rows)
        return n / (time.perf_counter() - started)


async def enqueue_single_raw(url: str, m: int) -> float:
    """asyncpg: BEGIN, one INSERT ... RETURNING id, COMMIT; m times."""
    import asyncpg

    from txtasks.clock import utcnow

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        started = time.perf_counter()
        for i in range(m):
            async with connection.transaction():
                payload = json.dumps({"n": i}).encode()
                await connection.fetchval(RAW_INSERT, apps.QUEUE, apps.TASK, payload, utcnow())
        return m / (time.perf_counter() - started)
    finally:
        await connection.close()


async def enqueue_single_raw_sqlalchemy(url: str, m: int) -> float:
    """The same INSERT written by hand, in the same kind of AsyncConnection transaction."""
    from txtasks.clock import utcnow

    engine = create_async_engine(url_async(url))
    insert = text(
        RAW_INSERT.replace("$1", ":queue").replace("$2", ":name").replace("$3", ":payload")
        .replace("$4", ":now")
    )  # fmt: skip
    try:
        started = time.perf_counter()
        for i in range(m):
            async with engine.begin() as conn:
                payload = json.dumps({"n": i}).encode()
                params = {"queue": apps.QUEUE, "name": apps.TASK, "payload": payload}
                (await conn.execute(insert, {**params, "now": utcnow()})).scalar_one()
        return m / (time.perf_counter() - started)
    finally:
        await engine.dispose()


async def enqueue_bulk_raw(url: str, n: int) -> float:
    """asyncpg `executemany` of CHUNK rows per transaction, n rows in all."""
    import asyncpg

    from txtasks.clock import utcnow

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        started = time.perf_counter()
        for start in range(0, n, CHUNK):
            now = utcnow()
            rows = [
                (apps.QUEUE, apps.TASK, json.dumps({"n": i}).encode(), now)
                for i in range(start, min(n, start + CHUNK))
            ]
            async with connection.transaction():
                await connection.executemany(RAW_INSERT_MANY, rows)
        return n / (time.perf_counter() - started)
    finally:
        await connection.close()


@dataclass
class Enqueue:
    key: str
    backend: str
    label: str
    count: int
    measure: Callable[[str, int], Awaitable[float]]


def enqueue_cases(args: argparse.Namespace, urls: dict[str, str]) -> list[Enqueue]:
    cases: list[Enqueue] = []
    for backend in BACKENDS:
        if backend not in urls:
            continue
        cases.append(
            Enqueue(
                f"{backend}/enqueue/single",
                backend,
                "txtasks: one task per transaction (SQLAlchemy AsyncConnection, aenqueue_tx)",
                args.single,
                enqueue_single_txtasks,
            )
        )
        if backend == "postgresql":
            cases.append(
                Enqueue(
                    "postgresql/enqueue/single-raw-sa",
                    backend,
                    "raw: the INSERT ... RETURNING id by hand, same AsyncConnection transaction",
                    args.single,
                    enqueue_single_raw_sqlalchemy,
                )
            )
            cases.append(
                Enqueue(
                    "postgresql/enqueue/single-raw",
                    backend,
                    "raw: asyncpg, BEGIN + INSERT ... RETURNING id + COMMIT",
                    args.single,
                    enqueue_single_raw,
                )
            )
        cases.append(
            Enqueue(
                f"{backend}/enqueue/bulk",
                backend,
                f"txtasks: bulk, {CHUNK} per transaction (aenqueue_many_tx)",
                args.bulk,
                enqueue_bulk_txtasks,
            )
        )
        if backend == "postgresql":
            cases.append(
                Enqueue(
                    "postgresql/enqueue/bulk-raw",
                    backend,
                    f"raw: asyncpg executemany, {CHUNK} per transaction",
                    args.bulk,
                    enqueue_bulk_raw,
                )
            )
    only = [k for k in (args.only or "").split(",") if k]
    return [c for c in cases if not only or any(o in c.key for o in only)]
