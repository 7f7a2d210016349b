"""The application enqueues in its own transactions while several workers claim, no fault
injected: a worker's or cleaner's transaction never fails or blocks the application's
(issue item 3: on MariaDB, claims at REPEATABLE READ deadlocked the application's INSERT)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.conftest import url_of
from tests.chaos.harness import Chaos

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]

ORDERS = 2000
#: Application transactions at once.
THREADS = 4
WORKERS = 3


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("sqlite"),
        pytest.param("postgresql", marks=pytest.mark.postgresql),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ],
)
def test_claims_never_fail_the_applications_transactions(
    backend: str, chaos: Callable[..., Chaos], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    h = chaos(url_of(request, backend, tmp_path))
    for _ in range(WORKERS):  # polling often: claims all the time, next to the inserts
        h.worker(concurrency=10, poll=0.05)
    h.cleaner()
    enqueuer = h.enqueuer(ORDERS, threads=THREADS, max_ms=5)
    settled = h.settle(60, enqueuers=[enqueuer])
    report = h.report()
    took = h.stop_all()
    print(f"{backend} enqueue vs claims: {report.summary()}; settled {settled}; stop {took}")
    h.check(report)
