"""Apply the versioned migrations, or print them as SQL for Alembic/Flyway users."""

from __future__ import annotations

import importlib
import io
import pkgutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from sqlalchemy import Connection, func, inspect, select

from txtasks.errors import SchemaError
from txtasks.schema import tables, versions

if TYPE_CHECKING:  # alembic is imported only when migrating, not by every worker at start
    from alembic.operations import Operations

#: The lock that concurrent `migrate` runs queue on (MySQL/MariaDB: a named lock of the server).
LOCK_NAME = "txtasks_migrate"
#: Seconds a `migrate` waits for another one to finish before it gives up with SchemaError.
LOCK_WAIT = 60


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


def lock_timeout_error() -> SchemaError:
    return SchemaError(
        f"another txtasks migrate has held the migration lock {LOCK_NAME!r} for more than "
        f"{LOCK_WAIT} s; run migrate again once it has finished"
    )


def migrate(
    conn: Connection,
    *,
    target: int | None = None,
    lock: Callable[[Connection], AbstractContextManager[None]] | None = None,
) -> list[Migration]:
    """Apply every pending migration on a sync connection (inside its transaction).

    Concurrent runs, in any processes, queue on a lock held from before the schema version is
    read until the migrations are committed, so each migration is applied once. The lock is
    the dialect's (`SqlDialect.migration_lock`), found from the connection unless given.
    """
    if lock is None:
        from txtasks.driver.dialect import dialect_for  # the dialects know their locks

        lock = dialect_for(conn.dialect).migration_lock
    with lock(conn):
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
