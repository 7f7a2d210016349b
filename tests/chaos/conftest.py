"""Fixtures of the chaos suite: a scenario's harness on a real server, cleaned up after."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.chaos.harness import Chaos


@pytest.fixture
def chaos(tmp_path: Path) -> Iterator[Callable[..., Chaos]]:
    """`chaos(url, broker_url=None)`: a harness on a fresh schema; its processes are killed
    at the end of the test."""
    made: list[Chaos] = []

    def make(url: str, *, broker_url: str | None = None) -> Chaos:
        harness = Chaos(url, tmp_path, broker_url=broker_url)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()


def url_of(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    """The server URL of `backend` (postgresql, mysql) or a SQLite file."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'chaos.sqlite3'}"
    fixture = {"postgresql": "postgres_url", "mysql": "mysql_url"}[backend]
    return str(request.getfixturevalue(fixture))
