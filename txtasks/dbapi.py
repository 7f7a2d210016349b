"""Enqueue through a plain DB-API (PEP 249) connection, inside the caller's transaction.

`DbapiTx(connection)` wraps a psycopg (3), psycopg2, PyMySQL, mysqlclient (MySQLdb) or sqlite3
connection for `enqueue_tx`, `enqueue_many_tx` and `publish_tx`: the rows are written by the
same plan of statements as on a SQLAlchemy connection, in the caller's transaction, which
txtasks never begins, commits, rolls back or closes. The wake-ups wait until the caller says the
transaction committed (`after_commit()`; `after_rollback()` drops them), or go to a hook such as
Django's `transaction.on_commit` (`DbapiTx(connection, on_commit=...)`).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.dialects import registry
from sqlalchemy.pool import NullPool

from txtasks.errors import ConfigurationError
from txtasks.wakeup.base import Notifier
from txtasks.wakeup.commit import PendingWakeups

#: DB-API module -> (SQLAlchemy URL scheme, the dialect class in txtasks.driver.caller_tx).
DRIVERS: dict[str, tuple[str, str]] = {
    "psycopg": ("postgresql.txtasks_psycopg", "PsycopgCallerTx"),
    "psycopg2": ("postgresql.txtasks_psycopg2", "Psycopg2CallerTx"),
    "pymysql": ("mysql.txtasks_pymysql", "PyMySQLCallerTx"),
    "MySQLdb": ("mysql.txtasks_mysqldb", "MySQLdbCallerTx"),
    "sqlite3": ("sqlite.txtasks_sqlite3", "SQLiteCallerTx"),
}
#: The drivers by the names their users know them by (for the error naming them).
SUPPORTED = "psycopg (3), psycopg2, PyMySQL, mysqlclient (MySQLdb) or sqlite3"
#: Dialect options: no hstore type looked up on the caller's connection (a query of its own,
#: and psycopg's registers the type on the connection).
_OPTIONS: dict[str, dict[str, Any]] = {
    "psycopg": {"use_native_hstore": False},
    "psycopg2": {"use_native_hstore": False},
}

#: The caller's connection, while a plan runs on it (the engines' pools hand it out).
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("txtasks_dbapi_connection")
_engines: dict[tuple[str, str], Engine] = {}
_lock = threading.Lock()


def driver_of(connection: Any) -> str:
    """The DB-API module of a connection (a key of DRIVERS), from its class."""
    for cls in type(connection).__mro__:
        module = cls.__module__.split(".")[0]
        if module in DRIVERS:
            return module
    raise ConfigurationError(
        f"DbapiTx: {type(connection).__module__}.{type(connection).__name__} is not a "
        f"{SUPPORTED} connection; pass one of those, or a SQLAlchemy Connection"
    )


def _server(connection: Any, driver: str) -> str:
    """The server's version: a dialect is set up once per driver and server version."""
    if driver == "psycopg":
        return str(connection.info.server_version)
    if driver == "psycopg2":
        return str(connection.server_version)
    if driver in ("pymysql", "MySQLdb"):
        return str(connection.get_server_info())
    return ""


def _caller_connection() -> Any:
    return _current.get()


def engine_for(connection: Any) -> Engine:
    """The engine whose connections are the caller's own (one per driver and server)."""
    driver = driver_of(connection)
    key = (driver, _server(connection, driver))
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            name, cls = DRIVERS[driver]
            registry.register(name, "txtasks.driver.caller_tx", cls)
            engine = _engines[key] = create_engine(
                name.replace(".", "+") + "://",
                creator=_caller_connection,
                poolclass=NullPool,
                pool_reset_on_return=None,
                **_OPTIONS.get(driver, {}),
            )
    return engine


class DbapiTx:
    """A DB-API connection's current transaction, for `enqueue_tx` and its relatives.

    The caller commits or rolls back its connection as usual, then calls `after_commit()`
    (the wake-ups go out) or `after_rollback()` (they are dropped). With `on_commit`, each
    enqueue's wake-ups are handed to that hook instead (e.g. Django's `transaction.on_commit`),
    which runs them after the commit or drops them with a rolled-back savepoint.
    """

    def __init__(
        self,
        connection: Any,
        *,
        on_commit: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        driver_of(connection)  # refuse an unsupported connection here, not at the first enqueue
        self.connection = connection
        self.on_commit = on_commit
        self.pending = PendingWakeups()

    @contextlib.contextmanager
    def sql_connection(self) -> Iterator[Connection]:
        """A SQLAlchemy Connection on the caller's connection, for one plan."""
        engine = engine_for(self.connection)
        token = _current.set(self.connection)
        try:
            with engine.connect() as sql:
                yield sql
        finally:
            _current.reset(token)

    def wakeups_add(self, notifier: Notifier, ids_by_queue: Mapping[str, Sequence[int]]) -> None:
        """Hold wake-ups until the commit (or hand them to the `on_commit` hook)."""
        if self.on_commit is None:
            self.pending.add(notifier, ids_by_queue)
            return
        pending = PendingWakeups()
        pending.add(notifier, ids_by_queue)
        self.on_commit(pending.publish)

    def after_commit(self) -> None:
        """The caller's transaction committed: send the wake-ups held (never raises)."""
        pending, self.pending = self.pending, PendingWakeups()
        pending.publish()

    def after_rollback(self) -> None:
        """The caller's transaction rolled back: drop the wake-ups held."""
        self.pending = PendingWakeups()

    def __enter__(self) -> DbapiTx:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """Commit the connection and send the wake-ups; on an exception, roll back."""
        if exc_type is None:
            self.connection.commit()
            self.after_commit()
        else:
            self.connection.rollback()
            self.after_rollback()
