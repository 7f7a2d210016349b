"""`txtasks.create_engine`, `txtasks.create_async_engine`, `txtasks.migrate` and
`App.amigrate`: an application's own transactions and txtasks' tables, on every database."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, insert, inspect, select, text

import txtasks
from tests.conftest import BACKENDS, server_url
from txtasks import App, ConfigurationError, MemoryDriver, TaskState
from txtasks.driver.sqlite import BUSY_TIMEOUT_MS
from txtasks.schema.migrate import latest_version
from txtasks.schema.tables import metadata as txtasks_metadata

DRIVERS = {
    "postgresql": ("postgresql+psycopg", "postgresql+asyncpg"),
    "mysql": ("mysql+pymysql", "mysql+aiomysql"),
    "sqlite": ("sqlite+pysqlite", "sqlite+aiosqlite"),
}


#: A queue no other test's worker consumes from.
QUEUE = "engines-test"


class Boom(Exception):
    pass


def emails_table() -> Table:
    return Table("engine_emails", MetaData(), Column("id", Integer, primary_key=True))


def task_ids(url: str) -> list[int]:
    """The tasks of this module's queue."""
    tasks = txtasks_metadata.tables["txtasks_tasks"]
    engine = txtasks.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.scalars(select(tasks.c.id).where(tasks.c.queue == QUEUE)))
    finally:
        engine.dispose()


# -- engines on the drivers txtasks uses -------------------------------------------------------


@pytest.mark.parametrize("backend", DRIVERS)
def test_the_engines_use_the_drivers_of_txtasks_whatever_the_url_names(backend: str) -> None:
    url = {"sqlite": "sqlite:///x.sqlite3", "mysql": "mariadb://u:p@h/db"}.get(
        backend, "postgres+psycopg2://u:p@h/db"
    )
    sync_engine = txtasks.create_engine(url)
    async_engine = txtasks.create_async_engine(url)
    assert (sync_engine.url.drivername, async_engine.url.drivername) == DRIVERS[backend]
    sync_engine.dispose()
    async_engine.sync_engine.dispose()


def test_extra_arguments_go_to_sqlalchemy(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.sqlite3'}"
    assert txtasks.create_engine(url, echo=True).echo is True
    assert txtasks.create_async_engine(url, echo=True).echo is True
    with pytest.raises(TypeError, match="no_such_option"):
        txtasks.create_engine(url, no_such_option=1)


@pytest.mark.parametrize("make", [txtasks.create_engine, txtasks.create_async_engine])
def test_a_url_txtasks_cannot_use_is_a_configuration_error(make: object) -> None:
    with pytest.raises(ConfigurationError, match="unsupported database 'oracle'"):
        make("oracle://u:p@h/db")  # type: ignore[operator]


def test_sqlite_connections_get_wal_a_busy_timeout_and_immediate_transactions(
    tmp_path: Path,
) -> None:
    engine = txtasks.create_engine(f"sqlite:///{tmp_path / 'x.sqlite3'}")
    try:
        with engine.begin() as conn:
            # BEGIN IMMEDIATE: the write lock is held from the start, before any statement.
            assert conn.connection.driver_connection.in_transaction  # type: ignore[union-attr]
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == BUSY_TIMEOUT_MS
    finally:
        engine.dispose()


async def test_async_sqlite_connections_get_the_same_settings(tmp_path: Path) -> None:
    engine = txtasks.create_async_engine(f"sqlite:///{tmp_path / 'x.sqlite3'}")
    try:
        async with engine.begin() as conn:
            assert (await conn.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
            assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() == BUSY_TIMEOUT_MS
    finally:
        await engine.dispose()


# -- enqueue_tx through them -------------------------------------------------------------------


async def test_a_task_enqueued_on_create_engine_commits_or_rolls_back_with_the_transaction(
    app: App, database_url: str
) -> None:
    job = app.task(name="engines.job", queue=QUEUE)(lambda payload: None)
    engine = txtasks.create_engine(database_url)
    try:
        with pytest.raises(Boom), engine.begin() as conn:
            job.enqueue_tx(conn, {"n": 1})
            raise Boom
        with engine.begin() as conn:
            task_id = job.enqueue_tx(conn, {"n": 2})
    finally:
        engine.dispose()
    assert task_ids(database_url) == [task_id]
    row = await app.driver.tasks.task_get(task_id)
    assert row is not None and row.state is TaskState.PENDING


async def test_a_task_enqueued_on_create_async_engine_commits_or_rolls_back_with_it(
    app: App, database_url: str
) -> None:
    job = app.task(name="engines.job", queue=QUEUE)(lambda payload: None)
    engine = txtasks.create_async_engine(database_url)
    try:
        with pytest.raises(Boom):
            async with engine.begin() as conn:
                await job.aenqueue_tx(conn, {"n": 1})
                raise Boom
        async with engine.begin() as conn:
            task_id = await job.aenqueue_tx(conn, {"n": 2})
    finally:
        await engine.dispose()
    assert task_ids(database_url) == [task_id]
    row = await app.driver.tasks.task_get(task_id)
    assert row is not None and row.state is TaskState.PENDING


# -- migrate -----------------------------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database without txtasks' tables (nor this module's)."""
    url = server_url(request, request.param, tmp_path)
    engine = txtasks.create_engine(url)
    try:
        with engine.begin() as conn:
            emails_table().drop(conn, checkfirst=True)
            txtasks_metadata.drop_all(conn)
            leftovers = MetaData()
            leftovers.reflect(conn, only=lambda name, _m: name.startswith("txtasks_"))
            leftovers.drop_all(conn)
    finally:
        engine.dispose()
    return url


def test_migrate_a_url_applies_every_version_once(empty_url: str) -> None:
    assert txtasks.migrate(empty_url) == list(range(1, latest_version() + 1))
    assert txtasks.migrate(empty_url) == []


def test_migrate_a_connection_commits_with_the_applications_own_tables(empty_url: str) -> None:
    emails = emails_table()
    engine = txtasks.create_engine(empty_url)
    try:
        with engine.begin() as conn:
            assert txtasks.migrate(conn) == list(range(1, latest_version() + 1))
            emails.create(conn)
        with engine.begin() as conn:
            assert {"txtasks_tasks", "engine_emails"} <= set(inspect(conn).get_table_names())
            conn.execute(insert(emails))
        assert txtasks.migrate(engine) == []
        with engine.begin() as conn:
            emails.drop(conn)
    finally:
        engine.dispose()


def test_migrate_something_else_says_what_it_takes() -> None:
    with pytest.raises(TypeError, match=r"app\.amigrate\(\)"):
        txtasks.migrate(42)  # type: ignore[arg-type]


async def test_app_amigrate_migrates_where_the_app_stores_tasks(empty_url: str) -> None:
    app = App("migrating", database_url=empty_url)
    try:
        assert await app.amigrate() == list(range(1, latest_version() + 1))
        assert await app.amigrate() == []
        assert await app.driver.tasks.task_get(1) is None  # the tables exist
    finally:
        await app.aclose()


async def test_app_amigrate_on_a_memory_driver_has_nothing_to_do() -> None:
    assert await App(driver=MemoryDriver()).amigrate() == []
