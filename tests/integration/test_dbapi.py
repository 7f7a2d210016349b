"""Enqueue through a plain DB-API connection, in the caller's transaction, on every database.

The rows are those a SQLAlchemy connection's enqueue writes (the same plan runs); the wake-ups
go out only after the caller says its transaction committed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy import Table, select

from tests.integration.conformance import table_rows
from tests.integration.dbapi_connect import dbapi_connect
from tests.recording import Recording
from txtasks import App, ConfigurationError, DbapiTx, create_engine
from txtasks.schema.tables import key_hints, tasks
from txtasks.types import NewTask


@pytest.fixture
async def recording() -> Recording:
    return Recording()


@pytest.fixture
async def app(database_url: str, recording: Recording) -> AsyncIterator[App]:
    application = App("dbapi", database_url=database_url, notifier=recording)  # type: ignore[arg-type]

    @application.task(name="send", queue="emails")
    def send(payload: Any) -> None:
        return None

    yield application
    await application.aclose()


@pytest.fixture
def connection(database_url: str) -> Iterator[Any]:
    conn = dbapi_connect(database_url)
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
    assert len(by_dbapi[tasks.name]) == 4


async def test_the_connection_is_left_as_it_was(app: App, connection: Any) -> None:
    """No commit, no rollback, no close, no session setting: the transaction is the caller's."""
    tx = DbapiTx(connection)
    app.tasks["send"].enqueue_tx(tx, {"n": 1})
    cursor = connection.cursor()
    cursor.execute("SELECT COUNT(*) FROM txtasks_tasks")
    assert cursor.fetchone()[0] == 1  # still in the open transaction, on the same connection
    connection.rollback()


def test_an_unsupported_connection_says_what_to_pass() -> None:
    with pytest.raises(ConfigurationError, match="psycopg, PyMySQL or sqlite3"):
        DbapiTx(object())


async def test_a_bare_dbapi_connection_says_to_wrap_it(app: App, connection: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"wrap it: `enqueue_tx\(txtasks.DbapiTx"):
        app.tasks["send"].enqueue_tx(connection, {"n": 1})
