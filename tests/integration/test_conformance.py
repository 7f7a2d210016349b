"""Conformance suite, part 1: enqueue inside the caller's transaction, on every database.

Each test runs against SQLite, PostgreSQL and MariaDB (the `database_url` fixture). The other
parts: `test_conformance_dedup.py` (dedup keys), `test_conformance_driver.py` (the driver
contract, also over the in-memory driver) and `test_conformance_worker.py` (the worker end to
end). Their shared helpers live here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    insert,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from txtasks import App, ConfigurationError, PayloadError
from txtasks.app import Task
from txtasks.clock import utcnow
from txtasks.driver.sqlite import sqlite_connection_setup
from txtasks.driver.urls import backend_name, url_async, url_sync
from txtasks.payload import payload_decode
from txtasks.schema.tables import tasks
from txtasks.testing import run_until_empty
from txtasks.types import TaskRow
from txtasks.worker.context import TaskContext

FLAVOURS = ["connection", "session", "async_connection", "async_session"]
LEASE = timedelta(seconds=30)

# ----------------------------------------------------------------------------- shared helpers


@contextlib.contextmanager
def sync_engine(url: str) -> Iterator[Engine]:
    """A sync engine of the application's own, set up as txtasks documents for SQLite."""
    engine = create_engine(url_sync(url))
    if backend_name(url) == "sqlite":
        sqlite_connection_setup(engine)
    try:
        yield engine
    finally:
        engine.dispose()


