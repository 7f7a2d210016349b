"""Conformance suite: cancel and pause seen by a running worker, on every database.

A running task is stopped by its worker within a heartbeat, or at once after a wake-up; its
outcome is recorded as cancelled. Each test waits for observable state (events the handlers
set, rows in the store), never for a fixed time, and bounds every wait.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import pytest

from tests.integration.wakeups import ClaimCounter
from tests.waiting import until
from txtasks import App, ConfigurationError, Rate
from txtasks.errors import TaskFailed
from txtasks.testing import run_until_empty
from txtasks.types import CancelResult, TaskRow, TaskState
from txtasks.worker.context import TaskContext
from txtasks.worker.worker import Worker, WorkerConfig

#: Seconds a test waits for what it expects.
BOUND = 10.0


async def final(app: App, task_id: int) -> TaskRow:
    async def done() -> TaskRow | None:
        row = await app.driver.tasks.task_get(task_id)
        return row if row is not None and not row.state.is_live else None

    return await until(done, f"task {task_id} to finish", timeout=BOUND)


@asynccontextmanager
async def serving(app: App, **config: Any) -> AsyncIterator[Worker]:
    """A worker running in the background, stopped at the end of the block."""
    worker = Worker(app, WorkerConfig(poll_interval=0.05, **config))
    running = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(running, BOUND)


async def test_an_async_handler_gets_cancelled_error_and_is_recorded_cancelled(app: App) -> None:
    started, seen = asyncio.Event(), []

    @app.task(name="control.slow")
    async def slow(payload: Any, ctx: TaskContext) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append(ctx.cancelled)
            raise

    task_id = await slow.aenqueue(None)
    async with serving(app, heartbeat=0.05, lease=5) as worker:
        await asyncio.wait_for(started.wait(), BOUND)
        result = await app.control.acancel(task_id)
        assert result.result is CancelResult.REQUESTED
        row = await final(app, task_id)
    assert (row.state, row.last_error, seen) == (
        TaskState.CANCELLED,
        "cancelled while running",
        [True],
    )
    assert worker.stats.outcomes == {"cancelled": 1}
    assert (
        (await app.control.acancel(task_id))
        .describe()
        .endswith("already finished (cancelled), nothing to cancel")
    )


async def test_a_sync_handler_polls_ctx_cancelled(app: App) -> None:
    started = threading.Event()

    @app.task(name="control.sync")
    def busy(payload: Any, ctx: TaskContext) -> str:
        started.set()
        for _ in range(int(BOUND / 0.01)):
            if ctx.cancelled:
                return "stopped early"
            threading.Event().wait(0.01)  # a unit of the handler's own work
        return "ran to the end"

    task_id = await busy.aenqueue(None)
    async with serving(app, heartbeat=0.05, lease=5):
        await asyncio.to_thread(started.wait, BOUND)
        # the sync API, from a thread of its own (as sync code calls it): it waits for the
        # row's lock, which a claim on this event loop may hold for a moment
        result = await asyncio.to_thread(app.control.cancel, task_id)
        assert result.result is CancelResult.REQUESTED
        row = await final(app, task_id)
    assert row.state is TaskState.CANCELLED


async def test_a_handler_that_swallows_the_cancel_is_still_recorded_cancelled(app: App) -> None:
    started, after = asyncio.Event(), []

    @app.task(name="control.stubborn")
    async def stubborn(payload: Any) -> None:
        started.set()
        with suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        await asyncio.sleep(0)  # the runner's task is not left cancelled: this await works
        after.append(True)

    @app.task(name="control.next")
    async def following(payload: Any) -> None:
        await asyncio.sleep(0)

    task_id = await stubborn.aenqueue(None)
    async with serving(app, heartbeat=0.05, lease=5, concurrency=1):
        await asyncio.wait_for(started.wait(), BOUND)
        await app.control.acancel(task_id)
        assert (await final(app, task_id)).state is TaskState.CANCELLED
        next_id = await following.aenqueue(None)  # the same runner goes on working
        assert (await final(app, next_id)).state is TaskState.COMPLETED
    assert after == [True]


async def test_a_cancel_wake_up_makes_the_worker_look_and_an_ordinary_one_does_not(
    app: App,
) -> None:
    """With the broker up, a cancel sends a cancel wake-up: the worker looks at once (here the
    wake-ups are delivered by hand; the heartbeat would take 30 s). Ordinary wake-ups, which
    only say new tasks are ready, cost no look."""
    started = asyncio.Event()

    @app.task(name="control.woken")
    async def slow(payload: Any) -> None:
        started.set()
        await asyncio.sleep(3600)

    task_id = await slow.aenqueue(None)
    claims = ClaimCounter(app.driver)
    worker = Worker(app, WorkerConfig(poll_interval=30, heartbeat=30, lease=90), driver=claims)  # type: ignore[arg-type]
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(started.wait(), BOUND)
        await app.control.acancel(task_id)
        for _ in range(5):
            worker.wake("default")
        seen = claims.calls
        await until(lambda: claims.calls > seen, "a claim after the wake-ups")
        row = await app.driver.tasks.task_get(task_id)
        assert row is not None and row.state is TaskState.PROCESSING
        assert (worker.stats.wakeups, worker.stats.cancel_looks) == (5, 0)
        worker.wake("default", cancel=True)
        row = await final(app, task_id)
    finally:
        worker.stop()
        await asyncio.wait_for(running, BOUND)
    assert row.state is TaskState.CANCELLED
    assert (worker.stats.cancel_wakeups, worker.stats.cancel_looks) == (1, 1)


async def test_a_cancelled_queued_task_never_runs(app: App) -> None:
    ran: list[int] = []

    @app.task(name="control.queued")
    def record(payload: int) -> None:
        ran.append(payload)

    ids = [await record.aenqueue(n) for n in range(3)]
    [result] = await app.control.acancel_many([ids[1]])
    assert result.result is CancelResult.CANCELLED
    await run_until_empty(app)
    assert sorted(ran) == [0, 2]  # the worker runs the two others side by side, in any order
    assert (await app.control.ainspect(ids[1])).state is TaskState.CANCELLED  # type: ignore[union-attr]


async def test_a_paused_queue_waits_and_a_burst_worker_does_not(app: App) -> None:
    ran: list[str] = []

    @app.task(name="control.paused", queue="reports")
    def report(payload: str) -> None:
        ran.append(payload)

    @app.task(name="control.other", queue="mail")
    def mail(payload: str) -> None:
        ran.append(payload)

    assert await app.control.apause("reports") is None
    await report.aenqueue("report")
    await mail.aenqueue("mail")
    await run_until_empty(app)  # returns: what is paused is not to do now
    assert ran == ["mail"]
    [stats] = [
        s for s in await app.driver.admin.queue_stats(now=app.clock()) if s.queue == "reports"
    ]
    assert stats.paused_at is not None and stats.counts == {"pending": 1}
    assert await app.control.aresume("reports") is True
    await run_until_empty(app)
    assert ran == ["mail", "report"]


async def test_a_queue_rate_set_at_run_time_wins_over_the_declared_one_until_cleared(
    app: App,
) -> None:
    starts: list[float] = []
    app.queue_rate("rated", Rate(1000, per=1))

    @app.task(name="control.rated", queue="rated")
    def rated(payload: int) -> None:
        starts.append(time.monotonic())

    await app.control.aset_queue_rate("rated", Rate(4, per=1))  # a start every 0.25 s
    assert await app.driver.control.queue_rates_stored() == {"rated": Rate(4, per=1)}
    assert await app.driver.control.key_override_list() == []  # not a key's limits
    ids = [await rated.aenqueue(n) for n in range(3)]
    await run_until_empty(app)
    assert len(starts) == 3
    # claims 0.25 s apart: read from the rows (each claim's own time), not from when the
    # handlers ran, which a busy machine delays by any amount
    claimed = sorted([(await final(app, i)).started_at for i in ids])  # type: ignore[type-var]
    assert (claimed[-1] - claimed[0]).total_seconds() >= 2 * 0.25 * 0.99, claimed
    assert await app.control.aclear_queue_rate("rated") is True
    assert await app.control.aclear_queue_rate("rated") is False
    assert await app.driver.control.queue_rates_stored() == {}
    await rated.aenqueue(3)
    await run_until_empty(app)  # the declared rate again
    assert len(starts) == 4


async def test_inspect_and_task_list_for_sync_callers(app: App) -> None:
    @app.task(name="control.listed", queue="reports")
    def listed(payload: Any) -> None: ...

    first = await listed.aenqueue(1, key="k")
    second = await listed.aenqueue(2, key="k")
    await app.control.acancel(first)

    def sync_reads() -> tuple[Any, ...]:  # in a thread of its own, as sync code calls them
        return (
            app.control.inspect(second),
            app.control.inspect(10**9),
            app.control.task_list(queue="reports", key="k"),
            app.control.task_list(states=["cancelled"], task=listed),
        )

    row, missing, waiting, cancelled = await asyncio.to_thread(sync_reads)
    assert row == await app.control.ainspect(second)
    assert row is not None and (row.state, row.partition_key) == (TaskState.PENDING, "k")
    assert missing is None
    assert [t.id for t in waiting] == [second]
    assert [t.id for t in cancelled] == [first]
    assert waiting == await app.control.atask_list(queue="reports", key="k")
    with pytest.raises(ConfigurationError, match="limit"):
        app.control.task_list(limit=0)
    with pytest.raises(ConfigurationError, match="state"):
        app.control.task_list(states=["sleeping"])


async def test_every_control_operation_has_a_sync_form_and_the_old_name_warns(app: App) -> None:
    @app.task(name="control.pairs", queue="pairs")
    def pairs(payload: Any) -> None: ...

    ids = [await pairs.aenqueue(n, key="a" if n < 3 else "b") for n in range(5)]

    def sync_calls() -> tuple[Any, ...]:  # in a thread of its own, as sync code calls them
        by_key = app.control.cancel_many(
            queue="pairs", key="a", batch=2
        )  # two transactions and one
        by_id = app.control.cancel_many([ids[3]])
        app.control.set_queue_rate("pairs", Rate(5, per=2))
        return (
            by_key,
            by_id,
            app.control.clear_queue_rate("pairs"),
            app.control.clear_queue_rate("pairs"),
        )

    by_key, by_id, cleared, again = await asyncio.to_thread(sync_calls)
    assert sorted(c.id for c in by_key) == ids[:3]
    assert [(c.id, c.result) for c in by_id] == [(ids[3], CancelResult.CANCELLED)]
    assert (cleared, again) == (True, False)
    await asyncio.to_thread(app.control.set_queue_rate, "pairs", Rate(5, per=2))
    assert await app.driver.control.queue_rates_stored() == {"pairs": Rate(5, per=2)}
    assert [t.id for t in await app.control.atask_list(queue="pairs")] == [ids[4]]
    with pytest.warns(DeprecationWarning, match=r"app\.control\.atask_list"):
        assert [t.id for t in await app.atasks(queue="pairs")] == [ids[4]]  # type: ignore[misc]
    with pytest.warns(DeprecationWarning, match=r"App\.acancel is deprecated; use app\.control"):
        cancelled = await app.acancel(ids[4])  # type: ignore[misc]
    assert cancelled.result is CancelResult.CANCELLED
    with pytest.warns(DeprecationWarning, match=r"app\.results\.get"), pytest.raises(TaskFailed):
        app.result(ids[4], timeout=0)  # type: ignore[misc]
    with pytest.raises(ConfigurationError, match="expected a Rate"):
        app.control.set_queue_rate("pairs", 5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="not both"):
        app.control.cancel_many([ids[4]], queue="pairs")
