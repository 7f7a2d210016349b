"""The SQL driver: SQLAlchemy Core statements shared by every SQL dialect.

Dialect subclasses (postgresql.py, mysql.py, sqlite.py) override only what their SQL lacks or
does better. Each statement is a small named builder; each driver method one short transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import random
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from sqlalchemy import (
    Engine,
    Executable,
    Integer,
    Result,
    String,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    insert,
    literal,
    select,
    tuple_,
    update,
)
from sqlalchemy.engine import URL, Connection, Dialect
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.sql.dml import Insert

from txtasks.driver.base import Capabilities, WriteResult
from txtasks.driver.plan import Plan, Step, plan_run_async, plan_run_sync, task_values
from txtasks.driver.sql_admin import SqlAdmin
from txtasks.driver.timeouts import Timeouts, Watchdog, keepalive_set, socket_of
from txtasks.driver.urls import url_async, url_parse, url_sync
from txtasks.errors import SchemaError
from txtasks.schema import migrate as schema_migrate
from txtasks.schema.tables import IS_READY, TASK_COLUMNS, Timestamp, archive, tasks
from txtasks.types import (
    NewTask,
    Outcome,
    OutcomeKind,
    TaskKey,
    TaskRow,
    TaskState,
)

PROCESSING = TaskState.PROCESSING.value
DEDUP_RETRIES = 3
TRANSIENT_RETRIES = 5
T = TypeVar("T")


def claim_order(row: TaskRow) -> tuple[int, datetime, int]:
    """The order tasks are handed out in: priority (high first), then due time, then id."""
    return (-row.priority, row.run_at, row.id)


def keys_match() -> Any:
    """WHERE clause fencing a batch of attempts (param `keys`): pairs still processing, held by
    the worker `fence_worker` and with a lease expired before `fence_expired` (each unless that
    parameter is NULL)."""
    pairs = tuple_(tasks.c.id, tasks.c.attempt).in_(bindparam("keys", expanding=True))
    holder = bindparam("fence_worker", type_=String)
    expiry = bindparam("fence_expired", type_=Timestamp)
    return (
        pairs
        & (tasks.c.state == PROCESSING)
        & (holder.is_(None) | (tasks.c.worker_id == holder))
        & (expiry.is_(None) | (tasks.c.lease_expires_at < expiry))
    )


def keys_param(
    keys: Sequence[TaskKey], worker_id: str | None = None, expired_before: datetime | None = None
) -> dict[str, Any]:
    """The parameters of `keys_match`: keys in id order (a consistent lock order)."""
    return {
        "keys": sorted((k.id, k.attempt) for k in keys),
        "fence_worker": worker_id,
        "fence_expired": expired_before,
    }


#: Seconds closing a driver waits for each pool's connections to close politely.
CLOSE_WITHIN = 2.0


class SqlDriver(SqlAdmin):
    """A task store on a SQL database through SQLAlchemy's asyncio engine."""

    capabilities: ClassVar[Capabilities] = Capabilities("sql")

    @staticmethod
    @contextlib.contextmanager
    def migration_lock(conn: Connection) -> Iterator[None]:
        """What concurrent `migrate` runs queue on, held from before the schema version is
        read until the migrations are committed; each dialect has its own."""
        yield

    #: INSERT ... RETURNING is available (all but MySQL proper).
    returning_insert: ClassVar[bool] = True
    #: The dedup-insert returns the ids of the rows it inserted.
    returning_dedup: ClassVar[bool] = True

    def __init__(
        self,
        url: str | URL,
        *,
        engine: AsyncEngine | None = None,
        engine_options: Mapping[str, Any] | None = None,
        timeouts: Timeouts | None = None,
    ) -> None:
        #: Bounds of every operation (connect, command, keepalives): see txtasks.driver.timeouts.
        self.timeouts, self.url = Timeouts.resolve(url_parse(url), timeouts)
        self._engine = engine
        self._sync_engine: Engine | None = None
        self._engine_options = dict(engine_options or {})
        #: Pooled connections opened before this moment (`time.monotonic()`) are replaced at
        #: their next checkout: set when a connection had to be cut (see `stale_pool`).
        self._stale_before = -math.inf

    # -- connections --------------------------------------------------------------------------

    def engine_options(self) -> dict[str, Any]:
        """Options for create_async_engine / create_engine; dialects add theirs.

        No pre-ping: it costs round trips on every checkout of the hot path. A connection that
        died with its server fails one statement, is invalidated, and the caller retries.
        """
        return {**self._engine_options}

    def connect_args(self, sync: bool) -> dict[str, Any]:
        """The DB-API driver's connect arguments carrying `self.timeouts`; dialects add theirs."""
        return {}

    def _options(self, sync: bool) -> dict[str, Any]:
        options = self.engine_options()
        options["connect_args"] = {**self.connect_args(sync), **options.get("connect_args", {})}
        return options

    def engine_setup(self, engine: Engine) -> None:
        """Install connection events: TCP keepalives on every new connection's socket, and
        the replacement of connections opened before a cut (`stale_pool`)."""
        timeouts = self.timeouts

        @event.listens_for(engine, "connect")
        def _keepalive(dbapi_connection: Any, record: Any) -> None:
            record.info["opened"] = time.monotonic()
            raw = getattr(dbapi_connection, "driver_connection", dbapi_connection)
            keepalive_set(socket_of(raw), timeouts)

        @event.listens_for(engine, "checkout")
        def _fresh(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
            if record.info.get("opened", -math.inf) < self._stale_before:
                raise DisconnectionError("opened before a connection was cut: replaced")

    async def stale_pool(self) -> None:
        """A connection had to be cut: the others in the pool, opened before it, likely went
        through the same network and stalled too. Each is replaced at its next checkout
        instead of costing its own command timeout."""
        self._stale_before = time.monotonic()

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            self._engine = create_async_engine(url_async(self.url), **self._options(sync=False))
            self.engine_setup(self._engine.sync_engine)
        return self._engine

    @property
    def sync_engine(self) -> Engine:
        if self._sync_engine is None:
            self._sync_engine = create_engine(url_sync(self.url), **self._options(sync=True))
            self.engine_setup(self._sync_engine)
        return self._sync_engine

    @staticmethod
    def connection_cut(driver_connection: Any) -> None:
        """Close a connection's socket at once, whatever it is waiting for."""
        terminate = getattr(driver_connection, "terminate", None)  # asyncpg
        (terminate or driver_connection.close)()  # aiomysql: close() is the abrupt one

    @contextlib.asynccontextmanager
    async def connect(self, *, bounded: bool = True) -> AsyncIterator[AsyncConnection]:
        """A pooled connection whose whole use, its return to the pool included, takes at most
        the command timeout (unless `bounded` is False): past it the socket is cut and the
        block raises `DatabaseTimeout`."""
        conn = await self.engine.connect()
        limit = self.timeouts.command if bounded else None
        watchdog = Watchdog(limit, lambda: self.connection_cut(raw))
        try:
            raw = (await conn.get_raw_connection()).driver_connection
            with watchdog.armed():
                try:
                    yield conn
                finally:
                    if watchdog.fired:
                        await conn.invalidate()
                        await self.stale_pool()
                    await conn.close()
        finally:
            if not conn.closed:  # cancelled before the close above ran
                await conn.invalidate()
                await conn.close()

    @contextlib.asynccontextmanager
    async def begin(self, *, bounded: bool = True) -> AsyncIterator[AsyncConnection]:
        """`connect()` in a transaction, committed at the end of the block."""
        async with self.connect(bounded=bounded) as conn, conn.begin():
            yield conn

    async def open(self) -> None:
        async with self.connect() as conn:
            version = await conn.run_sync(schema_migrate.schema_version)
        latest = schema_migrate.latest_version()
        if version < latest:
            raise SchemaError(
                f"database schema is at version {version}, this txtasks needs {latest}: "
                "run `txtasks migrate`"
            )

    async def close(self) -> None:
        """Close the pooled connections politely, or drop them after `CLOSE_WITHIN` seconds
        (a stalled connection would never answer the goodbye)."""
        if self._engine is not None:
            try:
                await asyncio.wait_for(self._engine.dispose(), CLOSE_WITHIN)
            except asyncio.TimeoutError:
                await self._engine.dispose(close=False)  # the sockets close with the objects
        if self._sync_engine is not None:
            self._sync_engine.dispose()

    async def migrate(self) -> list[int]:
        migrate = functools.partial(schema_migrate.migrate, lock=self.migration_lock)
        async with self.begin(bounded=False) as conn:  # DDL on big tables may take a while
            applied = await conn.run_sync(migrate)
        return [m.version for m in applied]

    @classmethod
    def error_is_transient(cls, exc: BaseException) -> bool:
        """A deadlock or lock timeout that a fresh transaction may not meet again."""
        return False

    async def in_transaction(self, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run `work` in a transaction, retrying it when the database reports a deadlock."""

        async def once() -> T:
            async with self.begin() as conn:
                return await work(conn)

        return await self.retrying(once)

    async def retrying(self, once: Callable[[], Awaitable[T]]) -> T:
        """`once()`, again (after a short random pause) when it fails with a deadlock or a
        serialization failure, up to `TRANSIENT_RETRIES` times in all."""
        for attempt in range(TRANSIENT_RETRIES):
            try:
                return await once()
            except Exception as exc:
                orig = exc.orig if isinstance(exc, DBAPIError) else exc
                if attempt + 1 == TRANSIENT_RETRIES or orig is None:
                    raise
                if not self.error_is_transient(orig):
                    raise
                await asyncio.sleep(random.uniform(0, 0.01 * 2**attempt))
        raise AssertionError("unreachable")

    # -- enqueue ------------------------------------------------------------------------------

    @classmethod
    def plan_class(cls, dialect: Dialect) -> type[SqlDriver]:
        """The class whose statements suit this connection (MariaDB is told apart at connect)."""
        return cls

    @classmethod
    def stmt_insert(cls) -> Insert:
        """Insert new tasks, returning their ids in parameter order."""
        return insert(tasks).returning(tasks.c.id, sort_by_parameter_order=True)

    @staticmethod
    @functools.cache
    def stmt_insert_one() -> Insert:
        """Insert one new task, returning its id."""
        return insert(tasks).returning(tasks.c.id)

    @classmethod
    def stmt_insert_dedup(cls) -> Insert:
        """Insert tasks that carry a dedup key, skipping keys already live (no error)."""
        raise NotImplementedError

    @classmethod
    def stmt_dedup_lookup(cls, keys: Sequence[str]) -> Executable:
        """The ids of live tasks holding these dedup keys."""
        return select(tasks.c.id, tasks.c.dedup_key).where(tasks.c.dedup_key.in_(keys))

    @classmethod
    def enqueue_plan(cls, rows: Sequence[NewTask]) -> Plan:
        """Insert `rows` on any connection (sync or async): one statement per batch."""
        ids: list[int | None] = [None] * len(rows)
        plain = [i for i, r in enumerate(rows) if r.dedup_key is None]
        # in key order: two transactions inserting overlapping keys lock them in the same order
        keyed = sorted(
            (i for i, r in enumerate(rows) if r.dedup_key is not None),
            key=lambda i: rows[i].dedup_key or "",
        )
        if plain:
            yield from cls._insert_plain(rows, plain, ids)
        for _ in range(DEDUP_RETRIES):
            missing = [i for i in keyed if ids[i] is None]
            if not missing:
                break
            yield from cls._insert_keyed(rows, missing, ids)
        if any(i is None for i in ids):
            raise RuntimeError("enqueue: a dedup key kept conflicting with finishing tasks")
        return [i for i in ids if i is not None]

    @classmethod
    def _insert_plain(
        cls, rows: Sequence[NewTask], todo: list[int], ids: list[int | None]
    ) -> Generator[Step, Result[Any], None]:
        if cls.returning_insert and len(todo) == 1:  # one row: no executemany machinery,
            values = {k: v for k, v in task_values(rows[todo[0]]).items() if v is not None}
            result = yield cls.stmt_insert_one(), values  # and no unused NULL parameters
            ids[todo[0]] = result.scalar_one()
            return
        if cls.returning_insert:
            result = yield cls.stmt_insert(), [task_values(rows[i]) for i in todo]
            for i, new_id in zip(todo, result.scalars().all(), strict=True):
                ids[i] = new_id
            return
        for i in todo:  # MySQL has no RETURNING: one statement a row, lastrowid each
            result = yield insert(tasks), task_values(rows[i])
            ids[i] = result.inserted_primary_key[0]  # type: ignore[attr-defined]

    @classmethod
    def _insert_keyed(
        cls, rows: Sequence[NewTask], todo: list[int], ids: list[int | None]
    ) -> Generator[Step, Result[Any], None]:
        result = yield cls.stmt_insert_dedup(), [task_values(rows[i]) for i in todo]
        found: dict[str, int] = {}
        if cls.returning_dedup:
            found.update({row[1]: row[0] for row in result.all()})  # type: ignore[misc]
        unresolved = {rows[i].dedup_key for i in todo} - found.keys()
        if unresolved:
            lookup = yield cls.stmt_dedup_lookup(sorted(k for k in unresolved if k)), None
            found.update({row[1]: row[0] for row in lookup.all()})  # type: ignore[misc]
        for i in todo:
            ids[i] = found.get(rows[i].dedup_key or "")

    async def task_insert_many(self, rows: Sequence[NewTask]) -> list[int]:
        if not rows:
            return []

        return await self.in_transaction(lambda conn: self.insert_on(conn, rows))

    async def insert_on(self, conn: AsyncConnection, rows: Sequence[NewTask]) -> list[int]:
        """Insert `rows` inside `conn`'s transaction; their ids (a dedup hit: the live id)."""
        return await plan_run_async(conn, self.plan_class(conn.dialect).enqueue_plan(rows))

    def task_insert_many_sync(self, rows: Sequence[NewTask]) -> list[int]:
        if not rows:
            return []
        with self.sync_engine.begin() as conn:
            return plan_run_sync(conn, self.plan_class(conn.dialect).enqueue_plan(rows))

    # -- claim --------------------------------------------------------------------------------

    @staticmethod
    @functools.cache
    def stmt_ready() -> Any:
        """Ready task ids of `queues`, in claim order, up to `limit`, locked, skipping locked."""
        return (
            select(tasks.c.id)
            .where(
                tasks.c.queue.in_(bindparam("queues", expanding=True)),
                IS_READY,
                tasks.c.run_at <= bindparam("now", type_=Timestamp),
            )
            .order_by(tasks.c.priority.desc(), tasks.c.run_at, tasks.c.id)
            .limit(bindparam("limit", type_=Integer))
            .with_for_update(skip_locked=True)
        )

    @staticmethod
    def claim_values() -> dict[str, Any]:
        """What a claim writes: processing, one more attempt, leased to the worker."""
        return {
            "state": PROCESSING,
            "attempt": tasks.c.attempt + 1,
            "lease_expires_at": bindparam("lease_until", type_=Timestamp),
            "worker_id": bindparam("worker_id"),
            "started_at": bindparam("now", type_=Timestamp),
        }

    @classmethod
    @functools.cache
    def stmt_claim(cls) -> Executable:
        """Claim a batch in one statement: UPDATE ... WHERE id IN (ready) RETURNING *."""
        return (
            update(tasks)
            .where(tasks.c.id.in_(cls.stmt_ready().scalar_subquery()))
            .values(**cls.claim_values())
            .returning(*tasks.c)
        )

    async def task_claim_many(
        self,
        queues: Sequence[str],
        limit: int,
        *,
        now: datetime,
        lease_until: datetime,
        worker_id: str,
    ) -> list[TaskRow]:
        params = {
            "queues": list(queues),
            "limit": limit,
            "now": now,
            "lease_until": lease_until,
            "worker_id": worker_id,
        }

        async def work(conn: AsyncConnection) -> list[TaskRow]:
            return await self._claim(conn, params)

        rows = await self.in_transaction(work)
        rows.sort(key=claim_order)
        return rows

    async def _claim(self, conn: AsyncConnection, params: dict[str, Any]) -> list[TaskRow]:
        result = await conn.execute(self.stmt_claim(), params)
        return [TaskRow.from_row(r) for r in result.mappings().all()]

    # -- outcomes -----------------------------------------------------------------------------

    async def outcome_write_many(
        self,
        outcomes: Sequence[Outcome],
        *,
        now: datetime,
        archive_completed: bool = True,
        worker_id: str | None = None,
        expired_before: datetime | None = None,
    ) -> WriteResult:
        if not outcomes:
            return WriteResult(0)
        fence = {"fence_worker": worker_id, "fence_expired": expired_before}

        async def work(conn: AsyncConnection) -> set[TaskKey]:
            return await self._outcomes_apply(conn, outcomes, now, archive_completed, fence)

        applied = await self.in_transaction(work)
        stale = tuple(o.key for o in outcomes if o.key not in applied)
        return WriteResult(len(outcomes) - len(stale), stale)

    async def _outcomes_apply(
        self,
        conn: AsyncConnection,
        outcomes: Sequence[Outcome],
        now: datetime,
        archive_completed: bool,
        fence: Mapping[str, Any],
    ) -> set[TaskKey]:
        """Lock the still-current attempts once, in id order, then write what applies to them.

        `fence` holds the `keys_match` parameters other than the keys.
        """
        held = await self._locked_keys(conn, [o.key for o in outcomes], fence)
        mine = [o for o in outcomes if o.key in held]
        finishing = [o for o in mine if o.kind.finishes]
        if finishing:
            await self._finish(conn, finishing, now, archive_completed)
        retries = [o for o in mine if o.kind is OutcomeKind.RETRY]
        if retries:
            await self._retry(conn, retries)
        releases = [o.key for o in mine if o.kind is OutcomeKind.RELEASE]
        if releases:
            await conn.execute(self.stmt_release(), {**keys_param(releases), **fence})
        return {o.key for o in mine}

    @staticmethod
    @functools.cache
    def stmt_lock_keys(skip_locked: bool = False) -> Executable:
        """Lock the rows of still-current attempts, in id order; with `skip_locked`, leaving out
        the rows another transaction holds instead of waiting for them."""
        return (
            select(tasks.c.id, tasks.c.attempt)
            .where(keys_match())
            .order_by(tasks.c.id)
            .with_for_update(skip_locked=skip_locked)
        )

    async def _locked_keys(
        self, conn: AsyncConnection, keys: Sequence[TaskKey], fence: Mapping[str, Any]
    ) -> set[TaskKey]:
        """Lock the rows of still-current attempts (in id order) and return their keys."""
        params = {**keys_param(keys), **fence}
        rows = await conn.execute(self.stmt_lock_keys(), params)
        return {TaskKey(row[0], row[1]) for row in rows}

    async def _finish(
        self,
        conn: AsyncConnection,
        outcomes: Sequence[Outcome],
        now: datetime,
        archive_completed: bool,
    ) -> None:
        """Move finished attempts (rows locked by the caller) to the archive."""
        mine = outcomes
        for kind in {o.kind for o in mine}:
            if kind is OutcomeKind.COMPLETE and not archive_completed:
                continue
            ids = sorted(o.key.id for o in mine if o.kind is kind)
            params = {"ids": ids, "state": kind.value, "now": now}
            await conn.execute(self.stmt_archive_copy(), params)
        errors = [{"b_id": o.key.id, "b_error": o.error} for o in mine if o.error]
        if errors:
            await conn.execute(self.stmt_archive_error(), errors)
        await conn.execute(self.stmt_delete(), {"ids": sorted(o.key.id for o in mine)})

    @staticmethod
    @functools.cache
    def stmt_archive_copy() -> Executable:
        """Copy rows `ids` into the archive with their final `state`, finished at `now`."""
        cols = [c for c in TASK_COLUMNS if c not in ("state", "lease_expires_at")]
        source = select(
            *[tasks.c[c] for c in cols],
            bindparam("state", type_=String).label("state"),
            literal(None, Timestamp).label("lease_expires_at"),
            bindparam("now", type_=Timestamp).label("finished_at"),
        ).where(tasks.c.id.in_(bindparam("ids", expanding=True)))
        target = [*cols, "state", "lease_expires_at", "finished_at"]
        return insert(archive).from_select(target, source)

    @staticmethod
    @functools.cache
    def stmt_delete() -> Executable:
        """Remove rows `ids` from the hot table."""
        return delete(tasks).where(tasks.c.id.in_(bindparam("ids", expanding=True)))

    @staticmethod
    @functools.cache
    def stmt_archive_error() -> Executable:
        """Record each finished attempt's error on its archived row."""
        return (
            update(archive)
            .where(archive.c.id == bindparam("b_id"))
            .values(last_error=bindparam("b_error"))
        )

    @staticmethod
    @functools.cache
    def stmt_retry() -> Executable:
        """Schedule the next attempt of a failed one (fenced)."""
        return (
            update(tasks)
            .where(
                tasks.c.id == bindparam("b_id"),
                tasks.c.attempt == bindparam("b_attempt"),
                tasks.c.state == PROCESSING,
            )
            .values(
                state=TaskState.RETRYABLE.value,
                run_at=bindparam("b_run_at", type_=Timestamp),
                last_error=bindparam("b_error"),
                checkpoint=func.coalesce(bindparam("b_checkpoint"), tasks.c.checkpoint),
                lease_expires_at=None,
                worker_id=None,
            )
        )

    async def _retry(self, conn: AsyncConnection, outcomes: Sequence[Outcome]) -> None:
        """Schedule the next attempts (rows locked by the caller)."""
        params = [
            {
                "b_id": o.key.id,
                "b_attempt": o.key.attempt,
                "b_run_at": o.run_at,
                "b_error": o.error,
                "b_checkpoint": o.checkpoint,
            }
            for o in outcomes
        ]
        await conn.execute(self.stmt_retry(), params)

    @staticmethod
    @functools.cache
    def stmt_release() -> Executable:
        """Claimed but never started: back to pending, the attempt not counted (fenced)."""
        return (
            update(tasks)
            .where(keys_match())
            .values(
                state=TaskState.PENDING.value,
                attempt=tasks.c.attempt - 1,
                lease_expires_at=None,
                worker_id=None,
            )
        )

    @staticmethod
    @functools.cache
    def stmt_count_keys() -> Executable:
        """How many of the attempts `keys` are still current (a plain read: no lock)."""
        return select(func.count()).select_from(tasks).where(keys_match())

    @staticmethod
    @functools.cache
    def stmt_lease_set() -> Executable:
        """Push the leases of rows `ids` (locked by the caller) to `lease_until`."""
        return (
            update(tasks)
            .where(tasks.c.id.in_(bindparam("ids", expanding=True)))
            .values(lease_expires_at=bindparam("lease_until", type_=Timestamp))
        )

    async def lease_extend_many(
        self, keys: Sequence[TaskKey], *, lease_until: datetime, worker_id: str | None = None
    ) -> int:
        """Rows another transaction holds are left out, not waited for: an outcome write is
        finishing them, a rescuer taking them (their lease is over anyway), or a session whose
        client vanished holds them until the server ends it. Waiting would let every other
        lease of the worker run out meanwhile."""
        if not keys:
            return 0
        params = keys_param(keys, worker_id)

        async def work(conn: AsyncConnection) -> int:
            rows = await conn.execute(self.stmt_lock_keys(skip_locked=True), params)
            ids = [row[0] for row in rows]
            if ids:
                await conn.execute(self.stmt_lease_set(), {"ids": ids, "lease_until": lease_until})
            if len(ids) == len(keys):
                return len(ids)
            held = await conn.execute(self.stmt_count_keys(), params)  # a read: never waits
            return int(held.scalar_one())

        return await self.in_transaction(work)
