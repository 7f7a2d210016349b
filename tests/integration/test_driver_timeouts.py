"""Bounded database operations on the real servers: a half-open connection is cut within the
command timeout and replaced; every connection carries TCP keepalives."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, select, text
from sqlalchemy.exc import DBAPIError

from tests.conftest import reset_schema, server_url
from tests.tcp_proxy import TcpProxy, target_of
from txtasks import App, MemoryDriver
from txtasks.clock import utcnow
from txtasks.driver import SqlDriver, driver_for_url
from txtasks.driver.timeouts import DatabaseTimeout, Timeouts, socket_of
from txtasks.schema.tables import tasks
from txtasks.types import NewTask

SERVERS = [
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgresql),
    pytest.param("mysql", id="mysql", marks=pytest.mark.mysql),
]
#: The command timeout of these tests, and the most any step may take (a hang fails the test).
COMMAND = 1.0
BOUND = 15.0


@pytest.fixture(params=SERVERS)
async def proxied(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """A driver reaching a migrated database through a TCP proxy, and the proxy."""
    url = server_url(request, request.param, tmp_path)
    reset_schema(url)
    proxy = await TcpProxy.start(*target_of(url))
    driver = driver_for_url(proxy.url_for(url), timeouts=Timeouts(connect=5, command=COMMAND))
    try:
        yield driver, proxy
    finally:
        await driver.close()
        await proxy.close()


APP = App("timeouts", driver=MemoryDriver())
TASK = APP.task(name="t", queue="q")(lambda payload: None)


def new_task(n: int) -> NewTask:
    return TASK.new(n)


async def claim(driver: SqlDriver) -> int:
    now = driver_now()
    rows = await driver.claims.task_claim_many(
        ["q"], 10, now=now, lease_until=now + timedelta(seconds=30), worker_id="w"
    )
    return len(rows)


def driver_now() -> datetime:
    return utcnow()


async def test_a_frozen_connection_is_cut_and_replaced(proxied: Any) -> None:
    driver, proxy = proxied
    async with asyncio.timeout(BOUND):  # without the command timeout, this hangs for good
        await driver.open()
        await driver.tasks.task_insert_many([new_task(1)])
        assert await claim(driver) == 1  # both pools (SQLAlchemy's, asyncpg's) hold connections
        assert proxy.freeze() > 0  # every open connection stalls for good; new ones work
        with pytest.raises(DatabaseTimeout, match=f"within {COMMAND:g}s"):
            await driver.tasks.task_insert_many([new_task(2)])
        await driver.tasks.task_insert_many([new_task(3)])  # on a new connection
        claimed = 0
        while claimed == 0:  # a claim may meet another stalled connection first: cut too
            try:
                claimed = await claim(driver)
            except DatabaseTimeout:
                continue
        assert claimed == 1  # task 3; task 2's insert never committed
        assert proxy.accepted > 1  # the stalled connections were replaced


async def test_after_a_cut_the_pools_other_stalled_connections_are_replaced_unused(
    proxied: Any,
) -> None:
    """Connections that went through the same network stalled with the one that was cut: each
    is replaced at its next checkout instead of costing its own command timeout."""
    driver, proxy = proxied
    async with asyncio.timeout(BOUND):
        await driver.open()
        await driver.tasks.task_insert_many([new_task(1)])
        assert await claim(driver) == 1
        async with contextlib.AsyncExitStack() as stack:  # three connections in the pool
            for _ in range(3):
                conn = await stack.enter_async_context(driver.db.connect())
                await conn.execute(text("SELECT 1"))
        assert proxy.freeze() >= 3
        with pytest.raises(DatabaseTimeout):
            await driver.tasks.task_insert_many([new_task(2)])
        for n in range(3, 8):  # each would check a stalled connection out first
            await driver.tasks.task_insert_many([new_task(n)])
        assert await claim(driver) == 5  # the claims' own pool too


async def test_a_connection_that_stalls_while_it_opens_is_given_up_within_the_bounds(
    proxied: Any,
) -> None:
    """The network stalls just as connections open: the TCP connect succeeds, the server's
    greeting never arrives. aiomysql's connect timeout covers the TCP connect only, so a
    worker taking its first connection (or replacing a cut one) at that moment waited for
    good, and never stopped. Each operation now gives up within the connect and command
    timeouts, and works again once the network does."""
    driver, proxy = proxied
    assert driver.db.timeouts.connect + COMMAND < BOUND
    proxy.blackhole(include_new=True)  # new connections are accepted and carry nothing
    for operation in (lambda: driver.tasks.task_insert_many([new_task(1)]), lambda: claim(driver)):
        async with asyncio.timeout(BOUND):  # without the bound, this hangs for good
            with pytest.raises((DatabaseTimeout, TimeoutError, OSError, DBAPIError)):
                await operation()
    proxy.restore()
    async with asyncio.timeout(BOUND):
        await driver.tasks.task_insert_many([new_task(2)])
        assert await claim(driver) == 1


async def test_closing_a_driver_whose_connections_stalled_ends(proxied: Any) -> None:
    """A worker's exit closes its pools: a stalled connection never answers the goodbye."""
    driver, proxy = proxied
    await driver.open()
    await driver.tasks.task_insert_many([new_task(1)])
    assert await claim(driver) == 1  # every pool holds a connection
    assert proxy.freeze() > 0
    async with asyncio.timeout(BOUND):
        await driver.close()


