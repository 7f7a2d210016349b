"""SQLAlchemy dialects that run statements on a connection whose transaction the caller owns.

A plain DB-API connection (psycopg, psycopg2, PyMySQL, mysqlclient, sqlite3) is wrapped in a SQLAlchemy `Connection`
so that an enqueue runs the very plan it runs on SQLAlchemy's own connections. These dialects
never begin, commit, roll back or close that connection, and change nothing of it on connect:
the transaction and the connection stay the caller's. Loaded through SQLAlchemy's dialect
registry, only when a DB-API enqueue first needs one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects.mysql.mysqldb import MySQLDialect_mysqldb
from sqlalchemy.dialects.mysql.pymysql import MySQLDialect_pymysql
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2
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


class Psycopg2CallerTx(CallerTx, PGDialect_psycopg2):
    """psycopg2."""

    supports_statement_cache = True


class PyMySQLCallerTx(CallerTx, MySQLDialect_pymysql):  # type: ignore[misc]
    """PyMySQL (MariaDB, MySQL)."""

    supports_statement_cache = True


class TextLiterals:
    """A mysqlclient connection as the builders of driver SQL see it (`DriverSql`): its
    `literal()` gives text, as PyMySQL's does (mysqlclient's gives bytes in the connection's
    encoding); bytes that are not text in that encoding are kept as surrogate escapes, which
    `MySQLdbCallerTx` turns back into those bytes when it sends the statement."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def literal(self, value: Any) -> str:
        """The driver's own escaping of a value, as SQL text."""
        escaped: bytes = self.connection.literal(value)
        return escaped.decode(self.connection.encoding, "surrogateescape")


class MySQLdbCallerTx(CallerTx, MySQLDialect_mysqldb):  # type: ignore[misc]
    """mysqlclient, the `MySQLdb` module (MariaDB, MySQL)."""

    supports_statement_cache = True

    def get_driver_connection(self, connection: Any) -> TextLiterals:
        """The connection whose escaping builds the bulk insert, giving text (`TextLiterals`)."""
        return TextLiterals(connection)

    def do_execute(self, cursor: Any, statement: str, parameters: Any, context: Any = None) -> None:
        """As mysqlclient sends it (in the connection's encoding), with the bytes a
        `TextLiterals` escaped restored."""
        cursor.execute(_encoded(cursor, statement), parameters)

    def do_execute_no_params(self, cursor: Any, statement: str, context: Any = None) -> None:
        cursor.execute(_encoded(cursor, statement))


def _encoded(cursor: Any, statement: str) -> bytes:
    """A statement in the connection's encoding, surrogate escapes back to their bytes."""
    return statement.encode(cursor.connection.encoding, "surrogateescape")


class SQLiteCallerTx(CallerTx, SQLiteDialect_pysqlite):  # type: ignore[misc]
    """sqlite3."""

    supports_statement_cache = True
