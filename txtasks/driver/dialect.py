"""The SQL of one database: its statement tables, its error rules, its migration lock.

A `SqlDialect` is picked once per database (`txtasks.driver.dialect_for`) and is all the core
knows of that database's SQL: a driver's roles run its statements on the connections they own,
and an enqueue in the caller's transaction runs its insert plan on the caller's connection. The
statements are tables of builders, one per feature (txtasks.driver.statements), each built
once; a dialect subclass (in postgresql.py, mysql.py, sqlite.py) names the tables whose entries
its SQL does differently.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator
from typing import Any, ClassVar

from sqlalchemy import (
    Connection,
    Engine,
    Result,
    Table,
)
from sqlalchemy.engine import Dialect

from txtasks.driver.base import Capabilities
from txtasks.driver.statements.claims import ClaimStatements
from txtasks.driver.statements.control import ControlStatements
from txtasks.driver.statements.dashboard import DashboardStatements
from txtasks.driver.statements.enqueue import EnqueueStatements
from txtasks.driver.statements.history import HistoryStatements
from txtasks.driver.statements.keys import KeyStatements
from txtasks.driver.statements.outcomes import OutcomeStatements
from txtasks.driver.statements.topics import TopicStatements
from txtasks.errors import ConfigurationError

#: Each database's dialect, as (module, class name), by SQLAlchemy's name for it.
DIALECTS: dict[str, tuple[str, str]] = {
    "postgresql": ("txtasks.driver.postgresql", "PostgresDialect"),
    "mysql": ("txtasks.driver.mysql", "MySQLDialect"),
    "mariadb": ("txtasks.driver.mysql", "MariaDBDialect"),
    "sqlite": ("txtasks.driver.sqlite", "SQLiteDialect"),
}


def dialect_for(dialect: Dialect) -> SqlDialect:
    """The SQL of a connection's database (MariaDB told apart from MySQL once connected); one
    object per database, shared by its drivers and by every enqueue in a caller's transaction."""
    name = "mariadb" if getattr(dialect, "is_mariadb", False) else dialect.name
    if name not in DIALECTS:
        raise ConfigurationError(
            f"connection: unsupported database dialect {dialect.name!r}; "
            "txtasks supports postgresql, mysql/mariadb and sqlite"
        )
    return _dialect(name)


@functools.cache
def _dialect(name: str) -> SqlDialect:
    module, cls = DIALECTS[name]
    made: SqlDialect = getattr(importlib.import_module(module), cls)()
    return made


class SqlDialect:
    """One database's SQL: its settings, error rules and migration lock, and one statement table
    per feature (txtasks.driver.statements); a subclass per database names the tables it
    overrides."""

    capabilities: ClassVar[Capabilities] = Capabilities("sql")

    #: INSERT ... RETURNING is available (all but MySQL proper).
    returning_insert: ClassVar[bool] = True

    #: The dedup-insert returns the ids of the rows it inserted.
    returning_dedup: ClassVar[bool] = True

    #: The statement tables, one per feature (see txtasks.driver.statements).
    enqueue: ClassVar[type[EnqueueStatements]] = EnqueueStatements
    claims: ClassVar[type[ClaimStatements]] = ClaimStatements
    keys: ClassVar[type[KeyStatements]] = KeyStatements
    outcomes: ClassVar[type[OutcomeStatements]] = OutcomeStatements
    topics: ClassVar[type[TopicStatements]] = TopicStatements
    control: ClassVar[type[ControlStatements]] = ControlStatements
    dashboard: ClassVar[type[DashboardStatements]] = DashboardStatements
    history: ClassVar[type[HistoryStatements]] = HistoryStatements

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        bind_tables(cls)

    @staticmethod
    def upsert(table: Table) -> Any:
        """The dialect's INSERT ... ON CONFLICT (PostgreSQL's and SQLite's share one API), used
        by the dedup insert and the arming of keys; a dialect without it overrides those two."""
        raise NotImplementedError

    @staticmethod
    @contextlib.contextmanager
    def migration_lock(conn: Connection) -> Iterator[None]:
        """What concurrent `migrate` runs queue on, held from before the schema version is
        read until the migrations are committed; each dialect has its own."""
        yield

    @staticmethod
    def connection_setup(engine: Engine) -> None:
        """What every engine on this database needs, txtasks' own and the application's
        (`txtasks.create_engine`); nothing by default."""

    @classmethod
    def error_is_transient(cls, exc: BaseException) -> bool:
        """A deadlock or lock timeout that a fresh transaction may not meet again."""
        return False

    @staticmethod
    def rows(result: Result[Any]) -> list[Any]:
        """The rows of one of the statements that read keys or hints (MySQL/MariaDB return
        them as one JSON value: `MySQLDialect.rows`), as tuples."""
        return list(result)

    @staticmethod
    def scalars(result: Result[Any]) -> list[Any]:
        """The values of such a statement of one column."""
        return list(result.scalars())


#: The names of a dialect's statement tables.
TABLES = (
    "enqueue",
    "claims",
    "keys",
    "outcomes",
    "topics",
    "control",
    "dashboard",
    "history",
)


def bind_tables(dialect: type[SqlDialect]) -> None:
    """Each statement table of `dialect` as a subclass bound to it (`Statements.sql`): a
    builder of one table reaches the dialect's other tables through it, so a dialect's
    override of one entry applies wherever another table uses that entry."""
    for name in TABLES:
        table = getattr(dialect, name)
        bound = type(table.__name__, (table,), {"sql": dialect, "__module__": table.__module__})
        setattr(dialect, name, bound)


bind_tables(SqlDialect)
