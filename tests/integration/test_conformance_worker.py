"""Conformance suite, part 3: the worker end to end on every database (burst mode)."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert

from cleaner.rescuer import Rescuer, RescuerConfig
from tests.integration.conformance import Calls, sync_engine, task_ids
from tests.waiting import until
from txtasks import App, Drop, KeyLimits, Rate, Reject, Retry
from txtasks.clock import utcnow
from txtasks.schema.tables import tasks
from txtasks.testing import run_until_empty
from txtasks.types import Outcome, OutcomeKind, TaskKey, TaskRow, TaskState
from txtasks.worker.context import TaskContext
from txtasks.worker.worker import Worker, WorkerConfig


async def finished(app: App, task_id: int) -> TaskRow:
    row = await app.driver.tasks.task_get(task_id)
    assert row is not None, f"task {task_id} is gone"
    assert not row.state.is_live, f"task {task_id} is still {row.state}"
    return row


# ----------------------------------------------------------------------------- handlers


async def test_sync_and_async_handlers_run_with_their_context(app: App) -> None:
    seen: dict[str, Any] = {}
    sync_thread: list[str] = []

    @app.task(name="conformance.sync")
    def sync_handler(payload: Any) -> None:
        sync_thread.append(threading.current_thread().name)
        seen["sync"] = payload

    @app.task(name="conformance.async", queue="other", max_attempts=4)
    async def async_handler(payload: Any, ctx: TaskContext) -> None:
        seen["async"] = payload
        seen["ctx"] = (ctx.task_id, ctx.attempt, ctx.max_attempts, ctx.queue, ctx.headers)
        seen["worker"] = ctx.worker_id

    first = await sync_handler.aenqueue({"kind": "sync"})
    second = await async_handler.aenqueue(b"\x00raw bytes", headers={"trace": "t-1"})
    stats = await run_until_empty(app, worker_id="conformance-worker")

    assert seen["sync"] == {"kind": "sync"}
    assert sync_thread and sync_thread[0].startswith("txtasks")  # a thread of the pool
    assert seen["async"] == b"\x00raw bytes"
    assert seen["ctx"] == (second, 1, 4, "other", {"trace": "t-1"})
    assert seen["worker"] == "conformance-worker"
    assert (stats.claimed, stats.started, stats.outcomes) == (2, 2, {"completed": 2})
    for task_id in (first, second):
        row = await finished(app, task_id)
        assert (row.state, row.attempt, row.worker_id) == (
            TaskState.COMPLETED,
            1,
            "conformance-worker",
        )
        assert row.finished_at is not None and row.started_at is not None


async def test_retry_with_delay_zero_keeps_the_checkpoint(app: App) -> None:
    seen: list[tuple[int, Any]] = []

    @app.task(name="conformance.resumable")
    def handler(payload: Any, ctx: TaskContext) -> None:
        seen.append((ctx.attempt, ctx.checkpoint))
        if ctx.attempt < 3:
            ctx.save_checkpoint({"done": ctx.attempt})
            raise Retry(f"not yet {ctx.attempt}", delay=0)

    task_id = await handler.aenqueue("work")
    stats = await run_until_empty(app)
    assert seen == [(1, None), (2, {"done": 1}), (3, {"done": 2})]
    assert stats.outcomes == {"retryable": 2, "completed": 1}
    row = await finished(app, task_id)
    assert (row.state, row.attempt, row.last_error) == (TaskState.COMPLETED, 3, "not yet 2")


async def test_drop_and_reject(app: App) -> None:
    @app.task(name="conformance.signals", max_attempts=5)
    def handler(payload: str) -> None:
        raise Drop("not wanted") if payload == "drop" else Reject("poison")

    dropped = await handler.aenqueue("drop")
    rejected = await handler.aenqueue("reject")
    stats = await run_until_empty(app)
    assert stats.outcomes == {"discarded": 1, "dead": 1}
    row = await finished(app, dropped)
    assert (row.state, row.attempt, row.last_error) == (TaskState.DISCARDED, 1, "not wanted")
    row = await finished(app, rejected)
    assert (row.state, row.attempt, row.last_error) == (TaskState.DEAD, 1, "poison")


@pytest.mark.parametrize(
    ("decision", "state", "attempts", "error"),
    [
        ("ack", TaskState.COMPLETED, 1, None),
        ("nack", TaskState.COMPLETED, 2, "try later"),
        ("reject", TaskState.DEAD, 1, "no good"),
        ("drop", TaskState.DISCARDED, 1, "skip it"),
    ],
)
async def test_manual_decisions_win_over_what_the_handler_does_next(
    app: App, decision: str, state: TaskState, attempts: int, error: str | None
) -> None:
    @app.task(name="conformance.manual", ack_policy="manual", retry=0)
    async def handler(payload: Any, ctx: TaskContext) -> None:
        if ctx.attempt > 1:
            ctx.ack()
            return
        if decision == "ack":
            ctx.ack()
        elif decision == "nack":
            ctx.nack("try later", delay=0)
        elif decision == "reject":
            ctx.reject("no good")
        else:
            ctx.drop("skip it")
        raise RuntimeError("after the decision")  # the decision stands

    task_id = await handler.aenqueue(None)
    await run_until_empty(app)
    row = await finished(app, task_id)
    assert (row.state, row.attempt, row.last_error) == (state, attempts, error)


@pytest.mark.parametrize(
    ("policy", "state", "attempts"),
    [
        ("retry", TaskState.DEAD, 2),
        ("dead_letter", TaskState.DEAD, 1),
        ("discard", TaskState.DISCARDED, 1),
        ("complete", TaskState.COMPLETED, 1),
        ("manual", TaskState.DEAD, 2),
    ],
)
async def test_ack_policy_decides_what_an_exception_does(
    app: App, policy: str, state: TaskState, attempts: int
) -> None:
    @app.task(name="conformance.failing", ack_policy=policy, max_attempts=2, retry=0)
    def handler(payload: Any) -> None:
        if policy == "manual":
            return  # returning without a decision under the manual policy is a nack
        raise ValueError(f"broken {payload}")

    task_id = await handler.aenqueue(7)
    await run_until_empty(app)
    row = await finished(app, task_id)
    assert (row.state, row.attempt) == (state, attempts)
    expected = "ack_policy manual" if policy == "manual" else "ValueError: broken 7"
    assert row.last_error is not None and expected in row.last_error


async def test_an_attempt_past_its_timeout_is_retried(app: App) -> None:
    @app.task(name="conformance.slow", timeout=0.2, retry=0)
    async def handler(payload: Any, ctx: TaskContext) -> str:
        if ctx.attempt == 1:
            await asyncio.Event().wait()  # never set: only the timeout ends this attempt
        return "fast"

    task_id = await handler.aenqueue(None)
    stats = await run_until_empty(app)
    assert stats.outcomes == {"retryable": 1, "completed": 1}
    row = await finished(app, task_id)
    assert (row.state, row.attempt) == (TaskState.COMPLETED, 2)
    assert row.last_error is not None and "TimeoutError" in row.last_error


async def test_a_sync_attempt_past_its_timeout_is_retried(app: App) -> None:
    """Attempt 1 blocks past its timeout. Its thread cannot be stopped (the task stays with it
    until it ends), so the test lets it end once the worker saw the overrun; then it retries."""
    gate = threading.Event()

    @app.task(name="conformance.slow_sync", timeout=0.2, retry=0)
    def handler(payload: Any, ctx: TaskContext) -> None:
        if ctx.attempt == 1:
            gate.wait(30)  # still blocked when its timeout passes

    task_id = await handler.aenqueue(None)
    # what run_until_empty runs, with a handle on the worker to see the overrun
    config = WorkerConfig(burst=True, burst_horizon=0, poll_interval=0.01, flush_interval=0.001)
    worker = Worker(app, config)
    run = asyncio.create_task(worker.run())
    try:
        await until(lambda: worker.stats.overruns == 1, "attempt 1 to pass its timeout")
        gate.set()
        stats = await asyncio.wait_for(run, 10)
    finally:
        gate.set()
        worker.stop(now=True)
        await asyncio.gather(run, return_exceptions=True)
    assert stats.outcomes == {"retryable": 1, "completed": 1}
    row = await finished(app, task_id)
    assert (row.state, row.attempt) == (TaskState.COMPLETED, 2)
    assert "TimeoutError" in (row.last_error or "")


async def test_an_overrunning_sync_attempt_keeps_its_task_until_its_thread_ends(app: App) -> None:
    """Attempt 1 of a sync handler overran its timeout. Its thread cannot be stopped, so the
    task stays with it (no second attempt beside it) until the thread ends; then it retries."""
    gate_first = threading.Event()
    second_started = asyncio.Event()
    loop = asyncio.get_running_loop()

    @app.task(name="conformance.overrun", timeout=0.2, retry=0)
    def handler(payload: Any, ctx: TaskContext) -> None:
        if ctx.attempt == 1:
            gate_first.wait(30)
        else:
            loop.call_soon_threadsafe(second_started.set)

    task_id = await handler.aenqueue(None)
    config = WorkerConfig(concurrency=4, poll_interval=0.01, flush_interval=0.001, shutdown_grace=0)
    worker = Worker(app, config)
    run = asyncio.create_task(worker.run())
    try:
        await until(lambda: worker.stats.overruns == 1, "attempt 1 to pass its timeout")
        row = await app.driver.tasks.task_get(task_id)
        assert row is not None
        assert (row.state, row.attempt) == (TaskState.PROCESSING, 1)
        assert not second_started.is_set()
        gate_first.set()  # the thread ends: now the failure is recorded and the retry runs
        await asyncio.wait_for(second_started.wait(), 10)
        await until(lambda: worker.stats.outcomes.get("completed") == 1, "attempt 2 to end")
        worker.stop()
        await asyncio.wait_for(run, 10)
        row = await app.driver.tasks.task_get(task_id)
        assert row is not None
        assert (row.state, row.attempt) == (TaskState.COMPLETED, 2)
    finally:
        gate_first.set()
        worker.stop(now=True)
        await asyncio.gather(run, return_exceptions=True)


async def test_a_worker_that_lost_its_lease_cannot_overwrite_the_next_attempt(app: App) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    @app.task(name="conformance.lease_lost", retry=0)
    async def handler(payload: Any) -> None:
        entered.set()
        await release.wait()

    task_id = await handler.aenqueue(None)
    config = WorkerConfig(
        burst=True, burst_horizon=0, poll_interval=0.01, flush_interval=0.001, worker_id="slow"
    )
    worker = Worker(app, config)
    run = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(entered.wait(), 10)
        # the lease is lost: a rescuer schedules a retry, another worker claims attempt 2
        driver, later = app.driver, utcnow() + timedelta(hours=1)
        lost = Outcome(TaskKey(task_id, 1), OutcomeKind.RETRY, error="lease expired", run_at=later)
        assert (await driver.claims.outcome_write_many([lost], now=utcnow())).applied == 1
        [stolen] = await until(  # SKIP LOCKED: the slow worker's claims pass over the row too
            lambda: driver.claims.task_claim_many(
                ["default"], 1, now=later, lease_until=later + timedelta(hours=1), worker_id="thief"
            ),
            "attempt 2 claimed by another worker",
        )
        assert stolen.key == TaskKey(task_id, 2)

        release.set()  # the slow worker completes attempt 1: fenced off
        await until(lambda: worker.stats.stale == 1, "the stale outcome")
        row = await app.driver.tasks.task_get(task_id)
        assert row is not None
        assert (row.state, row.attempt, row.worker_id) == (TaskState.PROCESSING, 2, "thief")

        done = Outcome(stolen.key, OutcomeKind.COMPLETE)
        assert (await driver.claims.outcome_write_many([done], now=utcnow())).applied == 1
        stats = await asyncio.wait_for(run, 10)
    finally:
        release.set()
        worker.stop()
        await asyncio.gather(run, return_exceptions=True)
    assert (stats.stale, stats.outcomes) == (1, {"completed": 1})
    row = await finished(app, task_id)
    assert (row.state, row.attempt, row.worker_id) == (TaskState.COMPLETED, 2, "thief")


#: Seconds an extension waiting for locked rows takes to reach the server, in the test below:
#: most of two heartbeat intervals (0.3 s each).
SLOW_TO_THE_SERVER = 0.55


async def test_rows_an_outcome_write_held_past_the_lease_are_extended_before_a_rescue(
    app: App,
) -> None:
    """An outcome write locked its rows, then hung past the lease and ended without an answer
    (its connection lost; the server kept the session, and the locks, until it noticed). The
    heartbeat could not extend a lease on a locked row, so the lease ran out. When the locks
    go, the worker's extension, waiting in line for them, must come before a rescue: else
    the rescuer retries the task and it runs a second time (seen on a network down in
    spells). The rescuer runs right after the locks go, a beat never between the two; and each
    extension that waits reaches the server late (a loaded machine: `SLOW_TO_THE_SERVER`), so
    the one in line must be one put there beats ago, not the last beat's."""
    if not app.driver.capabilities.concurrent_claims:
        pytest.skip("no row locks held by another transaction (one writer at a time)")
    ran: list[int] = []

    @app.task(name="conformance.held_write")
    async def handler(payload: Any, ctx: TaskContext) -> None:
        ran.append(ctx.attempt)

    task_id = await handler.aenqueue(None)
    driver: Any = app.driver
    write, extend = driver.claims.outcome_write_many, driver.claims.lease_extend_many
    holding, release, beat = asyncio.Event(), asyncio.Event(), asyncio.Event()
    rescues: list[Any] = []

    async def held_write(outcomes: list[Outcome], **kw: Any) -> Any:
        if rescues or kw.get("expired_before"):  # the write's retry, the rescuer's: as they are
            return await write(outcomes, **kw)
        async with driver.db.engine.connect() as conn:
            tx = await conn.begin()
            ids = [o.key.id for o in outcomes]
            await conn.execute(tasks.select().where(tasks.c.id.in_(ids)).with_for_update())
            holding.set()
            await release.wait()
            await tx.rollback()  # the server ends the session: the locks go
        rescues.append(await Rescuer(app, RescuerConfig()).run_once())
        raise ConnectionResetError("the outcome write's answer was lost")

    async def beats(keys: Any, **kw: Any) -> int:
        if kw.get("wait_locked"):
            await asyncio.sleep(SLOW_TO_THE_SERVER)
        held = await extend(keys, **kw)
        if not kw.get("wait_locked"):
            beat.set()
        return held

    driver.claims.outcome_write_many, driver.claims.lease_extend_many = held_write, beats
    config = WorkerConfig(lease=1.5, heartbeat=0.3, poll_interval=0.05, flush_interval=0.001)
    worker = Worker(app, config)
    run = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(holding.wait(), 10)
        row = await app.driver.tasks.task_get(task_id)
        assert row is not None and row.lease_expires_at is not None
        expired = row.lease_expires_at + timedelta(seconds=0.1)
        await until(lambda: utcnow() > expired, "the lease to run out while the write holds it")
        beat.clear()
        await asyncio.wait_for(beat.wait(), 5)  # the next beat is an interval away
        release.set()
        await until(lambda: rescues, "the rescue right after the write's locks went")
        await until(lambda: worker.stats.outcomes, "the outcome written again")
    finally:
        release.set()
        worker.stop()
        await asyncio.gather(run, return_exceptions=True)
        del driver.claims.outcome_write_many, driver.claims.lease_extend_many
    assert rescues[0].retried == 0, "the rescuer took a task whose worker was extending it"
    row = await finished(app, task_id)
    assert (row.state, row.attempt, ran) == (TaskState.COMPLETED, 1, [1])


