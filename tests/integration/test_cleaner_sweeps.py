"""The cleaner's sweeps, `run_once()` at a time, on every database and the in-memory driver.

Rows are put in the states a dead worker (or a finished one) leaves, time is a manual clock,
and each test checks what one pass changed and what it left alone.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from cleaner import (
    Archiver,
    ArchiverConfig,
    Keep,
    Periodic,
    PeriodicConfig,
    Reannouncer,
    ReannouncerConfig,
    Rescuer,
    RescuerConfig,
    Retention,
    RetentionConfig,
    ServiceSweep,
)
from tests.integration.conformance import (
    BACKOFF,
    LEASE,
    T0,
    ManualClock,
    at,
    claim,
    cleaner_app,
    get,
    new,
)
from tests.integration.conftest import another
from tests.recording import Recording
from txtasks import App
from txtasks.driver import Driver
from txtasks.options import EnqueueOptions
from txtasks.publishes import new_publish
from txtasks.spark import StagedPurge
from txtasks.types import NewTask, Outcome, OutcomeKind, TaskRow, TaskState


async def claim_one(driver: Driver, task_id: int, *, now: datetime, worker: str) -> TaskRow:
    """Claim exactly task `task_id` (the only ready task of its own queue)."""
    row = await get(driver, task_id)
    [claimed] = await claim(driver, [row.queue], 1, now=now, worker=worker)
    assert claimed.id == task_id
    return claimed


# -- re-announcer -------------------------------------------------------------------------------


async def test_reannouncer_skips_a_paused_queue_until_it_is_resumed(driver: Driver) -> None:
    clock, doorbell = ManualClock(T0), Recording()
    app = App("cleaner-test", driver=driver, clock=clock, notifier=doorbell, default_queue="q")
    app.task(name="conformance.task")(lambda payload: None)
    app.task(name="other.task", queue="other")(lambda payload: None)
    held = await driver.tasks.task_insert_many([new(1), new(2)])
    [other] = await driver.tasks.task_insert_many([new(3, queue="other")])
    sweep = Reannouncer(app, ReannouncerConfig(after=5))
    clock.now = at(60)

    await app.control.apause("q")
    result = await sweep.run_once()
    assert (result.wakeups, result.tasks) == (1, 1)
    assert doorbell.calls == [("other", [other])]  # nothing for the paused queue

    doorbell.calls.clear()
    assert await app.control.aresume("q") is True
    assert doorbell.calls == [("q", [])]  # resume wakes the queue's workers at once
    doorbell.calls.clear()
    result = await sweep.run_once()  # and its overlooked tasks are announced again
    assert sorted(doorbell.calls) == [("other", [other]), ("q", held)]
    assert (result.wakeups, result.tasks) == (2, 3)


# -- rescuer ------------------------------------------------------------------------------------


async def test_rescuer_applies_the_policy_to_expired_leases_only(driver: Driver) -> None:
    """Lease expired by seconds -> retried with the task's backoff; exhausted -> dead;
    lease still valid by seconds -> untouched, and its worker can still finish it."""
    ids = await driver.tasks.task_insert_many(
        [
            new("expired", queue="a"),
            new("valid", queue="b"),
            new("exhausted", queue="c", max_attempts=1),
            replace(new("deadline", queue="d"), expires_at=at(40)),  # before now + BACKOFF
            replace(new("unknown", queue="e"), task_name="no.such.task"),
        ]
    )
    expired, valid, exhausted, deadline, unknown = ids
    for task_id in (expired, exhausted, deadline, unknown):
        await claim_one(driver, task_id, now=T0, worker="dead-1")
    await claim_one(driver, valid, now=at(4), worker="alive")  # lease until T0 + 34 s
    clock = ManualClock(T0 + LEASE + timedelta(seconds=2))  # 2 s past the first leases
    app = cleaner_app(driver, clock)

    result = await Rescuer(app, RescuerConfig()).run_once()

    assert (result.retried, result.dead, result.skipped) == (2, 2, 0)
    row = await get(driver, expired)
    assert (row.state, row.attempt, row.worker_id) == (TaskState.RETRYABLE, 1, None)
    assert row.run_at == clock.now + timedelta(seconds=BACKOFF)
    assert row.lease_expires_at is None
    assert "lease expired" in (row.last_error or "") and "dead-1" in (row.last_error or "")
    dead = await get(driver, exhausted)
    assert (dead.state, dead.attempt, dead.finished_at) == (TaskState.DEAD, 1, clock.now)
    assert "lease expired" in (dead.last_error or "")
    assert (await get(driver, deadline)).state is TaskState.DEAD
    alive = await get(driver, valid)
    assert (alive.state, alive.worker_id, alive.lease_expires_at) == (
        TaskState.PROCESSING,
        "alive",
        at(34),
    )
    assert (await get(driver, unknown)).state is TaskState.RETRYABLE  # default policy
    # the dead worker's late outcome is fenced off; the live worker's is written
    late = await driver.claims.outcome_write_many(
        [Outcome(row.key, OutcomeKind.COMPLETE), Outcome(alive.key, OutcomeKind.COMPLETE)],
        now=clock.now,
    )
    assert late.stale == (row.key,)
    assert (await get(driver, valid)).state is TaskState.COMPLETED
    assert (await Rescuer(app, RescuerConfig()).run_once()).busy is False


async def test_rescuer_respects_grace_and_the_task_deadline(driver: Driver) -> None:
    [task_id] = await driver.tasks.task_insert_many([new("x")])
    await claim_one(driver, task_id, now=T0, worker="gone")
    clock = ManualClock(T0 + LEASE + timedelta(seconds=2))
    app = cleaner_app(driver, clock)

    assert (await Rescuer(app, RescuerConfig(grace=5)).run_once()).busy is False
    assert (await get(driver, task_id)).state is TaskState.PROCESSING
    clock.now += timedelta(seconds=4)  # expired by 6 s now
    assert (await Rescuer(app, RescuerConfig(grace=5)).run_once()).retried == 1


async def test_rescue_is_fenced_against_a_heartbeat_that_arrives_meanwhile(
    driver: Driver,
) -> None:
    """The rescuer reads expired leases, then the worker's heartbeat extends them before the
    write: the write must leave those tasks alone."""
    ids = await driver.tasks.task_insert_many([new(n) for n in range(3)])
    await claim(driver, now=T0, worker="slow")
    clock = ManualClock(T0 + LEASE + timedelta(seconds=1))

    class HeartbeatInBetween:
        """The sweeps role, with the worker's heartbeat between the read and the write."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def lease_expired_list(self, *, now: datetime, limit: int) -> list[TaskRow]:
            rows = await self.inner.lease_expired_list(now=now, limit=limit)
            keys = [r.key for r in rows]
            await driver.claims.lease_extend_many(keys, lease_until=clock.now + LEASE)
            return rows

    class Wrapped:
        def __init__(self, inner: Driver) -> None:
            self.inner = inner
            self.sweeps = HeartbeatInBetween(inner.sweeps)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    app = cleaner_app(Wrapped(driver), clock)  # type: ignore[arg-type]
    result = await Rescuer(app, RescuerConfig()).run_once()

    assert (result.retried, result.dead, result.skipped) == (0, 0, 3)
    for task_id in ids:
        row = await get(driver, task_id)
        assert (row.state, row.worker_id) == (TaskState.PROCESSING, "slow")