@contextlib.asynccontextmanager
async def async_engine(url: str) -> AsyncIterator[AsyncEngine]:
    """An async engine of the application's own."""
    engine = create_async_engine(url_async(url))
    if backend_name(url) == "sqlite":
        sqlite_connection_setup(engine.sync_engine)
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
        await driver.task_claim_many(
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
    deadline = time.monotonic() + 10
    async with async_engine(url) as engine:
        while True:
            async with engine.connect() as conn:
                if await conn.scalar(probe, {"cid": connection_id}):
                    return
            assert time.monotonic() < deadline, "the second transaction never waited on the lock"
            await asyncio.sleep(0.01)


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


@pytest.fixture
def orders(database_url: str) -> Iterator[Table]:
    """The application's own table, next to txtasks' tables."""
    with own_table(database_url) as table:
        yield table


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


Step = Write | Enqueue | EnqueueMany


def step_sync(executor: Connection | Session, step: Step) -> Any:
    if isinstance(step, Write):
        executor.execute(insert(ORDERS), {"name": step.name})
        return None
    if isinstance(step, Enqueue):
        return step.task.enqueue_tx(executor, step.payload, **step.options)
    return step.app.enqueue_many_tx(executor, step.rows)


async def step_async(executor: AsyncConnection | AsyncSession, step: Step) -> Any:
    if isinstance(step, Write):
        await executor.execute(insert(ORDERS), {"name": step.name})
        return None
    if isinstance(step, Enqueue):
        return await step.task.aenqueue_tx(executor, step.payload, **step.options)
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


# ----------------------------------------------------------------------------- 1. flavours


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_committed_enqueue_exists_and_runs(
    app: App, database_url: str, orders: Table, flavour: str
) -> None:
    calls = Calls()
    task = app.task(name="conformance.record")(calls)
    _, task_id = await run_tx(database_url, flavour, [Write("order-1"), Enqueue(task, {"n": 1})])

    row = await app.driver.task_get(task_id)
    assert row is not None
    assert (row.task_name, row.state.value, row.attempt) == ("conformance.record", "pending", 0)
    assert payload_decode(row.payload, row.content_type) == {"n": 1}
    assert order_names(database_url) == ["order-1"]

    stats = await run_until_empty(app)
    assert calls.payloads == [{"n": 1}]
    assert stats.outcomes == {"completed": 1}
    assert task_ids(database_url) == []


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_rolled_back_enqueue_never_exists_nor_runs(
    app: App, database_url: str, orders: Table, flavour: str
) -> None:
    calls = Calls()
    task = app.task(name="conformance.record")(calls)
    steps = [Write("order-1"), Enqueue(task, {"n": 1}), Enqueue(task, {"n": 2}, {"delay": 0})]
    _, first, second = await run_tx(database_url, flavour, steps, commit=False)

    assert await app.driver.task_get(first) is None
    assert await app.driver.task_get(second) is None
    assert task_ids(database_url) == []
    assert order_names(database_url) == []

    stats = await run_until_empty(app)
    assert (stats.claimed, stats.started, calls.payloads) == (0, 0, [])


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
async def test_enqueue_and_own_write_share_the_transaction(
    app: App, database_url: str, orders: Table, flavour: str, commit: bool
) -> None:
    calls = Calls()
    task = app.task(name="conformance.record")(calls)
    rows = [task.new({"bulk": i}) for i in range(3)]
    # the bulk enqueue comes first: it opens the transaction (on asyncpg it sends its rows with
    # COPY, on the same connection), and must still commit or roll back with the rest
    steps = [EnqueueMany(app, rows), Write("a"), Enqueue(task, "one"), Write("b"), Write("c")]
    await run_tx(database_url, flavour, steps, commit=commit)

    names, ids = order_names(database_url), task_ids(database_url)
    if commit:
        assert (names, len(ids)) == (["a", "b", "c"], 4)
    else:
        assert (names, ids) == ([], [])
    await run_until_empty(app)
    expected = ["one", {"bulk": 0}, {"bulk": 1}, {"bulk": 2}] if commit else []
    assert sorted(map(str, calls.payloads)) == sorted(map(str, expected))


async def test_enqueue_by_task_name_in_transaction(app: App, database_url: str) -> None:
    calls = Calls()
    app.task(name="conformance.by_name")(calls)
    with sync_engine(database_url) as engine, engine.begin() as conn:
        task_id = app.enqueue_tx(conn, "conformance.by_name", [1, 2])
    async with async_engine(database_url) as aengine, aengine.begin() as aconn:
        other = await app.aenqueue_tx(aconn, "conformance.by_name", [3])
    assert task_ids(database_url) == sorted([task_id, other])
    await run_until_empty(app)
    assert sorted(calls.payloads) == [[1, 2], [3]]


async def test_wrong_flavour_is_refused_before_writing(app: App, database_url: str) -> None:
    task = app.task(name="conformance.noop")(Calls())
    async with async_engine(database_url) as aengine, aengine.connect() as aconn:
        with pytest.raises(ConfigurationError, match="aenqueue_tx"):
            task.enqueue_tx(aconn, 1)  # type: ignore[arg-type]
    with (
        sync_engine(database_url) as engine,
        engine.connect() as conn,
        pytest.raises(ConfigurationError, match="enqueue_tx"),
    ):
        await task.aenqueue_tx(conn, 1)  # type: ignore[arg-type]
    assert task_ids(database_url) == []


async def test_enqueue_options_are_stored(database_url: str) -> None:
    fixed = datetime(2031, 5, 6, 7, 8, 9, 101112)
    app = App("options", database_url=database_url, clock=lambda: fixed)
    try:
        task = app.task(name="conformance.options", queue="opts", priority=2, max_attempts=7)(
            Calls()
        )
        plus_two = timezone(timedelta(hours=2))
        steps = [
            Enqueue(task, "now"),
            Enqueue(task, "delay", {"delay": 90}),
            Enqueue(task, "timedelta", {"delay": timedelta(minutes=2)}),
            Enqueue(task, "aware", {"run_at": datetime(2031, 5, 6, 12, 0, tzinfo=plus_two)}),
            Enqueue(task, "naive", {"run_at": fixed - timedelta(days=1)}),
            Enqueue(task, "custom", {"priority": -3, "queue": "other", "headers": {"h": "v"}}),
        ]
        ids = await run_tx(database_url, "async_session", steps)
        rows = [await app.driver.task_get(i) for i in ids]
        assert [r.run_at for r in rows if r] == [
            fixed,
            fixed + timedelta(seconds=90),
            fixed + timedelta(minutes=2),
            datetime(2031, 5, 6, 10, 0),
            fixed - timedelta(days=1),
            fixed,
        ]
        assert [(r.queue, r.priority, r.max_attempts) for r in rows if r] == [
            ("opts", 2, 7)
        ] * 5 + [("other", -3, 7)]
        assert {r.created_at for r in rows if r} == {fixed}
        assert rows[-1] is not None and json.loads(rows[-1].headers or "") == {"h": "v"}

        due = await claim_all(app.driver, ["opts", "other"], now=fixed)
        assert [r.id for r in due] == [ids[4], ids[0], ids[5]]  # priority, then run_at
        later = await claim_all(app.driver, ["opts"], now=fixed + timedelta(seconds=90))
        assert [r.id for r in later] == [ids[1]]
    finally:
        await app.aclose()


async def test_text_and_bytes_round_trip(app: App, database_url: str) -> None:
    seen: dict[int, tuple[Any, dict[str, str]]] = {}

    @app.task(name="conformance.text")
    def record(payload: Any, ctx: TaskContext) -> None:
        seen[ctx.task_id] = (payload, ctx.headers)

    @app.task(name="conformance.unicode_error", max_attempts=1)
    def fails(payload: Any) -> None:
        raise ValueError("échec 💥 失败")

    largest = "x" * (app.max_payload_bytes - 2)  # with its quotes: exactly the limit
    payloads: list[Any] = [{"name": "Zoë 🚀 日本"}, largest, bytes(range(256))]
    headers = {"from": "café ☕", "ключ": "значение"}
    with sync_engine(database_url) as engine, engine.begin() as conn:
        ids = [record.enqueue_tx(conn, payload, headers=headers) for payload in payloads]
        failing = fails.enqueue_tx(conn, None)
    await run_until_empty(app)
    assert [seen[i] for i in ids] == [(payload, headers) for payload in payloads]
    row = await app.driver.task_get(failing)
    assert row is not None and row.state.value == "dead"
    assert "ValueError: échec 💥 失败" in (row.last_error or "")


@pytest.mark.parametrize("flavour", ["session", "async_connection"])
async def test_a_bad_payload_fails_before_writing_and_spares_the_transaction(
    app: App, database_url: str, orders: Table, flavour: str
) -> None:
    task = app.task(name="conformance.bad_payload")(Calls())
    steps: list[Step] = [Write("before"), Enqueue(task, {"ok": 1})]
    for bad in ({"when": object()}, float("nan"), "x" * app.max_payload_bytes):
        with pytest.raises(PayloadError):
            await run_tx(database_url, flavour, [*steps, Enqueue(task, bad), Write("never")])
    assert (order_names(database_url), task_ids(database_url)) == ([], [])
    # the same transaction goes on after the error and commits
    if flavour == "session":
        with sync_engine(database_url) as engine, Session(engine) as session:
            session.execute(insert(ORDERS), {"name": "kept"})
            with pytest.raises(PayloadError):
                task.enqueue_tx(session, {"when": object()})
            task_id = task.enqueue_tx(session, "fine")
            session.commit()
    else:
        async with async_engine(database_url) as engine, engine.connect() as conn:
            await conn.execute(insert(ORDERS), {"name": "kept"})
            with pytest.raises(PayloadError):
                await task.aenqueue_tx(conn, {"when": object()})
            task_id = await task.aenqueue_tx(conn, "fine")
            await conn.commit()
    assert (order_names(database_url), task_ids(database_url)) == (["kept"], [task_id])


# ----------------------------------------------------------------------------- 2. visibility


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
async def test_uncommitted_task_is_never_claimable(
    app: App, database_url: str, commit: bool
) -> None:
    task = app.task(name="conformance.noop")(Calls())
    sqlite = backend_name(database_url) == "sqlite"
    async with async_engine(database_url) as engine, engine.connect() as conn:
        tx = await conn.begin()
        task_id = await task.aenqueue_tx(conn, {"n": 1})
        if not sqlite:  # SQLite's single writer lock would make these wait for the commit
            assert await claim_all(app.driver) == []
            assert await app.driver.task_get(task_id) is None
            now = utcnow()
            assert await app.driver.live_count(None, now=now, due_before=now + LEASE) == 0
        await (tx.commit if commit else tx.rollback)()

    claimed = await claim_all(app.driver)
    assert [r.id for r in claimed] == ([task_id] if commit else [])
    assert [r.attempt for r in claimed] == ([1] if commit else [])


# ----------------------------------------------------------------------------- 10. bulk


@pytest.mark.parametrize("flavour", ["connection", "async_session", "own-transaction"])
async def test_bulk_enqueue_returns_ids_in_input_order(
    app: App, database_url: str, flavour: str
) -> None:
    task = app.task(name="conformance.bulk")(Calls())
    count = 2000
    rows = [task.new({"i": i}, priority=i % 7) for i in range(count)]
    if flavour == "own-transaction":
        ids = await app.aenqueue_many(rows)
    else:
        [ids] = await run_tx(database_url, flavour, [EnqueueMany(app, rows)])
    assert len(ids) == count and len(set(ids)) == count
    stored = {
        r.id: payload_decode(r.payload, r.content_type) for r in table_rows(database_url, tasks)
    }
    assert len(stored) == count
    assert [stored[task_id] for task_id in ids] == [{"i": i} for i in range(count)]


async def test_bulk_enqueue_of_nothing_writes_nothing(app: App, database_url: str) -> None:
    with sync_engine(database_url) as engine, engine.begin() as conn:
        assert app.enqueue_many_tx(conn, []) == []
    assert await app.aenqueue_many([]) == []
    assert task_ids(database_url) == []
