"""Database URLs: users give one URL; txtasks picks the async and sync drivers for it."""

from __future__ import annotations

import os

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from txtasks.driver.pooling import POOLER_PARAM
from txtasks.errors import ConfigurationError

#: backend -> (async driver, sync driver)
DRIVERS = {
    "postgresql": ("asyncpg", "psycopg"),
    "mysql": ("aiomysql", "pymysql"),
    "sqlite": ("aiosqlite", "pysqlite"),
}
ALIASES = {"postgres": "postgresql", "mariadb": "mysql"}


def url_parse(url: str | URL, *, setting: str = "database_url") -> URL:
    """Parse and validate; the error names the setting and the accepted schemes."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigurationError(f"{setting}: cannot parse {str(url)!r}: {exc}") from exc
    backend = ALIASES.get(parsed.get_backend_name(), parsed.get_backend_name())
    if backend not in DRIVERS:
        raise ConfigurationError(
            f"{setting}: unsupported database {parsed.get_backend_name()!r} in "
            f"{parsed.render_as_string(hide_password=True)!r}; use postgresql://, mysql:// "
            "(MariaDB/MySQL) or sqlite:///path"
        )
    return parsed.set(drivername=backend)


def backend_name(url: str | URL) -> str:
    """'postgresql', 'mysql' or 'sqlite'."""
    return url_parse(url).get_backend_name()


def url_async(url: str | URL) -> URL:
    """The URL with the async driver txtasks uses for this backend (without txtasks' own
    `pooler` parameter: see txtasks.driver.pooling)."""
    parsed = url_parse(url).difference_update_query([POOLER_PARAM])
    backend = parsed.get_backend_name()
    return parsed.set(drivername=f"{backend}+{DRIVERS[backend][0]}")


def url_sync(url: str | URL) -> URL:
    """The URL with the sync driver txtasks uses for this backend (without `pooler`)."""
    parsed = url_parse(url).difference_update_query([POOLER_PARAM])
    backend = parsed.get_backend_name()
    return parsed.set(drivername=f"{backend}+{DRIVERS[backend][1]}")


def url_safe(url: str | URL) -> str:
    """For logs and errors: the URL with the password hidden."""
    return make_url(url).render_as_string(hide_password=True)


def sqlite_file_missing(url: str | URL) -> str | None:
    """The path of a SQLite database file that does not exist, None when the URL names
    another database, an in-memory one, or a file that exists."""
    parsed = url_parse(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    path = parsed.database or ""
    if path in ("", ":memory:") or path.startswith("file:"):
        return None
    return None if os.path.exists(path) else path
