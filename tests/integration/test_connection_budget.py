"""A connection budget (`db_connections`) bounds what a worker holds and never deadlocks it.

At the smallest budget each database accepts, one worker runs tasks of every kind that needs
a connection: claims without and with a key, retries (the generic outcome path), fast
outcomes (PostgreSQL's own asyncpg pools), heartbeats, progress, and handlers' own
transactions (async and, when the worker has sync handlers, sync) that enqueue a follow-up in
them and, nested, another one on a connection of their own. Everything finishes, no pool ever
held more than its share, and the kernel's count of the process's connections to the server
never passed the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select
from sqlalchemy.engine import make_url

from tests.conftest import backends, reset_schema
from tests.integration.conformance import sync_engine
from tests.sockets import tcp_connections
from txtasks import App, KeyLimits, Retry, TaskContext
from txtasks.driver import SqlDriver
from txtasks.driver.database import ENGINE_MIN
from txtasks.driver.pooling import ENV_CONNECTIONS
from txtasks.driver.postgresql import PostgresDatabase
from txtasks.errors import ConfigurationError
from txtasks.testing import run_until_empty

pytestmark = pytest.mark.timeout(90)

metadata = MetaData()
effects = Table(
    "budget_effects",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("task", String(64), nullable=False),
    Column("n", Integer, nullable=False),
)

PLAIN, KEYED, TRANSACTIONS, SYNC_TRANSACTIONS = 60, 30, 20, 10


@pytest.fixture(autouse=True)
def no_budget_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_CONNECTIONS, raising=False)


def budget_app(url: str, budget: int, sync: bool) -> App:
    """The tasks of the module docstring, on `url` with the budget; the sync one if `sync`."""
    app = App("budget", database_url=url, db_connections=budget)

    @app.task(name="budget.follow_up", queue="budget")
    async def follow_up(payload: dict[str, Any]) -> None: ...

    @app.task(name="budget.plain", queue="budget")
    async def plain(payload: dict[str, Any], ctx: TaskContext) -> None:
        ctx.progress(f"{payload['n']} started")
        await asyncio.sleep(0.01)

    @app.task(
        name="budget.keyed",
        queue="budget",
        key=lambda p: f"k{p['n'] % 3}",
        key_limits=KeyLimits(concurrency=1),
        retry=0,
    )
    async def keyed(payload: dict[str, Any], ctx: TaskContext) -> None:
        if ctx.attempt == 1 and payload["n"] % 2:
            raise Retry(delay=0)  # a retry: the generic outcome path

    @app.task(name="budget.transaction", queue="budget")
    async def transaction(payload: dict[str, Any], ctx: TaskContext) -> None:
        async with ctx.transaction() as conn:
            await conn.execute(insert(effects).values(task="async", n=payload["n"]))
            await follow_up.aenqueue_tx(conn, {"n": payload["n"]})
            await follow_up.aenqueue({"nested": payload["n"]})  # another connection, nested

    def sync_transaction(payload: dict[str, Any], ctx: TaskContext) -> None:
        with ctx.transaction_sync() as conn:
            conn.execute(insert(effects).values(task="sync", n=payload["n"]))
            follow_up.enqueue_tx(conn, {"n": payload["n"]})
            follow_up.enqueue({"nested": payload["n"]})

    if sync:
        app.task(name="budget.sync_transaction", queue="budget")(sync_transaction)
    return app


@dataclass
class Peak:
    """The most connections each of a driver's pools held at once, sampled."""

    pools: dict[str, int] = field(default_factory=dict)
    #: This process's TCP connections to the server.
    sockets: int = 0

    def note(self, name: str, count: int) -> None:
        self.pools[name] = max(self.pools.get(name, 0), count)


def pool_counts(driver: SqlDriver) -> dict[str, int]:
    """The connections open in each pool of the driver now."""
    db = driver.db
    counts = {}
    for name, engine in (("engine", db._engine), ("sync", db._sync_engine)):
        if engine is not None:
            pool: Any = engine.pool
            counts[name] = pool.checkedout() + pool.checkedin()
    if isinstance(db, PostgresDatabase):
        for name, (_loop, raw) in list(db._pools.items()):
            counts[f"raw:{name}"] = raw.get_size()
    return counts


@contextlib.asynccontextmanager
async def sampled(driver: SqlDriver) -> AsyncIterator[Peak]:
    """Sample the pools, and this process's connections to the server (all of them the
    worker's meanwhile), every few milliseconds."""
    peak = Peak()
    port = make_url(str(driver.url)).port

    async def sample() -> None:
        while True:
            for name, count in pool_counts(driver).items():
                peak.note(name, count)
            if port is not None:
                peak.sockets = max(peak.sockets, tcp_connections("self", port))
            await asyncio.sleep(0.002)

    sampler = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler


