"""A Django project configured in the test process: one database alias per backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BACKENDS

pytest.importorskip("django")


def _server(request: pytest.FixtureRequest, fixture: str) -> str | None:
    try:
        return str(request.getfixturevalue(fixture))
    except pytest.skip.Exception:
        return None


def _django_database(url: str) -> dict[str, Any]:
    from sqlalchemy import make_url

    parsed = make_url(url)
    engine = {"postgresql": "postgresql", "mysql": "mysql"}[parsed.get_backend_name()]
    return {
        "ENGINE": f"django.db.backends.{engine}",
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
    """Configure Django once: the alias of each backend whose server runs -> its txtasks URL."""
    import django
    from django.conf import settings

    sqlite_file = tmp_path_factory.mktemp("django") / "django.sqlite3"
    urls = {"sqlite": f"sqlite:///{sqlite_file}"}
    databases: dict[str, Any] = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(sqlite_file)}
    }
    for backend, fixture in (("postgresql", "postgres_url"), ("mysql", "mysql_url")):
        url = _server(request, fixture)
        if url is not None:
            urls[backend] = url
            databases[backend] = _django_database(url)
    if "mysql" in databases:  # Django's MySQL backend on PyMySQL
        import pymysql

        pymysql.version_info = (2, 2, 1, "final", 0)
        pymysql.install_as_MySQLdb()
    settings.configure(
        DATABASES=databases,
        INSTALLED_APPS=["txtasks.contrib.django"],
        TXTASKS_APP="tests.integration.django.tasks:app",
        USE_TZ=True,
    )
    django.setup()
    return urls


@pytest.fixture(params=BACKENDS)
def alias(request: pytest.FixtureRequest, django_urls: dict[str, str], tmp_path: Path) -> Any:
    """A Django database alias of each backend, its txtasks tables migrated and empty, and
    TXTASKS_DATABASE set to it."""
    from django.conf import settings
    from django.db import connections

    from tests.conftest import reset_schema
    from tests.integration.django import tasks

    backend = request.param
    if backend not in django_urls:
        pytest.skip(f"no {backend} server")
    name = "default" if backend == "sqlite" else backend
    reset_schema(django_urls[backend])
    settings.TXTASKS_DATABASE = name
    tasks.recording.calls.clear()
    tasks.sent.clear()
    yield name
    connections[name].close()
