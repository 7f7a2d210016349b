"""Helpers of the conformance suites (test_conformance*.py) and of the suites that build on them.

Engines of the application's own, the steps of one caller's transaction in each SQLAlchemy
flavour, tasks and claims at a fixed time (`T0`, `at()`: the driver contract takes `now`), and
the cleaner's manual clock.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    insert,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from tests.waiting import until
from txtasks import App, create_async_engine, create_engine
from txtasks.app import Task
from txtasks.clock import utcnow
from txtasks.driver import Driver
from txtasks.driver.urls import backend_name
from txtasks.keys import KeyLimits
from txtasks.payload import payload_encode
from txtasks.retry import Constant
from txtasks.schema.tables import tasks
from txtasks.types import NewTask, Outcome, TaskRow

FLAVOURS = ["connection", "session", "async_connection", "async_session"]
LEASE = timedelta(seconds=30)
T0 = datetime(2030, 1, 2, 3, 4, 5, 678901)
#: The cleaner's tests: the retry backoff of `cleaner_app`'s task.
BACKOFF = 10.0

# ----------------------------------------------------------------------------- engines and rows


@contextlib.contextmanager
def sync_engine(url: str) -> Iterator[Engine]:
    """A sync engine of the application's own, set up as txtasks documents (`txtasks.
    create_engine`: SQLite's settings, a transaction pooler's)."""
    engine = create_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


@contextlib.asynccontextmanager
async def async_engine(url: str) -> AsyncIterator[AsyncEngine]:
    """An async engine of the application's own (`txtasks.create_async_engine`)."""
    engine = create_async_engine(url)
    try:
        yield engine
    finally:
        await engine.dispose()


def table_rows(url: str, table: Table, *where: Any) -> list[Any]:
    """Rows of a table, read on a connection of its own (committed data only)."""
    with sync_engine(url) as engine, engine.connect() as conn:
        return list(conn.execute(select(table).where(*where).order_by(table.c.id)).all())


def task_ids(url: str) -> list[int]:
    """Ids in the hot table."""
    return [row.id for row in table_rows(url, tasks)]


async def claim_all(
    driver: Any, queues: Sequence[str] = ("default",), *, now: datetime | None = None
) -> list[TaskRow]:
    """Claim every ready task (as one worker would, in one statement)."""
    at = now or utcnow()
    return list(
        await driver.claims.task_claim_many(
            list(queues), 10_000, now=at, lease_until=at + LEASE, worker_id="conformance"
        )
    )


async def wait_blocked(url: str, connection_id: int) -> None:
    """Wait until the server shows that connection waiting on a lock (PostgreSQL, MariaDB)."""
    if backend_name(url) == "postgresql":
        probe = text("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :cid")
    else:  # the INSERT is still running only while it waits for the other transaction's lock
        probe = text(
            "SELECT INFO LIKE 'INSERT%' FROM information_schema.PROCESSLIST "
            "WHERE ID = :cid AND COMMAND = 'Query'"
        )
    async with async_engine(url) as engine:

        async def blocked() -> bool:
            async with engine.connect() as conn:
                return bool(await conn.scalar(probe, {"cid": connection_id}))

        await until(blocked, "the second transaction to wait on the lock")


async def connection_id(conn: AsyncConnection) -> int:
    """The server's id of a connection, in a transaction that is then ended."""
    sql = (
        "SELECT pg_backend_pid()" if conn.dialect.name == "postgresql" else "SELECT CONNECTION_ID()"
    )
    value = await conn.scalar(text(sql))
    await conn.commit()
    return int(value)


class Calls:
    """What handlers received, in the order they ran."""

    def __init__(self) -> None:
        self.payloads: list[Any] = []

    def __call__(self, payload: Any) -> None:
        self.payloads.append(payload)


# ----------------------------------------------------------------------------- one transaction

ORDERS = Table(
    "conformance_orders",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("name", String(64), nullable=False),
    mysql_engine="InnoDB",
)


@contextlib.contextmanager
def own_table(url: str) -> Iterator[Table]:
    """Create the application's table for one test, and drop it after."""
    with sync_engine(url) as engine:
        ORDERS.metadata.drop_all(engine)
        ORDERS.metadata.create_all(engine)
    try:
        yield ORDERS
    finally:
        with sync_engine(url) as engine:
            ORDERS.metadata.drop_all(engine)


def order_names(url: str) -> list[str]:
    return [row.name for row in table_rows(url, ORDERS)]


@dataclass
class Write:
    """The application's own row, written in the transaction."""

    name: str


@dataclass
class Enqueue:
    """One task enqueued in the transaction."""

    task: Task
    payload: Any = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class EnqueueMany:
    """A bulk enqueue in the transaction."""

    app: App
    rows: list[Any]


@dataclass
class Publish:
    """One publish to a topic in the transaction (`publishes` set: a bulk publish of them)."""

    app: App
    topic: str = ""
    payload: Any = None
    options: dict[str, Any] = field(default_factory=dict)
    publishes: list[Any] | None = None


Step = Write | Enqueue | EnqueueMany | Publish


def step_sync(executor: Connection | Session, step: Step) -> Any:
    if isinstance(step, Write):
        executor.execute(insert(ORDERS), {"name": step.name})
        return None
    if isinstance(step, Enqueue):
        return step.task.enqueue_tx(executor, step.payload, **step.options)
    if isinstance(step, Publish):
        if step.publishes is not None:
            return step.app.topics.publish_many_tx(executor, step.publishes)
        return step.app.topics.publish_tx(executor, step.topic, step.payload, **step.options)
    return step.app.enqueue_many_tx(executor, step.rows)


async def step_async(executor: AsyncConnection | AsyncSession, step: Step) -> Any:
    if isinstance(step, Write):
        await executor.execute(insert(ORDERS), {"name": step.name})
        return None
    if isinstance(step, Enqueue):
        return await step.task.aenqueue_tx(executor, step.payload, **step.options)
    if isinstance(step, Publish):
        if step.publishes is not None:
            return await step.app.topics.apublish_many_tx(executor, step.publishes)
        return await step.app.topics.apublish_tx(executor, step.topic, step.payload, **step.options)
    return await step.app.aenqueue_many_tx(executor, step.rows)


async def run_tx(
    url: str, flavour: str, steps: Sequence[Step], *, commit: bool = True
) -> list[Any]:
    """Run the steps in one transaction of the given SQLAlchemy flavour; commit or roll back.

    Returns what each step returned (None for the application's own writes).
    """
    if flavour == "connection":
        with sync_engine(url) as engine, engine.connect() as conn:
            tx = conn.begin()
            results = [step_sync(conn, s) for s in steps]
            (tx.commit if commit else tx.rollback)()
    elif flavour == "session":
        with sync_engine(url) as engine, Session(engine) as session:
            results = [step_sync(session, s) for s in steps]
            (session.commit if commit else session.rollback)()
    elif flavour == "async_connection":
        async with async_engine(url) as aengine, aengine.connect() as aconn:
            atx = await aconn.begin()
            results = [await step_async(aconn, s) for s in steps]
            await (atx.commit() if commit else atx.rollback())
    else:
        async with async_engine(url) as aengine, AsyncSession(aengine) as asession:
            results = [await step_async(asession, s) for s in steps]
            await (asession.commit() if commit else asession.rollback())
    return results


# ----------------------------------------------------------------------------- the driver contract at a fixed time


T0 = datetime(2030, 1, 2, 3, 4, 5, 678901)
LEASE = timedelta(seconds=30)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def new(
    payload: Any = None,
    *,
    queue: str = "q",
    priority: int = 0,
    run_at: datetime = T0,
    dedup_key: str | None = None,
    max_attempts: int = 5,
    headers: dict[str, str] | None = None,
    key: str | None = None,
) -> NewTask:
    data, content_type = payload_encode(payload)
    return NewTask(
        queue=queue,
        task_name="conformance.task",
        payload=data,
        content_type=content_type,
        priority=priority,
        run_at=run_at,
        max_attempts=max_attempts,
        created_at=at(-3600),
        dedup_key=dedup_key,
        headers=None if headers is None else json.dumps(headers),
        partition_key=key,
    )


async def claim(
    driver: Driver,
    queues: Sequence[str] = ("q",),
    limit: int = 100,
    *,
    now: datetime = T0,
    worker: str = "w1",
    keys: Mapping[str, KeyLimits] | None = None,
) -> list[TaskRow]:
    return await driver.claims.task_claim_many(
        list(queues), limit, now=now, lease_until=now + LEASE, worker_id=worker, keys=keys
    )


async def write(
    driver: Driver, *outcomes: Outcome, now: datetime = T0, archive: bool = True
) -> Any:
    return await driver.claims.outcome_write_many(
        list(outcomes), now=now, archive_completed=archive
    )


async def get(driver: Driver, task_id: int) -> TaskRow:
    row = await driver.tasks.task_get(task_id)
    assert row is not None, f"task {task_id} is gone"
    return row


# ----------------------------------------------------------------------------- the cleaner


class ManualClock:
    """The cleaner's clock: moved by the test."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def cleaner_app(driver: Driver, clock: ManualClock) -> App:
    """An App whose conformance task retries after BACKOFF seconds (the rescue policy)."""
    app = App("cleaner-test", driver=driver, clock=clock, default_queue="q")
    app.task(name="conformance.task", retry=Constant(BACKOFF))(lambda payload: None)
    return app
