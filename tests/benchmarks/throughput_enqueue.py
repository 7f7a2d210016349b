"""The enqueue half of the throughput benchmark: txtasks' enqueue paths against the same
inserts written by hand (see tests/benchmarks/README.md)."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from tests.benchmarks import throughput_apps as apps
from tests.benchmarks.latency import asyncpg_dsn
from tests.benchmarks.server_cpu import Meter
from tests.benchmarks.throughput_report import BACKENDS
from txtasks.clock import utcnow
from txtasks.driver.sqlite import sqlite_connection_setup
from txtasks.driver.urls import url_async
from txtasks.schema.tables import Blob, Timestamp

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
#: The same INSERT for aiomysql, every value a parameter: its executemany sends multi-row
#: INSERTs only for VALUES of parameters alone (with a literal among them, a statement a row).
MYSQL_INSERT_MANY = (
    f"INSERT INTO txtasks_tasks ({INSERT_COLUMNS}) VALUES ({', '.join(['%s'] * 10)})"
)
#: The same INSERT for aiosqlite.
SQLITE_INSERT_MANY = re.sub(r"\$\d", "?", RAW_INSERT_MANY)
#: The same INSERT ... RETURNING id as SQLAlchemy text, in the application's transaction; the
#: payload and the times bound as the columns' types (as txtasks binds them).
SA_NAMES = {"$1": ":queue", "$2": ":name", "$3": ":payload", "$4": ":now"}
SA_INSERT = text(re.sub(r"\$\d", lambda m: SA_NAMES[m[0]], RAW_INSERT)).bindparams(
    bindparam("payload", type_=Blob), bindparam("now", type_=Timestamp)
)


def app_engine(url: str) -> Any:
    """An application's own AsyncEngine (SQLite set up as the docs say)."""
    engine = create_async_engine(url_async(url))
    if url.startswith("sqlite"):
        sqlite_connection_setup(engine.sync_engine)
    return engine


@contextlib.asynccontextmanager
async def application(url: str) -> AsyncIterator[tuple[Any, Any, Any]]:
    """An application's own AsyncEngine, an App on the same database and its no-op task."""
    engine = app_engine(url)
    app = type(apps.app)("throughput-enqueue", database_url=url)
    task = app.task(name=apps.TASK, queue=apps.QUEUE)(apps.noop.handler)
    try:
        yield engine, app, task
    finally:
        await engine.dispose()
        await app.aclose()


def chunks(n: int) -> list[range]:
    """The numbers 0..n-1 in ranges of CHUNK (a transaction each)."""
    return [range(start, min(n, start + CHUNK)) for start in range(0, n, CHUNK)]


async def enqueue_single_txtasks(url: str, m: int, meter: Meter) -> None:
    """`aenqueue_tx` in an AsyncConnection transaction of the application's own, m times."""
    async with application(url) as (engine, _app, task):
        with meter:
            for i in range(m):
                async with engine.begin() as conn:
                    await task.aenqueue_tx(conn, {"n": i})


async def enqueue_bulk_txtasks(url: str, n: int, meter: Meter) -> None:
    """`aenqueue_many_tx` of CHUNK rows per application transaction, n rows in all."""
    async with application(url) as (engine, app, task):
        with meter:
            for numbers in chunks(n):
                rows = [task.new({"n": i}) for i in numbers]
                async with engine.begin() as conn:
                    await app.aenqueue_many_tx(conn, rows)


async def enqueue_single_raw(url: str, m: int, meter: Meter) -> None:
    """asyncpg: BEGIN, one INSERT ... RETURNING id, COMMIT; m times."""
    import asyncpg

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        with meter:
            for i in range(m):
                async with connection.transaction():
                    payload = json.dumps({"n": i}).encode()
                    await connection.fetchval(RAW_INSERT, apps.QUEUE, apps.TASK, payload, utcnow())
    finally:
        await connection.close()