# ----------------------------------------------------------------------------- 7. dead letters


async def test_exhausted_attempts_dead_letter_then_requeue_and_purge(app: App) -> None:
    healed = threading.Event()
    runs: list[tuple[str, int]] = []

    @app.task(name="conformance.flaky", max_attempts=3, retry=0)
    def handler(payload: str, ctx: TaskContext) -> None:
        runs.append((payload, ctx.attempt))
        if not healed.is_set():
            raise RuntimeError(f"down for {payload}")

    keep = await handler.aenqueue("keep")
    purge = await handler.aenqueue("purge")
    stats = await run_until_empty(app)
    assert stats.outcomes == {"retryable": 4, "dead": 2}
    assert sorted(runs) == [(p, a) for p in ("keep", "purge") for a in (1, 2, 3)]
    row = await finished(app, keep)
    assert (row.state, row.attempt) == (TaskState.DEAD, 3)
    assert row.last_error is not None
    assert "RuntimeError: down for keep" in row.last_error
    assert "(attempt 3 of 3)" in row.last_error

    driver = app.driver
    assert sorted(r.id for r in await driver.admin.dead_list()) == sorted([keep, purge])
    assert await driver.admin.dead_requeue([keep], now=utcnow()) == [keep]
    back = await driver.tasks.task_get(keep)
    assert back is not None and (back.state, back.attempt) == (TaskState.PENDING, 0)

    healed.set()
    runs.clear()
    stats = await run_until_empty(app)
    assert runs == [("keep", 1)] and stats.outcomes == {"completed": 1}
    assert (await finished(app, keep)).state is TaskState.COMPLETED

    assert [r.id for r in await driver.admin.dead_list()] == [purge]
    assert await driver.admin.dead_purge([purge]) == 1
    assert await driver.admin.dead_list() == [] and await driver.tasks.task_get(purge) is None


