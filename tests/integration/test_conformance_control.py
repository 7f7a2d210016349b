"""Conformance suite: cancel, pause and listings, on every database and in memory.

Time is passed in (`now`), so every test controls it exactly. The races run two drivers (two
pools of connections) against each other for many rounds and check the result in the store.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from cleaner.rescuer import Rescuer, RescuerConfig
from tests.integration.conformance import (
    LEASE,
    T0,
    ManualClock,
    at,
    claim,
    cleaner_app,
    get,
    new,
    write,
)
from tests.integration.conftest import another
from txtasks.control import TaskFilter
from txtasks.driver import Driver
from txtasks.keys import KeyLimits
from txtasks.types import CancelResult, Outcome, OutcomeKind, TaskState

R = CancelResult
#: Rounds of each race (each round a fresh batch of tasks).
ROUNDS = 20


async def close_other(driver: Driver, other: Driver) -> None:
    if other is not driver:
        await other.close()


# -- cancel a waiting task ---------------------------------------------------------------------


async def test_a_cancelled_pending_task_is_archived_and_never_claimed(driver: Driver) -> None:
    ids = await driver.tasks.task_insert_many([new(1), new(2)])
    [result] = await driver.control.task_cancel_many([ids[0]], now=at(1))
    assert (result.id, result.result, result.state) == (ids[0], R.CANCELLED, TaskState.PENDING)
    row = await get(driver, ids[0])
    assert (row.state, row.finished_at, row.attempt) == (TaskState.CANCELLED, at(1), 0)
    assert [r.id for r in await claim(driver, now=at(2))] == [ids[1]]
    again = await driver.control.task_cancel_many([ids[0]], now=at(3))
    assert again[0].result is R.FINISHED and again[0].state is TaskState.CANCELLED


async def test_a_retryable_task_cancelled_keeps_its_last_error(driver: Driver) -> None:
    [task_id] = await driver.tasks.task_insert_many([new(1)])
    [row] = await claim(driver)
    await write(driver, Outcome(row.key, OutcomeKind.RETRY, error="boom", run_at=at(60)))
    [result] = await driver.control.task_cancel_many([task_id], now=at(1))
    assert (result.result, result.state) == (R.CANCELLED, TaskState.RETRYABLE)
    archived = await get(driver, task_id)
    assert (archived.state, archived.last_error, archived.attempt) == (
        TaskState.CANCELLED,
        "boom",
        1,
    )
    assert await claim(driver, now=at(61)) == []


async def test_cancel_says_what_it_found(driver: Driver) -> None:
    ids = await driver.tasks.task_insert_many([new(1), new(2), new(3)])
    rows = {r.id: r for r in await claim(driver, limit=2)}
    done = rows[ids[0]]
    await write(driver, Outcome(done.key, OutcomeKind.COMPLETE))
    results = await driver.control.task_cancel_many(
        [ids[0], ids[1], ids[2], 999_999, ids[2]], now=at(1)
    )
    assert [(c.id, c.result, c.state) for c in results] == [
        (ids[0], R.FINISHED, TaskState.COMPLETED),
        (ids[1], R.REQUESTED, TaskState.PROCESSING),
        (ids[2], R.CANCELLED, TaskState.PENDING),
        (999_999, R.NOT_FOUND, None),
    ]
    assert "already finished (completed)" in results[0].describe()
    assert results[3].describe() == "task 999999: not found"
    [again] = await driver.control.task_cancel_many([ids[1]], now=at(2))
    assert again.result is R.ALREADY_REQUESTED
    assert (await get(driver, ids[1])).cancel_requested_at == at(1)  # the first request's time


async def test_the_sync_twin_cancels_too(driver: Driver) -> None:
    [task_id] = await driver.tasks.task_insert_many([new(1)])
    [result] = driver.control.task_cancel_many_sync([task_id], now=at(1))
    assert result.result is R.CANCELLED
    assert (await get(driver, task_id)).state is TaskState.CANCELLED


# -- cancel a running task ---------------------------------------------------------------------


async def test_a_running_task_is_marked_and_its_worker_sees_it(driver: Driver) -> None:
    ids = await driver.tasks.task_insert_many([new(1), new(2)])
    rows = await claim(driver)
    await driver.control.task_cancel_many([ids[0]], now=at(1))
    keys = [r.key for r in rows]
    assert await driver.claims.cancel_requested_list(keys) == [rows[0].key]
    assert await driver.claims.cancel_requested_list([rows[0].key._replace(attempt=9)]) == []
    assert (await get(driver, ids[0])).state is TaskState.PROCESSING  # until its outcome
    await write(driver, Outcome(rows[0].key, OutcomeKind.CANCEL, error="stopped"), now=at(2))
    row = await get(driver, ids[0])
    assert (row.state, row.last_error, row.cancel_requested_at) == (
        TaskState.CANCELLED,
        "stopped",
        at(1),
    )


@pytest.mark.parametrize("kind", [OutcomeKind.RETRY, OutcomeKind.RELEASE])
async def test_a_retry_or_release_of_a_cancelled_task_is_recorded_as_cancelled(
    driver: Driver, kind: OutcomeKind
) -> None:
    """The retry policy never brings a cancelled task back."""
    [task_id] = await driver.tasks.task_insert_many([new(1)])
    [row] = await claim(driver)
    await driver.control.task_cancel_many([task_id], now=at(1))
    outcome = Outcome(
        row.key, kind, error="failed", run_at=T0 if kind is OutcomeKind.RETRY else None
    )
    assert (await write(driver, outcome, now=at(2))).applied == 1
    archived = await get(driver, task_id)
    assert (archived.state, archived.finished_at) == (TaskState.CANCELLED, at(2))
    assert await claim(driver, now=at(100)) == []


async def test_an_outcome_that_finishes_stands_over_a_late_cancel(driver: Driver) -> None:
    """The handler finished before its worker saw the cancel: completed, as it did."""
    [task_id] = await driver.tasks.task_insert_many([new(1)])
    [row] = await claim(driver)
    await driver.control.task_cancel_many([task_id], now=at(1))
    await write(driver, Outcome(row.key, OutcomeKind.COMPLETE), now=at(2))
    assert (await get(driver, task_id)).state is TaskState.COMPLETED


async def test_a_cancelled_outcome_is_fenced(driver: Driver) -> None:
    [task_id] = await driver.tasks.task_insert_many([new(1)])
    [row] = await claim(driver)
    await driver.control.task_cancel_many([task_id], now=at(1))
    stale = Outcome(row.key._replace(attempt=row.attempt + 1), OutcomeKind.CANCEL)
    assert (await write(driver, stale)).stale == (stale.key,)
    other_worker = await driver.claims.outcome_write_many(
        [Outcome(row.key, OutcomeKind.CANCEL)], now=at(2), worker_id="not-w1"
    )
    assert other_worker.applied == 0
    assert (await get(driver, task_id)).state is TaskState.PROCESSING


async def test_a_dead_letter_requeued_carries_no_old_cancel(driver: Driver) -> None:
    [task_id] = await driver.tasks.task_insert_many([new(1)])
    [row] = await claim(driver)
    await driver.control.task_cancel_many([task_id], now=at(1))
    await write(driver, Outcome(row.key, OutcomeKind.DEAD, error="poison"), now=at(2))
    assert await driver.admin.dead_requeue([task_id], now=at(3)) == [task_id]
    [again] = await claim(driver, now=at(4))
    assert again.cancel_requested_at is None
    assert await driver.claims.cancel_requested_list([again.key]) == []


async def test_the_rescuer_archives_a_cancelled_task_of_a_dead_worker(driver: Driver) -> None:
    clock = ManualClock(T0)
    app = cleaner_app(driver, clock)
    ids = await driver.tasks.task_insert_many([new(1), new(2)])
    await claim(driver)
    await driver.control.task_cancel_many([ids[0]], now=at(1))
    clock.now = T0 + LEASE + LEASE
    result = await Rescuer(app, RescuerConfig()).run_once()
    assert (result.cancelled, result.retried) == (1, 1)
    assert (await get(driver, ids[0])).state is TaskState.CANCELLED
    assert (await get(driver, ids[1])).state is TaskState.RETRYABLE


# -- cancel and keys ---------------------------------------------------------------------------


async def test_cancelling_an_ordered_key_s_head_lets_the_next_task_start(driver: Driver) -> None:
    limits = {"q": KeyLimits(ordered=True)}
    ids = await driver.tasks.task_insert_many([new(i, key="a") for i in range(3)])
    [head] = await claim(driver, keys=limits)
    await write(driver, Outcome(head.key, OutcomeKind.RETRY, run_at=at(600)))
    assert await claim(driver, keys=limits, now=at(1)) == []  # the retrying head holds the key
    await driver.control.task_cancel_many([ids[0]], now=at(2))
    assert [r.id for r in await claim(driver, keys=limits, now=at(3))] == [ids[1]]


async def test_a_cancelled_running_task_frees_its_key_s_slot(driver: Driver) -> None:
    limits = {"q": KeyLimits(concurrency=1)}
    ids = await driver.tasks.task_insert_many([new(i, key="a") for i in range(2)])
    [first] = await claim(driver, keys=limits)
    await driver.control.task_cancel_many([ids[0]], now=at(1))
    assert await claim(driver, keys=limits, now=at(2)) == []  # still running
    await write(driver, Outcome(first.key, OutcomeKind.CANCEL), now=at(3))
    assert [r.id for r in await claim(driver, keys=limits, now=at(4))] == [ids[1]]


# -- cancel by queue, task name or key ---------------------------------------------------------


async def test_cancel_by_queue_task_or_key_takes_only_matching_live_tasks(driver: Driver) -> None:
    ids = await driver.tasks.task_insert_many(
        [new(1, queue="a"), new(2, queue="a", key="k"), new(3, queue="b", key="k"), new(4)]
    )
    [running] = await claim(driver, ["b"], keys={"b": KeyLimits()})
    by_queue = await driver.control.task_cancel_many(where=TaskFilter(queue="a"), now=at(1))
    assert sorted((c.id, c.result) for c in by_queue) == [
        (ids[0], R.CANCELLED),
        (ids[1], R.CANCELLED),
    ]
    by_key = await driver.control.task_cancel_many(where=TaskFilter(key="k"), now=at(2))
    assert [(c.id, c.result) for c in by_key] == [(running.id, R.REQUESTED)]
    assert await driver.control.task_cancel_many(where=TaskFilter(key="k"), now=at(3)) == []
    by_name = await driver.control.task_cancel_many(
        where=TaskFilter(task_name="conformance.task"), now=at(4), limit=10
    )
    assert [c.id for c in by_name] == [ids[3]]


# -- pause -------------------------------------------------------------------------------------


async def test_a_paused_queue_is_not_claimed_until_resumed(driver: Driver) -> None:
    ids = await driver.tasks.task_insert_many(
        [new(1, queue="a"), new(2, queue="a", key="k"), new(3)]
    )
    assert await driver.control.queue_pause("a", now=at(1)) is None
    assert await driver.control.queue_pause("a", now=at(2)) == at(1)  # paused since then
    limits = {"a": KeyLimits(), "q": KeyLimits()}
    assert [r.id for r in await claim(driver, ["a", "q"], keys=limits, now=at(3))] == [ids[2]]
    assert await claim(driver, ["a"], keys=limits, now=at(4)) == []
    assert await driver.control.queue_paused_list() == {"a": at(1)}
    stats = {s.queue: s for s in await driver.admin.queue_stats(now=at(5))}
    assert (stats["a"].paused_at, stats["q"].paused_at) == (at(1), None)
    assert await driver.control.queue_resume("a") is True
    assert await driver.control.queue_resume("a") is False
    got = await claim(driver, ["a"], keys=limits, now=at(6))
    assert sorted(r.id for r in got) == ids[:2]


async def test_a_paused_queue_with_no_task_shows_in_the_stats(driver: Driver) -> None:
    driver.control.queue_pause_sync("empty", now=at(1))
    [stats] = await driver.admin.queue_stats(now=at(2))
    assert (stats.queue, stats.counts, stats.paused_at) == ("empty", {}, at(1))
    assert driver.control.queue_resume_sync("empty") is True


async def test_running_tasks_of_a_paused_queue_finish(driver: Driver) -> None:
    [task_id] = await driver.tasks.task_insert_many([new(1)])
    [row] = await claim(driver)
    await driver.control.queue_pause("q", now=at(1))
    assert (await write(driver, Outcome(row.key, OutcomeKind.COMPLETE))).applied == 1
    assert (await get(driver, task_id)).state is TaskState.COMPLETED


# -- listing -----------------------------------------------------------------------------------


async def test_tasks_are_listed_by_state_queue_task_and_key(driver: Driver) -> None:
    ids = await driver.tasks.task_insert_many(
        [new(1, queue="a"), new(2, queue="a", key="k"), new(3, queue="b"), new(4, queue="b")]
    )
    [running] = await claim(driver, ["b"], limit=1)
    await driver.control.task_cancel_many([ids[0]], now=at(1))
    live = await driver.tasks.task_list()
    assert [r.id for r in live] == [ids[3], ids[2], ids[1]]  # newest first
    assert [r.id for r in await driver.tasks.task_list(where=TaskFilter(queue="a"))] == [ids[1]]
    assert [r.id for r in await driver.tasks.task_list(where=TaskFilter(key="k"))] == [ids[1]]
    processing = await driver.tasks.task_list(states=[TaskState.PROCESSING])
    assert [r.id for r in processing] == [running.id]
    both = await driver.tasks.task_list(states=[TaskState.CANCELLED, TaskState.PENDING], limit=10)
    assert [r.state for r in both][-1] is TaskState.CANCELLED  # finished ones after live ones
    assert [r.id for r in both if r.state is TaskState.CANCELLED] == [ids[0]]
    named = TaskFilter(task_name="conformance.task", queue="a")
    cancelled = await driver.tasks.task_list(states=[TaskState.CANCELLED], where=named)
    assert [r.id for r in cancelled] == [ids[0]]
    assert await driver.tasks.task_list(where=TaskFilter(task_name="other")) == []
    assert len(await driver.tasks.task_list(limit=1)) == 1
    # the sync listing lists the same
    for states, where, limit in (
        (None, None, 100),
        (None, TaskFilter(queue="a"), 100),
        ([TaskState.CANCELLED, TaskState.PENDING], None, 10),
        ([TaskState.CANCELLED], named, 100),
        (None, None, 1),
    ):
        wanted = await driver.tasks.task_list(states=states, where=where, limit=limit)
        assert driver.tasks.task_list_sync(states=states, where=where, limit=limit) == wanted


# -- races -------------------------------------------------------------------------------------


async def test_cancel_racing_claims_each_task_is_claimed_or_cancelled_never_both(
    driver: Driver,
) -> None:
    other = await another(driver)
    try:
        for n in range(ROUNDS):
            ids = await driver.tasks.task_insert_many([new(i) for i in range(6)])
            now = at(n)
            claimed, cancels = await asyncio.gather(
                claim(other, limit=3, now=now, worker="racer"),
                driver.control.task_cancel_many(ids, now=now),
            )
            got = {r.id for r in claimed}
            cancelled = {c.id for c in cancels if c.result is R.CANCELLED}
            requested = {c.id for c in cancels if c.result is R.REQUESTED}
            assert got.isdisjoint(cancelled), (got, cancelled)
            assert requested <= got and got | cancelled == set(ids)
            for task_id in ids:  # and the store agrees
                row = await get(driver, task_id)
                if task_id in got:
                    assert row.state is TaskState.PROCESSING and row.cancel_requested_at == now
                else:
                    assert row.state is TaskState.CANCELLED and row.attempt == 0
            outcomes = [Outcome(r.key, OutcomeKind.RETRY, run_at=now) for r in claimed]
            await write(other, *outcomes, now=now)
            assert await claim(driver, limit=100, now=at(n + 0.5)) == []
    finally:
        await close_other(driver, other)


async def test_cancel_racing_outcomes_records_one_final_state(driver: Driver) -> None:
    other = await another(driver)
    try:
        for n in range(ROUNDS):
            ids = await driver.tasks.task_insert_many([new(i) for i in range(4)])
            rows = await claim(driver, now=at(n))
            kinds = [OutcomeKind.COMPLETE, OutcomeKind.RETRY] * 2
            outcomes = [Outcome(r.key, k, run_at=at(n)) for r, k in zip(rows, kinds, strict=True)]
            written, cancels = await asyncio.gather(
                write(driver, *outcomes, now=at(n)),
                other.control.task_cancel_many(ids, now=at(n)),
            )
            assert written.applied == 4
            by_id = {c.id: c for c in cancels}
            for row, kind in zip(rows, kinds, strict=True):
                stored = await get(driver, row.id)
                cancel = by_id[row.id]
                if kind is OutcomeKind.COMPLETE:
                    assert stored.state is TaskState.COMPLETED  # finished before or after
                    assert cancel.result in (R.FINISHED, R.REQUESTED)
                elif cancel.result is R.REQUESTED:  # the retry came after: cancelled
                    assert stored.state is TaskState.CANCELLED
                else:  # the retry came first: a waiting task, cancelled
                    assert cancel.result is R.CANCELLED
                    assert stored.state is TaskState.CANCELLED
            assert await claim(driver, now=at(n + 0.5)) == []
    finally:
        await close_other(driver, other)


async def test_no_claim_that_starts_after_a_pause_takes_the_queue(driver: Driver) -> None:
    other = await another(driver)
    try:
        for n in range(ROUNDS):
            await driver.tasks.task_insert_many([new(i, queue="p") for i in range(5)])
            now = at(n)

            async def pause(now: datetime = now) -> None:
                await driver.control.queue_pause("p", now=now)
                after = await claim(other, ["p"], now=now, worker="after")
                assert after == []  # every claim that began after the commit skips it

            claimed, _ = await asyncio.gather(claim(other, ["p"], limit=2, now=now), pause())
            assert len(claimed) in (0, 2)
            await write(other, *[Outcome(r.key, OutcomeKind.COMPLETE) for r in claimed], now=now)
            await driver.control.queue_resume("p")
            await write(
                driver,
                *[
                    Outcome(r.key, OutcomeKind.COMPLETE)
                    for r in await claim(driver, ["p"], now=now)
                ],
                now=now,
            )
    finally:
        await close_other(driver, other)
