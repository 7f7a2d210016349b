"""Bounded database operations on the real servers: a half-open connection is cut within the
command timeout and replaced; every connection carries TCP keepalives."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import reset_schema, server_url
from tests.tcp_proxy import TcpProxy, target_of
from txtasks import App, MemoryDriver
from txtasks.clock import utcnow
from txtasks.driver import SqlDriver, driver_for_url
from txtasks.driver.timeouts import DatabaseTimeout, Timeouts, socket_of
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
    rows = await driver.task_claim_many(
        ["q"], 10, now=now, lease_until=now + timedelta(seconds=30), worker_id="w"
    )
    return len(rows)


def driver_now() -> datetime:
    return utcnow()


async def test_a_frozen_connection_is_cut_and_replaced(proxied: Any) -> None:
    driver, proxy = proxied
    async with asyncio.timeout(BOUND):  # without the command timeout, this hangs for good
        await driver.open()
        await driver.task_insert_many([new_task(1)])
        assert await claim(driver) == 1  # both pools (SQLAlchemy's, asyncpg's) hold connections
        assert proxy.freeze() > 0  # every open connection stalls for good; new ones work
        with pytest.raises(DatabaseTimeout, match=f"within {COMMAND:g}s"):
            await driver.task_insert_many([new_task(2)])
        await driver.task_insert_many([new_task(3)])  # on a new connection
        claimed = 0
        while claimed == 0:  # a claim may meet another stalled connection first: cut too
            try:
                claimed = await claim(driver)
            except DatabaseTimeout:
                continue
        assert claimed == 1  # task 3; task 2's insert never committed
        assert proxy.accepted > 1  # the stalled connections were replaced


async def test_every_connection_has_tcp_keepalives(proxied: Any) -> None:
    driver, _proxy = proxied
    await driver.open()
    async with driver.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert_keepalive(socket_of(raw))
    await asyncio.to_thread(sync_keepalive, driver)  # the proxy runs on this event loop


def sync_keepalive(driver: SqlDriver) -> None:
    """psycopg (libpq's keepalive parameters) and pymysql (its socket) alike."""
    with driver.sync_engine.connect() as sync_conn:
        raw: Any = sync_conn.connection.driver_connection
        fileno = raw.pgconn.socket if hasattr(raw, "pgconn") else raw._sock.fileno()
        with socket.socket(fileno=os.dup(fileno)) as sock:
            assert_keepalive(sock)


def assert_keepalive(sock: Any) -> None:
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 25_000
