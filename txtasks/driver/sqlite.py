"""SQLite: one writer at a time (BEGIN IMMEDIATE), UPDATE ... RETURNING claims, WAL journal."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import operator
import sqlite3
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from sqlalchemy import Connection, Engine, Result, event, text
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.driver.base import Capabilities
from txtasks.driver.database import SqlDatabase
from txtasks.driver.dialect import SqlDialect
from txtasks.driver.insert_plan import TASK_COLUMNS, DriverSql, Step
from txtasks.driver.sql import SqlDriver
from txtasks.driver.sql_claims import Claim, SqlClaims
from txtasks.driver.statements.enqueue import EnqueueStatements
from txtasks.schema.tables import READY, Timestamp
from txtasks.types import CLAIMED_COLUMNS, NewTask, TaskRow

log = logging.getLogger("txtasks.sqlite")
BUSY_TIMEOUT_MS = 30_000
T = TypeVar("T")

#: Claim those of the tasks {ids} a claim of the queues {queues} would take, on the event
#: loop's thread (`SQLiteClaims.named_claim`). Parameters: lease_until, worker_id, now, the
#: ids, the queues' names, now (times as SQLAlchemy stores them: `_time_processors`).
NAMED_CLAIM_SQL = f"""UPDATE txtasks_tasks SET state = 'processing', attempt = attempt + 1,
       lease_expires_at = ?, worker_id = ?, started_at = ?
 WHERE id IN ({{ids}}) AND queue IN ({{queues}}) AND partition_key IS NULL AND {READY}
   AND run_at <= ? AND queue NOT IN (SELECT p.queue FROM txtasks_paused_queues AS p)
RETURNING {", ".join(CLAIMED_COLUMNS)}"""


@functools.lru_cache(maxsize=64)
def _named_claim_sql(ids: int, queues: int) -> str:
    """`NAMED_CLAIM_SQL` for so many ids and queues, all parameters: one text per count, which
    sqlite3 compiles once (its statement cache), where the ids written out would compile a
    statement per claim."""
    return NAMED_CLAIM_SQL.format(ids=", ".join(["?"] * ids), queues=", ".join(["?"] * queues))


#: Where `NAMED_CLAIM_SQL`'s rows hold their times.
_NAMED_TIMES = tuple(CLAIMED_COLUMNS.index(c) for c in ("run_at", "created_at", "expires_at"))


@functools.cache
def _time_processors() -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """How SQLAlchemy writes a `Timestamp` to SQLite, and reads it back: the same text, so
    that times compare alike whichever way they were written."""
    from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

    dialect = SQLiteDialect_pysqlite()
    impl = Timestamp.dialect_impl(dialect)
    bind = impl.bind_processor(dialect)
    result = impl.result_processor(dialect, None)
    assert bind is not None and result is not None
    return bind, result


#: SQLite's primary result code when another connection holds the lock it needs.
SQLITE_BUSY = 5


def _busy(exc: BaseException) -> bool:
    """SQLite's answer when another connection holds the write lock (SQLITE_BUSY)."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return bool(code & 0xFF == SQLITE_BUSY)
    return isinstance(exc, sqlite3.OperationalError) and "database is locked" in str(exc)


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


#: The columns of a bulk enqueue, in the order of `_bulk_record`.
BULK_COLUMNS = ", ".join(TASK_COLUMNS)
#: Rows per statement of a bulk enqueue (at most 15 parameters each: far under SQLite's
#: 32,766); the fastest measured, from 100 to 5,000.
BULK_ROWS = 500
#: The last id this connection inserted (the last row of a bulk enqueue).
LAST_ID = text("SELECT last_insert_rowid()")


@functools.lru_cache(maxsize=256)
def _bulk_sql(uniform: tuple[bool, ...], count: int) -> str:
    """`INSERT ... SELECT` of `count` rows from a VALUES list of the columns that differ
    between rows; each column that holds one value in every row is bound once, in the
    SELECT list (SQLite binds and steps a statement of VALUES far faster than executemany of
    one row, and the fewer parameters a row the faster)."""
    varying = uniform.count(False)
    names = iter(range(1, varying + 1))
    select = ", ".join("?" if same else f"column{next(names)}" for same in uniform)
    values = ", ".join(["(" + ", ".join(["?"] * varying) + ")"] * count)
    return f"INSERT INTO txtasks_tasks ({BULK_COLUMNS}) SELECT {select} FROM (VALUES {values})"


