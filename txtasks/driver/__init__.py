"""Drivers: where tasks are stored. `driver_for_url` picks the SQL driver for a URL."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL, Dialect

from txtasks.driver.base import Capabilities, Driver, WriteResult
from txtasks.driver.memory import MemoryDriver
from txtasks.driver.mysql import MariaDBDriver, MySQLDriver
from txtasks.driver.postgresql import PostgresDriver
from txtasks.driver.sql import SqlDriver
from txtasks.driver.sqlite import SQLiteDriver
from txtasks.driver.urls import backend_name
from txtasks.errors import ConfigurationError

BY_BACKEND: dict[str, type[SqlDriver]] = {
    "postgresql": PostgresDriver,
    "mysql": MySQLDriver,
    "mariadb": MariaDBDriver,
    "sqlite": SQLiteDriver,
}


def sql_driver_class(dialect: Dialect) -> type[SqlDriver]:
    """The SQL knowledge for a connection's dialect (MariaDB told apart from MySQL)."""
    try:
        return BY_BACKEND[dialect.name].plan_class(dialect)
    except KeyError:
        raise ConfigurationError(
            f"connection: unsupported database dialect {dialect.name!r}; "
            "txtasks supports postgresql, mysql/mariadb and sqlite"
        ) from None


def driver_for_url(url: str | URL, **options: Any) -> SqlDriver:
    """A driver for a database URL (postgresql://, mysql://, sqlite:///path)."""
    return BY_BACKEND[backend_name(url)](url, **options)


__all__ = [
    "Capabilities",
    "Driver",
    "MariaDBDriver",
    "MemoryDriver",
    "MySQLDriver",
    "PostgresDriver",
    "SQLiteDriver",
    "SqlDriver",
    "WriteResult",
    "driver_for_url",
    "sql_driver_class",
]
