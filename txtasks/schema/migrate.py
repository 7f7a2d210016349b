"""Apply the versioned migrations, or print them as SQL for Alembic/Flyway users."""

from __future__ import annotations

import importlib
import io
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from sqlalchemy import Connection, func, inspect, select

from txtasks.schema import tables, versions

if TYPE_CHECKING:  # alembic is imported only when migrating, not by every worker at start
    from alembic.operations import Operations

LOCK_NAME = "txtasks_migrate"


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


def _lock(conn: Connection) -> None:
    """Serialise concurrent `migrate` runs (PostgreSQL: transaction lock; MySQL: named lock)."""
    name = conn.dialect.name
    if name == "postgresql":
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('txtasks_migrate'))")
    elif name in ("mysql", "mariadb"):
        conn.exec_driver_sql(f"SELECT GET_LOCK('{LOCK_NAME}', 60)")


def _unlock(conn: Connection) -> None:
    if conn.dialect.name in ("mysql", "mariadb"):
        conn.exec_driver_sql(f"SELECT RELEASE_LOCK('{LOCK_NAME}')")


def migrate(conn: Connection, *, target: int | None = None) -> list[Migration]:
    """Apply every pending migration on a sync connection (inside its transaction)."""
    _lock(conn)
    try:
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
    finally:
        _unlock(conn)


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
