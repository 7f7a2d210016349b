"""Enqueue through a plain DB-API connection, in the caller's transaction, with every driver
DbapiTx takes (psycopg, psycopg2, PyMySQL, mysqlclient, sqlite3).

The rows are those a SQLAlchemy connection's enqueue writes (the same plan runs); the wake-ups
go out only after the caller says its transaction committed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Table, select

from tests.conftest import reset_schema, server_url
from tests.integration.conformance import table_rows
from tests.integration.dbapi_connect import DBAPI_DRIVERS, dbapi_connect, dbapi_module
from tests.recording import Recording
from txtasks import App, ConfigurationError, DbapiTx, create_engine
from txtasks.dbapi import driver_of
from txtasks.schema.tables import key_hints, tasks
from txtasks.types import NewTask


@pytest.fixture(params=DBAPI_DRIVERS)
def dbapi_driver(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(backend, DB-API module) of each driver; skipped where the module is not installed."""
    backend, driver = request.param
    dbapi_module(driver)
    return backend, driver


@pytest.fixture
def database_url(
    request: pytest.FixtureRequest, dbapi_driver: tuple[str, str], tmp_path: Path
) -> str:
    """A migrated, empty database of the driver's backend."""
    url = server_url(request, dbapi_driver[0], tmp_path)
    reset_schema(url)
    return url


@pytest.fixture
async def recording() -> Recording:
    return Recording()


@pytest.fixture
async def app(database_url: str, recording: Recording) -> AsyncIterator[App]:
    application = App("dbapi", database_url=database_url, notifier=recording)  # type: ignore[arg-type]

    @application.task(name="send", queue="emails")
    def send(payload: Any) -> None:
        return None

    @application.task(name="bill", queue="billing", subscribe="order.created")
    def bill(payload: Any) -> None:
        return None

    @application.task(name="ship", queue="shipping", subscribe="order.created")
    def ship(payload: Any) -> None:
        return None

    yield application
    await application.aclose()


@pytest.fixture
def connection(database_url: str, dbapi_driver: tuple[str, str]) -> Iterator[Any]:
    conn = dbapi_connect(database_url, dbapi_driver[1])
    yield conn
    conn.close()


def ids_of(url: str) -> list[int]:
    return [row.id for row in table_rows(url, tasks)]


async def test_committed_tasks_exist_and_wake_after_the_commit(
    app: App, connection: Any, database_url: str, recording: Recording
) -> None:
    tx = DbapiTx(connection)
    first = app.tasks["send"].enqueue_tx(tx, {"n": 1})
    more = app.enqueue_many_tx(tx, [app.new_task("send", {"n": n}) for n in (2, 3)])
    connection.commit()
    assert recording.calls == []  # committed, not yet told
    tx.after_commit()
    assert ids_of(database_url) == [first, *more]
    assert recording.calls == [("emails", [first]), ("emails", more)] or recording.calls == [
        ("emails", [first, *more])
    ]
    tx.after_commit()  # sent once
    assert len({i for _, ids in recording.calls for i in ids}) == 3


async def test_a_rollback_leaves_no_task_and_no_wake_up(
    app: App, connection: Any, database_url: str, recording: Recording
) -> None:
    tx = DbapiTx(connection)
    app.tasks["send"].enqueue_tx(tx, {"n": 1})
    app.enqueue_many_tx(tx, [app.new_task("send", {"n": 2})])
    connection.rollback()
    tx.after_rollback()
    tx.after_commit()
    assert ids_of(database_url) == []
    assert recording.calls == []


async def test_the_context_manager_commits_or_rolls_back(
    app: App, connection: Any, database_url: str, recording: Recording
) -> None:
    with pytest.raises(RuntimeError), DbapiTx(connection) as tx:
        app.tasks["send"].enqueue_tx(tx, {"n": 1})
        raise RuntimeError("the caller's own write failed")
    assert ids_of(database_url) == [] and recording.calls == []
    with DbapiTx(connection) as tx:
        task_id = app.tasks["send"].enqueue_tx(tx, {"n": 2})
    assert ids_of(database_url) == [task_id]
    assert recording.calls == [("emails", [task_id])]


async def test_a_rolled_back_savepoint_drops_only_its_tasks(
    app: App, connection: Any, database_url: str
) -> None:
    tx = DbapiTx(connection)
    if isinstance(connection, __import__("sqlite3").Connection):
        connection.execute("BEGIN")  # sqlite3 opens its transaction only before a write
    kept = app.tasks["send"].enqueue_tx(tx, {"n": 1})
    cursor = connection.cursor()
    cursor.execute("SAVEPOINT before_more")
    app.enqueue_many_tx(tx, [app.new_task("send", {"n": n}) for n in (2, 3)])
    cursor.execute("ROLLBACK TO SAVEPOINT before_more")
    connection.commit()
    tx.after_commit()
    assert ids_of(database_url) == [kept]


