"""Apply the versioned migrations, or print them as SQL for Alembic/Flyway users."""

from __future__ import annotations

import importlib
import io
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from sqlalchemy import Connection, func, inspect, select, text
from sqlalchemy.exc import DBAPIError

from txtasks.errors import SchemaError
from txtasks.schema import tables, versions

if TYPE_CHECKING:  # alembic is imported only when migrating, not by every worker at start
    from alembic.operations import Operations

#: The lock that concurrent `migrate` runs queue on (MySQL/MariaDB: a named lock of the server).
LOCK_NAME = "txtasks_migrate"
#: Seconds a `migrate` waits for another one to finish before it gives up with SchemaError.
LOCK_WAIT = 60
#: PostgreSQL's SQLSTATE for a lock wait that ran out of lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"


@dataclass(frozen=True)
class Migration:
    """One schema version."""

    version: int
    name: str
    upgrade: Callable[[Operations], None]


def _load(module: ModuleType) -> Migration:
    return Migration(module.VERSION, module.NAME, module.upgrade)


def migrations_all() -> list[Migration]:
    """Every migration shipped with this version, in order."""
    found = [
        _load(importlib.import_module(f"{versions.__name__}.{info.name}"))
        for info in pkgutil.iter_modules(versions.__path__)
        if info.name.startswith("v")
    ]
    found.sort(key=lambda m: m.version)
    expected = list(range(1, len(found) + 1))
    if [m.version for m in found] != expected:
        raise RuntimeError(f"migration versions are not 1..n: {[m.version for m in found]}")
    return found


def latest_version() -> int:
    return migrations_all()[-1].version


def schema_version(conn: Connection) -> int:
    """The highest applied version, 0 for an empty database."""
    if not inspect(conn).has_table(tables.migrations.name):
        return 0
    value = conn.execute(select(func.max(tables.migrations.c.version))).scalar()
    return int(value or 0)


def _record(op: Operations, migration: Migration) -> None:
    op.execute(
        tables.migrations.insert().values(
            version=migration.version, name=migration.name, applied_at=func.current_timestamp()
        )
    )


@contextmanager
def _postgresql_lock(conn: Connection) -> Iterator[None]:
    """A transaction-level advisory lock, waited for up to LOCK_WAIT seconds (whatever the
    session's statement_timeout): the commit (or rollback) of the migrating transaction
    releases it."""
    saved = conn.execute(
        text("SELECT current_setting('lock_timeout'), current_setting('statement_timeout')")
    ).one()
    _postgresql_timeouts(conn, f"{LOCK_WAIT}s", "0")
    try:
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock(hashtext('{LOCK_NAME}'))")
    except DBAPIError as exc:
        if _sqlstate(exc) == LOCK_NOT_AVAILABLE:
            raise _lock_timeout() from None
        raise
    _postgresql_timeouts(conn, *saved)
    yield


def _postgresql_timeouts(conn: Connection, lock: str, statement: str) -> None:
    """Set lock_timeout and statement_timeout for the rest of the transaction."""
    query = text(
        "SELECT set_config('lock_timeout', :lock, true), "
        "set_config('statement_timeout', :statement, true)"
    )
    conn.execute(query, {"lock": lock, "statement": statement})


@contextmanager
def _mysql_lock(conn: Connection) -> Iterator[None]:
    """A named lock of the server (a session's, not a transaction's), waited for up to
    LOCK_WAIT seconds. DDL commits implicitly on MySQL/MariaDB, so a migration is not atomic
    there anyway: the migrating transaction is committed before the lock is released, so that
    the next holder reads the record of the last migration."""
    query = text("SELECT GET_LOCK(:name, :wait)")
    got = conn.execute(query, {"name": LOCK_NAME, "wait": LOCK_WAIT}).scalar()
    if got is None:
        raise SchemaError(f"the migration lock {LOCK_NAME!r} could not be taken (GET_LOCK failed)")
    if got != 1:
        raise _lock_timeout()
    try:
        yield
        conn.exec_driver_sql("COMMIT")
    finally:
        conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": LOCK_NAME})


@contextmanager
def _sqlite_lock(conn: Connection) -> Iterator[None]:
    """The database's write lock, from before reading the version until the commit.

    txtasks' own engines begin every transaction with BEGIN IMMEDIATE; on any other engine,
    whose sqlite3 connection has no transaction open yet, migrate begins one the same way.
    """
    if not getattr(conn.connection.driver_connection, "in_transaction", True):
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    yield


def _lock_timeout() -> SchemaError:
    return SchemaError(
        f"another txtasks migrate has held the migration lock {LOCK_NAME!r} for more than "
        f"{LOCK_WAIT} s; run migrate again once it has finished"
    )


def _sqlstate(exc: DBAPIError) -> str | None:
    """The SQLSTATE of a PostgreSQL error (asyncpg: sqlstate; psycopg: pgcode)."""
    orig = exc.orig
    return getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)


LOCKS = {"postgresql": _postgresql_lock, "mysql": _mysql_lock, "mariadb": _mysql_lock}


def migrate(conn: Connection, *, target: int | None = None) -> list[Migration]:
    """Apply every pending migration on a sync connection (inside its transaction).

    Concurrent runs, in any processes, queue on a lock held from before the schema version is
    read until the migrations are committed, so each migration is applied once.
    """
    with LOCKS.get(conn.dialect.name, _sqlite_lock)(conn):
        current = schema_version(conn)
        todo = [
            m
            for m in migrations_all()
            if m.version > current and (target is None or m.version <= target)
        ]
        from alembic.migration import MigrationContext
        from alembic.operations import Operations

        op = Operations(MigrationContext.configure(conn))
        for migration in todo:
            migration.upgrade(op)
            _record(op, migration)
        return todo


def migrate_sql(dialect_name: str, *, since: int = 0) -> str:
    """The SQL of every migration after `since`, for the given dialect, without a database."""
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    buffer = io.StringIO()
    context = MigrationContext.configure(
        dialect_name=dialect_name,
        opts={"as_sql": True, "output_buffer": buffer, "literal_binds": True},
    )
    op = Operations(context)
    for migration in migrations_all():
        if migration.version > since:
            buffer.write(f"-- txtasks migration {migration.version}: {migration.name}\n")
            migration.upgrade(op)
            _record(op, migration)
    return buffer.getvalue()