async def enqueue_single_raw_sqlalchemy(url: str, m: int, meter: Meter) -> None:
    """The same INSERT ... RETURNING id written by hand, in the same kind of AsyncConnection
    transaction on the same kind of engine."""
    engine = app_engine(url)
    try:
        with meter:
            for i in range(m):
                async with engine.begin() as conn:
                    payload = json.dumps({"n": i}).encode()
                    params = {"queue": apps.QUEUE, "name": apps.TASK, "payload": payload}
                    (await conn.execute(SA_INSERT, {**params, "now": utcnow()})).scalar_one()
    finally:
        await engine.dispose()


async def enqueue_bulk_raw(url: str, n: int, meter: Meter) -> None:
    """asyncpg `executemany` of CHUNK rows per transaction, n rows in all."""
    import asyncpg

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        with meter:
            for numbers in chunks(n):
                now = utcnow()
                rows = [
                    (apps.QUEUE, apps.TASK, json.dumps({"n": i}).encode(), now) for i in numbers
                ]
                async with connection.transaction():
                    await connection.executemany(RAW_INSERT_MANY, rows)
    finally:
        await connection.close()


async def enqueue_bulk_raw_mysql(url: str, n: int, meter: Meter) -> None:
    """aiomysql `executemany` of CHUNK rows per transaction (PyMySQL sends them as multi-row
    INSERTs), n rows in all."""
    import aiomysql

    parsed = make_url(url)
    connection = await aiomysql.connect(
        host=parsed.host or "127.0.0.1",
        port=parsed.port or 3306,
        user=parsed.username or "",
        password=parsed.password or "",
        db=parsed.database or "",
        autocommit=False,
    )
    try:
        cursor = await connection.cursor()
        with meter:
            for numbers in chunks(n):
                now = utcnow()
                rows = [
                    (
                        apps.QUEUE,
                        apps.TASK,
                        json.dumps({"n": i}).encode(),
                        "application/json",
                        "pending",
                        0,
                        now,
                        0,
                        3,
                        now,
                    )
                    for i in numbers
                ]
                await cursor.executemany(MYSQL_INSERT_MANY, rows)
                await connection.commit()
    finally:
        connection.close()


async def enqueue_bulk_raw_sqlite(url: str, n: int, meter: Meter) -> None:
    """aiosqlite `executemany` of CHUNK rows per transaction (BEGIN IMMEDIATE, with the
    pragmas txtasks sets), n rows in all; times written as SQLAlchemy writes them."""
    import aiosqlite

    connection = await aiosqlite.connect(make_url(url).database or "", isolation_level=None)
    try:
        for pragma in apps.SQLITE_PRAGMAS:
            await connection.execute(pragma)
        with meter:
            for numbers in chunks(n):
                now = utcnow().strftime("%Y-%m-%d %H:%M:%S.%f")
                rows = [
                    (apps.QUEUE, apps.TASK, json.dumps({"n": i}).encode(), now, now)
                    for i in numbers
                ]
                await connection.execute("BEGIN IMMEDIATE")
                await connection.executemany(SQLITE_INSERT_MANY, rows)
                await connection.commit()
    finally:
        await connection.close()


#: Each backend's hand-written bulk insert: its driver's executemany.
BULK_RAW = {
    "postgresql": ("asyncpg", enqueue_bulk_raw),
    "mysql": ("aiomysql", enqueue_bulk_raw_mysql),
    "sqlite": ("aiosqlite", enqueue_bulk_raw_sqlite),
}


@dataclass
class Enqueue:
    key: str
    backend: str
    label: str
    count: int
    measure: Callable[[str, int, Meter], Awaitable[None]]


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
        cases.append(
            Enqueue(
                f"{backend}/enqueue/single-raw-sa",
                backend,
                "raw: the INSERT ... RETURNING id by hand, same AsyncConnection transaction",
                args.single,
                enqueue_single_raw_sqlalchemy,
            )
        )
        if backend == "postgresql":
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
        driver, measure = BULK_RAW[backend]
        cases.append(
            Enqueue(
                f"{backend}/enqueue/bulk-raw",
                backend,
                f"raw: {driver} executemany, {CHUNK} per transaction",
                args.bulk,
                measure,
            )
        )
    only = [k for k in (args.only or "").split(",") if k]
    return [c for c in cases if not only or any(o in c.key for o in only)]
