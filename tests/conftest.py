"""Shared fixtures: real servers (tests/servers.py), and a clean txtasks schema per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, create_engine

from tests import pace
from txtasks import App
from txtasks.cli import demo_app
from txtasks.driver.urls import url_sync
from txtasks.schema.migrate import migrate
from txtasks.schema.tables import metadata

pytest_plugins = ("tests.servers", "pytester")

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgresql),
    pytest.param("mysql", id="mysql", marks=pytest.mark.mysql),
]


def backends(*names: str) -> list[Any]:
    """The BACKENDS params of some backends, with their servers' markers (for `database_url`)."""
    chosen = [param for param in BACKENDS if param.values[0] in names]
    assert len(chosen) == len(names), f"unknown backend among {names}"
    return chosen


def reset_schema(url: str) -> None:
    """Drop every txtasks table (and the demo's), then apply all migrations."""
    engine = create_engine(url_sync(url))
    try:
        with engine.begin() as conn:
            demo_app.metadata.drop_all(conn)
            metadata.drop_all(conn)
            leftovers = MetaData()
            leftovers.reflect(conn, only=lambda name, _m: name.startswith("txtasks_"))
            leftovers.drop_all(conn)
        with engine.begin() as conn:
            migrate(conn)
    finally:
        engine.dispose()


def server_url(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'txtasks.sqlite3'}"
    fixture = {"postgresql": "postgres_url", "mysql": "mysql_url"}[backend]
    return str(request.getfixturevalue(fixture))


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database on each backend (SQLite file, PostgreSQL, MariaDB)."""
    url = server_url(request, request.param, tmp_path)
    reset_schema(url)
    yield url


@pytest.fixture
async def app(database_url: str) -> App:
    """An App on a clean database; its driver is closed after the test."""
    application = App("test", database_url=database_url)
    yield application  # type: ignore[misc]
    await application.aclose()


#: The pytest-xdist groups (`--dist loadgroup`) of the tests that each run in one process, one
#: after another: those that use Spark (one JVM, about 1 GiB and a slow start, per run, not one
#: per process) and the chaos scenarios (each starts workers, a cleaner and an application:
#: four at once on two cores starved the workers past their leases).
SPARK_GROUP = "spark"
CHAOS_GROUP = "chaos"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that use the `spark` fixture go to `SPARK_GROUP`, those that use `chaos` to
    `CHAOS_GROUP`, and both groups first: each runs its tests one after another (minutes),
    and a group that started last would end last. (Only those: JVMs that all start at once,
    on two cores, made a first Spark query outlast its test's timeout.)"""
    first: list[pytest.Item] = []
    chosen: set[pytest.Item] = set()
    for group, fixture in ((SPARK_GROUP, "spark"), (CHAOS_GROUP, "chaos")):
        for item in items:
            if fixture in getattr(item, "fixturenames", ()) and item not in chosen:
                item.add_marker(pytest.mark.xdist_group(group))
                first.append(item)
                chosen.add(item)
    items[:] = first + [item for item in items if item not in chosen]
    stretch_timeouts(config, items)


def stretch_timeouts(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's pytest-timeout limit (its marker's, else the configured one) at the pace."""
    if pace.pace() == 1:
        return
    configured = config.getini("timeout")
    for item in items:
        marker = item.get_closest_marker("timeout")
        args, kwargs = (marker.args, dict(marker.kwargs)) if marker else ((), {})
        limit = args[0] if args else kwargs.pop("timeout", configured)
        if limit:
            item.add_marker(
                pytest.mark.timeout(pace.seconds(float(limit)), *args[1:], **kwargs), append=False
            )


#: Java options of every JVM the tests start (Spark's drivers, a test cluster's daemons and
#: executors), through the `java` launcher's JDK_JAVA_OPTIONS (one set by the caller wins).
#: They run small jobs, and much of their CPU went to starting up, the JIT compiler's second
#: tier above all: with C1 alone and the serial collector, a test cluster and an application on
#: it start in 27 s instead of 46 s on two idle cores, and the encoding tests run in 79 s
#: instead of 83-100 s.
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def pytest_configure(config: pytest.Config) -> None:
    """The run's pace (tests/pace.py), measured before pytest-xdist starts its workers; the
    JVMs' options."""
    pace.pace()
    os.environ.setdefault("JDK_JAVA_OPTIONS", JAVA_OPTIONS)


def pytest_report_header(config: pytest.Config) -> str:
    return pace_line()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The pace again at the end, beside the results (a log's tail is often all one reads)."""
    terminalreporter.write_line(pace_line())


def pace_line() -> str:
    return f"txtasks test pace: {pace.pace():g} (time bounds x{pace.pace():g}; {pace.ENV} sets it)"
