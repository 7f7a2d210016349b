"""Fixtures of the integration suites: a driver on every database and in memory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import BACKENDS, reset_schema, server_url
from txtasks.driver import Driver, MemoryDriver, SqlDriver, driver_for_url
from txtasks.spark.staging import SqlStaging, staging_for

DRIVERS = [pytest.param("memory", id="memory"), *BACKENDS]


@pytest.fixture(params=DRIVERS)
async def driver(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Driver]:
    """A driver on an empty store: in memory, or a migrated database of each backend."""
    if request.param == "memory":
        yield MemoryDriver()
        return
    url = server_url(request, request.param, tmp_path)
    reset_schema(url)
    sql = driver_for_url(url)
    await sql.open()
    yield sql
    await sql.close()


@pytest.fixture
async def sql(database_url: str) -> AsyncIterator[SqlDriver]:
    """An open SQL driver on `database_url`'s database (the staging suites)."""
    driver = driver_for_url(database_url)
    await driver.open()
    yield driver
    await driver.close()


@pytest.fixture
def staging(sql: SqlDriver) -> SqlStaging:
    """The staging of Spark writes on `sql`'s database."""
    return staging_for(sql)


async def another(driver: Driver) -> Driver:
    """A second driver on the same store, with connections of its own."""
    if isinstance(driver, MemoryDriver):
        return driver
    other = driver_for_url(driver.db.url)  # type: ignore[attr-defined]
    await other.open()
    return other
