"""The application's enqueue never fails or blocks because workers are claiming: its own
transactions, each a business row and a task, all commit while several workers claim."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from tests.conftest import BACKENDS, reset_schema, server_url
from tests.waiting import until
from txtasks import App, Worker, WorkerConfig
from txtasks.driver import driver_for_url
from txtasks.driver.mysql import MySQLDialect
from txtasks.driver.sqlite import sqlite_connection_setup
from txtasks.driver.urls import url_async

CLIENTS = 6
TRANSACTIONS = 40  # per client
WORKERS = 3
#: MariaDB's error number of a deadlock (its victim's transaction is rolled back).
DEADLOCK = 1213

metadata = MetaData()
orders = Table("chaos_orders", metadata, Column("id", Integer, primary_key=True))


@pytest.mark.parametrize("backend", BACKENDS)
async def test_claims_never_fail_an_application_transaction(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = server_url(request, backend, tmp_path)
    reset_schema(url)
    engine = create_async_engine(url_async(url), pool_size=CLIENTS)
    if backend == "sqlite":
        sqlite_connection_setup(engine.sync_engine)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.drop_all)
        await conn.run_sync(metadata.create_all)

    app = App("beside", database_url=url)
    done: list[int] = []

    @app.task(name="ship", queue="orders")
    async def ship(payload: int) -> None:
        done.append(payload)

    async def enqueue_in(conn: AsyncConnection, n: int) -> None:
        """A task, the business row, another task: workers claim between the statements."""
        await ship.aenqueue_tx(conn, 2 * n - 1)
        await conn.execute(insert(orders).values(id=n))
        await ship.aenqueue_tx(conn, 2 * n)

    failures: list[BaseException] = []

    async def client(c: int) -> None:
        for t in range(TRANSACTIONS):
            try:
                async with engine.begin() as conn:
                    await enqueue_in(conn, c * TRANSACTIONS + t + 1)
            except Exception as exc:  # the application's transaction failed: the defect
                failures.append(exc)

    deadlocks = worker_deadlocks(monkeypatch)
    config = WorkerConfig(concurrency=4, poll_interval=0.005, flush_interval=0.001)
    workers = [
        Worker(app, config, driver=driver_for_url(url), notifier=None) for _ in range(WORKERS)
    ]
    running = [asyncio.create_task(w.run()) for w in workers]
    try:
        async with asyncio.timeout(90):
            await asyncio.gather(*(client(c) for c in range(CLIENTS)))
            async with engine.connect() as conn:
                committed = (await conn.execute(select(func.count()).select_from(orders))).scalar()
            expected = 2 * (committed or 0)
            await until(lambda: len(done) >= expected, "every committed task done", timeout=90)
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*running, return_exceptions=True)
        for w in workers:
            await w.driver.close()
        await app.aclose()
        await engine.dispose()
    assert [f"{type(e).__name__}: {e}"[:300] for e in failures] == []
    # nor one between the workers' own transactions: every statement locks only its rows
    assert [str(e) for e in deadlocks] == []
    assert sorted(done) == list(range(1, 2 * CLIENTS * TRANSACTIONS + 1))


def worker_deadlocks(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """The deadlocks the workers' drivers of this process meet (MariaDB: InnoDB picks a
    victim, the driver tries again), gathered as they happen. Not InnoDB's own counter: it
    counts those of every test on the server."""
    seen: list[BaseException] = []
    transient = MySQLDialect.error_is_transient

    def spy(cls: type[MySQLDialect], exc: BaseException) -> bool:
        args = getattr(exc, "args", ())
        if args and args[0] == DEADLOCK:
            seen.append(exc)
        return transient(exc)

    monkeypatch.setattr(MySQLDialect, "error_is_transient", classmethod(spy))
    return seen