async def test_rescuer_works_through_every_batch_in_one_pass(driver: Driver) -> None:
    ids = await driver.tasks.task_insert_many([new(n) for n in range(7)])
    await claim(driver, now=T0)
    app = cleaner_app(driver, ManualClock(T0 + LEASE + timedelta(seconds=1)))

    result = await Rescuer(app, RescuerConfig(batch_size=2)).run_once()

    assert result.retried == 7
    assert {(await get(driver, i)).state for i in ids} == {TaskState.RETRYABLE}


async def test_two_rescuers_at_once_rescue_each_task_once(driver: Driver) -> None:
    ids = await driver.tasks.task_insert_many([new(n) for n in range(20)])
    await claim(driver, now=T0)
    clock = ManualClock(T0 + LEASE + timedelta(seconds=1))
    other = await another(driver)
    try:
        first = Rescuer(cleaner_app(driver, clock), RescuerConfig(batch_size=5))
        second = Rescuer(cleaner_app(other, clock), RescuerConfig(batch_size=5))
        results = await asyncio.gather(first.run_once(), second.run_once())
    finally:
        if other is not driver:
            await other.close()

    assert sum(r.retried for r in results) == 20
    rows = [await get(driver, i) for i in ids]
    assert {(r.state, r.attempt) for r in rows} == {(TaskState.RETRYABLE, 1)}


