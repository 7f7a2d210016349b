"""PostgreSQL's raw asyncpg pools: one per purpose and event loop, however many callers ask at
once (a claim and a cancel check racing at a worker's start), and every one closed with the
driver."""

from __future__ import annotations

import asyncio

from tests.conftest import reset_schema
from txtasks.driver import driver_for_url
from txtasks.driver.postgresql import PostgresDriver


async def test_callers_racing_for_a_pool_share_one(postgres_url: str) -> None:
    reset_schema(postgres_url)
    driver = driver_for_url(postgres_url)
    assert isinstance(driver, PostgresDriver)
    try:
        pools = await asyncio.gather(*[driver.db.raw_pool("claims") for _ in range(4)])
        assert len({id(p) for p in pools}) == 1  # before: one pool each, three never closed
        rows = await asyncio.gather(*[driver.db.raw_fetch("writes", "SELECT 1") for _ in range(3)])
        assert [r[0][0] for r in rows] == [1, 1, 1]
        assert len(driver.db._pools) == 2
    finally:
        await driver.close()


async def test_statements_racing_for_a_pool_of_one_never_wait_on_a_kept_connection(
    postgres_url: str,
) -> None:
    """Under a small budget one asyncpg connection serves claims and outcome writes: the one
    a statement is done with goes to the statement waiting for it, not kept for later."""
    reset_schema(postgres_url)
    driver = driver_for_url(postgres_url, connections=3)
    assert isinstance(driver, PostgresDriver) and driver.db.raw_shared
    try:
        statements = [
            driver.db.raw_fetch(purpose, "SELECT pg_sleep(0.01), 1")
            for _ in range(5)
            for purpose in ("claims", "writes")
        ]
        rows = await asyncio.wait_for(asyncio.gather(*statements), 10)
        assert [r[0][1] for r in rows] == [1] * 10
        assert len(driver.db._pools) == 1
    finally:
        await driver.close()


async def test_a_kept_connection_the_server_closed_is_replaced_not_an_error(
    postgres_url: str,
) -> None:
    """A connection kept for the next statement that the server ends (a restart, an idle
    timeout) is handed back by asyncpg itself: the next statement takes another one, instead
    of failing with "connection has been released back to the pool"."""
    reset_schema(postgres_url)
    driver = driver_for_url(postgres_url)
    assert isinstance(driver, PostgresDriver)
    try:
        [[pid]] = await driver.db.raw_fetch("claims", "SELECT pg_backend_pid()")
        assert "claims" in driver.db._kept
        await driver.db.raw_fetch("writes", "SELECT pg_terminate_backend($1)", pid)
        kept = driver.db._kept["claims"][1]
        for _ in range(200):  # the client sees the end of its connection
            if kept._con is None:
                break
            await asyncio.sleep(0.01)
        [[other]] = await driver.db.raw_fetch("claims", "SELECT pg_backend_pid()")
        assert other != pid
    finally:
        await driver.close()
