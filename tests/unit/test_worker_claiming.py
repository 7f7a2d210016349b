"""When a worker claims, and what: the tasks a wake-up names, by their ids, while its queues
were found empty, its whole queues otherwise; a burst's looks while others' tasks run
(in-memory driver; wake-ups handed to `Worker.wake` as the subscriber hands them)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tests.waiting import until
from txtasks import App, MemoryDriver, Worker, WorkerConfig
from txtasks.wakeup.base import MAX_IDS

#: Long enough that only wake-ups make the worker claim within a test.
NO_POLL = {"poll_interval": 30.0, "flush_interval": 0.001}


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    task = asyncio.create_task(worker.run())
    try:
        await until(lambda: worker.idle.is_set(), "the worker's first claim found nothing")
        yield worker
    finally:
        worker.stop()
        await task


def app_with_task(started: list[str], gate: asyncio.Event | None = None) -> App:
    app = App(driver=MemoryDriver())

    @app.task(name="job", queue="q")
    async def job(payload: str) -> None:
        started.append(payload)
        if payload == "blocker" and gate is not None:
            await gate.wait()

    return app


async def test_an_idle_worker_takes_the_named_task_by_its_id() -> None:
    started: list[str] = []
    app = app_with_task(started)
    worker = Worker(app, WorkerConfig(**NO_POLL))
    async with running(worker):
        task_id = await app.get_task("job").aenqueue("one")
        worker.wake("q", ids=[task_id])
        await until(lambda: started == ["one"], "the named task starts")
        assert worker.stats.claimed_named == 1
        await until(lambda: worker.idle.is_set(), "the worker waits again")
        # a wake-up without ids: the worker looks at its queues (and finds what it names not)
        other = await app.get_task("job").aenqueue("two")
        worker.wake("q")
        await until(lambda: started == ["one", "two"], "the next task starts")
        assert worker.stats.claimed_named == 1 and other != task_id


async def test_a_busy_worker_claims_in_order_not_what_the_wake_up_named() -> None:
    """Its last claim found tasks, so others may be ready: the next claim looks at the queue
    and takes the task of higher priority first, not the newer one a wake-up named."""
    started: list[str] = []
    gate = asyncio.Event()
    app = app_with_task(started, gate)
    job = app.get_task("job")
    worker = Worker(app, WorkerConfig(concurrency=1, **NO_POLL))
    async with running(worker):
        blocker = await job.aenqueue("blocker")
        worker.wake("q", ids=[blocker])
        await until(lambda: started == ["blocker"], "the blocker runs")
        await job.aenqueue("older, urgent", priority=5)  # no wake-up reached this worker
        newer = await job.aenqueue("newer")
        worker.wake("q", ids=[newer])
        gate.set()
        await until(lambda: len(started) == 3, "both start once the slot is free")
    assert started == ["blocker", "older, urgent", "newer"]


async def test_a_named_task_the_claim_cannot_take_makes_the_worker_look() -> None:
    """A wake-up naming a task with a key (or one not due, or another worker's) claims
    nothing by id: the worker then looks at its queues at once, not at its next poll."""
    started: list[str] = []
    app = app_with_task(started)
    worker = Worker(app, WorkerConfig(**NO_POLL))
    async with running(worker):
        keyed = await app.get_task("job").aenqueue("keyed", key="customer-1")
        worker.wake("q", ids=[keyed])
        await until(lambda: started == ["keyed"], "the task with a key starts")
        assert worker.stats.claimed_named == 0


async def test_a_wake_up_that_may_have_left_ids_out_makes_the_worker_look() -> None:
    """A message holds at most MAX_IDS ids; one that full may stand for more tasks."""
    started: list[str] = []
    app = app_with_task(started)
    worker = Worker(app, WorkerConfig(concurrency=MAX_IDS + 10, **NO_POLL))
    async with running(worker):
        job = app.get_task("job")
        ids = [await job.aenqueue(f"t{i}") for i in range(MAX_IDS + 5)]
        worker.wake("q", ids=ids[:MAX_IDS])
        await until(lambda: len(started) == len(ids), "every task starts, named or not")
        assert worker.stats.claimed_named == 0


async def test_a_burst_ends_soon_after_another_workers_last_task_not_at_its_poll() -> None:
    """Two burst workers: the one that finds the queue empty while the other still runs a
    task exits once that task is done, not a poll interval (30 s here) later."""
    started: list[str] = []
    gate = asyncio.Event()
    app = app_with_task(started, gate)
    await app.get_task("job").aenqueue("blocker")
    config = WorkerConfig(concurrency=1, burst=True, burst_horizon=0, **NO_POLL)
    first, second = Worker(app, config), Worker(app, config)
    runs = [asyncio.create_task(w.run()) for w in (first, second)]
    await until(lambda: started == ["blocker"], "one worker runs the task")
    await until(lambda: first.idle.is_set() or second.idle.is_set(), "the other waits")
    gate.set()
    done, _ = await asyncio.wait(runs, timeout=10)
    assert len(done) == 2, "a burst worker waited for its poll after the queue was done"
