"""The database handle of a SQL driver: engines, connections, transactions, retries.

Every role of a `SqlDriver` (sql.py) holds the same `SqlDatabase`; the database modules
(postgresql.py, mysql.py, sqlite.py) add their connection settings to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import threading
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, ClassVar, TypeVar

from sqlalchemy import (
    Engine,
    create_engine,
    event,
)
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import QueuePool

from txtasks._waits import within
from txtasks.driver.dialect import (
    SqlDialect,
    dialect_for,
)
from txtasks.driver.insert_plan import plan_run_async, plan_run_sync
from txtasks.driver.pooling import (
    POOLER_PARAM,
    TRANSACTION,
    connections_resolve,
    log,
    pooler_of,
)
from txtasks.driver.timeouts import (
    DatabaseTimeout,
    Timeouts,
    Watchdog,
    keepalive_set,
    socket_of,
)
from txtasks.driver.urls import url_async, url_parse, url_sync
from txtasks.errors import ConfigurationError, extras_needed
from txtasks.types import (
    NewTask,
)

TRANSIENT_RETRIES = 5


T = TypeVar("T")


#: Seconds closing a driver waits for each pool's connections to close politely.
CLOSE_WITHIN = 2.0
#: The fewest connections of an engine under a budget: one for handlers' own transactions,
#: one for everything else (`SqlDatabase.attempt_slot`).
ENGINE_MIN = 2


class SqlDatabase:
    """One SQL database as every role of a driver shares it: the engines and pools,
    connections bounded by `Timeouts`, transactions retried on transient errors, and the
    dialect whose statements the roles run (`sql`)."""

    #: The SQL of this database, until a connection tells it apart (MariaDB from MySQL, on a
    #: mysql:// URL): see `sql`.
    dialect_class: ClassVar[type[SqlDialect]]
    #: The fewest connections a connection budget may give this database's pools: two for the
    #: engine (`ENGINE_MIN`); more for a worker whose sync handlers need a sync engine too
    #: (`share_with_sync`).
    min_connections: ClassVar[int] = ENGINE_MIN
    #: Whether this database works behind a transaction pooler (the URL's `pooler`).
    poolable: ClassVar[bool] = False

    def __init__(
        self,
        url: str | URL,
        *,
        engine: AsyncEngine | None = None,
        engine_options: Mapping[str, Any] | None = None,
        timeouts: Timeouts | None = None,
        connections: int | None = None,
    ) -> None:
        #: Bounds of every operation (connect, command, keepalives): see txtasks.driver.timeouts.
        self.timeouts, self.url = Timeouts.resolve(url_parse(url), timeouts)
        #: `TRANSACTION` when a pooler in transaction mode stands before the database (the
        #: URL's `pooler`, kept in `url`): see txtasks.driver.pooling.
        self.pooler = pooler_of(self.url)[0]
        if self.pooler is not None and not self.poolable:
            raise ConfigurationError(
                f"{POOLER_PARAM}={TRANSACTION}: txtasks works behind a transaction pooler "
                f"(PgBouncer) on PostgreSQL only, not on {self.url.get_backend_name()}"
            )
        #: The most connections this database's pools hold at once (None: each pool its
        #: default size): see txtasks.driver.pooling.
        self.connections = connections_resolve(connections, minimum=self.min_connections)
        #: Whether the budget's engine share is split between the async and the sync engine
        #: (`share_with_sync`); else each has all of it.
        self.sync_shared = False
        self._attempt_gates: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self._attempt_gate_sync: threading.BoundedSemaphore | None = None
        self._engine = engine
        self._engine_given = engine is not None
        self._sync_engine: Engine | None = None
        self._engine_options = dict(engine_options or {})
        #: Pooled connections opened before this moment (`time.monotonic()`) are replaced at
        #: their next checkout: set when a connection had to be cut (see `stale_pool`).
        self._stale_before = -math.inf
        #: The SQL this database runs: its dialect's statements, insert plan and error rules;
        #: settled by the first connection (`connect`).
        self.sql: SqlDialect = self.dialect_class()
        self._sql_settled = False

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
        url = url_sync(self.url) if sync else url_async(self.url)
        options.update(self._pool_options(url, sync))
        return options

    def engines_budget(self) -> int | None:
        """What the budget leaves the SQLAlchemy engines (None: no budget): all of it here;
        PostgreSQL keeps some for its asyncpg pools."""
        return self.connections

    def engine_connections(self, sync: bool = False) -> int | None:
        """The most connections the async (or the sync) engine holds (None: no budget). The
        async engine serves the worker's and the cleaner's own statements and async
        handlers' transactions; the sync engine synchronous calls (a sync handler's
        transaction or enqueue, a Spark job's write). Each has the whole of
        `engines_budget`, unless a worker with sync handlers split it (`share_with_sync`)."""
        budget = self.engines_budget()
        if budget is None or not self.sync_shared:
            return budget
        return budget // 2 if sync else budget - budget // 2

    async def share_with_sync(self) -> None:
        """From now on the budget holds the sync engine's connections too: the engines'
        share is split between them (a worker whose sync handlers use txtasks' sync calls:
        `ctx.transaction_sync()`, `task.enqueue()`). Each needs `ENGINE_MIN`: a budget too
        small for both is refused. Engines and pools made before are closed, to be made
        again with their new sizes. Nothing without a budget."""
        if self.connections is None or self.sync_shared:
            return
        need = self.min_connections + ENGINE_MIN
        if self.connections < need:
            raise ConfigurationError(
                f"db_connections: at least {need} on this database for a worker with sync "
                f"handlers (its sync engine needs {ENGINE_MIN} of its own), got {self.connections}"
            )
        await self.close()
        if not self._engine_given:  # an engine of the caller's keeps its own pool
            self._engine = None
        self._sync_engine = None
        self.sync_shared = True
        self._attempt_gates.clear()
        self._attempt_gate_sync = None

    def _pool_options(self, url: URL, sync: bool) -> dict[str, Any]:
        """Under a budget: the engine's pool holds at most its share, and a caller waits for
        one of them up to `Timeouts.checkout` (the connect and command timeouts)."""
        size = self.engine_connections(sync)
        dialect: Any = url.get_dialect()
        if size is None or not issubclass(dialect.get_pool_class(url), QueuePool):
            return {}  # no budget, or a pool of one connection by design (SQLite in memory)
        overridden = sorted({"pool_size", "max_overflow"} & set(self._engine_options))
        if overridden:
            log.info(
                "db_connections=%d: the engine's %s set by the connection budget",
                self.connections,
                " and ".join(overridden),
            )
        # a second past the bound `checkout` puts on the async engine's wait: its error stands
        wait = self.timeouts.checkout + 1.0
        return {"pool_size": size, "max_overflow": 0, "pool_timeout": wait}

    @contextlib.asynccontextmanager
    async def attempt_slot(self) -> AsyncIterator[None]:
        """Where a handler's own transaction waits for its connection: under a budget, these
        transactions hold at most all but one of the async engine's connections, so that the
        worker's claims, heartbeats and outcome writes always have one (a handler's
        transaction lasts as long as the handler, and a heartbeat that waited for it would
        let every lease run out)."""
        size = self.engine_connections()
        if size is None:
            yield
            return
        loop = asyncio.get_running_loop()
        gate = self._attempt_gates.get(loop)
        if gate is None:
            gate = self._attempt_gates[loop] = asyncio.Semaphore(max(1, size - 1))
        async with gate:
            yield

    @contextlib.contextmanager
    def attempt_slot_sync(self) -> Iterator[None]:
        """`attempt_slot` for a sync handler's transaction, on the sync engine's pool: one
        connection stays for the sync enqueues of the others."""
        size = self.engine_connections(sync=True)
        if size is None:
            yield
            return
        if self._attempt_gate_sync is None:
            self._attempt_gate_sync = threading.BoundedSemaphore(max(1, size - 1))
        with self._attempt_gate_sync:
            yield

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
            with extras_needed():
                engine = create_async_engine(url_async(self.url), **self._options(sync=False))
            self._engine = engine
            self.engine_setup(self._engine.sync_engine)
        return self._engine

    @property
    def sync_engine(self) -> Engine:
        if self._sync_engine is None:
            with extras_needed():
                sync_engine = create_engine(url_sync(self.url), **self._options(sync=True))
            self._sync_engine = sync_engine
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
        conn = await self.checkout()
        limit = self.timeouts.command if bounded else None
        watchdog = Watchdog(limit, lambda: self.connection_cut(raw))
        try:
            raw = (await conn.get_raw_connection()).driver_connection
            if not self._sql_settled:
                self.sql, self._sql_settled = dialect_for(conn.dialect), True
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

    async def checkout(self) -> AsyncConnection:
        """A connection from the pool within `Timeouts.checkout` seconds, or `DatabaseTimeout`.

        Whether bounded or not, its use is the caller's: the bound is on getting it. aiomysql's
        connect timeout covers the TCP connect only, and SQLAlchemy sets a new connection up
        with statements of its own (and ours, `engine_setup`): on a network that stalls while
        a connection opens, all of these would wait for good."""
        limit = self.timeouts.checkout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        try:
            return await within(self.engine.connect(), limit)
        except DBAPIError as exc:
            refused = self.connect_refused(exc)
            if refused is None:
                raise
            raise refused from exc
        except (asyncio.TimeoutError, TimeoutError) as exc:
            if loop.time() < deadline:  # a timeout of the driver's own: its error stands
                raise
            budget = (
                f", or none of the db_connections={self.connections} free"
                if self.connections is not None
                else ""
            )
            raise DatabaseTimeout(
                f"no connection from the database within {limit:g}s (the connect timeout "
                f"plus the command timeout{budget}): given up"
            ) from exc

    def connect_refused(self, exc: DBAPIError) -> Exception | None:
        """A clearer error for a connection the server (or a pooler before it) refused
        because of a setting; None: `exc` stands."""
        return None

    @contextlib.asynccontextmanager
    async def begin(self, *, bounded: bool = True) -> AsyncIterator[AsyncConnection]:
        """`connect()` in a transaction, committed at the end of the block."""
        async with self.connect(bounded=bounded) as conn, conn.begin():
            yield conn

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
                if not self.sql.error_is_transient(orig):
                    raise
                await asyncio.sleep(random.uniform(0, 0.01 * 2**attempt))
        raise AssertionError("unreachable")

    async def insert_on(self, conn: AsyncConnection, rows: Sequence[NewTask]) -> list[int]:
        """Insert `rows` inside `conn`'s transaction; their ids (a dedup hit: the live id)."""
        return await plan_run_async(conn, self.sql.enqueue.enqueue_plan(rows))

    async def plan_async(self, make: Callable[[SqlDialect], Any]) -> Any:
        """Run the plan `make` builds of this database's dialect, in one transaction."""

        async def work(conn: AsyncConnection) -> Any:
            return await plan_run_async(conn, make(self.sql))

        return await self.in_transaction(work)

    def plan_sync(self, make: Callable[[SqlDialect], Any]) -> Any:
        """`plan_async` on the sync engine (the dialect its connection tells)."""
        from txtasks.driver.dialect import dialect_for

        with self.sync_engine.begin() as conn:
            return plan_run_sync(conn, make(dialect_for(conn.dialect)))
