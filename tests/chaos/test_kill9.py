"""Workers killed with SIGKILL over and over while the application enqueues: nothing committed
is lost, nothing rolled back runs, re-runs stay within the tasks in flight at the kills."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from tests.chaos.app import KEY_CONCURRENCY, QUEUE, QUEUE_RATE_VAR
from tests.chaos.conftest import url_of
from tests.chaos.harness import Chaos, Proc

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]

ORDERS = 1500
WORKERS = 3
KILLS = 6
KEYED_ORDERS = 800
#: Short leases (at the run's pace, see `Chaos.worker`): the cleaner rescues a dead worker's
#: tasks within a few seconds.
LEASE = 2.0
SERVERS = [
    pytest.param("postgresql", marks=pytest.mark.postgresql),
    pytest.param("mysql", marks=pytest.mark.mysql),
]


def start(h: Chaos) -> list[Proc]:
    """WORKERS workers and a cleaner that rescues often."""
    workers = [h.worker(lease=LEASE) for _ in range(WORKERS)]
    h.cleaner(rescue_every=0.3)
    return workers


def kill_loop(h: Chaos, workers: list[Proc], rng: random.Random, kills: int) -> list[int]:
    """SIGKILL a worker at random `kills` times, starting another each time; the tasks each
    victim had in flight."""
    in_flight: list[int] = []
    for _ in range(kills):
        time.sleep(rng.uniform(1.0, 2.0))  # the fault schedule, not a wait for state
        victim = workers.pop(rng.randrange(len(workers)))
        in_flight.append(h.kill9(victim))
        workers.append(h.worker(lease=LEASE))
    return in_flight


@pytest.mark.parametrize("backend", SERVERS)
def test_kill9_loop_loses_nothing(
    backend: str,
    chaos: Callable[..., Chaos],
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    h = chaos(url_of(request, backend, tmp_path))
    workers = start(h)
    enqueuer = h.enqueuer(ORDERS, pause=0.005, max_ms=50)
    kills = kill_loop(h, workers, random.Random(12), KILLS)
    settled = h.settle(45, enqueuers=[enqueuer])
    report = h.report()
    took = h.stop_all()
    print(
        f"{backend}: {report.summary()}; in flight at kills {kills}; settled {settled}; stop {took}"
    )
    h.check(report, max_reruns=h.in_flight_at_kills)


@pytest.mark.parametrize("backend", SERVERS)
def test_kill9_loop_keeps_each_key_within_its_concurrency(
    backend: str,
    chaos: Callable[..., Chaos],
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    """Tasks over 6 keys (24 handler slots), at most KEY_CONCURRENCY of a key at once,
    measured by the handlers themselves while workers are killed: the limit holds, a dead
    worker's slots come back."""
    h = chaos(url_of(request, backend, tmp_path))
    workers = start(h)
    enqueuer = h.enqueuer(KEYED_ORDERS, pause=0.002, max_ms=60, keys=6)
    kills = kill_loop(h, workers, random.Random(14), KILLS // 2)
    settled = h.settle(60, enqueuers=[enqueuer])
    report = h.report()
    most = h.most_at_once_per_key()
    h.stop_all()
    print(f"{backend}: {report.summary()}; in flight at kills {kills}; settled {settled}; {most}")
    h.check(report, max_reruns=h.in_flight_at_kills)
    assert len(most) == 6 and max(most.values()) <= KEY_CONCURRENCY, most
    assert max(most.values()) == KEY_CONCURRENCY, most  # the limit was reached, not just kept


QUEUE_RATE = 40
RATED_ORDERS = 240


@pytest.mark.parametrize("backend", SERVERS)
def test_kill9_loop_keeps_a_queue_within_its_rate(
    backend: str,
    chaos: Callable[..., Chaos],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A queue at QUEUE_RATE starts a second, tasks with a key and without, while workers
    are killed: no two starts of the queue come closer than 1 / QUEUE_RATE s (the claims'
    own times, kept by the archive), and nothing is lost."""
    monkeypatch.setenv(QUEUE_RATE_VAR, str(QUEUE_RATE))
    h = chaos(url_of(request, backend, tmp_path))
    workers = start(h)
    plain = h.enqueuer(RATED_ORDERS // 2, pause=0.002, max_ms=20)
    keyed = h.enqueuer(RATED_ORDERS // 2, start=RATED_ORDERS, pause=0.002, max_ms=20, keys=4)
    kills = kill_loop(h, workers, random.Random(15), KILLS // 2)
    settled = h.settle(60, enqueuers=[plain, keyed])
    report = h.report()
    starts = h.archived_starts(QUEUE)
    h.stop_all()
    print(f"{backend}: {report.summary()}; in flight at kills {kills}; settled {settled}")
    h.check(report, max_reruns=h.in_flight_at_kills)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(starts) >= RATED_ORDERS * 0.8, len(starts)  # rollbacks left out
    assert min(gaps) >= timedelta(seconds=1 / QUEUE_RATE), min(gaps)
