"""The worker on the in-memory driver: slots, outcomes, shutdown, leases, outages."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from tests.waiting import until
from txtasks import (
    AckPolicy,
    App,
    Drop,
    MemoryDriver,
    Reject,
    Retry,
    TaskContext,
    TaskState,
    Worker,
    WorkerConfig,
)
from txtasks.driver.memory import MemoryClaims, MemoryStore
from txtasks.testing import enqueued, finished, payloads, run_until_empty
from txtasks.types import JSON_CONTENT_TYPE, NewTask
from txtasks.worker.worker import BEAT_RETRY_MAX

FAST = {"poll_interval": 0.01, "flush_interval": 0.001}


def new_app() -> App:
    return App(driver=MemoryDriver())


def states(app: App) -> dict[int, tuple[str, int]]:
    """id -> (state, attempt) of every task, live or archived."""
    driver: MemoryDriver = app.driver  # type: ignore[assignment]
    rows = {**driver.store.live, **driver.store.archived}
    return {i: (r.state.value, r.attempt) for i, r in sorted(rows.items())}


async def test_outcomes_of_every_handler_signal() -> None:
    app = new_app()

    @app.task(name="signals", max_attempts=2, retry=0)
    def signals(payload: str) -> None:
        if payload == "drop":
            raise Drop("not processable")
        if payload == "reject":
            raise Reject("refused")
        if payload == "retry":
            raise Retry("again", delay=0)
        if payload == "error":
            raise ValueError("bad")

    ids = [await signals.aenqueue(p) for p in ["ok", "drop", "reject", "retry", "error"]]
    await run_until_empty(app)
    assert [states(app)[i] for i in ids] == [
        ("completed", 1),
        ("discarded", 1),
        ("dead", 1),
        ("dead", 2),
        ("dead", 2),
    ]
    dead = {r.id: r.last_error for r in finished(app, "dead")}
    assert dead[ids[2]] == "refused"
    assert "ValueError: bad" in (dead[ids[4]] or "")


async def test_manual_decisions_and_manual_policy() -> None:
    app = new_app()

    @app.task(name="manual", ack_policy=AckPolicy.MANUAL, max_attempts=2, retry=0)
    async def manual(payload: str, ctx: TaskContext) -> None:
        if payload == "ack-then-raise":
            ctx.ack()
            raise RuntimeError("ignored: acked already")
        if payload == "reject":
            ctx.reject("manual reject")
        if payload == "drop":
            ctx.drop("manual drop")
        if payload == "nack" and ctx.attempt == 1:
            ctx.nack("later", delay=0)
            return
        if payload == "nack":
            ctx.ack()
        # "silent": returns without a decision -> retried, then dead

    ids = [await manual.aenqueue(p) for p in ["ack-then-raise", "reject", "drop", "nack", "silent"]]
    await run_until_empty(app)
    assert [states(app)[i] for i in ids] == [
        ("completed", 1),
        ("dead", 1),
        ("discarded", 1),
        ("completed", 2),
        ("dead", 2),
    ]


async def test_checkpoint_is_kept_for_the_next_attempt() -> None:
    app = new_app()
    seen: list[Any] = []

    @app.task(name="resumable")
    async def resumable(payload: None, ctx: TaskContext) -> None:
        seen.append(ctx.checkpoint)
        if ctx.attempt < 3:
            ctx.save_checkpoint({"done": ctx.attempt})
            raise Retry(delay=0)

    await resumable.aenqueue()
    await run_until_empty(app)
    assert seen == [None, {"done": 1}, {"done": 2}]


async def test_timeout_counts_as_a_failure() -> None:
    app = new_app()

    @app.task(name="slow", timeout=0.02, max_attempts=2, retry=0)
    async def slow(payload: None) -> None:
        await asyncio.Event().wait()

    task_id = await slow.aenqueue()
    await run_until_empty(app)
    assert states(app)[task_id] == ("dead", 2)
    assert "TimeoutError" in (finished(app, "dead")[0].last_error or "")


async def test_sync_handlers_run_in_worker_threads() -> None:
    app = new_app()
    threads: list[str] = []

    @app.task(name="sync")
    def sync(payload: int) -> None:
        threads.append(threading.current_thread().name)

    for i in range(5):
        sync.enqueue(i)
    await run_until_empty(app)
    assert len(threads) == 5
    assert all(name.startswith("txtasks") for name in threads)
    assert threading.main_thread().name not in threads


async def test_bad_rows_are_dead_lettered_and_the_worker_goes_on() -> None:
    app = new_app()

    @app.task(name="good")
    def good(payload: int) -> None: ...

    driver: MemoryDriver = app.driver  # type: ignore[assignment]
    now = app.clock()
    row = good.new(1)
    unknown = NewTask("default", "nobody.knows", b"1", JSON_CONTENT_TYPE, 0, now, 3, now)
    garbled = NewTask("default", "good", b"{not json", JSON_CONTENT_TYPE, 0, now, 3, now)
    ids = await driver.tasks.task_insert_many([unknown, garbled, row])
    await run_until_empty(app)
    assert [states(app)[i][0] for i in ids] == ["dead", "dead", "completed"]
    errors = {r.id: r.last_error or "" for r in finished(app, "dead")}
    assert "no task named 'nobody.knows'" in errors[ids[0]]
    assert "cannot decode payload" in errors[ids[1]]


async def test_dead_letter_reasons_hold_no_file_paths() -> None:
    app = new_app()

    @app.task(name="good", max_attempts=1)
    def good(payload: object) -> None:
        raise ValueError("the handler failed")

    driver: MemoryDriver = app.driver  # type: ignore[assignment]
    now = app.clock()
    deep = b"[" * 100_000 + b"]" * 100_000
    nested = NewTask("default", "good", deep, JSON_CONTENT_TYPE, 0, now, 3, now)
    ids = await driver.tasks.task_insert_many([nested, good.new(1)])
    await run_until_empty(app)
    errors = {r.id: r.last_error or "" for r in finished(app, "dead")}
    assert (
        errors[ids[0]]
        == "cannot decode payload: payload is not valid JSON: nested too deeply to decode"
    )
    raised = errors[ids[1]].splitlines()
    assert raised[0] == "ValueError: the handler failed"
    assert raised[-1] == "(attempt 1 of 1)"
    assert raised[-2].startswith(f"  at {__name__}.good line ")  # where, by module name
    assert raised[-2].endswith('raise ValueError("the handler failed")')
    for error in errors.values():
        assert "/" not in error and ".py" not in error, error


async def test_expired_deadline_is_dead_lettered_without_running() -> None:
    ran: list[int] = []
    clock = {"now": None}
    app = App(driver=MemoryDriver())
    base = app.clock()
    app.clock = lambda: clock["now"] or base  # type: ignore[assignment]

    @app.task(name="deadline", deadline=10)
    def deadline(payload: int) -> None:
        ran.append(payload)

    task_id = await deadline.aenqueue(1)
    from datetime import timedelta

    clock["now"] = base + timedelta(seconds=11)  # type: ignore[assignment]
    await run_until_empty(app)
    assert ran == []
    assert states(app)[task_id] == ("dead", 1)


async def test_never_more_tasks_at_once_than_slots() -> None:
    app = new_app()
    running = 0
    peak = 0
    release = asyncio.Event()

    @app.task(name="block")
    async def block(payload: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1

    await app.aenqueue_many([block.new(i) for i in range(10)])
    worker = Worker(app, WorkerConfig(concurrency=3, burst=True, burst_horizon=0, **FAST))
    run = asyncio.create_task(worker.run())
    await until(lambda: running == 3, "three handlers running")
    processing = [r for r in enqueued(app) if r.state is TaskState.PROCESSING]
    assert len(processing) == 3  # claimed only as many as free slots
    release.set()
    stats = await run
    assert peak == 3
    assert stats.outcomes == {"completed": 10}


async def test_a_waiting_handler_does_not_hold_up_the_rows_claimed_with_it() -> None:
    """Five rows claimed in one batch: the first handler waits until the last one has run."""
    app = new_app()
    last_ran = asyncio.Event()

    @app.task(name="chain")
    async def chain(payload: int) -> None:
        if payload == 0:
            await last_ran.wait()
        elif payload == 4:
            last_ran.set()

    await app.aenqueue_many([chain.new(i) for i in range(5)])
    stats = await asyncio.wait_for(run_until_empty(app, concurrency=5), 5)
    assert stats.outcomes == {"completed": 5}


async def test_handlers_that_never_wait_share_a_runner() -> None:
    app = new_app()
    runners: set[Any] = set()

    @app.task(name="quick")
    async def quick(payload: int) -> None:
        runners.add(asyncio.current_task())

    await app.aenqueue_many([quick.new(i) for i in range(50)])
    stats = await run_until_empty(app, concurrency=10)
    assert stats.outcomes == {"completed": 50}
    # not an asyncio task per handler: one runner, and at most one woken in case a handler waited
    assert 1 <= len(runners) <= 2


@pytest.mark.parametrize("concurrency", [1, 3])
async def test_every_handler_starts_in_the_workers_context(concurrency: int) -> None:
    """A context variable one handler sets and never resets is not seen by the next one."""
    app = new_app()
    var: contextvars.ContextVar[int] = contextvars.ContextVar("txtasks_test_var")
    seen: list[int | None] = []

    @app.task(name="set_var")
    async def set_var(payload: int) -> None:
        seen.append(var.get(None))
        var.set(payload)

    await app.aenqueue_many([set_var.new(i) for i in range(6)])
    stats = await run_until_empty(app, concurrency=concurrency)
    assert stats.outcomes == {"completed": 6}
    assert seen == [None] * 6


async def test_graceful_stop_lets_in_flight_tasks_finish() -> None:
    app = new_app()
    started = asyncio.Event()
    release = asyncio.Event()

    @app.task(name="long")
    async def long(payload: int) -> None:
        started.set()
        await release.wait()

    ids = await app.aenqueue_many([long.new(i) for i in range(3)])
    worker = Worker(app, WorkerConfig(concurrency=1, shutdown_grace=5, **FAST))
    run = asyncio.create_task(worker.run())
    await started.wait()
    worker.stop()
    release.set()
    await run
    assert [states(app)[i] for i in ids] == [("completed", 1), ("pending", 0), ("pending", 0)]


@pytest.mark.parametrize("now", [False, True])
async def test_tasks_past_the_grace_are_handed_back_uncounted(now: bool) -> None:
    app = new_app()
    started = asyncio.Event()

    @app.task(name="stuck")
    async def stuck(payload: int) -> None:
        started.set()
        await asyncio.Event().wait()

    task_id = await stuck.aenqueue(1)
    worker = Worker(app, WorkerConfig(shutdown_grace=0.05 if not now else 60, **FAST))
    run = asyncio.create_task(worker.run())
    await started.wait()
    worker.stop(now=now)
    stats = await run
    assert states(app)[task_id] == ("pending", 0)
    assert stats.outcomes == {"pending": 1}


async def test_tasks_stopped_before_their_first_step_are_handed_back() -> None:
    """stop(now=True) while a claimed batch is being started: tasks cancelled before they
    ever ran still get their outcome (pending, the attempt not counted) and free their slot."""
    app = new_app()

    @app.task(name="slow")
    async def slow(payload: int) -> None:
        await asyncio.Event().wait()

    ids = [await slow.aenqueue(i) for i in range(5)]

    class StopsMidBatch(Worker):
        def _start(self, row: Any) -> None:
            super()._start(row)
            if row.id == ids[-1]:  # the batch is started: stop before the loop turns
                self.stop(now=True)

    worker = StopsMidBatch(app, WorkerConfig(concurrency=5, **FAST))
    stats = await asyncio.wait_for(worker.run(), 5)
    assert [states(app)[i] for i in ids] == [("pending", 0)] * 5
    assert stats.outcomes == {"pending": 5}
    assert not worker._held


async def test_heartbeat_extends_leases_of_running_tasks() -> None:
    app = new_app()
    driver: MemoryDriver = app.driver  # type: ignore[assignment]
    first_lease: list[Any] = []

    @app.task(name="watch")
    async def watch(payload: None, ctx: TaskContext) -> None:
        first_lease.append(driver.store.live[ctx.task_id].lease_expires_at)
        await until(
            lambda: driver.store.live[ctx.task_id].lease_expires_at > first_lease[0],
            "the heartbeat to extend the lease",
        )

    await watch.aenqueue()
    stats = await run_until_empty(app, lease=1.0, heartbeat=0.02)
    assert stats.outcomes == {"completed": 1}


class FailingBeats(MemoryClaims):
    """Lease extensions fail `failures` times (a network down), then go through; each try's
    time is recorded (`time.monotonic()`)."""

    def __init__(self, store: MemoryStore, failures: int) -> None:
        super().__init__(store)
        self.failures = failures
        self.tries: list[float] = []

    async def lease_extend_many(self, keys: Any, **kwargs: Any) -> int:
        self.tries.append(time.monotonic())
        if len(self.tries) <= self.failures:
            raise ConnectionError("connection reset by peer")
        return await super().lease_extend_many(keys, **kwargs)


async def test_failed_lease_extensions_are_tried_again_within_a_second_not_an_interval() -> None:
    """A worker on a network down in spells, with a heartbeat every third of the lease: were
    each failed extension tried again only one interval later, three failures in a row would
    let the lease run out (and the task run twice). The first retry comes at once, and
    however long the failures go on, the tries stay within a second or so of each other."""
    driver = MemoryDriver()
    driver.claims = beats = FailingBeats(driver.store, failures=6)
    app = App(driver=driver)
    extended = asyncio.Event()

    @app.task(name="long")
    async def long(payload: None, ctx: TaskContext) -> None:
        await until(lambda: len(beats.tries) > beats.failures, "an extension to go through")
        extended.set()

    await long.aenqueue()
    interval = 2.5
    stats = await run_until_empty(app, lease=3 * interval, heartbeat=interval)
    assert extended.is_set() and stats.outcomes == {"completed": 1}
    gaps = [round(b - a, 2) for a, b in zip(beats.tries, beats.tries[1:], strict=False)]
    assert gaps[0] < interval / 2, gaps
    assert max(gaps[: beats.failures]) < 2 * BEAT_RETRY_MAX < interval, gaps


class FlakyClaims(MemoryClaims):
    """Fails the first few claims and outcome writes, like a database restarting."""

    def __init__(self, store: MemoryStore, claim_failures: int, write_failures: int) -> None:
        super().__init__(store)
        self.claim_failures = claim_failures
        self.write_failures = write_failures

    async def task_claim_many(self, *args: Any, **kwargs: Any) -> Any:
        if self.claim_failures:
            self.claim_failures -= 1
            raise ConnectionError("database restarting")
        return await super().task_claim_many(*args, **kwargs)

    async def outcome_write_many(self, *args: Any, **kwargs: Any) -> Any:
        if self.write_failures:
            self.write_failures -= 1
            raise ConnectionError("database restarting")
        return await super().outcome_write_many(*args, **kwargs)


async def test_database_outage_loses_no_outcome() -> None:
    driver = MemoryDriver()
    driver.claims = FlakyClaims(driver.store, claim_failures=2, write_failures=3)
    app = App(driver=driver)

    @app.task(name="work")
    async def work(payload: int) -> None: ...

    ids = await app.aenqueue_many([work.new(i) for i in range(20)])
    stats = await run_until_empty(app, flush_batch=5)
    assert stats.claim_errors == 2
    assert {states(app)[i] for i in ids} == {("completed", 1)}


async def test_testing_helpers() -> None:
    app = new_app()

    @app.task(name="mail")
    def mail(payload: dict[str, str]) -> None: ...

    await mail.aenqueue({"to": "a@example.com"})
    assert payloads(enqueued(app, mail)) == [{"to": "a@example.com"}]
    await run_until_empty(app)
    assert enqueued(app) == []
    assert payloads(finished(app, "completed")) == [{"to": "a@example.com"}]


async def test_sync_timeout_counts_from_the_start_and_keeps_the_slot() -> None:
    app = new_app()
    started: list[int] = []

    @app.task(name="blocking", timeout=0.2, max_attempts=1)
    def blocking(payload: dict[str, float]) -> None:
        started.append(int(payload["n"]))
        threading.Event().wait(payload["s"])

    slow = await blocking.aenqueue({"n": 1, "s": 0.6})
    quick = await blocking.aenqueue({"n": 2, "s": 0})
    await run_until_empty(app, concurrency=1)
    assert states(app)[slow] == ("dead", 1)
    assert states(app)[quick] == ("completed", 1)  # its wait in the queue was not timed
    assert started == [1, 2]


async def test_a_handler_raising_cancelled_error_fails_and_is_counted() -> None:
    app = new_app()

    @app.task(name="cancels", max_attempts=2, retry=0)
    async def cancels(payload: None) -> None:
        raise asyncio.CancelledError("not a shutdown")

    task_id = await cancels.aenqueue()
    await run_until_empty(app)
    assert states(app)[task_id] == ("dead", 2)  # not handed back forever


async def test_retry_delay_may_be_a_timedelta_and_a_huge_delay_does_not_crash() -> None:
    from datetime import timedelta

    app = new_app()

    @app.task(name="later")
    async def later(payload: str) -> None:
        raise Retry(delay=timedelta(minutes=5) if payload == "td" else 1e12)

    now = app.clock()
    td, huge = await later.aenqueue("td"), await later.aenqueue("huge")
    await run_until_empty(app)
    driver: MemoryDriver = app.driver  # type: ignore[assignment]
    assert driver.store.live[td].state is TaskState.RETRYABLE
    assert timedelta(minutes=4) < driver.store.live[td].run_at - now < timedelta(minutes=6)
    assert driver.store.live[huge].state is TaskState.RETRYABLE


async def test_error_text_is_made_storable(caplog: pytest.LogCaptureFixture) -> None:
    """Stored, and logged, as text every database and log sink takes: a UTF-8 file handler
    (or a test runner shipping captured logs) fails on a lone surrogate."""
    app = new_app()

    @app.task(name="nul", max_attempts=1)
    async def nul(payload: None) -> None:
        raise ValueError("bad byte \x00 and a lone surrogate \udcff")

    await nul.aenqueue()
    with caplog.at_level(logging.WARNING, logger="txtasks.worker"):
        await run_until_empty(app)
    [dead] = finished(app, "dead")
    assert "\x00" not in (dead.last_error or "")
    (dead.last_error or "").encode("utf-8")  # encodable
    assert "bad byte" in (dead.last_error or "")
    [failed] = [r for r in caplog.records if "bad byte" in r.getMessage()]
    failed.getMessage().encode("utf-8")  # encodable


class PickyClaims(MemoryClaims):
    """Refuses any batch holding an outcome whose error mentions 'unstorable'."""

    async def outcome_write_many(self, outcomes: Any, **kwargs: Any) -> Any:
        if any("unstorable" in (o.error or "") for o in outcomes):
            raise ValueError("the database refused a value")
        return await super().outcome_write_many(outcomes, **kwargs)


async def test_one_refused_outcome_does_not_block_the_others() -> None:
    driver = MemoryDriver()
    driver.claims = PickyClaims(driver.store)
    app = App(driver=driver)

    @app.task(name="mixed", max_attempts=1)
    async def mixed(payload: int) -> None:
        if payload == 3:
            raise Reject("unstorable reason")

    ids = await app.aenqueue_many([mixed.new(i) for i in range(6)])
    await run_until_empty(app, flush_interval=0.05)
    assert [states(app)[i][0] for i in ids] == ["completed"] * 3 + ["dead"] + ["completed"] * 2
    refused = {r.id: r.last_error for r in finished(app, "dead")}
    assert "could not be stored" in (refused[ids[3]] or "")


async def test_a_sync_callable_returning_a_coroutine_is_awaited() -> None:
    app = new_app()
    ran: list[int] = []

    async def body(payload: int) -> None:
        ran.append(payload)

    app.task(name="wrapped")(lambda payload: body(payload))
    await app.aenqueue("wrapped", 7)
    await run_until_empty(app)
    assert ran == [7]


async def test_deadline_counts_from_when_the_task_is_due() -> None:
    app = new_app()
    task = app.task(name="late", deadline=10)(lambda payload: None)
    row = task.new(None, delay=20)
    assert row.expires_at is not None and row.expires_at - row.run_at == timedelta(seconds=10)


async def test_each_failed_attempt_is_logged_once_and_the_dead_letter_at_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = new_app()

    @app.task(name="flaky", max_attempts=3, retry=0)
    async def flaky(payload: None) -> None:
        raise ConnectionError("the mail server hung up")

    @app.task(name="fine")
    async def fine(payload: None) -> None: ...

    task_id = await flaky.aenqueue()
    await fine.aenqueue()
    caplog.set_level(logging.INFO, logger="txtasks.worker")
    await run_until_empty(app)
    failures = [r for r in caplog.records if "failed:" in r.getMessage()]
    assert [(r.levelname, r.attempt) for r in failures] == [  # type: ignore[attr-defined]
        ("WARNING", 1),
        ("WARNING", 2),
        ("ERROR", 3),
    ]
    first, _, dead = (r.getMessage() for r in failures)
    assert re.fullmatch(
        rf"task {task_id} flaky attempt 1/3 failed: ConnectionError: the mail server hung up; "
        r"retry at \d{4}-\d\d-\d\dT[\d:.]+Z \(in 0\.0s\)",
        first,
    ), first
    assert dead == (
        f"task {task_id} flaky attempt 3/3 failed: ConnectionError: the mail server hung up; "
        "dead-lettered"
    )
    assert {r.task_id for r in failures} == {task_id}  # type: ignore[attr-defined]
    assert failures[0].retry_at.endswith("Z")  # type: ignore[attr-defined]
    assert failures[2].outcome == "dead"  # type: ignore[attr-defined]


async def test_drops_and_rejects_say_what_happens_next(caplog: pytest.LogCaptureFixture) -> None:
    app = new_app()

    @app.task(name="choosy")
    async def choosy(payload: str) -> None:
        raise Drop("not for us") if payload == "drop" else Reject("refused")

    await choosy.aenqueue("drop")
    await choosy.aenqueue("reject")
    with caplog.at_level(logging.WARNING, logger="txtasks.worker"):
        await run_until_empty(app)
    lines = sorted((r.levelname, r.getMessage().split(": ", 1)[1]) for r in caplog.records)
    assert lines == [("ERROR", "refused; dead-lettered"), ("WARNING", "not for us; discarded")]
