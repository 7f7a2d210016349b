"""Several `txtasks migrate` at once (Kubernetes may start two migrate Jobs) on a fresh database:
every one exits 0, the schema is applied once, each migration is recorded once."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import Connection, Engine, create_engine, event, inspect, select, text

from tests import isolation
from tests.acceptance.apps import cli_many
from tests.conftest import backends, server_url
from tests.waiting import NotWithin, until_sync
from txtasks.cli import demo_app
from txtasks.driver import driver_for_url
from txtasks.driver.mysql import migration_lock_name
from txtasks.driver.urls import url_sync
from txtasks.errors import SchemaError
from txtasks.schema import migrate as schema_migrate
from txtasks.schema.migrate import LOCK_NAME, latest_version, migrate, migrations_all
from txtasks.schema.tables import metadata, migrations

#: Migrators started at once: enough that some wait for the lock while others work.
MIGRATORS = 8


@pytest.fixture
def empty(database_url: str) -> Iterator[Engine]:
    """An engine on the fixture's database with no txtasks table at all."""
    engine = create_engine(url_sync(database_url))
    with engine.begin() as conn:
        demo_app.metadata.drop_all(conn)
        metadata.drop_all(conn)
    with engine.connect() as conn:
        assert not [t for t in inspect(conn).get_table_names() if t.startswith("txtasks_")]
    yield engine
    engine.dispose()


def test_concurrent_migrates_apply_each_migration_once(database_url: str, empty: Engine) -> None:
    results = cli_many([(["migrate"], database_url)] * MIGRATORS, timeout=90)

    failed = [r for r in results if r.returncode != 0]
    assert not failed, "\n".join(f"exit {r.returncode}: {r.stderr[-2000:]}" for r in failed)
    outputs = [r.stdout for r in results]
    assert sum("applied migrations" in out for out in outputs) == 1, outputs
    assert sum("schema already at version" in out for out in outputs) == MIGRATORS - 1, outputs
    with empty.connect() as conn:
        recorded = Counter(conn.execute(select(migrations.c.version)).scalars())
    assert recorded == Counter(m.version for m in migrations_all())
    assert max(recorded) == latest_version()


#: Whether another session of this database waits for the migration lock (PostgreSQL,
#: MariaDB/MySQL): tests in other processes migrate their own databases on the same server.
LOCK_WAITERS = {
    "postgresql": (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ),
    "mysql": (
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
        " WHERE INFO LIKE 'SELECT GET_LOCK(%%' AND ID <> CONNECTION_ID() AND DB = DATABASE()"
    ),
}


def lock_waited(engine: Engine, asked: threading.Event) -> bool:
    """Whether the second migrate waits for the lock. The servers show it. SQLite does not, but
    there the lock is the second's BEGIN IMMEDIATE: once asked, it waits or it was too late."""
    if engine.dialect.name == "sqlite":
        return asked.is_set()
    with engine.connect() as conn:
        return bool(conn.exec_driver_sql(LOCK_WAITERS[engine.dialect.name]).scalar())


