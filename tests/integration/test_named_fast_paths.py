"""The named claim's fast paths on MariaDB and SQLite give what the transactional way gives.

A worker whose queues were empty claims the tasks a wake-up named by their ids
(`Claims.task_claim_ids`). MariaDB does it in one round trip on a connection kept for it
(`txtasks.driver.mysql.NAMED_CLAIM_SQL`), SQLite in one statement on the event loop's thread
(`txtasks.driver.sqlite.NAMED_CLAIM_SQL`); the transactional way (`SqlClaims.named_claim`, a
SELECT ... FOR UPDATE SKIP LOCKED and an UPDATE in a transaction through SQLAlchemy) remains
for when a row is locked, or the write lock taken. One workload runs on each way, from the
same empty schema and the same clock: the claims must hand out the same rows (every column),
and the tables must end up the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, create_engine, select

from tests.conftest import reset_schema, server_url
from tests.integration.conformance import LEASE, T0, at, new
from txtasks.driver import SqlDriver, driver_for_url
from txtasks.driver.mysql import MySQLClaims, MySQLDriver
from txtasks.driver.sql_claims import Claim, SqlClaims
from txtasks.driver.sqlite import SQLiteDriver
from txtasks.driver.urls import url_sync
from txtasks.schema.tables import archive, tasks
from txtasks.types import NewTask, Outcome, OutcomeKind, TaskRow

pytestmark = pytest.mark.timeout(120)

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("mysql", id="mysql", marks=pytest.mark.mysql),
]


class GenericMySQLClaims(MySQLClaims):
    """MariaDB's claims, the named ones the transactional way only."""

    async def named_claim(self, claim: Claim, ids: list[int]) -> list[TaskRow]:
        return await SqlClaims.named_claim(self, claim, ids)


class GenericMySQLDriver(MySQLDriver):
    claims_class = GenericMySQLClaims


class GenericSQLiteDriver(SQLiteDriver):
    claims_class = SqlClaims


GENERIC: dict[str, type[SqlDriver]] = {"mysql": GenericMySQLDriver, "sqlite": GenericSQLiteDriver}


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return server_url(request, request.param, tmp_path)


@pytest.fixture
async def driver(url: str) -> AsyncIterator[SqlDriver]:
    reset_schema(url)
    sql = driver_for_url(url)
    await sql.open()
    yield sql
    await sql.close()


def fast_path_used(driver: SqlDriver) -> bool:
    """The driver claimed by name on its fast path (its kept connection is open)."""
    return driver.db._kept is not None  # type: ignore[attr-defined]


def workload_rows() -> list[NewTask]:
    """Every column a claim returns, set and unset; queues told apart byte for byte; tasks a
    named claim must leave (a key, a paused queue, another queue, not due yet)."""
    rows = []
    for i in range(36):
        kind = i % 9
        rows.append(
            new(
                {"n": i, "text": "é\u2603\U0001f600"},
                queue={0: "q", 1: "Q", 2: "qé", 3: "held", 4: "other"}.get(kind, "q"),
                priority=i % 4,
                run_at=at(i % 5 - 2) if kind != 5 else at(10_000),
                dedup_key=f"dedup-{i}" if i % 2 else None,
                headers={"h": str(i), "quote": "'\"\\"} if i % 3 else None,
                key="k" if kind == 6 else None,
            )
        )
        if kind == 7:
            rows[-1] = dataclasses.replace(rows[-1], expires_at=at(3600 + i))
    return rows


QUEUES = ["q", "qé", "held"]


async def run_workload(driver: SqlDriver, used: list[bool]) -> list[list[TaskRow]]:
    """Named claims of overlapping sets of ids (some claimed already, some missing), each
    batch's outcomes written (a retry comes back with its error and checkpoint); the rows.
    Whether the fast path was taken goes to `used`."""
    await driver.open()
    try:
        ids = await driver.tasks.task_insert_many(workload_rows())
        await driver.control.queue_pause("held", now=T0)
        claims: list[list[TaskRow]] = []
        now = T0
        for turn in range(16):
            now += timedelta(seconds=10)  # past every retry's backoff below
            named = [*ids[turn * 2 : turn * 2 + 6], ids[turn], max(ids) + 100 + turn]
            rows = await driver.claims.task_claim_ids(
                QUEUES, named, now=now, lease_until=now + LEASE, worker_id=f"w{turn % 2}"
            )
            claims.append(rows)
            outcomes = [
                Outcome(
                    r.key,
                    OutcomeKind.RETRY if r.attempt == 1 and r.id % 2 else OutcomeKind.COMPLETE,
                    error=f"boom at turn {turn}",
                    run_at=now + timedelta(seconds=1),
                    checkpoint=f'{{"turn": {turn}}}',
                )
                for r in rows
            ]
            result = await driver.claims.outcome_write_many(outcomes, now=now, worker_id=None)
            assert result.stale == ()
        used.append(fast_path_used(driver))
        return claims
    finally:
        await driver.close()


def tables(url: str) -> dict[str, list[Any]]:
    engine = create_engine(url_sync(url))
    try:
        with engine.connect() as conn:
            return {
                t.name: [tuple(r) for r in conn.execute(select(t).order_by(*t.primary_key))]
                for t in (tasks, archive)
            }
    finally:
        engine.dispose()