async def test_unknown_task_name_is_dead_lettered_and_the_worker_goes_on(
    app: App, database_url: str
) -> None:
    calls = Calls()
    known = app.task(name="conformance.known")(calls)
    producer = App("producer", database_url=database_url)
    try:
        ghost = producer.task(name="conformance.ghost")(Calls())
        producer.task(name="conformance.known")(Calls())
        ids = producer.enqueue_many(
            [
                producer.new_task("conformance.known", 1),
                ghost.new(2),
                producer.new_task(known.name, 3),
            ]
        )
    finally:
        await producer.aclose()

    stats = await run_until_empty(app)
    assert sorted(calls.payloads) == [1, 3]
    assert stats.outcomes == {"completed": 2, "dead": 1}
    row = await finished(app, ids[1])
    assert (row.state, row.task_name) == (TaskState.DEAD, "conformance.ghost")
    assert row.last_error is not None and "conformance.ghost" in row.last_error
    assert [r.id for r in await app.driver.admin.dead_list()] == [ids[1]]


async def test_undecodable_payload_is_dead_lettered_with_the_decode_error(
    app: App, database_url: str
) -> None:
    calls = Calls()
    task = app.task(name="conformance.json")(calls)
    good = await task.aenqueue({"ok": True})
    bad = task.new("placeholder")
    with sync_engine(database_url) as engine, engine.begin() as conn:
        result = conn.execute(
            insert(tasks).values(
                queue=bad.queue,
                task_name=bad.task_name,
                payload=b"\xff{not json",
                content_type=bad.content_type,
                state="pending",
                priority=0,
                run_at=bad.run_at,
                attempt=0,
                max_attempts=5,
                created_at=bad.created_at,
            )
        )
        bad_id = result.inserted_primary_key[0]

    stats = await run_until_empty(app)
    assert calls.payloads == [{"ok": True}]
    assert stats.outcomes == {"completed": 1, "dead": 1}
    row = await finished(app, bad_id)
    assert (row.state, row.attempt) == (TaskState.DEAD, 1)
    assert row.last_error is not None and "cannot decode payload" in row.last_error
    assert (await finished(app, good)).state is TaskState.COMPLETED


