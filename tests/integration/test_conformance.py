"""Conformance suite, part 1: enqueue inside the caller's transaction, on every database.

Each test runs against SQLite, PostgreSQL and MariaDB (the `database_url` fixture). The other
parts: `test_conformance_dedup.py` (dedup keys), `test_conformance_driver.py` (the driver
contract, also over the in-memory driver) and `test_conformance_worker.py` (the worker end to
end). Their shared helpers live in `conformance.py`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Table, delete, insert
from sqlalchemy.orm import Session

from tests.integration.conformance import (
    FLAVOURS,
    LEASE,
    ORDERS,
    Calls,
    Enqueue,
    EnqueueMany,
    Step,
    Write,
    async_engine,
    claim_all,
    order_names,
    own_table,
    run_tx,
    sync_engine,
    table_rows,
    task_ids,
)
from txtasks import App, ConfigurationError, PayloadError
from txtasks.clock import utcnow
from txtasks.driver.urls import backend_name
from txtasks.payload import payload_decode
from txtasks.schema.tables import key_hints, tasks
from txtasks.testing import run_until_empty
from txtasks.types import NewTask
from txtasks.worker.context import TaskContext

# ----------------------------------------------------------------------------- one transaction


@pytest.fixture
def orders(database_url: str) -> Iterator[Table]:
    """The application's own table, next to txtasks' tables."""
    with own_table(database_url) as table:
        yield table


# ----------------------------------------------------------------------------- 1. flavours


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_committed_enqueue_exists_and_runs(
    app: App, database_url: str, orders: Table, flavour: str
) -> None:
    calls = Calls()
    task = app.task(name="conformance.record")(calls)
    _, task_id = await run_tx(database_url, flavour, [Write("order-1"), Enqueue(task, {"n": 1})])

    row = await app.driver.tasks.task_get(task_id)
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

    assert await app.driver.tasks.task_get(first) is None
    assert await app.driver.tasks.task_get(second) is None
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
        rows = [await app.driver.tasks.task_get(i) for i in ids]
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
    row = await app.driver.tasks.task_get(failing)
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
            assert await app.driver.tasks.task_get(task_id) is None
            now = utcnow()
            assert await app.driver.tasks.live_count(None, now=now, due_before=now + LEASE) == 0
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


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
async def test_a_key_travels_with_the_transaction(
    app: App, database_url: str, flavour: str, commit: bool
) -> None:
    """A key given at enqueue, or by the task's key function, is stored with the task, with
    its hint for the claims; a rollback leaves neither."""
    calls = Calls()
    task = app.task(name="conformance.keyed", key=lambda p: f"customer:{p['c']}")(calls)
    steps: list[Step] = [Enqueue(task, {"c": 1}), Enqueue(task, {"c": 2}, {"key": "vip"})]
    first, second = await run_tx(database_url, flavour, steps, commit=commit)
    hints = table_rows(database_url, key_hints)
    if not commit:
        assert (await app.driver.tasks.task_get(first), hints) == (None, [])
        return
    rows = [await app.driver.tasks.task_get(i) for i in (first, second)]
    assert [r.partition_key for r in rows if r] == ["customer:1", "vip"]
    assert sorted(h.partition_key for h in hints) == ["customer:1", "vip"]
    stats = await run_until_empty(app)
    assert stats.outcomes == {"completed": 2}


def _mixed_rows(n: int) -> list[NewTask]:
    """New tasks unlike each other in every column a bulk enqueue writes: unicode, quotes,
    backslashes, `%`, NUL and non-UTF-8 bytes, large payloads, NULLs beside values, times
    apart, keys and dedup keys (one twice)."""
    t0 = datetime(2031, 2, 3, 4, 5, 6, 789012)
    odd = ["ünï 中文 🚀", 'it\'s "quoted" \\ 100% %s %(x)s', "", "a\tb\nc"]
    rows = []
    for i in range(n):
        text = odd[i % len(odd)]
        payload = (text.encode() + bytes([0, 255, 39, 92, i % 256])) * (1 + (i % 3) * 40)
        if i % 97 == 5:
            payload = bytes(range(256)) * 1200  # 300 KiB: statements split by size
        rows.append(
            NewTask(
                queue=f"q-{text}"[:40] if i % 5 == 0 else "bulk",
                task_name=f"conformance.mixed.{text}"[:60],
                payload=payload,
                content_type="application/octet-stream" if i % 2 else "application/json",
                priority=(i % 4) - 1,
                run_at=t0 + timedelta(microseconds=i) if i % 3 else t0 - timedelta(days=1),
                max_attempts=3 + i % 2,
                created_at=t0,
                dedup_key=None if i % 50 else f"dédup-{i % 100}",
                headers=None if i % 4 else json.dumps({"h": text}),
                expires_at=None if i % 6 else t0 + timedelta(hours=1, microseconds=i),
                partition_key=None if i % 7 else f"clé:{text}",
            )
        )
    return rows


def _stored(url: str, ids: list[int]) -> list[tuple[Any, ...]]:
    """The tasks `ids` as stored, but their ids, in the order of `ids`."""
    by_id = {r.id: tuple(r)[1:] for r in table_rows(url, tasks)}
    return [by_id[i] for i in ids]


@pytest.mark.parametrize("flavour", ["connection", "async_connection"])
async def test_bulk_enqueue_stores_rows_as_one_at_a_time(
    app: App, database_url: str, flavour: str
) -> None:
    """A bulk enqueue (whatever statements it sends) stores each row exactly as an enqueue
    of that row alone, across any statement or parameter limit, each id its row's."""
    rows = _mixed_rows(1203)
    single_ids = []
    for row in rows:
        with sync_engine(database_url) as engine, engine.begin() as conn:
            single_ids += app.enqueue_many_tx(conn, [row])
    one_by_one = _stored(database_url, single_ids)
    with sync_engine(database_url) as engine, engine.begin() as conn:
        conn.execute(delete(tasks))
        conn.execute(delete(key_hints))
    [ids] = await run_tx(database_url, flavour, [EnqueueMany(app, rows)])
    assert _stored(database_url, ids) == one_by_one
    assert len(table_rows(database_url, tasks)) == len(set(single_ids)) == len(set(ids))
    assert ids[0] == ids[100] and ids[0] != ids[50]  # a dedup key twice: one task


@pytest.mark.parametrize("count", [2, 501, 5000])
async def test_bulk_enqueue_of_identical_rows(app: App, database_url: str, count: int) -> None:
    """Rows alike in every column (one payload, one time) each get a task of their own."""
    task = app.task(name="conformance.same")(Calls())
    row = task.new({"same": True})
    with sync_engine(database_url) as engine, engine.begin() as conn:
        ids = app.enqueue_many_tx(conn, [row] * count)
    assert len(set(ids)) == count and ids == sorted(ids)
    assert [r.id for r in table_rows(database_url, tasks)] == ids
