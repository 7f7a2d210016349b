"""A faulty network between the processes (workers, cleaner) and the database, through a TCP
proxy; the application enqueues straight to the server.

- flap: every connection reset every 0.3-1.5 s for 15 s. A connection error is never a verdict
  on a task: 0 dead-lettered, 0 lost, 0 completed twice (issue item 1).
- freeze: the open connections stall for good (half-open), new ones work. Workers and the
  cleaner notice within their bounds, replace the connections and finish the work; SIGTERM
  ends them within grace + bound (issue item 2).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.conftest import url_of
from tests.chaos.harness import DB_COMMAND_TIMEOUT, Chaos
from tests.tcp_proxy import ProxyThread

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(150)]

BACKENDS = [
    pytest.param("postgresql", marks=pytest.mark.postgresql),
    pytest.param("mysql", marks=pytest.mark.mysql),
]
WORKERS = 3
FLAP_PERIOD = (0.3, 1.5)
FLAP_SECONDS = 15.0
#: Down spells of the network (resets, nothing moving in between), each followed by an up spell
#: in which at least some work must get done.
DOWN_SPELLS = 3
DOWN_SECONDS = 4.0
UP_SECONDS = 5.0
#: After the network heals: time for everything left to finish.
SETTLE = 30.0
#: A freeze must be noticed within the command timeout; then a few seconds to catch up.
FREEZE_RECOVERY = DB_COMMAND_TIMEOUT * 3 + 10


@pytest.mark.parametrize("backend", BACKENDS)
def test_flapping_network_dead_letters_nothing(
    backend: str, chaos: Callable[..., Chaos], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    h = chaos(url_of(request, backend, tmp_path))
    with ProxyThread.for_url(h.url) as proxy:
        faulty = proxy.url_for(h.url)
        workers = [h.worker(faulty, concurrency=32) for _ in range(WORKERS)]
        h.cleaner(faulty)
        # many short tasks claimed together: their outcomes are written in batches
        enqueuer = h.enqueuer(3000, threads=3, pause=0.006, max_ms=2)  # spans the flapping
        h.wait_until(lambda: h.finished_count() >= 100, 20, watch=workers)  # all serving
        flapping = proxy.flap(FLAP_PERIOD, FLAP_SECONDS)
        resets = flapping.result(timeout=FLAP_SECONDS + 10)
        settled = h.settle(SETTLE, enqueuers=[enqueuer])
        report = h.report()
        took = h.stop_all()
    print(f"{backend} flap: {report.summary()}; {resets} resets; settled {settled}; stop {took}")
    h.expect(resets >= FLAP_SECONDS / FLAP_PERIOD[1], f"only {resets} resets")
    h.check(report)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_network_down_that_resets_connections_dead_letters_nothing(
    backend: str, chaos: Callable[..., Chaos], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Down spells that reset the connections every 0.3-1.5 s, nothing moving in between, then
    up again: every write under way fails, several in a row (the case of issue item 1, where
    the second failure of an outcome was taken as the database refusing it)."""
    h = chaos(url_of(request, backend, tmp_path))
    with ProxyThread.for_url(h.url) as proxy:
        faulty = proxy.url_for(h.url)
        workers = [h.worker(faulty, concurrency=16) for _ in range(WORKERS)]
        h.cleaner(faulty)
        enqueuer = h.enqueuer(1500, threads=2, pause=0.01, max_ms=50)
        h.wait_until(lambda: h.finished_count() >= 100, 20, watch=workers)  # all serving
        resets = 0
        for _ in range(DOWN_SPELLS):  # tasks finish while it is down: outcomes pile up
            resets += proxy.flap(FLAP_PERIOD, DOWN_SECONDS, down=True).result(DOWN_SECONDS + 10)
            h.wait_until(h.progress(50), UP_SECONDS, watch=workers)
        settled = h.settle(SETTLE, enqueuers=[enqueuer])
        report = h.report()
        took = h.stop_all()
    print(f"{backend} down spells: {report.summary()}; {resets} resets; settled {settled}; {took}")
    h.check(report)


@pytest.mark.parametrize("backend", BACKENDS)
def test_half_open_connections_are_noticed_and_replaced(
    backend: str, chaos: Callable[..., Chaos], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    h = chaos(url_of(request, backend, tmp_path))
    with ProxyThread.for_url(h.url) as proxy:
        faulty = proxy.url_for(h.url)
        workers = [h.worker(faulty) for _ in range(WORKERS)]
        cleaner = h.cleaner(faulty)
        first = h.enqueuer(300, pause=0.005)
        h.wait_until(lambda: h.finished_count() >= 100, 20, watch=workers)
        frozen = proxy.freeze()  # mid-run: claims, outcomes, heartbeats, sweeps in flight
        t = time.monotonic()
        second = h.enqueuer(300, start=300, pause=0.005)
        settled = h.settle(FREEZE_RECOVERY, enqueuers=[first, second])
        recovered_in = time.monotonic() - t
        report = h.report()
        alive = [p.name for p in [*workers, cleaner] if p.alive]
        took = h.stop_all()
    print(
        f"{backend} freeze: {report.summary()}; {frozen} connections frozen; settled {settled} "
        f"in {recovered_in:.1f}s; alive before SIGTERM {alive}; stop {took}"
    )
    h.expect(settled, f"no recovery within {FREEZE_RECOVERY:.0f}s of the freeze")
    h.expect(len(alive) == WORKERS + 1, f"only {alive} still running before SIGTERM")
    h.check(report)


@pytest.mark.parametrize("backend", BACKENDS)
def test_processes_started_while_the_network_flaps_come_up(
    backend: str, chaos: Callable[..., Chaos], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    h = chaos(url_of(request, backend, tmp_path))
    with ProxyThread.for_url(h.url) as proxy:
        faulty = proxy.url_for(h.url)
        proxy.blackhole(include_new=True)
        workers = [h.worker(faulty) for _ in range(WORKERS)]
        cleaner = h.cleaner(faulty)
        # each process's first connection is open and stuck: then the network resets it
        connecting = h.wait_until(lambda: proxy.connections >= WORKERS + 1, 20)
        proxy.reset()
        proxy.restore()
        flapping = proxy.flap(FLAP_PERIOD, FLAP_SECONDS / 2)
        enqueuer = h.enqueuer(300, pause=0.01)
        resets = flapping.result(timeout=FLAP_SECONDS)
        settled = h.settle(SETTLE, enqueuers=[enqueuer])
        report = h.report()
        alive = [p.name for p in [*workers, cleaner] if p.alive]
        took = h.stop_all()
    print(
        f"{backend} start in flap: {report.summary()}; {resets} resets; settled {settled}; "
        f"alive {alive}; stop {took}"
    )
    h.expect(connecting, "the processes never connected")
    h.check(report)