# ----------------------------------------------------------------------------- 8, 9 end to end


async def test_without_archive_completed_rows_are_deleted_failures_kept(app: App) -> None:
    @app.task(name="conformance.mixed", max_attempts=1)
    def handler(payload: str) -> None:
        if payload == "fail":
            raise ValueError("nope")

    done = await handler.aenqueue("ok")
    failed = await handler.aenqueue("fail")
    await run_until_empty(app, archive_completed=False)
    assert await app.driver.tasks.task_get(done) is None
    assert (await finished(app, failed)).state is TaskState.DEAD


async def test_one_slot_runs_tasks_by_priority_then_due_time(app: App) -> None:
    order: list[str] = []

    @app.task(name="conformance.ordered", priority=1)
    async def handler(payload: str) -> None:
        order.append(payload)

    now = utcnow()
    await app.aenqueue_many(
        [
            handler.new("default-priority"),
            handler.new("low", priority=-5),
            handler.new("high-later", priority=9, run_at=now),
            handler.new("high-earlier", priority=9, run_at=now.replace(year=now.year - 1)),
        ]
    )
    await run_until_empty(app, concurrency=1)
    assert order == ["high-earlier", "high-later", "default-priority", "low"]


async def test_an_idle_worker_starts_a_rate_limited_key_s_next_task_on_time(app: App) -> None:
    """A key held back by its rate is claimed again when its rate allows, not at the next poll
    (30 s here): the claim tells the worker when (`Driver.keys_wake_at`)."""
    started: list[int] = []

    @app.task(name="conformance.paced", key=lambda p: "k", key_limits=KeyLimits(rate=Rate(20)))
    async def paced(payload: int) -> None:
        started.append(payload)

    await app.aenqueue_many([paced.new(n) for n in range(4)])
    stats = await asyncio.wait_for(run_until_empty(app, poll_interval=30), timeout=20)
    assert sorted(started) == [0, 1, 2, 3]
    assert stats.outcomes == {"completed": 4}