def _bulk_statements(records: list[tuple[Any, ...]]) -> list[tuple[str, tuple[Any, ...]]]:
    """The statements (and their parameters) that insert `records` in order."""
    columns = list(zip(*records, strict=True))
    same = [c.count(c[0]) == len(c) for c in columns]
    if all(same):  # a VALUES list needs a column
        same[0] = False
    uniform = tuple(same)
    bound = [c[0] for c, s in zip(columns, uniform, strict=True) if s]
    pick = operator.itemgetter(*(j for j, s in enumerate(uniform) if not s))
    statements = []
    for start in range(0, len(records), BULK_ROWS):
        chunk = records[start : start + BULK_ROWS]
        picked = map(pick, chunk) if uniform.count(False) > 1 else ((pick(r),) for r in chunk)
        params = (*bound, *itertools.chain.from_iterable(picked))
        statements.append((_bulk_sql(uniform, len(chunk)), params))
    return statements


def _given(sql: str, params: tuple[Any, ...], _driver: Any) -> tuple[str, tuple[Any, ...]]:
    """A `DriverSql` step's SQL and parameters, built already."""
    return sql, params


def _stored_time(value: datetime | None) -> str | None:
    """A time as SQLAlchemy's DateTime stores it on SQLite (`YYYY-MM-DD HH:MM:SS.ffffff`,
    microseconds always written, an offset dropped)."""
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.replace(tzinfo=None)
    return value.isoformat(" ", "microseconds")


def _bulk_record(row: NewTask) -> tuple[Any, ...]:
    """A new task's values in the order of `BULK_COLUMNS`, each as SQLAlchemy would bind it."""
    created = _stored_time(row.created_at)
    return (
        row.queue,
        row.task_name,
        row.payload,
        row.content_type,
        row.state.value,
        row.priority,
        created if row.run_at is row.created_at else _stored_time(row.run_at),
        0,
        row.max_attempts,
        created,
        row.dedup_key,
        row.headers,
        _stored_time(row.expires_at),
        row.stage_id,
        row.partition_key,
    )