def on_begin_immediate(asked: threading.Event) -> Callable[..., None]:
    def before_cursor_execute(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if statement.startswith("BEGIN IMMEDIATE"):
            asked.set()

    return before_cursor_execute


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgresql),
        pytest.param("mysql", id="mysql", marks=pytest.mark.mysql),
    ],
)
def test_a_migrate_that_starts_as_another_commits_applies_nothing(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path
) -> None:
    """The worst moment for a second `migrate`: the first is about to commit. The second
    must wait for that commit (its lock is held until then), read the new version and apply
    nothing. On MariaDB the lock used to be released before the commit, and the second
    applied the last migration again: "Table 'txtasks_writes' already exists". On SQLite
    (engines other than txtasks' own, such as a plain `create_engine`), nothing was locked."""
    url = server_url(request, backend, tmp_path)
    first, second = (create_engine(url_sync(url)) for _ in range(2))
    with first.begin() as conn:
        demo_app.metadata.drop_all(conn)
        metadata.drop_all(conn)
    outcome: list[object] = []
    timed_out: list[bool] = []
    threads: list[threading.Thread] = []
    asked = threading.Event()
    event.listen(second, "before_cursor_execute", on_begin_immediate(asked))

    def migrate_second() -> None:
        try:
            with second.begin() as conn:
                outcome.append(migrate(conn))
        except Exception as exc:
            outcome.append(exc)

    def before_commit(_conn: object) -> None:
        """Start the second migrate; commit once it has finished or waits for the lock."""
        if threads:  # only the first commit
            return
        thread = threading.Thread(target=migrate_second)
        threads.append(thread)
        thread.start()
        try:
            until_sync(
                lambda: not thread.is_alive() or lock_waited(first, asked),
                "the second migrate to end or wait for the lock",
                interval=0.01,
            )
        except NotWithin:
            timed_out.append(True)

    event.listen(first, "commit", before_commit)
    try:
        with first.begin() as conn:
            applied = migrate(conn)
        for thread in threads:
            thread.join(timeout=30)
    finally:
        first.dispose()
        second.dispose()
    assert [m.version for m in applied] == [m.version for m in migrations_all()]
    assert not timed_out
    assert outcome == [[]], outcome


def hold_lock(conn: Connection) -> None:
    """Hold the migration lock of `conn`'s database, as a migrate that never finishes would."""
    if conn.dialect.name == "postgresql":
        held = conn.exec_driver_sql(f"SELECT pg_try_advisory_lock(hashtext('{LOCK_NAME}'))")
    else:
        name = migration_lock_name(conn)
        held = conn.execute(text("SELECT GET_LOCK(:name, 0)"), {"name": name})
    assert held.scalar() in (True, 1), "the migration lock is taken"


@contextlib.contextmanager
def lock_held(url: str) -> Iterator[None]:
    """The migration lock of `url`'s database held by a session of its own meanwhile."""
    holder = create_engine(url_sync(url))
    try:
        with holder.connect() as conn:
            hold_lock(conn)
            yield
    finally:
        holder.dispose()


@pytest.mark.parametrize("backend", backends("postgresql", "mysql"))
async def test_a_migrate_that_cannot_get_the_lock_says_so(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = server_url(request, backend, tmp_path)
    monkeypatch.setattr(schema_migrate, "LOCK_WAIT", 1)
    driver = driver_for_url(url)
    try:
        with lock_held(url):
            started = time.monotonic()
            with pytest.raises(SchemaError, match="held the migration lock 'txtasks_migrate'"):
                await driver.migrate()
            assert 0.9 < time.monotonic() - started < 10
    finally:
        await driver.close()


@pytest.mark.postgresql
def test_the_lock_wait_outlasts_a_shorter_statement_timeout(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's statement_timeout (txtasks sets one) does not cut the wait short."""
    monkeypatch.setattr(schema_migrate, "LOCK_WAIT", 1)
    bounded = create_engine(
        url_sync(postgres_url), connect_args={"options": "-c statement_timeout=200"}
    )
    try:
        with lock_held(postgres_url), bounded.begin() as conn:
            started = time.monotonic()
            with pytest.raises(SchemaError, match="for more than 1 s"):
                migrate(conn)
            assert time.monotonic() - started > 0.9
    finally:
        bounded.dispose()


@pytest.mark.parametrize("backend", backends("postgresql", "mysql"))
async def test_a_migrate_never_waits_for_one_in_another_database_of_the_server(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two applications' databases on one server: a migration of one (here one that never
    ends) does not hold up the other's. (MariaDB's named locks are the server's.)"""
    url = server_url(request, backend, tmp_path)
    monkeypatch.setattr(schema_migrate, "LOCK_WAIT", 1)
    base = request.getfixturevalue("txtasks_servers").urls[backend]
    other = isolation.create_database(backend, base, isolation.own_name() + "_b")
    driver = driver_for_url(other)
    try:
        with lock_held(url):
            started = time.monotonic()
            await driver.migrate()  # already at the latest version: takes the lock, reads it
            assert time.monotonic() - started < 0.9
    finally:
        await driver.close()
        isolation.drop_databases(backend, base, isolation.like_literal(isolation.own_name() + "_b"))
