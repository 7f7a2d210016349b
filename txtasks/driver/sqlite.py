"""SQLite: one writer at a time (BEGIN IMMEDIATE), UPDATE ... RETURNING claims, WAL journal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

from sqlalchemy import Connection, Engine, Result, event, insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.driver.base import Capabilities
from txtasks.driver.database import SqlDatabase
from txtasks.driver.dialect import SqlDialect
from txtasks.driver.insert_plan import Step, task_values
from txtasks.driver.sql import SqlDriver
from txtasks.driver.statements.enqueue import EnqueueStatements
from txtasks.schema.tables import tasks
from txtasks.types import NewTask

log = logging.getLogger("txtasks.sqlite")
BUSY_TIMEOUT_MS = 30_000
T = TypeVar("T")


def sqlite_connection_setup(engine: Engine) -> None:
    """WAL, a busy timeout, and write transactions that take the lock up front.

    A deferred transaction that reads and then writes can fail with "database is locked" at
    once instead of waiting; BEGIN IMMEDIATE waits for the busy timeout instead.
    """

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let SQLAlchemy's BEGIN below rule
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        try:  # fails at once if another connection is writing; a later connection sets it
            cursor.execute("PRAGMA journal_mode = WAL")
        except Exception as exc:
            log.debug("journal_mode = WAL not set now: %s", exc)
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


class SQLiteEnqueueStatements(EnqueueStatements):
    """SQLite's enqueue statements."""

    @classmethod
    def _insert_plain(
        cls, rows: Sequence[NewTask], todo: list[int], ids: list[int | None]
    ) -> Generator[Step, Result[Any], None]:
        """Several rows: multi-row INSERTs, each `RETURNING id`. Asking SQLAlchemy for the ids
        in parameter order would send one row per statement here; instead, as the table is
        AUTOINCREMENT and the rows of a transaction go in one after another, in order, under
        its write lock, the returned ids sorted are in parameter order."""
        if len(todo) == 1:
            yield from super()._insert_plain(rows, todo, ids)
            return
        result = yield insert(tasks).returning(tasks.c.id), [task_values(rows[i]) for i in todo]
        for i, new_id in zip(todo, sorted(result.scalars().all()), strict=True):
            ids[i] = new_id


class SQLiteDialect(SqlDialect):
    """SQLite 3.35+: one writer at a time, taken up front by BEGIN IMMEDIATE."""

    capabilities: ClassVar[Capabilities] = Capabilities("sqlite", concurrent_claims=False)

    upsert = staticmethod(sqlite_insert)
    enqueue = SQLiteEnqueueStatements

    @staticmethod
    @contextlib.contextmanager
    def migration_lock(conn: Connection) -> Iterator[None]:
        """The database's write lock, from before reading the version until the commit.

        txtasks' own engines begin every transaction with BEGIN IMMEDIATE; on any other engine,
        whose sqlite3 connection has no transaction open yet, migrate begins one the same way.
        """
        if not getattr(conn.connection.driver_connection, "in_transaction", True):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        yield

    @staticmethod
    def connection_setup(engine: Engine) -> None:
        sqlite_connection_setup(engine)

    @classmethod
    def error_is_transient(cls, exc: BaseException) -> bool:
        return "database is locked" in str(exc)


class SQLiteDatabase(SqlDatabase):
    """SQLite 3.35+ through aiosqlite (async) and sqlite3 (sync).

    SQLite has one writer at a time. Within a process, write transactions queue on an asyncio
    lock rather than meeting in SQLite's busy handler, which sleeps in steps of milliseconds.
    """

    dialect_class = SQLiteDialect

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._writer: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def _write_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._writer is None or self._writer[0] is not loop:
            self._writer = (loop, asyncio.Lock())
        return self._writer[1]

    async def in_transaction(self, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        async with self._write_lock():
            return await super().in_transaction(work)

    def engine_setup(self, engine: Engine) -> None:
        self.sql.connection_setup(engine)

    @staticmethod
    def connection_cut(driver_connection: Any) -> None:
        """Nothing to cut: a local file never half-opens; a wait for the write lock ends at
        the busy timeout."""


class SQLiteDriver(SqlDriver):
    """SQLite 3.35+ (`SQLiteDatabase`)."""

    database_class = SQLiteDatabase