def _comparable(url: str, table: Table) -> list[tuple[Any, ...]]:
    """The rows of a table without their ids (whose values differ by insertion order)."""
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(select(table).order_by(table.c.id)).all()
    engine.dispose()
    skip = {"id", "task_id"}
    return [tuple(v for k, v in row._mapping.items() if k not in skip) for row in rows]


async def test_rows_are_those_a_sqlalchemy_connection_writes(
    app: App, connection: Any, database_url: str
) -> None:
    rows: list[NewTask] = [
        app.new_task("send", {"plain": 1}),
        app.new_task("send", {"keyed": 2}, key="customer:7", priority=5),
        app.new_task("send", {"dedup": 3}, dedup_key="order-3", headers={"trace": "x"}),
        app.new_task("send", b"\x00bytes", delay=3600),
        app.new_task("send", b"\xff\xfe not UTF-8 \\ ' %s"),
        app.new_task("send", {"text": "na\u00efve \u2713 \U0001f600 ' \\ %"}, key="k\u00e9y"),
    ]
    engine = create_engine(database_url)
    with engine.begin() as conn:
        app.enqueue_many_tx(conn, rows)
    engine.dispose()
    by_sqlalchemy = {t.name: _comparable(database_url, t) for t in (tasks, key_hints)}
    with engine.begin() as conn:
        conn.execute(tasks.delete())
        conn.execute(key_hints.delete())
    engine.dispose()
    with DbapiTx(connection) as tx:
        app.enqueue_many_tx(tx, rows)
    by_dbapi = {t.name: _comparable(database_url, t) for t in (tasks, key_hints)}
    assert by_dbapi == by_sqlalchemy
    assert len(by_dbapi[tasks.name]) == len(rows)


async def test_the_connection_is_left_as_it_was(
    app: App, connection: Any, dbapi_driver: tuple[str, str]
) -> None:
    """No commit, no rollback, no close, no session setting: the transaction is the caller's."""
    tx = DbapiTx(connection)
    app.tasks["send"].enqueue_tx(tx, {"n": 1})
    cursor = connection.cursor()
    cursor.execute("SELECT COUNT(*) FROM txtasks_tasks")
    assert cursor.fetchone()[0] == 1  # still in the open transaction, on the same connection
    if dbapi_driver[1] == "psycopg2":  # SQLAlchemy's would register UUID's typecaster on it
        assert connection.string_types == {}
    connection.rollback()


async def test_a_publish_commits_with_the_transaction_and_wakes_its_groups_after(
    app: App, connection: Any, database_url: str, recording: Recording
) -> None:
    await app.topics.asubscribe()
    tx = DbapiTx(connection)
    app.topics.publish_tx(tx, "order.created", {"order": 1})
    connection.rollback()
    tx.after_rollback()
    assert ids_of(database_url) == [] and recording.calls == []
    with DbapiTx(connection) as tx:
        ids = app.topics.publish_tx(tx, "order.created", {"order": 2})
        assert recording.calls == []
    assert len(ids) == 2 and ids_of(database_url) == sorted(ids)
    assert sorted(queue for queue, _ in recording.calls) == ["billing", "shipping"]
    assert sorted(i for _, woken in recording.calls for i in woken) == sorted(ids)


def test_each_driver_gets_its_own_dialect(connection: Any, dbapi_driver: tuple[str, str]) -> None:
    backend, driver = dbapi_driver
    assert driver_of(connection) == driver
    with DbapiTx(connection).sql_connection() as sql:
        assert (sql.dialect.name, type(sql.dialect).__name__) == (
            backend,
            {
                "psycopg": "PsycopgCallerTx",
                "psycopg2": "Psycopg2CallerTx",
                "pymysql": "PyMySQLCallerTx",
                "MySQLdb": "MySQLdbCallerTx",
                "sqlite3": "SQLiteCallerTx",
            }[driver],
        )
    connection.rollback()


def test_an_unsupported_connection_says_what_to_pass() -> None:
    with pytest.raises(ConfigurationError) as refused:
        DbapiTx(object())
    assert str(refused.value) == (
        "DbapiTx: builtins.object is not a psycopg (3), psycopg2, PyMySQL, mysqlclient (MySQLdb) "
        "or sqlite3 connection; pass one of those, or a SQLAlchemy Connection"
    )


async def test_a_bare_dbapi_connection_says_to_wrap_it(app: App, connection: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"wrap it: `enqueue_tx\(txtasks.DbapiTx"):
        app.tasks["send"].enqueue_tx(connection, {"n": 1})
