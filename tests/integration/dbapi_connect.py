"""A plain DB-API connection of each driver DbapiTx takes, to a test database's URL."""

from __future__ import annotations

import importlib
import sqlite3
from typing import Any

import pytest
from sqlalchemy import make_url

from tests.servers import in_ci

#: (backend, DB-API module) of each driver, with its server's marker; the id is the package's
#: name (mysqlclient is the `MySQLdb` module).
DBAPI_DRIVERS = [
    pytest.param(("sqlite", "sqlite3"), id="sqlite3"),
    pytest.param(("postgresql", "psycopg"), id="psycopg", marks=pytest.mark.postgresql),
    pytest.param(("postgresql", "psycopg2"), id="psycopg2", marks=pytest.mark.postgresql),
    pytest.param(("mysql", "pymysql"), id="pymysql", marks=pytest.mark.mysql),
    pytest.param(("mysql", "MySQLdb"), id="mysqlclient", marks=pytest.mark.mysql),
]


def dbapi_module(driver: str) -> Any:
    """The DB-API module of a driver; skips the test where it is not installed (fails it in CI:
    the drivers are dev dependencies)."""
    try:
        return importlib.import_module(driver)
    except ImportError as exc:
        msg = f"{driver} is not installed ({exc})"
        if in_ci():
            pytest.fail(f"{msg}; CI is set: a missing dev dependency is a failure", pytrace=False)
        pytest.skip(msg)


def dbapi_connect(url: str, driver: str) -> Any:
    """A new connection of a DB-API driver, in its default transaction mode."""
    parsed = make_url(url)
    if driver == "sqlite3":
        return sqlite3.connect(parsed.database or ":memory:")
    module = dbapi_module(driver)
    if driver in ("psycopg", "psycopg2"):
        return module.connect(
            host=parsed.host, port=parsed.port, user=parsed.username,
            password=parsed.password, dbname=parsed.database,
        )  # fmt: skip
    return module.connect(
        host=parsed.host, port=parsed.port or 3306, user=parsed.username,
        password=parsed.password or "", database=parsed.database, charset="utf8mb4",
    )  # fmt: skip
