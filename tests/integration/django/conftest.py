"""A Django project configured in the test process: one database alias per DB-API driver."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from tests.integration.dbapi_connect import DBAPI_DRIVERS, dbapi_module

pytest.importorskip("django")

#: The database alias and Django ENGINE of each driver: Django's own backends, on psycopg (3)
#: and mysqlclient; tests/integration/django/backends' copies, on psycopg2 and PyMySQL.
ALIASES = {
    "sqlite3": ("default", "django.db.backends.sqlite3"),
    "psycopg": ("postgresql", "django.db.backends.postgresql"),
    "psycopg2": ("postgresql_psycopg2", "tests.integration.django.backends.postgresql_psycopg2"),
    "MySQLdb": ("mysql", "django.db.backends.mysql"),
    "pymysql": ("mysql_pymysql", "tests.integration.django.backends.mysql_pymysql"),
}


def _server(request: pytest.FixtureRequest, fixture: str) -> str | None:
    try:
        return str(request.getfixturevalue(fixture))
    except pytest.skip.Exception:
        return None


def _installed(driver: str) -> bool:
    try:
        importlib.import_module(driver)
    except ImportError:
        return False
    return True


def _django_database(url: str, engine: str) -> dict[str, Any]:
    from sqlalchemy import make_url

    parsed = make_url(url)
    return {
        "ENGINE": engine,
        "NAME": parsed.database,
        "USER": parsed.username,
        "PASSWORD": parsed.password or "",
        "HOST": parsed.host,
        "PORT": str(parsed.port or ""),
    }


@pytest.fixture(scope="session")
def django_urls(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """Configure Django once: the alias of each driver installed whose server runs -> its
    txtasks URL."""
    import django
    from django.conf import settings

    sqlite_file = tmp_path_factory.mktemp("django") / "django.sqlite3"
    urls = {"default": f"sqlite:///{sqlite_file}"}
    databases: dict[str, Any] = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(sqlite_file)}
    }
    servers = {"postgresql": "postgres_url", "mysql": "mysql_url"}
    for param in DBAPI_DRIVERS:
        backend, driver = param.values[0]
        url = _server(request, servers[backend]) if backend in servers else None
        if url is not None and _installed(driver):
            name, engine = ALIASES[driver]
            urls[name] = url
            databases[name] = _django_database(url, engine)
    settings.configure(
        DATABASES=databases,
        INSTALLED_APPS=["txtasks.contrib.django"],
        TXTASKS_APP="tests.integration.django.tasks:app",
        USE_TZ=True,
    )
    django.setup()
    return urls


@pytest.fixture(params=DBAPI_DRIVERS)
def alias(request: pytest.FixtureRequest, django_urls: dict[str, str], tmp_path: Path) -> Any:
    """The Django database alias of each DB-API driver, its connection on that driver, its
    txtasks tables migrated and empty, and TXTASKS_DATABASE set to it."""
    from django.conf import settings
    from django.db import connections

    from tests.conftest import reset_schema
    from tests.integration.django import tasks
    from txtasks.dbapi import driver_of

    _backend, driver = request.param
    dbapi_module(driver)  # skips (fails in CI) where it is not installed
    name, _engine = ALIASES[driver]
    if name not in django_urls:
        pytest.skip(f"no server for {driver}")
    reset_schema(django_urls[name])
    connections[name].ensure_connection()
    assert driver_of(connections[name].connection) == driver
    settings.TXTASKS_DATABASE = name
    tasks.recording.calls.clear()
    tasks.sent.clear()
    yield name
    connections[name].close()
