"""SQLAlchemy dialects that run statements on a connection whose transaction the caller owns.

A plain DB-API connection (psycopg, PyMySQL, sqlite3) is wrapped in a SQLAlchemy `Connection`
so that an enqueue runs the very plan it runs on SQLAlchemy's own connections. These dialects
never begin, commit, roll back or close that connection, and change nothing of it on connect:
the transaction and the connection stay the caller's. Loaded through SQLAlchemy's dialect
registry, only when a DB-API enqueue first needs one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects.mysql.pymysql import MySQLDialect_pymysql
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite


class CallerTx:
    """Leaves the connection's transaction and lifetime to the caller."""

    supports_statement_cache = True  # compiles as its base dialect does

    def do_begin(self, dbapi_connection: Any) -> None:
        """The caller's transaction is open already (or the caller runs in autocommit)."""

    def do_commit(self, dbapi_connection: Any) -> None:
        """The caller commits."""

    def do_rollback(self, dbapi_connection: Any) -> None:
        """The caller rolls back."""

    def do_close(self, dbapi_connection: Any) -> None:
        """The caller closes its connection."""

    def on_connect(self) -> None:
        """No session settings: the connection is the caller's as it is."""
        return None


class PsycopgCallerTx(CallerTx, PGDialect_psycopg):
    """psycopg (3)."""

    supports_statement_cache = True


class PyMySQLCallerTx(CallerTx, MySQLDialect_pymysql):  # type: ignore[misc]
    """PyMySQL (MariaDB, MySQL)."""

    supports_statement_cache = True


class SQLiteCallerTx(CallerTx, SQLiteDialect_pysqlite):  # type: ignore[misc]
    """sqlite3."""

    supports_statement_cache = True
