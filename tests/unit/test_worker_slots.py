"""How many tasks a worker runs at once: the concurrency it is given, or, when none is given,
10 that grows while its claims find a backlog, for async handlers only (in-memory driver)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests.waiting import until
from txtasks import App, MemoryDriver, Worker, WorkerConfig
from txtasks.metrics import Metrics
from txtasks.testing import run_until_empty
from txtasks.worker.config import CONCURRENCY_AUTO_MAX, CONCURRENCY_START, WorkerStats
from txtasks.worker.worker import Slots


def app_counting(running: dict[str, int], *, sync: bool = False) -> App:
    """An app whose task counts the handlers running at once (`running`); each yields to the
    event loop a few times, so that the handlers of a claim overlap."""
    app = App(driver=MemoryDriver())

    @app.task(name="job", queue="q")
    async def job(payload: int) -> None:
        running["now"] += 1
        running["most"] = max(running["most"], running["now"])
        for _ in range(3):
            await asyncio.sleep(0)
        running["now"] -= 1

    if sync:

        @app.task(name="sync_job", queue="q")
        def sync_job(payload: int) -> None:
            pass

    return app


@pytest.mark.parametrize(
    ("concurrency", "sync", "peak"),
    [
        (None, False, CONCURRENCY_AUTO_MAX),
        (None, True, CONCURRENCY_START),
        (10, False, 10),
        (300, False, 300),
    ],
    ids=["adaptive", "adaptive-with-sync-handlers", "given-10", "given-300"],
)
async def test_a_backlog_grows_only_an_adaptive_worker_of_async_handlers(
    concurrency: int | None, sync: bool, peak: int
) -> None:
    running = {"now": 0, "most": 0}
    app = app_counting(running, sync=sync)
    job = app.get_task("job")
    await app.aenqueue_many([job.new(i) for i in range(2_000)])
    stats = await run_until_empty(app, concurrency=concurrency)
    assert stats.outcomes == {"completed": 2_000}
    assert stats.concurrency_peak == peak
    assert running["most"] <= peak
    if peak > CONCURRENCY_START:  # it grew, and its handlers overlapped beyond the start
        assert running["most"] > CONCURRENCY_START


async def test_at_a_low_load_an_adaptive_worker_keeps_its_start() -> None:
    """Tasks that come one at a time are claimed one at a time: claims come back short of
    the free slots, and the concurrency stays where it started."""
    started: list[int] = []
    app = App(driver=MemoryDriver())

    @app.task(name="job", queue="q")
    async def job(payload: int) -> None:
        started.append(payload)

    worker = Worker(app, WorkerConfig(poll_interval=30.0, flush_interval=0.001))
    task = asyncio.create_task(worker.run())
    try:
        await until(lambda: worker.idle.is_set(), "the worker's first claim found nothing")
        for i in range(30):
            task_id = await app.get_task("job").aenqueue(i)
            worker.wake("q", ids=[task_id])
            await until(lambda n=i + 1: len(started) == n, "the task starts")
            await until(lambda: worker.idle.is_set(), "the worker waits again")
    finally:
        worker.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert worker.stats.concurrency_peak == CONCURRENCY_START


def test_slots_double_on_a_full_claim_and_halve_on_a_short_one() -> None:
    stats = WorkerStats()
    slots = Slots(WorkerConfig(), stats)
    slots.settle(all_async=True)
    seen = []
    for got, asked in [(10, 10), (10, 10), (20, 30), (40, 40), (1, 20), (0, 10), (0, 10), (0, 5)]:
        slots.claimed(got, asked)
        seen.append(slots.limit)
    assert seen == [20, 40, 20, 40, 20, 10, 10, 10]
    for _ in range(10):
        slots.claimed(5, 5)
    assert slots.limit == CONCURRENCY_AUTO_MAX == stats.concurrency_peak


def test_a_given_concurrency_never_moves() -> None:
    slots = Slots(WorkerConfig(concurrency=7), WorkerStats())
    slots.settle(all_async=True)
    slots.claimed(7, 7)
    assert (slots.limit, slots.most) == (7, 7)


async def test_the_concurrency_gauge_follows_the_worker() -> None:
    """`txtasks_worker_concurrency` shows what the worker allows itself now: read by the
    handlers while the backlog lasts, it reaches the ceiling."""
    metrics = Metrics()
    seen: list[float] = []
    app = App(driver=MemoryDriver())

    @app.task(name="job", queue="q")
    async def job(payload: int) -> None:
        seen.append(metrics.registry.get_sample_value("txtasks_worker_concurrency") or 0.0)
        await asyncio.sleep(0)

    await app.aenqueue_many([job.new(i) for i in range(2_000)])
    config = WorkerConfig(burst=True, burst_horizon=0, poll_interval=0.01, flush_interval=0.001)
    stats = await Worker(app, config, metrics=metrics).run()
    assert min(seen) >= CONCURRENCY_START
    assert max(seen) == CONCURRENCY_AUTO_MAX == stats.concurrency_peak