class SQLiteEnqueueStatements(EnqueueStatements):
    """SQLite's enqueue statements."""

    @classmethod
    def _insert_plain(
        cls, rows: Sequence[NewTask], todo: list[int], ids: list[int | None]
    ) -> Generator[Step, Result[Any], None]:
        """Several rows: `INSERT ... SELECT` statements of VALUES lists (`_bulk_sql`), their
        parameters built here as SQLAlchemy would bind them (its executemany spent more per
        row on the parameters than SQLite on the insert), then the last id inserted. The table is AUTOINCREMENT and the
        rows of a transaction go in one after another, in order, under its write lock: the ids
        are the consecutive ones ending there."""
        if len(todo) == 1:
            yield from super()._insert_plain(rows, todo, ids)
            return
        records = [_bulk_record(rows[i]) for i in todo]
        count = 0
        for sql, params in _bulk_statements(records):
            inserted = yield DriverSql(functools.partial(_given, sql, params))
            count += inserted.rowcount  # type: ignore[attr-defined]
        if count != len(todo):
            raise RuntimeError(f"enqueue: {len(todo)} rows sent, {count} inserted")
        last = (yield LAST_ID, None).scalar_one()
        for i, new_id in zip(todo, range(last - len(todo) + 1, last + 1), strict=True):
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
        #: The sqlite3 connection kept for the named claims, with its event loop (`kept`).
        self._kept: tuple[asyncio.AbstractEventLoop, sqlite3.Connection] | None = None
        #: No kept connection: the database is in memory, not in WAL mode, or the engine's
        #: driver is not aiosqlite.
        self._kept_off = False

    def _write_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._writer is None or self._writer[0] is not loop:
            self._writer = (loop, asyncio.Lock())
        return self._writer[1]

    def writing(self) -> bool:
        """A write transaction of this process, on this event loop, is running or waiting."""
        return self._write_lock().locked()

    def kept(self) -> sqlite3.Connection | None:
        """A sqlite3 connection for the named claims, used on the event loop's own thread
        (`SQLiteClaims.named_claim`), opened at its first use; None when there is none (a
        database in memory, which another connection would not see; one not in WAL mode,
        where a commit would wait for readers). The pragmas of `sqlite_connection_setup`,
        but no busy timeout: a write lock held elsewhere is an error at once, never a wait on
        the event loop; and no checkpoints, which write the database file: the engine's
        connections run them."""
        loop = asyncio.get_running_loop()
        if self._kept is not None:
            kept_loop, connection = self._kept
            if kept_loop is loop:
                return connection
            self._kept = None
            with contextlib.suppress(Exception):
                connection.close()
        if self._kept_off:
            return None
        engine = self.engine
        args, params = engine.dialect.create_connect_args(engine.url)
        filename = str(args[0]) if args else ""
        if (
            engine.dialect.driver != "aiosqlite"
            or filename in ("", ":memory:")
            or "mode=memory" in filename
        ):
            self._kept_off = True
            return None
        connection = sqlite3.connect(
            filename,
            timeout=0,
            isolation_level=None,
            check_same_thread=False,
            uri=bool(params.get("uri", False)),
        )
        try:
            connection.execute("PRAGMA busy_timeout = 0")
            try:
                mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            except sqlite3.OperationalError as exc:  # another connection is writing: later
                if not _busy(exc):
                    raise
                connection.close()
                return None
            if str(mode).lower() != "wal":
                self._kept_off = True
                connection.close()
                return None
            connection.execute("PRAGMA synchronous = NORMAL")
            connection.execute("PRAGMA wal_autocheckpoint = 0")
        except BaseException:
            connection.close()
            raise
        self._kept = (loop, connection)
        return connection

    def kept_drop(self) -> None:
        """Close the kept connection (the next claim opens another)."""
        kept, self._kept = self._kept, None
        if kept is not None:
            with contextlib.suppress(Exception):
                kept[1].close()

    async def close(self) -> None:
        self.kept_drop()
        await super().close()

    async def in_transaction(self, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        async with self._write_lock():
            return await super().in_transaction(work)

    def engine_setup(self, engine: Engine) -> None:
        self.sql.connection_setup(engine)

    @staticmethod
    def connection_cut(driver_connection: Any) -> None:
        """Nothing to cut: a local file never half-opens; a wait for the write lock ends at
        the busy timeout."""


class SQLiteClaims(SqlClaims):
    """The tasks a wake-up named, claimed on the event loop's thread (`named_claim`)."""

    db: SQLiteDatabase

    async def named_claim(self, claim: Claim, ids: list[int]) -> list[TaskRow]:
        """`NAMED_CLAIM_SQL` on the kept connection (`kept`), on the event loop's thread, as
        a transaction of its own: in WAL mode it takes microseconds, where aiosqlite's thread
        costs a hop and a turn of the event loop per call (nine of each: BEGIN IMMEDIATE,
        the statement, its rows, COMMIT, the pool's ROLLBACK, cursors). When the write lock
        is taken (by a write of this process, another thread's or another process's), the
        transactional way, which waits for it in aiosqlite's thread."""
        rows = None if self.db.writing() else self._named_claim_kept(claim, ids)
        if rows is None:
            return await super().named_claim(claim, ids)
        return rows

    def _named_claim_kept(self, claim: Claim, ids: list[int]) -> list[TaskRow] | None:
        """The rows claimed, or None if the write lock is taken (nothing claimed) or there
        is no kept connection."""
        connection = self.db.kept()
        if connection is None:
            return None
        time_text, time_value = _time_processors()
        now = time_text(claim.now)
        sql = _named_claim_sql(len(ids), len(claim.queues))
        params = (time_text(claim.lease_until), claim.worker_id, now, *ids, *claim.queues, now)
        try:  # one statement, its own transaction: the write lock is taken as it starts
            found = connection.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if _busy(exc) and not connection.in_transaction:  # nothing written
                return None
            self.db.kept_drop()
            raise
        except BaseException:
            self.db.kept_drop()
            raise
        rows = []
        for values in found:
            values = list(values)
            for i in _NAMED_TIMES:
                values[i] = time_value(values[i])
            rows.append(TaskRow.from_claim(values, claim.worker_id, claim.lease_until, claim.now))
        return rows


class SQLiteDriver(SqlDriver):
    """SQLite 3.35+ (`SQLiteDatabase`; `SQLiteClaims`)."""

    database_class = SQLiteDatabase
    claims_class = SQLiteClaims
