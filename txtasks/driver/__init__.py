"""Drivers: where tasks are stored. `driver_for_url` picks the SQL driver for a URL.

The SQL drivers are imported when first used (`driver_for_url`, or an attribute of this
package): `import txtasks` loads no database dialect it does not need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from txtasks.driver.base import Capabilities, Driver, WriteResult
from txtasks.driver.memory import MemoryDriver
from txtasks.driver.urls import backend_name

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from txtasks.driver.dialect import SqlDialect, dialect_for
    from txtasks.driver.mysql import MariaDBDriver, MySQLDriver
    from txtasks.driver.postgresql import PostgresDriver
    from txtasks.driver.sql import SqlDriver
    from txtasks.driver.sqlite import SQLiteDriver

#: Each backend's driver class, as (module, class name).
BY_BACKEND: dict[str, tuple[str, str]] = {
    "postgresql": ("txtasks.driver.postgresql", "PostgresDriver"),
    "mysql": ("txtasks.driver.mysql", "MySQLDriver"),
    "mariadb": ("txtasks.driver.mysql", "MariaDBDriver"),
    "sqlite": ("txtasks.driver.sqlite", "SQLiteDriver"),
}
#: The other names this package serves on first use.
LAZY: dict[str, tuple[str, str]] = {
    **{cls: (module, cls) for module, cls in BY_BACKEND.values()},
    "SqlDriver": ("txtasks.driver.sql", "SqlDriver"),
    "SqlDialect": ("txtasks.driver.dialect", "SqlDialect"),
    "dialect_for": ("txtasks.driver.dialect", "dialect_for"),
}


def driver_class(backend: str) -> type[SqlDriver]:
    """The driver class of a backend name (postgresql, mysql, mariadb, sqlite)."""
    module, name = BY_BACKEND[backend]
    cls: type[SqlDriver] = getattr(importlib.import_module(module), name)
    return cls


def capabilities_for_url(url: str | URL) -> Capabilities:
    """What the database of a URL can do, known before connecting (MariaDB is told apart
    from MySQL only by a connection; they can do the same)."""
    return driver_class(backend_name(url)).database_class.dialect_class.capabilities


def driver_for_url(url: str | URL, **options: Any) -> SqlDriver:
    """A driver for a database URL (postgresql://, mysql://, sqlite:///path)."""
    return driver_class(backend_name(url))(url, **options)


def __getattr__(name: str) -> Any:
    if name in LAZY:
        module, attr = LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Capabilities",
    "Driver",
    "MariaDBDriver",
    "MemoryDriver",
    "MySQLDriver",
    "PostgresDriver",
    "SQLiteDriver",
    "SqlDialect",
    "SqlDriver",
    "WriteResult",
    "capabilities_for_url",
    "dialect_for",
    "driver_class",
    "driver_for_url",
]
