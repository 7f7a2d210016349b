"""SQLAlchemy engines and txtasks' tables for an application's own transactions.

`create_engine` and `create_async_engine` take the same database URL as `App(database_url=...)`
(postgresql://, mysql:// for MySQL and MariaDB, sqlite:///path) and return engines on the
drivers txtasks uses; on SQLite they also install the connection settings txtasks relies on.
`migrate` creates or upgrades txtasks' tables, on its own or inside your transaction.

SQLAlchemy's dialects, its asyncio extension and the migrations load when these are called, not
with `import txtasks`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL

from txtasks.driver.pooling import POOLED_CONNECT_ARGS, TRANSACTION, pooler_of
from txtasks.driver.urls import DRIVERS, url_async, url_parse, url_sync
from txtasks.errors import ConfigurationError, extras_needed

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine
    from sqlalchemy.ext.asyncio import AsyncEngine


def create_engine(url: str | URL, **kwargs: Any) -> Engine:
    """A SQLAlchemy `Engine` for your own transactions on a txtasks database.

    The URL's driver is the sync one txtasks uses (psycopg, PyMySQL, sqlite3), whatever the URL
    names. On SQLite each connection gets WAL, a busy timeout and `BEGIN IMMEDIATE`
    transactions, so that your writes and the workers' wait for each other instead of failing
    with "database is locked". `kwargs` go to `sqlalchemy.create_engine` (`pool_size`,
    `pool_pre_ping`, `echo`, ...). Raises `ConfigurationError` for a URL txtasks cannot use.

    A PostgreSQL URL with `pooler=transaction` (PgBouncer in transaction mode in front of the
    database) gets the driver's settings for it: psycopg prepares no statement by name.
    """
    import sqlalchemy

    with extras_needed():
        engine = sqlalchemy.create_engine(url_sync(url), **_pooled(url, kwargs, sync=True))
    _connection_setup(engine)
    return engine


def create_async_engine(url: str | URL, **kwargs: Any) -> AsyncEngine:
    """A SQLAlchemy `AsyncEngine` for your own transactions on a txtasks database.

    As `create_engine`, on the async drivers txtasks uses (asyncpg, aiomysql, aiosqlite);
    `kwargs` go to `sqlalchemy.ext.asyncio.create_async_engine`. With `pooler=transaction`,
    asyncpg keeps no statement by name (its statement cache and SQLAlchemy's are off).
    """
    from sqlalchemy.ext.asyncio import create_async_engine as sqlalchemy_create_async_engine

    options = _pooled(url, kwargs, sync=False)
    with extras_needed():
        engine = sqlalchemy_create_async_engine(url_async(url), **options)
    _connection_setup(engine.sync_engine)
    return engine


def _pooled(url: str | URL, kwargs: dict[str, Any], *, sync: bool) -> dict[str, Any]:
    """`kwargs`, with the connect arguments a transaction pooler needs when the URL names
    one (`pooler=transaction`; see txtasks.driver.pooling); the caller's own win."""
    parsed = url_parse(url)
    if pooler_of(parsed)[0] != TRANSACTION:
        return kwargs
    backend = parsed.get_backend_name()
    if backend != "postgresql":
        raise ConfigurationError(
            f"pooler={TRANSACTION}: txtasks works behind a transaction pooler (PgBouncer) on "
            f"PostgreSQL only, not on {backend}"
        )
    driver = DRIVERS[backend][1 if sync else 0]
    connect_args = {**POOLED_CONNECT_ARGS[driver], **kwargs.get("connect_args", {})}
    return {**kwargs, "connect_args": connect_args}


def _connection_setup(engine: Engine) -> None:
    """The settings every connection to this database needs (SQLite's; none elsewhere)."""
    from txtasks.driver.dialect import dialect_for

    dialect_for(engine.dialect).connection_setup(engine)


def migrate(database: str | URL | Engine | Connection) -> list[int]:
    """Create or upgrade txtasks' tables, as `txtasks migrate` does; return the schema versions
    applied (empty when the schema is up to date).

    - A URL or an `Engine`: in a transaction of its own, committed before this returns.
    - A `Connection`: inside its transaction, so the tables commit (or roll back) with your own
      DDL, such as `metadata.create_all(conn)` in the same block.

    Async code migrates the application's database with `await app.amigrate()`.
    """
    from sqlalchemy import Connection, Engine

    from txtasks.schema.migrate import migrate as migrate_connection

    if isinstance(database, Connection):
        return [m.version for m in migrate_connection(database)]
    if isinstance(database, Engine):
        with database.begin() as conn:
            return migrate(conn)
    if isinstance(database, (str, URL)):
        engine = create_engine(database)
        try:
            return migrate(engine)
        finally:
            engine.dispose()
    raise TypeError(
        "migrate: expected a database URL, a SQLAlchemy Engine or a sync Connection, got "
        f"{type(database).__name__}; in async code use `await app.amigrate()`"
    )
