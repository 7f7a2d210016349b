"""The conformance suites again, through PgBouncer in transaction pooling mode.

Each module of this folder imports a representative part of a conformance suite; the fixtures
here give its tests the same database as ``postgres_url``'s, reached through PgBouncer
(``pgbouncer_url``: ``?pooler=transaction``), where a client connection's transactions may each
run on another server connection. The schema is reset on a direct connection (migrating
through the pooler has a test of its own).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.conftest import reset_schema
from txtasks import App
from txtasks.driver import Driver, driver_for_url


@pytest.fixture
def database_url(postgres_url: str, pgbouncer_url: str) -> Iterator[str]:
    """A migrated, empty database, through PgBouncer."""
    reset_schema(postgres_url)
    yield pgbouncer_url


@pytest.fixture
async def driver(database_url: str) -> AsyncIterator[Driver]:
    """An open driver through PgBouncer."""
    sql = driver_for_url(database_url)
    await sql.open()
    yield sql
    await sql.close()


@pytest.fixture
async def any_app(database_url: str) -> AsyncIterator[App]:
    """An App through PgBouncer."""
    application = App("test", database_url=database_url)
    yield application
    await application.aclose()
