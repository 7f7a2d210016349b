"""All migrations applied == the tables declared in txtasks.schema.tables, on every backend."""

from __future__ import annotations

from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from tests.conftest import reset_schema
from txtasks.driver.urls import backend_name, url_sync
from txtasks.schema.migrate import (
    latest_version,
    migrate,
    migrate_sql,
    migrations_all,
    schema_version,
)
from txtasks.schema.tables import metadata


def declared_here(index: Any, dialect: str) -> bool:
    """An index declared for some databases only (`Index.ddl_if`) is compared on those."""
    only = getattr(index, "_ddl_if", None)
    return only is None or only.dialect is None or dialect in only.dialect


def schema_diff(url: str) -> list[Any]:
    """Differences between the live database and the declared tables (txtasks_* only)."""
    engine = create_engine(url_sync(url))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "include_name": lambda name, kind, _parent: (
                        kind != "table" or str(name).startswith("txtasks_")
                    ),
                    "include_object": lambda obj, _name, kind, reflected, _other: (
                        reflected or kind != "index" or declared_here(obj, conn.dialect.name)
                    ),
                },
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def test_migrations_produce_the_declared_tables(database_url: str) -> None:
    assert schema_diff(database_url) == []


def test_schema_version_and_second_run_is_a_no_op(database_url: str) -> None:
    engine = create_engine(url_sync(database_url))
    try:
        with engine.begin() as conn:
            assert schema_version(conn) == latest_version()
            assert migrate(conn) == []
        assert set(inspect(engine).get_table_names()) >= {
            "txtasks_tasks",
            "txtasks_archive",
            "txtasks_migrations",
        }
    finally:
        engine.dispose()


#: Migrations already shipped: a database records (version, name) as it applies them, so these
#: never change number or meaning; new ones come after.
SHIPPED = [(1, "initial"), (2, "periodic"), (3, "staging"), (4, "staged_table")]


def test_shipped_migrations_keep_their_numbers() -> None:
    assert [(m.version, m.name) for m in migrations_all()][: len(SHIPPED)] == SHIPPED


@pytest.mark.parametrize("start", range(1, len(SHIPPED) + 1))
def test_a_database_at_a_shipped_version_upgrades_to_the_declared_schema(
    database_url: str, start: int
) -> None:
    engine = create_engine(url_sync(database_url))
    try:
        with engine.begin() as conn:
            metadata.drop_all(conn)
        with engine.begin() as conn:
            migrate(conn, target=start)
        with engine.begin() as conn:
            applied = [m.version for m in migrate(conn)]
            assert applied == [m.version for m in migrations_all() if m.version > start]
    finally:
        engine.dispose()
    assert schema_diff(database_url) == []


def test_printed_sql_builds_the_same_schema(database_url: str) -> None:
    """`txtasks migrate --sql` output, run by hand, gives the declared schema too."""
    reset_schema(database_url)
    engine = create_engine(url_sync(database_url))
    try:
        with engine.begin() as conn:
            metadata.drop_all(conn)
        script = migrate_sql(backend_name(database_url))
        statements = [s.strip() for s in script.split(";\n") if s.strip()]
        with engine.begin() as conn:
            for statement in statements:
                body = "\n".join(
                    line for line in statement.splitlines() if not line.startswith("--")
                )
                if body.strip():
                    conn.exec_driver_sql(body)
        with engine.connect() as conn:
            assert schema_version(conn) == latest_version()
    finally:
        engine.dispose()
    assert schema_diff(database_url) == []


@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "sqlite"])
def test_sql_needs_no_database(dialect: str) -> None:
    script = migrate_sql(dialect)
    assert "CREATE TABLE txtasks_tasks" in script
    assert "CREATE TABLE txtasks_archive" in script
    assert "INSERT INTO txtasks_migrations" in script