@pytest.mark.parametrize("backend", SERVERS)
async def test_the_server_ends_a_stalled_session_and_frees_its_row_locks(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A session whose client stalled inside a transaction (the network froze after its
    SELECT ... FOR UPDATE) is ended by the server after the command timeout, so the rows it
    locked do not wait for it forever (PostgreSQL's idle_in_transaction_session_timeout,
    MariaDB's idle_transaction_timeout)."""
    url = server_url(request, backend, tmp_path)
    reset_schema(url)
    proxy = await TcpProxy.start(*target_of(url))
    stalled = driver_for_url(proxy.url_for(url), timeouts=Timeouts(connect=5, command=COMMAND))
    direct = driver_for_url(url, timeouts=Timeouts(connect=5, command=BOUND))
    lock = select(tasks.c.id).where(tasks.c.id == bindparam("id")).with_for_update()
    try:
        [task_id] = await direct.tasks.task_insert_many([new_task(1)])
        async with stalled.db.connect() as conn:  # its client side is cut after COMMAND
            await conn.execute(lock, {"id": task_id})
            assert proxy.freeze() == 1
            async with direct.db.begin() as other:  # waits for the server to end the session
                found = (await other.execute(lock, {"id": task_id})).scalar_one()
        assert found == task_id
    finally:
        await stalled.close()
        await direct.close()
        await proxy.close()


async def test_every_connection_has_tcp_keepalives(proxied: Any) -> None:
    driver, _proxy = proxied
    await driver.open()
    async with driver.db.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert_keepalive(socket_of(raw))
    await asyncio.to_thread(sync_keepalive, driver)  # the proxy runs on this event loop


def sync_keepalive(driver: SqlDriver) -> None:
    """psycopg (libpq's keepalive parameters) and pymysql (its socket) alike."""
    with driver.db.sync_engine.connect() as sync_conn:
        raw: Any = sync_conn.connection.driver_connection
        fileno = raw.pgconn.socket if hasattr(raw, "pgconn") else raw._sock.fileno()
        with socket.socket(fileno=os.dup(fileno)) as sock:
            assert_keepalive(sock)


def assert_keepalive(sock: Any) -> None:
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 25_000


@pytest.fixture
async def proxied_mysql(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """A MariaDB driver through a TCP proxy, and the proxy (`proxied`, MariaDB only)."""
    url = server_url(request, "mysql", tmp_path)
    reset_schema(url)
    proxy = await TcpProxy.start(*target_of(url))
    driver = driver_for_url(proxy.url_for(url), timeouts=Timeouts(connect=5, command=COMMAND))
    try:
        yield driver, proxy
    finally:
        await driver.close()
        await proxy.close()


async def claim_named(driver: SqlDriver, ids: list[int]) -> int:
    now = driver_now()
    rows = await driver.claims.task_claim_ids(
        ["q"], ids, now=now, lease_until=now + timedelta(seconds=30), worker_id="w"
    )
    return len(rows)


@pytest.mark.mysql
async def test_mariadb_kept_connection_is_bounded_cut_and_replaced(proxied_mysql: Any) -> None:
    """The connection MariaDB keeps for named claims: keepalives; a frozen one is cut within
    the command timeout and the next claim opens another; one that stalls as it opens is
    given up within the bounds; a driver whose kept connection stalled still closes."""
    driver, proxy = proxied_mysql
    async with asyncio.timeout(BOUND):
        ids = await driver.tasks.task_insert_many([new_task(n) for n in range(3)])
        assert await claim_named(driver, ids[:1]) == 1
        kept = driver.db._kept[1]
        assert_keepalive(socket_of(kept))
        assert proxy.freeze() > 0
        with pytest.raises(DatabaseTimeout, match=f"within {COMMAND:g}s"):
            await claim_named(driver, ids[1:2])
        assert driver.db._kept is None
        claimed = 0
        while claimed == 0:  # the engine's stalled connections are cut in turn
            with contextlib.suppress(DatabaseTimeout):
                claimed = await claim_named(driver, ids[1:2])
        assert claimed == 1 and driver.db._kept[1] is not kept
    proxy.blackhole(include_new=True)
    driver.db._kept_drop(driver.db._kept[1])
    async with asyncio.timeout(BOUND):
        with pytest.raises((DatabaseTimeout, TimeoutError, OSError, DBAPIError)):
            await claim_named(driver, ids[2:])
    proxy.restore()
    async with asyncio.timeout(BOUND):
        assert await claim_named(driver, ids[2:]) == 1
        assert proxy.freeze() > 0
        await driver.close()
