"""The test servers are real and answer what txtasks relies on."""

from __future__ import annotations

import os
import uuid
from urllib.parse import unquote, urlsplit

import aio_pika
import aiomysql
import asyncpg
import pytest

from tests.waiting import until

pytest_plugins = ("tests.servers",)  # also loaded by tests/conftest.py; harmless twice


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


async def _mysql_connect(url: str) -> aiomysql.Connection:
    u = urlsplit(url)
    return await aiomysql.connect(
        host=u.hostname,
        port=u.port or 3306,
        user=unquote(u.username or ""),
        password=unquote(u.password or ""),
        db=u.path.lstrip("/"),
        autocommit=True,
    )


@pytest.mark.postgresql
async def test_postgres_select_1(postgres_url: str) -> None:
    conn = await asyncpg.connect(postgres_url)
    try:
        assert await conn.fetchval("SELECT 1") == 1
    finally:
        await conn.close()


@pytest.mark.postgresql
async def test_postgres_skip_locked_gives_each_session_another_row(postgres_url: str) -> None:
    table = _name("smoke")
    one = await asyncpg.connect(postgres_url)
    two = await asyncpg.connect(postgres_url)
    claim = f"SELECT id FROM {table} ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
    try:
        await one.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
        await one.execute(f"INSERT INTO {table} SELECT generate_series(1, 3)")
        async with one.transaction():
            first = await one.fetchval(claim)
            async with two.transaction():
                second = await two.fetchval(claim)
        assert (first, second) == (1, 2)
    finally:
        await one.execute(f"DROP TABLE IF EXISTS {table}")
        await one.close()
        await two.close()


@pytest.mark.mysql
async def test_mariadb_insert_returning(mysql_url: str) -> None:
    table = _name("smoke")
    conn = await _mysql_connect(mysql_url)
    try:
        async with conn.cursor() as cur:
            await cur.execute(
                f"CREATE TABLE {table} (id INT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(40) NOT NULL)"
            )
            try:
                await cur.execute(
                    f"INSERT INTO {table} (name) VALUES (%s), (%s) RETURNING id, name", ("a", "b")
                )
                rows = await cur.fetchall()
                await cur.execute(f"SELECT COUNT(*) FROM {table}")
                (count,) = await cur.fetchone()
            finally:
                await cur.execute(f"DROP TABLE {table}")
    finally:
        await conn.ensure_closed()
    assert [name for _, name in rows] == ["a", "b"]
    assert rows[0][0] < rows[1][0]
    assert count == 2


@pytest.mark.mysql
async def test_mariadb_skip_locked_gives_each_session_another_row(mysql_url: str) -> None:
    table = _name("smoke")
    one = await _mysql_connect(mysql_url)
    two = await _mysql_connect(mysql_url)
    claim = f"SELECT id FROM {table} ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
    try:
        async with one.cursor() as c1, two.cursor() as c2:
            await c1.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY)")
            try:
                await c1.execute(f"INSERT INTO {table} VALUES (1), (2), (3)")
                await one.begin()
                await two.begin()
                await c1.execute(claim)
                await c2.execute(claim)
                claimed = ((await c1.fetchone())[0], (await c2.fetchone())[0])
            finally:
                await two.rollback()  # release the row locks before DROP waits on them
                await one.rollback()
                await c1.execute(f"DROP TABLE {table}")
    finally:
        await one.ensure_closed()
        await two.ensure_closed()
    assert claimed == (1, 2)


@pytest.mark.mysql
async def test_mariadb_of_the_services_script_flushes_its_log_as_configured(
    mysql_url: str,
) -> None:
    """tests/services.sh runs MariaDB with MY_FAST (default PG_FAST's, itself 1): the redo log
    written at each commit and flushed once a second (2), or flushed at each commit (1)."""
    if not os.environ.get("TXTASKS_TEST_SERVICES_ENV"):
        pytest.skip("servers not started by tests/services.sh")
    fast = os.environ.get("MY_FAST", os.environ.get("PG_FAST", "1")) != "0"
    conn = await _mysql_connect(mysql_url)
    try:
        async with conn.cursor() as cur:
            await cur.execute("SELECT @@innodb_flush_log_at_trx_commit")
            (flush,) = await cur.fetchone()
    finally:
        await conn.ensure_closed()
    assert int(flush) == (2 if fast else 1)


@pytest.mark.rabbitmq
async def test_rabbitmq_publish_then_get(amqp_url: str) -> None:
    body = uuid.uuid4().bytes
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        channel = await connection.channel()  # publisher confirms on: publish returns once routed
        queue = await channel.declare_queue(_name("smoke"), durable=False)
        try:
            await channel.default_exchange.publish(
                aio_pika.Message(body=body), routing_key=queue.name
            )
            message = await until(
                lambda: queue.get(fail=False, timeout=5), "the published message", interval=0.1
            )
            await message.ack()
            assert message.body == body
        finally:
            await queue.delete(if_unused=False, if_empty=False)