async def test_an_idle_worker_starts_a_rate_limited_queue_s_next_task_on_time(app: App) -> None:
    """The same for a rate of a whole queue, tasks without a key included."""
    started: list[int] = []
    app.queue_rate("metered", Rate(20))

    @app.task(name="conformance.metered", queue="metered")
    async def metered(payload: int) -> None:
        started.append(payload)

    await app.aenqueue_many([metered.new(n) for n in range(4)])
    stats = await asyncio.wait_for(run_until_empty(app, poll_interval=30), timeout=20)
    assert sorted(started) == [0, 1, 2, 3]
    assert stats.outcomes == {"completed": 4}


async def test_queues_and_delays_are_respected(app: App, database_url: str) -> None:
    calls = Calls()
    on_a = app.task(name="conformance.on_a", queue="a")(calls)
    on_b = app.task(name="conformance.on_b", queue="b")(calls)
    await on_a.aenqueue("a-now")
    await on_b.aenqueue("b-now")
    later = await on_a.aenqueue("a-later", delay=3600)

    await run_until_empty(app, queues=["a"])
    assert calls.payloads == ["a-now"]
    row = await app.driver.tasks.task_get(later)
    assert row is not None and row.state is TaskState.PENDING
    assert row.run_at > utcnow()

    await run_until_empty(app)
    assert sorted(calls.payloads) == ["a-now", "b-now"]
    assert later in task_ids(database_url)
    [stats_a, stats_b] = await app.driver.admin.queue_stats(now=utcnow())
    assert (stats_a.queue, stats_a.counts, stats_a.oldest_ready_age) == (
        "a",
        {"pending": 1, "completed": 1},
        None,
    )
    assert (stats_b.queue, stats_b.counts) == ("b", {"completed": 1})
