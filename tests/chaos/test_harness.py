"""The chaos harness itself: what it does when a scenario ends before its application does."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select

from tests import pace
from tests.chaos.app import orders
from tests.chaos.conftest import url_of
from tests.chaos.harness import Chaos

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(60)]


def test_an_enqueuer_still_placing_orders_when_a_scenario_settles_is_asked_to_stop(
    chaos: Callable[..., Chaos], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A slow machine can end a scenario before its application placed every order: settling
    asks it to stop (SIGTERM), it ends the transaction under way and exits cleanly, saying
    how far it got, and that is no problem of the scenario. It inherits the run's pace."""
    h = chaos(url_of(request, "sqlite", tmp_path))
    enqueuer = h.enqueuer(100_000, pause=0.02)

    def placed() -> int:
        with h.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(orders)).scalar_one())

    assert h.wait_until(placed, 30, watch=[enqueuer]), h.notes  # placing (its handler is set)
    settled = h.settle(0.1, enqueuers=[enqueuer])

    assert enqueuer.popen.returncode == 0, enqueuer.tail()
    said = json.loads(enqueuer.stdout)
    assert said["stopped"] and 0 < said["placed"] < said["count"] == 100_000, said
    report = h.report()  # each order it began ended: committed, rolled back or failed
    assert report.committed + report.rolled_back + report.failed == said["placed"], report
    assert h.notes == []
    assert not settled  # no worker: the committed orders' tasks are still waiting
    assert os.environ[pace.ENV] == h.env(h.url, None)[pace.ENV]