# -- archiver and retention ---------------------------------------------------------------------


def finished(payload: Any, state: TaskState, queue: str = "q") -> NewTask:
    """A row in a finished state, as something other than a worker might leave it."""
    return replace(new(payload, queue=queue), state=state)


async def test_archiver_moves_finished_rows_out_of_the_hot_table(driver: Driver) -> None:
    states = [TaskState.COMPLETED, TaskState.FAILED, TaskState.DISCARDED, TaskState.DEAD]
    ids = await driver.tasks.task_insert_many([finished(n, states[n % 4]) for n in range(7)])
    [live] = await driver.tasks.task_insert_many([new("live")])
    clock = ManualClock(at(60))

    abandoned = replace(new("old write"), state=TaskState.STAGED, stage_id="w.1")  # at(-3600)
    recent = replace(abandoned, created_at=at(0), stage_id="w.2")
    [old_staged, new_staged] = await driver.tasks.task_insert_many([abandoned, recent])
    app = cleaner_app(driver, clock)

    result = await Archiver(app, ArchiverConfig(batch_size=3)).run_once()
    purged = await ServiceSweep(app, StagedPurge(after=1800)).run_once()  # txtasks.spark's

    assert (result.archived, purged.abandoned) == (7, 1)
    assert await driver.tasks.task_get(old_staged) is None
    assert (await get(driver, new_staged)).state is TaskState.STAGED
    for n, task_id in enumerate(ids):
        row = await get(driver, task_id)
        assert (row.state, row.finished_at) == (states[n % 4], clock.now)
    assert (await get(driver, live)).state is TaskState.PENDING
    assert (
        await driver.tasks.live_count(None, now=clock.now, due_before=clock.now) == 1
    )  # no staged


async def archive_at(driver: Driver, queue: str, kind: OutcomeKind, finished_at: datetime) -> int:
    """A task archived with outcome `kind` at `finished_at`."""
    [task_id] = await driver.tasks.task_insert_many([new(queue, queue=queue)])
    row = await claim_one(driver, task_id, now=T0, worker="w")
    await driver.claims.outcome_write_many([Outcome(row.key, kind, error="x")], now=finished_at)
    return task_id


async def test_retention_purges_per_outcome_and_per_queue(driver: Driver) -> None:
    hour = 3600.0
    old, recent = at(0), at(2 * hour - 60)
    clock = ManualClock(at(2 * hour))
    tasks = {
        "completed old": await archive_at(driver, "q", OutcomeKind.COMPLETE, old),
        "completed recent": await archive_at(driver, "q", OutcomeKind.COMPLETE, recent),
        "failed old": await archive_at(driver, "q", OutcomeKind.FAIL, old),
        "discarded old": await archive_at(driver, "q", OutcomeKind.DISCARD, old),
        "dead old": await archive_at(driver, "q", OutcomeKind.DEAD, old),
        "kept queue completed old": await archive_at(driver, "keep", OutcomeKind.COMPLETE, old),
        "kept queue dead old": await archive_at(driver, "keep", OutcomeKind.DEAD, old),
    }
    config = RetentionConfig(
        batch_size=1,
        keep=Keep(completed=hour, failed=hour, discarded=timedelta(hours=1), dead=None),
        queues={"keep": Keep(completed=None, dead=hour)},
    )

    result = await Retention(cleaner_app(driver, clock), config).run_once()

    assert result.purged == {"completed": 1, "dead": 1, "discarded": 1, "failed": 1}
    left = {name for name, i in tasks.items() if await driver.tasks.task_get(i) is not None}
    assert left == {"completed recent", "dead old", "kept queue completed old"}


