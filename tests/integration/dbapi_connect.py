"""A plain DB-API connection (psycopg, PyMySQL, sqlite3) to a test database's URL."""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import make_url


def dbapi_connect(url: str) -> Any:
    """A new connection of the backend's DB-API driver, in its default transaction mode."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return sqlite3.connect(parsed.database or ":memory:")
    if backend == "postgresql":
        import psycopg

        return psycopg.connect(
            host=parsed.host, port=parsed.port, user=parsed.username,
            password=parsed.password, dbname=parsed.database,
        )  # fmt: skip
    import pymysql

    return pymysql.connect(
        host=parsed.host, port=parsed.port or 3306, user=parsed.username,
        password=parsed.password or "", database=parsed.database,
    )  # fmt: skip
