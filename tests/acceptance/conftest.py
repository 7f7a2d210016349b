"""Fixtures of the acceptance tests: the test's own engine, and the processes it starts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.acceptance.apps import Processes, create_app_tables, db_engine


@pytest.fixture
def db(database_url: str) -> Iterator[Engine]:
    """The test's own engine on the fixture's database, with the app's tables created."""
    engine = db_engine(database_url)
    create_app_tables(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """Starts txtasks processes; kills any still running when the test ends."""
    processes = Processes(tmp_path)
    yield processes
    processes.close()