async def test_retention_forgets_keys_idle_for_keys_idle(driver: Driver) -> None:
    hour = 3600.0
    [done_task, waiting] = await driver.tasks.task_insert_many(
        [new("q", key="done"), new("q", key="waiting", run_at=at(10 * hour))]
    )
    row = await claim_one(driver, done_task, now=T0, worker="w")
    await driver.claims.outcome_write_many([Outcome(row.key, OutcomeKind.COMPLETE)], now=T0)
    await driver.claims.task_claim_many(
        ["q"], 10, now=T0, lease_until=at(60), worker_id="w", keys={}
    )
    app = cleaner_app(driver, ManualClock(at(2 * hour)))

    kept = await Retention(app, RetentionConfig(keys_idle=3 * hour)).run_once()
    forgot = await Retention(app, RetentionConfig(keys_idle=hour)).run_once()
    never = await Retention(app, RetentionConfig(keys_idle=None)).run_once()

    assert (kept.keys_forgotten, forgot.keys_forgotten, never.keys_forgotten) == (0, 1, 0)
    assert (await get(driver, waiting)).state is TaskState.PENDING


async def test_retention_forgets_dropped_publishes_after_topic_drops(driver: Driver) -> None:
    hour = 3600.0
    for when in (T0, at(hour)):
        publish = new_publish(
            "nobody.listens", 1, EnqueueOptions(), clock=lambda w=when: w, max_payload_bytes=99
        )
        assert await driver.topics.topic_publish_many([publish]) == [[]]
    app = cleaner_app(driver, ManualClock(at(2 * hour)))

    never = await Retention(app, RetentionConfig(topic_drops=None)).run_once()
    kept = await Retention(app, RetentionConfig(topic_drops=3 * hour)).run_once()
    forgot = await Retention(app, RetentionConfig(topic_drops=1.5 * hour)).run_once()

    assert [r.topic_drops_forgotten for r in (never, kept, forgot)] == [0, 0, 1]
    [stats] = await driver.topics.topic_stats()
    assert (stats.topic, stats.dropped, stats.last_dropped_at) == ("nobody.listens", 1, at(hour))


# -- periodic -----------------------------------------------------------------------------------


def periodic_app(driver: Driver, clock: ManualClock, **options: Any) -> App:
    app = cleaner_app(driver, clock)
    app.periodic("conformance.task", every=10, name="tick", payload={"p": 1}, **options)
    return app


async def fire_times(driver: Driver) -> list[datetime]:
    """The fire time of every task the periodic sweep enqueued, in claim order."""
    ids = await driver.sweeps.ready_list("q", due_before=datetime.max, limit=1000)
    rows = [await get(driver, i) for i in ids]
    times = [json.loads(r.headers or "")["txtasks-fire-time"] for r in rows]
    return [datetime.fromisoformat(t) for t in times]


