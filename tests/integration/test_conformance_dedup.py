"""Conformance suite, part 2: dedup keys, on every database.

A duplicate key, while the first task is live, returns the existing id and never aborts the
caller's transaction; once the task finished, the key is free again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Table, text

from tests.integration.conformance import (
    FLAVOURS,
    ORDERS,
    Calls,
    Enqueue,
    EnqueueMany,
    Write,
    async_engine,
    connection_id,
    order_names,
    own_table,
    run_tx,
    table_rows,
    task_ids,
    wait_blocked,
)
from txtasks import App
from txtasks.driver.urls import backend_name
from txtasks.payload import payload_decode
from txtasks.schema.tables import tasks
from txtasks.testing import run_until_empty


@pytest.fixture
def orders(database_url: str) -> Iterator[Table]:
    with own_table(database_url) as table:
        yield table


def live_with_key(url: str, key: str) -> list[Any]:
    return table_rows(url, tasks, tasks.c.dedup_key == key)


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_dedup_in_one_transaction_keeps_the_callers_writes(
    app: App, database_url: str, orders: Table, flavour: str
) -> None:
    task = app.task(name="conformance.dedup")(Calls())
    steps = [
        Write("before"),
        Enqueue(task, "first", {"dedup_key": "K"}),
        Enqueue(task, "second", {"dedup_key": "K"}),
        Write("after"),
    ]
    _, first, second, _ = await run_tx(database_url, flavour, steps)
    assert first == second
    assert order_names(database_url) == ["before", "after"]
    [row] = live_with_key(database_url, "K")
    assert (row.id, payload_decode(row.payload, row.content_type)) == (first, "first")


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_dedup_across_transactions_keeps_the_callers_writes(
    app: App, database_url: str, orders: Table, flavour: str
) -> None:
    task = app.task(name="conformance.dedup")(Calls())
    [first] = await run_tx(database_url, flavour, [Enqueue(task, "first", {"dedup_key": "K"})])
    steps = [Write("before"), Enqueue(task, "again", {"dedup_key": "K"}), Write("after")]
    _, again, _ = await run_tx(database_url, flavour, steps)
    assert again == first
    assert order_names(database_url) == ["before", "after"]
    assert [r.id for r in live_with_key(database_url, "K")] == [first]


@pytest.mark.parametrize("flavour", ["connection", "async_connection"])
async def test_dedup_bulk_with_duplicates_inside_the_batch(
    app: App, database_url: str, flavour: str
) -> None:
    task = app.task(name="conformance.dedup")(Calls())
    [existing] = await run_tx(database_url, flavour, [Enqueue(task, "old", {"dedup_key": "X"})])
    rows = [
        task.new("a1", dedup_key="A"),
        task.new("plain"),
        task.new("a2", dedup_key="A"),
        task.new("x", dedup_key="X"),
        task.new("b", dedup_key="B"),
        task.new("b2", dedup_key="B"),
    ]
    [ids] = await run_tx(database_url, flavour, [EnqueueMany(app, rows)])
    assert len(ids) == len(rows)
    assert ids[0] == ids[2] and ids[4] == ids[5] and ids[3] == existing
    assert len({ids[0], ids[1], ids[3], ids[4]}) == 4
    stored = {
        r.id: payload_decode(r.payload, r.content_type) for r in table_rows(database_url, tasks)
    }
    assert stored == {existing: "old", ids[0]: "a1", ids[1]: "plain", ids[4]: "b"}


async def test_dedup_key_is_free_again_once_the_task_finished(app: App, database_url: str) -> None:
    calls = Calls()
    task = app.task(name="conformance.dedup")(calls)
    first = await task.aenqueue("first", dedup_key="K")
    assert await task.aenqueue("dup", dedup_key="K") == first
    await run_until_empty(app)
    finished = await app.driver.tasks.task_get(first)
    assert finished is not None and finished.state.value == "completed"

    second = await task.aenqueue("second", dedup_key="K")
    assert second != first
    assert [r.id for r in live_with_key(database_url, "K")] == [second]
    await run_until_empty(app)
    assert calls.payloads == ["first", "second"]


async def test_dedup_key_of_a_rolled_back_task_stays_free(app: App, database_url: str) -> None:
    task = app.task(name="conformance.dedup")(Calls())
    await run_tx(
        database_url, "async_connection", [Enqueue(task, 1, {"dedup_key": "K"})], commit=False
    )
    kept = await task.aenqueue(2, dedup_key="K")
    [row] = live_with_key(database_url, "K")
    assert row.id == kept
    assert payload_decode(row.payload, row.content_type) == 2
    assert len(task_ids(database_url)) == 1


@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
async def test_dedup_concurrent_transactions_make_one_task(
    app: App, database_url: str, first_commits: bool
) -> None:
    """Both transactions insert the same key; the second waits for the first to end."""
    task = app.task(name="conformance.dedup")(Calls())
    sqlite = backend_name(database_url) == "sqlite"
    async with (
        async_engine(database_url) as engine_a,
        async_engine(database_url) as engine_b,
        engine_a.connect() as conn_a,
        engine_b.connect() as conn_b,
    ):
        cid = None if sqlite else await connection_id(conn_b)
        first = await task.aenqueue_tx(conn_a, "from-a", dedup_key="K")  # transaction A, open

        async def second() -> int:
            task_id = await task.aenqueue_tx(conn_b, "from-b", dedup_key="K")  # waits for A
            await conn_b.commit()
            return task_id

        waiter = asyncio.create_task(second())
        if cid is not None:
            await wait_blocked(database_url, cid)
        await (conn_a.commit() if first_commits else conn_a.rollback())
        second_id = await asyncio.wait_for(waiter, 30)

    [row] = live_with_key(database_url, "K")
    assert row.id == second_id
    if first_commits:
        assert second_id == first
        assert payload_decode(row.payload, row.content_type) == "from-a"
    else:
        assert payload_decode(row.payload, row.content_type) == "from-b"


async def test_dedup_keys_are_compared_exactly(app: App, database_url: str) -> None:
    """Keys differing in case, accents or a trailing space are different keys on every backend."""
    task = app.task(name="conformance.dedup")(Calls())
    first = await task.aenqueue(0, dedup_key="order-1")
    others = [
        await task.aenqueue(i, dedup_key=key)
        for i, key in enumerate(["ORDER-1", "order-1 ", "ördér-1"], start=1)
    ]
    assert await task.aenqueue(9, dedup_key="order-1") == first
    assert len({first, *others}) == 4
    keys = {r.dedup_key for r in table_rows(database_url, tasks)}
    assert keys == {"order-1", "ORDER-1", "order-1 ", "ördér-1"}


async def test_dedup_sees_a_task_committed_after_the_callers_snapshot(
    app: App, database_url: str, orders: Table
) -> None:
    """The caller's transaction read before another one committed the key (REPEATABLE READ)."""
    if backend_name(database_url) == "sqlite":
        pytest.skip(
            "SQLite has one writer: no other transaction commits while the caller's is open"
        )
    task = app.task(name="conformance.dedup")(Calls())
    async with async_engine(database_url) as engine, engine.connect() as conn:
        await conn.execute(text("SELECT COUNT(*) FROM txtasks_tasks"))  # the snapshot starts
        committed = await task.aenqueue("elsewhere", dedup_key="K")  # its own transaction
        await conn.execute(ORDERS.insert(), {"name": "mine"})
        assert await task.aenqueue_tx(conn, "mine", dedup_key="K") == committed
        await conn.commit()
    assert order_names(database_url) == ["mine"]
    assert [r.id for r in live_with_key(database_url, "K")] == [committed]