@contextlib.contextmanager
def effects_table(url: str) -> Iterator[None]:
    with sync_engine(url) as engine:
        metadata.drop_all(engine)
        metadata.create_all(engine)
    try:
        yield
    finally:
        with sync_engine(url) as engine:
            metadata.drop_all(engine)


async def run_at_budget(url: str, budget: int, *, sync: bool = True) -> Peak:
    app = budget_app(url, budget, sync)
    syncs = SYNC_TRANSACTIONS if sync else 0
    driver = app.driver
    assert isinstance(driver, SqlDriver) and driver.connections == budget
    try:
        for n in range(PLAIN):
            await app.aenqueue("budget.plain", {"n": n})
        await app.aenqueue_many([app.new_task("budget.keyed", {"n": n}) for n in range(KEYED)])
        await app.aenqueue_many(
            [app.new_task("budget.transaction", {"n": n}) for n in range(TRANSACTIONS)]
            + [app.new_task("budget.sync_transaction", {"n": n}) for n in range(syncs)]
        )
        async with sampled(driver) as peak:
            stats = await asyncio.wait_for(
                run_until_empty(app, concurrency=8, lease=3.0, progress_interval=0.05), 60
            )
        follow_ups = 2 * (TRANSACTIONS + syncs)
        assert stats.outcomes == {
            "completed": PLAIN + KEYED + TRANSACTIONS + syncs + follow_ups,
            "retryable": KEYED // 2,
        }
        assert (stats.claim_errors, stats.stale) == (0, 0)
        assert await driver.admin.dead_list() == []
        async with driver.db.connect() as conn:
            rows = (await conn.execute(select(effects.c.task, effects.c.n))).all()
        assert sorted(rows) == sorted(
            [("async", n) for n in range(TRANSACTIONS)] + [("sync", n) for n in range(syncs)]
        )
        assert driver.db.sync_shared is sync
    finally:
        await app.aclose()
    return peak


def check_peak(peak: Peak, url: str, budget: int, *, sync: bool = True) -> None:
    """No engine above its share, and the process within the budget."""
    db: Any = App(database_url=url, db_connections=budget).driver.db  # type: ignore[attr-defined]
    db.sync_shared = sync
    assert 0 < peak.pools.get("engine", 0) <= db.engine_connections(), peak
    assert peak.pools.get("sync", 0) <= (db.engine_connections(sync=True) if sync else 0), peak
    assert 0 < peak.sockets <= budget, peak


def smallest(url: str, *, sync: bool) -> int:
    """The smallest budget the database accepts, for a worker with sync handlers or without."""
    db: Any = App(database_url=url).driver.db  # type: ignore[attr-defined]
    return int(db.min_connections + (ENGINE_MIN if sync else 0))


@pytest.mark.parametrize("sync", [True, False], ids=["sync-handlers", "async-only"])
@pytest.mark.parametrize("database_url", backends("postgresql", "mysql"), indirect=True)
async def test_the_smallest_budget_runs_everything_and_holds_no_more(
    database_url: str, sync: bool
) -> None:
    budget = smallest(database_url, sync=sync)
    with effects_table(database_url):
        peak = await run_at_budget(database_url, budget, sync=sync)
    check_peak(peak, database_url, budget, sync=sync)


@pytest.mark.postgresql
async def test_the_smallest_budget_behind_pgbouncer(postgres_url: str, pgbouncer_url: str) -> None:
    reset_schema(postgres_url)
    budget = smallest(pgbouncer_url, sync=True)
    with effects_table(postgres_url):
        peak = await run_at_budget(pgbouncer_url, budget)
    check_peak(peak, pgbouncer_url, budget)


@pytest.mark.postgresql
async def test_a_budget_with_an_asyncpg_pool_per_purpose(postgres_url: str) -> None:
    reset_schema(postgres_url)
    with effects_table(postgres_url):
        peak = await run_at_budget(postgres_url, 8)
    check_peak(peak, postgres_url, 8)
    assert {"raw:claims", "raw:writes"} <= set(peak.pools)


@pytest.mark.parametrize("database_url", backends("sqlite"), indirect=True)
async def test_a_budget_too_small_for_sync_handlers_is_refused_at_start(
    database_url: str,
) -> None:
    app = budget_app(database_url, smallest(database_url, sync=False), sync=True)
    try:
        with pytest.raises(ConfigurationError, match=r"db_connections: at least 4 .* sync"):
            await run_until_empty(app)
    finally:
        await app.aclose()