async def test_two_cleaners_fire_each_time_once(driver: Driver) -> None:
    clock = ManualClock(at(0))
    other = await another(driver)
    try:
        sweeps = [
            Periodic(periodic_app(d, clock), PeriodicConfig()) for d in (driver, other, driver)
        ]
        results = []
        for step in range(40):  # 120 s in 3 s steps; every pass of all three at once
            clock.now = at(3 * step)
            results += await asyncio.gather(*(s.run_once() for s in sweeps))
    finally:
        if other is not driver:
            await other.close()

    times = await fire_times(driver)
    first = datetime(2030, 1, 2, 3, 4, 10)  # the first multiple of 10 s after T0
    expected = [first + timedelta(seconds=10 * n) for n in range(12)]  # up to T0 + 117 s
    assert Counter(times) == Counter(expected)
    assert sum(r.registered for r in results) == 1
    assert sum(r.fired for r in results) == 12
    row = await get(
        driver, max(await driver.sweeps.ready_list("q", due_before=datetime.max, limit=99))
    )
    assert (row.payload, row.run_at, row.task_name) == (
        b'{"p":1}',
        expected[-1],
        "conformance.task",
    )


@pytest.mark.parametrize(
    ("catch_up", "expected"),
    [("all", [40, 50, 60, 70, 80]), ("latest", [80]), ("skip", [])],
)
async def test_fires_missed_while_no_cleaner_ran(
    driver: Driver, catch_up: str, expected: list[int]
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, 0, 0, 35))
    app = periodic_app(driver, clock, catch_up=catch_up, misfire_grace=2)
    assert (await Periodic(app, PeriodicConfig()).run_once()).registered == 1

    # Down from 0:35 to 1:27: 0:40 ... 1:20 missed (more than five 1 s intervals late)
    clock.now = datetime(2030, 1, 1, 0, 1, 27)
    restarted = Periodic(
        periodic_app(driver, clock, catch_up=catch_up, misfire_grace=2), PeriodicConfig()
    )
    await restarted.run_once()
    clock.now = datetime(2030, 1, 1, 0, 1, 30)  # the next fire is on time in every mode
    await restarted.run_once()

    base = datetime(2030, 1, 1)
    assert await fire_times(driver) == [
        *(base + timedelta(seconds=s) for s in expected),
        base + timedelta(seconds=90),
    ]


async def test_a_changed_schedule_starts_over_from_now(driver: Driver) -> None:
    clock = ManualClock(datetime(2030, 1, 1, 0, 0, 5))
    await Periodic(periodic_app(driver, clock), PeriodicConfig()).run_once()
    stored = (await driver.sweeps.periodic_list())["tick"]
    assert stored.next_fire_at == datetime(2030, 1, 1, 0, 0, 10)

    app = cleaner_app(driver, clock)
    app.periodic("conformance.task", cron="0 * * * *", name="tick")  # hourly now
    result = await Periodic(app, PeriodicConfig()).run_once()

    assert result.registered == 1
    stored = (await driver.sweeps.periodic_list())["tick"]
    assert (stored.schedule, stored.next_fire_at) == (
        "cron 0 * * * * UTC",
        datetime(2030, 1, 1, 1, 0),
    )


@pytest.mark.parametrize(
    ("ack_policy", "state"),
    [
        ("dead_letter", TaskState.DEAD),
        ("discard", TaskState.DISCARDED),
        ("complete", TaskState.COMPLETED),
        ("manual", TaskState.RETRYABLE),
    ],
)
async def test_rescue_follows_the_task_ack_policy(
    driver: Driver, ack_policy: str, state: TaskState
) -> None:
    """A dead worker's attempt fails like a handler error: the task's ack policy decides."""
    clock = ManualClock(T0 + LEASE + timedelta(seconds=1))
    app = App("cleaner-test", driver=driver, clock=clock)
    app.task(name="conformance.task", ack_policy=ack_policy)(lambda payload: None)
    [task_id] = await driver.tasks.task_insert_many([new("x")])
    await claim_one(driver, task_id, now=T0, worker="gone")

    result = await Rescuer(app, RescuerConfig()).run_once()

    row = await get(driver, task_id)
    assert row.state is state
    assert "LeaseExpired: lease expired" in (row.last_error or "")
    counted = {"retried": result.retried, "dead": result.dead, "finished": result.finished}
    expected = {TaskState.RETRYABLE: "retried", TaskState.DEAD: "dead"}.get(state, "finished")
    assert counted == {k: int(k == expected) for k in counted}