async def test_the_fast_path_claims_named_tasks_as_the_transactional_way_does(url: str) -> None:
    found = {}
    for name, cls in (("fast", driver_for_url(url).__class__), ("generic", GENERIC[_backend(url)])):
        reset_schema(url)
        used: list[bool] = []
        claims = await run_workload(cls(url), used)
        assert used == [name == "fast"]
        found[name] = (claims, tables(url))
    (fast, fast_tables), (generic, generic_tables) = found["fast"], found["generic"]
    assert sum(len(c) for c in fast) > 15
    assert {r.queue for c in fast for r in c} == {"q", "qé"}
    rows = [r for c in fast for r in c]
    assert any(r.attempt == 2 and r.last_error and r.checkpoint for r in rows)
    for column in ("headers", "dedup_key", "expires_at"):
        assert {getattr(r, column) is None for r in rows} == {True, False}, column
    assert fast == generic
    for table in fast_tables:
        assert fast_tables[table] == generic_tables[table], table


def _backend(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "mysql"


async def claim_named(driver: SqlDriver, ids: list[int], worker: str = "w1") -> list[TaskRow]:
    return await driver.claims.task_claim_ids(
        ["q"], ids, now=T0, lease_until=T0 + LEASE, worker_id=worker
    )


async def test_the_fast_path_is_taken(driver: SqlDriver) -> None:
    ids = await driver.tasks.task_insert_many([new(i) for i in range(3)])
    assert [r.id for r in await claim_named(driver, ids)] == ids
    assert fast_path_used(driver)


@pytest.mark.mysql
async def test_mariadb_skips_a_locked_row_at_once(mysql_url: str) -> None:
    """A row another transaction holds is not waited for: the claim takes the others (the
    kept connection's UPDATE fails at once; the transactional way skips the row)."""
    reset_schema(mysql_url)
    driver, other = driver_for_url(mysql_url), driver_for_url(mysql_url)
    try:
        ids = await driver.tasks.task_insert_many([new(i) for i in range(3)])
        assert await claim_named(driver, [max(ids) + 1]) == []  # the kept connection opens
        lock = select(tasks.c.id).where(tasks.c.id == bindparam("id")).with_for_update()
        async with other.db.begin() as conn:
            await conn.execute(lock, {"id": ids[1]})
            started = time.monotonic()
            got = await claim_named(driver, ids)
            assert time.monotonic() - started < 1.0  # no lock wait
        assert [r.id for r in got] == [ids[0], ids[2]]
        assert fast_path_used(driver)  # kept after the lock error
        assert [r.id for r in await claim_named(driver, ids)] == [ids[1]]
    finally:
        await driver.close()
        await other.close()


async def test_racing_drivers_claim_each_named_task_once(url: str) -> None:
    """Claimers of two processes (here: two drivers) and of one, racing for the same ids."""
    reset_schema(url)
    drivers = [driver_for_url(url), driver_for_url(url)]
    try:
        for _ in range(5):
            ids = await drivers[0].tasks.task_insert_many([new(i) for i in range(12)])
            results = await asyncio.gather(
                *(claim_named(drivers[i % 2], ids, worker="same") for i in range(6))
            )
            claimed = [r.id for rows in results for r in rows]
            assert sorted(claimed) == sorted(ids)
        assert all(fast_path_used(d) for d in drivers)
    finally:
        for d in drivers:
            await d.close()


async def test_sqlite_waits_for_a_held_write_lock_off_the_event_loop(tmp_path: Path) -> None:
    """Another connection holds SQLite's write lock: the claim neither fails nor blocks the
    event loop (no busy wait on its thread): it waits in aiosqlite's thread, and claims once
    the lock is let go."""
    url = f"sqlite:///{tmp_path / 'txtasks.sqlite3'}"
    reset_schema(url)
    driver = driver_for_url(url)
    holder = sqlite3.connect(str(tmp_path / "txtasks.sqlite3"), isolation_level=None)
    try:
        ids = await driver.tasks.task_insert_many([new(i) for i in range(2)])
        assert [r.id for r in await claim_named(driver, ids[:1])] == ids[:1]
        holder.execute("BEGIN IMMEDIATE")
        claim = asyncio.ensure_future(claim_named(driver, ids[1:]))
        ticks = 0
        for _ in range(20):  # the event loop runs meanwhile
            await asyncio.sleep(0.01)
            ticks += 1
        assert not claim.done()
        holder.execute("COMMIT")
        assert [r.id for r in await asyncio.wait_for(claim, 30)] == ids[1:]
        assert ticks == 20
    finally:
        holder.close()
        await driver.close()


async def test_sqlite_in_memory_has_no_kept_connection() -> None:
    """Another connection would open another database: the transactional way only."""
    driver = driver_for_url("sqlite://")
    try:
        assert isinstance(driver, SQLiteDriver)
        assert driver.db.kept() is None
    finally:
        await driver.close()


@pytest.mark.mysql
async def test_mariadb_keeps_no_connection_beyond_a_budget(mysql_url: str) -> None:
    """Under a connection budget every connection is the pools': the named claim takes the
    transactional way, and the process holds no more than the budget."""
    reset_schema(mysql_url)
    driver = driver_for_url(mysql_url, connections=3)
    try:
        ids = await driver.tasks.task_insert_many([new(i) for i in range(3)])
        assert [r.id for r in await claim_named(driver, ids)] == ids
        assert not fast_path_used(driver)
    finally:
        await driver.close()
