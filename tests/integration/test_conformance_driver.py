"""Conformance suite, part 2: the driver contract, on every database and the in-memory driver.

Time is passed in (`now`), so every test controls it exactly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text

from tests.integration.conformance import LEASE, T0, at, claim, get, new, write
from tests.integration.conftest import another
from tests.waiting import until
from txtasks.driver import Driver, MemoryDriver
from txtasks.schema.tables import tasks
from txtasks.types import (
    NewTask,
    Outcome,
    OutcomeKind,
    QueueRates,
    QueueStats,
    TaskKey,
    TaskRow,
    TaskState,
)

# ----------------------------------------------------------------------------- insert and get


async def test_insert_returns_ids_in_order_and_stores_every_field(driver: Driver) -> None:
    rows = [
        new({"n": 1}, priority=3, run_at=at(1.5), headers={"trace": "abc"}),
        new(b"\x00\xffraw", queue="other", max_attempts=2, dedup_key="k1"),
    ]
    ids = await driver.tasks.task_insert_many(rows)
    more = driver.tasks.task_insert_many_sync([new("sync")])
    assert len(set(ids + more)) == 3
    first = await get(driver, ids[0])
    assert (first.queue, first.task_name, first.state, first.attempt) == (
        "q",
        "conformance.task",
        TaskState.PENDING,
        0,
    )
    assert (first.payload, first.content_type) == (b'{"n":1}', "application/json")
    assert (first.priority, first.run_at, first.created_at) == (3, at(1.5), at(-3600))
    assert json.loads(first.headers or "") == {"trace": "abc"}
    assert (first.dedup_key, first.finished_at, first.lease_expires_at) == (None, None, None)
    second = await get(driver, ids[1])
    assert (second.payload, second.content_type) == (b"\x00\xffraw", "application/octet-stream")
    assert (second.queue, second.max_attempts, second.dedup_key) == ("other", 2, "k1")
    assert await driver.tasks.task_get(max(ids + more) + 1000) is None


async def test_insert_dedup_returns_the_live_task(driver: Driver) -> None:
    [first] = await driver.tasks.task_insert_many([new(1, dedup_key="K")])
    again = await driver.tasks.task_insert_many(
        [new(2), new(3, dedup_key="K"), new(4, dedup_key="K")]
    )
    assert again[1:] == [first, first] and again[0] != first
    assert driver.tasks.task_insert_many_sync([new(5, dedup_key="K")]) == [first]
    assert (await get(driver, first)).payload == b"1"


async def test_ids_are_never_reused_after_tasks_leave_the_hot_table(driver: Driver) -> None:
    """A finished task's id stays its own: a new task must not take it (the archive keeps it)."""
    [first] = await driver.tasks.task_insert_many([new(1)])
    [row] = await claim(driver)
    assert (await write(driver, Outcome(row.key, OutcomeKind.COMPLETE))).applied == 1

    [second] = await driver.tasks.task_insert_many([new(2)])
    assert second != first
    [row] = await claim(driver)
    assert (await write(driver, Outcome(row.key, OutcomeKind.COMPLETE))).applied == 1
    assert (await get(driver, first)).payload == b"1"
    assert (await get(driver, second)).payload == b"2"


# ----------------------------------------------------------------------------- 3. claim races


async def claim_until_empty(
    driver: Driver, worker: str, limit: int, *, complete: bool
) -> list[TaskRow]:
    """Claim batches until none is left; with `complete`, finish each batch before the next."""
    claimed: list[TaskRow] = []
    while batch := await claim(driver, limit=limit, worker=worker):
        claimed.extend(batch)
        if complete:
            done = [Outcome(r.key, OutcomeKind.COMPLETE) for r in batch]
            result = await write(driver, *done, now=at(1))
            assert (result.applied, result.stale) == (len(batch), ())
    return claimed


@pytest.mark.parametrize("complete", [False, True], ids=["claim", "claim-and-complete"])
@pytest.mark.parametrize(("tasks", "claimers", "limit"), [(300, 4, 7), (3, 8, 2)])
async def test_racing_claimers_claim_every_task_exactly_once(
    driver: Driver, tasks: int, claimers: int, limit: int, complete: bool
) -> None:
    ids = await driver.tasks.task_insert_many([new(i) for i in range(tasks)])
    drivers = [driver] + [await another(driver) for _ in range(claimers - 1)]
    try:
        results = await asyncio.gather(
            *(
                claim_until_empty(d, f"w{n}", limit, complete=complete)
                for n, d in enumerate(drivers)
            )
        )
    finally:
        for other in drivers[1:]:
            if other is not driver:
                await other.close()
    claimed = [row for batch in results for row in batch]
    assert sorted(r.id for r in claimed) == sorted(ids)
    assert {r.attempt for r in claimed} == {1}
    assert await claim(driver) == []
    for n, batch in enumerate(results):  # each row says who holds it
        assert {r.worker_id for r in batch} <= {f"w{n}"}
    state = "completed" if complete else "processing"
    assert await driver.admin.queue_stats(now=at(2)) == [QueueStats("q", {state: tasks}, None)]


async def test_claim_marks_the_row_processing_and_leased(driver: Driver) -> None:
    [task_id] = await driver.tasks.task_insert_many([new("x", run_at=at(-5))])
    [row] = await claim(driver, now=at(1), worker="w-7")
    assert (row.id, row.state, row.attempt) == (task_id, TaskState.PROCESSING, 1)
    assert (row.worker_id, row.started_at, row.lease_expires_at) == ("w-7", at(1), at(1) + LEASE)
    assert row.payload == b'"x"'
    stored = await get(driver, task_id)
    assert (stored.state, stored.attempt, stored.worker_id) == (TaskState.PROCESSING, 1, "w-7")
    assert stored.lease_expires_at == at(1) + LEASE
    assert await claim(driver, now=at(2)) == []  # a processing task is not handed out twice


# ----------------------------------------------------------------------------- 4. fencing


async def lose_lease(driver: Driver) -> tuple[TaskKey, TaskKey]:
    """Claim (attempt 1), let a rescuer retry it, re-claim (attempt 2): (stale key, current key)."""
    await driver.tasks.task_insert_many([new("fenced")])
    [first] = await claim(driver, worker="w1")
    rescued = Outcome(first.key, OutcomeKind.RETRY, error="lease expired", run_at=at(40))
    assert (await write(driver, rescued, now=at(31))).applied == 1
    [second] = await claim(driver, now=at(41), worker="w2")
    assert (second.id, second.attempt) == (first.id, 2)
    return first.key, second.key


@pytest.mark.parametrize(
    "kind",
    [
        OutcomeKind.COMPLETE,
        OutcomeKind.FAIL,
        OutcomeKind.DEAD,
        OutcomeKind.RETRY,
        OutcomeKind.RELEASE,
        OutcomeKind.DISCARD,
    ],
)
async def test_stale_attempt_outcome_is_fenced_off(driver: Driver, kind: OutcomeKind) -> None:
    stale, current = await lose_lease(driver)
    outcome = Outcome(
        stale, kind, error="late", run_at=at(99) if kind is OutcomeKind.RETRY else None
    )
    result = await write(driver, outcome, now=at(42))
    assert (result.applied, result.stale) == (0, (stale,))
    row = await get(driver, stale.id)
    assert (row.state, row.attempt, row.worker_id) == (TaskState.PROCESSING, 2, "w2")

    result = await write(driver, Outcome(current, OutcomeKind.COMPLETE), now=at(43))
    assert (result.applied, result.stale) == (1, ())
    done = await get(driver, stale.id)
    assert (done.state, done.attempt, done.finished_at) == (TaskState.COMPLETED, 2, at(43))
    again = await write(driver, Outcome(current, OutcomeKind.COMPLETE), now=at(44))
    assert (again.applied, again.stale) == (0, (current,))  # finished: nothing to fence on


async def test_stale_lease_extension_changes_nothing(driver: Driver) -> None:
    stale, current = await lose_lease(driver)
    assert await driver.claims.lease_extend_many([stale], lease_until=at(500)) == 0
    assert (await get(driver, current.id)).lease_expires_at == at(41) + LEASE
    assert await driver.claims.lease_extend_many([stale, current], lease_until=at(600)) == 1
    assert (await get(driver, current.id)).lease_expires_at == at(600)
    # extending to the lease it already has still counts the lease as held
    assert await driver.claims.lease_extend_many([current], lease_until=at(600)) == 1
    assert await driver.claims.lease_extend_many([], lease_until=at(700)) == 0


async def test_lease_extension_leaves_out_rows_locked_elsewhere_without_waiting(
    driver: Driver,
) -> None:
    """A row another transaction has locked (an outcome write finishing it, or a session whose
    client vanished) is left out of the heartbeat, not waited for: waiting would let every
    other lease run out meanwhile. It still counts as held."""
    if isinstance(driver, MemoryDriver) or not driver.capabilities.concurrent_claims:
        pytest.skip("no row locks held by another transaction to wait for")
    await driver.tasks.task_insert_many([new(), new()])
    locked, free = [row.key for row in await claim(driver)]
    sql: Any = driver
    async with sql.db.engine.connect() as conn, conn.begin():
        await conn.execute(select(tasks.c.id).where(tasks.c.id == locked.id).with_for_update())
        held = await asyncio.wait_for(
            driver.claims.lease_extend_many([locked, free], lease_until=at(500), worker_id="w1"), 10
        )
        assert held == 2
    assert (await get(driver, free.id)).lease_expires_at == at(500)
    assert (await get(driver, locked.id)).lease_expires_at == T0 + LEASE  # left out


async def lock_waiters(engine: Any) -> int:
    """Sessions of the engine's database waiting for a row lock, seen from a connection of
    its own (PostgreSQL: a transaction sees one snapshot of pg_stat_activity; MariaDB: a
    SELECT ... FOR UPDATE is still running only while it waits)."""
    if engine.dialect.name == "postgresql":
        sql = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
    else:
        sql = (
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() "
            "AND COMMAND = 'Query' AND INFO LIKE 'SELECT t.id, t.attempt%FOR UPDATE'"
        )
    async with engine.connect() as probe:
        return int(await probe.scalar(text(sql)))


async def test_lease_extension_that_waits_extends_a_row_once_its_holder_lets_go(
    driver: Driver,
) -> None:
    """With `wait_locked`, the extension waits in line for a row another transaction holds,
    and extends it when that transaction ends without finishing it (an expired lease too:
    no rescuer took it meanwhile). A callable `lease_until` is asked once the row is locked."""
    if isinstance(driver, MemoryDriver) or not driver.capabilities.concurrent_claims:
        pytest.skip("no row locks held by another transaction to wait for")
    await driver.tasks.task_insert_many([new()])
    [row] = await claim(driver)
    sql: Any = driver
    async with sql.db.engine.connect() as conn:
        tx = await conn.begin()
        await conn.execute(select(tasks.c.id).where(tasks.c.id == row.id).with_for_update())
        asked: list[int] = []

        def lease_until() -> datetime:
            asked.append(1)
            return at(500)

        extend = asyncio.ensure_future(
            driver.claims.lease_extend_many(
                [row.key], lease_until=lease_until, worker_id="w1", wait_locked=True
            )
        )
        await until(lambda: lock_waiters(sql.db.engine), "the extension to wait for the row's lock")
        assert not extend.done() and not asked
        await tx.rollback()
    assert await asyncio.wait_for(extend, 10) == 1
    assert asked == [1]
    assert (await get(driver, row.id)).lease_expires_at == at(500)


async def test_outcomes_and_leases_are_fenced_on_the_claiming_worker(driver: Driver) -> None:
    """The same (id, attempt) claimed by another worker (a handed-back attempt is counted
    again) is not this worker's: its outcome and its heartbeat change nothing."""
    [task_id] = await driver.tasks.task_insert_many([new()])
    [row] = await claim(driver, worker="w1")
    done = Outcome(row.key, OutcomeKind.COMPLETE)
    assert (
        await driver.claims.lease_extend_many([row.key], lease_until=at(500), worker_id="w2") == 0
    )
    result = await driver.claims.outcome_write_many([done], now=T0, worker_id="w2")
    assert result.stale == (row.key,)
    assert (await get(driver, task_id)).state is TaskState.PROCESSING
    assert (
        await driver.claims.lease_extend_many([row.key], lease_until=at(500), worker_id="w1") == 1
    )
    result = await driver.claims.outcome_write_many([done], now=T0, worker_id="w1")
    assert (result.applied, result.stale) == (1, ())
    assert (await get(driver, task_id)).state is TaskState.COMPLETED


async def test_one_flush_applies_the_current_and_fences_the_stale(driver: Driver) -> None:
    stale, current = await lose_lease(driver)
    ids = await driver.tasks.task_insert_many([new(i, queue="batch") for i in range(3)])
    done, retried, released = await claim(driver, ["batch"], now=at(50))
    result = await write(
        driver,
        Outcome(done.key, OutcomeKind.COMPLETE),
        Outcome(stale, OutcomeKind.COMPLETE),
        Outcome(retried.key, OutcomeKind.RETRY, error="again", run_at=at(60)),
        Outcome(released.key, OutcomeKind.RELEASE),
        Outcome(current, OutcomeKind.FAIL, error="bad"),
        now=at(51),
    )
    assert (result.applied, result.stale) == (4, (stale,))
    states = [(await get(driver, i)).state for i in [*ids, current.id]]
    assert states == [TaskState.COMPLETED, TaskState.RETRYABLE, TaskState.PENDING, TaskState.FAILED]


# ----------------------------------------------------------------------------- 6. retries


async def test_retry_schedules_the_next_attempt(driver: Driver) -> None:
    [task_id] = await driver.tasks.task_insert_many([new("r")])
    [row] = await claim(driver)
    checkpoint = json.dumps({"step": 2})
    retry = Outcome(row.key, OutcomeKind.RETRY, error="boom", run_at=at(60), checkpoint=checkpoint)
    assert (await write(driver, retry, now=at(1))).applied == 1

    stored = await get(driver, task_id)
    assert (stored.state, stored.run_at, stored.attempt) == (TaskState.RETRYABLE, at(60), 1)
    assert (stored.last_error, stored.checkpoint) == ("boom", checkpoint)
    assert (stored.worker_id, stored.lease_expires_at) == (None, None)

    assert await claim(driver, now=at(59)) == []
    [again] = await claim(driver, now=at(60))
    assert (again.id, again.attempt, again.checkpoint) == (task_id, 2, checkpoint)

    # a retry that saves no checkpoint keeps the previous one
    retry = Outcome(again.key, OutcomeKind.RETRY, error="boom 2", run_at=at(70))
    assert (await write(driver, retry, now=at(61))).applied == 1
    stored = await get(driver, task_id)
    assert (stored.checkpoint, stored.last_error) == (checkpoint, "boom 2")
    [third] = await claim(driver, now=at(70))
    assert third.attempt == 3


async def test_release_hands_the_task_back_uncounted(driver: Driver) -> None:
    [task_id] = await driver.tasks.task_insert_many([new("rel")])
    [row] = await claim(driver, worker="w1")
    assert (await write(driver, Outcome(row.key, OutcomeKind.RELEASE), now=at(1))).applied == 1
    stored = await get(driver, task_id)
    assert (stored.state, stored.attempt) == (TaskState.PENDING, 0)
    assert (stored.worker_id, stored.lease_expires_at) == (None, None)
    [again] = await claim(driver, now=at(2), worker="w2")
    assert (again.id, again.attempt, again.worker_id) == (task_id, 1, "w2")


# ----------------------------------------------------------------------------- 8. archive


@pytest.mark.parametrize("archive", [True, False], ids=["archive", "no-archive"])
async def test_complete_moves_the_row_to_the_archive(driver: Driver, archive: bool) -> None:
    [task_id] = await driver.tasks.task_insert_many([new("c", dedup_key="K")])
    [row] = await claim(driver, now=at(1))
    assert (
        await write(driver, Outcome(row.key, OutcomeKind.COMPLETE), now=at(2), archive=archive)
    ).applied == 1
    stored = await driver.tasks.task_get(task_id)
    if not archive:
        assert stored is None
    else:
        assert stored is not None
        assert (stored.state, stored.finished_at, stored.attempt) == (TaskState.COMPLETED, at(2), 1)
        assert (stored.payload, stored.dedup_key, stored.lease_expires_at) == (b'"c"', "K", None)
        assert stored.started_at == at(1)
    assert await claim(driver, now=at(3)) == []
    assert await driver.tasks.live_count(None, now=at(3), due_before=at(999)) == 0
    # the key is free again: the hot table no longer holds the row
    [new_id] = await driver.tasks.task_insert_many([new("c2", dedup_key="K")])
    fresh = await get(driver, new_id)
    assert (fresh.state, fresh.payload, fresh.attempt) == (TaskState.PENDING, b'"c2"', 0)


@pytest.mark.parametrize("kind", [OutcomeKind.FAIL, OutcomeKind.DISCARD, OutcomeKind.DEAD])
@pytest.mark.parametrize("archive", [True, False], ids=["archive", "no-archive"])
async def test_failed_discarded_dead_are_always_archived(
    driver: Driver, kind: OutcomeKind, archive: bool
) -> None:
    [task_id] = await driver.tasks.task_insert_many([new("f")])
    [row] = await claim(driver)
    result = await write(
        driver, Outcome(row.key, kind, error=f"why {kind.value}"), now=at(5), archive=archive
    )
    assert result.applied == 1
    stored = await get(driver, task_id)
    assert (stored.state.value, stored.finished_at) == (kind.value, at(5))
    assert stored.last_error == f"why {kind.value}"
    assert await claim(driver, now=at(6)) == []


async def test_complete_keeps_the_last_error_of_an_earlier_attempt(driver: Driver) -> None:
    [task_id] = await driver.tasks.task_insert_many([new("e")])
    [row] = await claim(driver)
    await write(driver, Outcome(row.key, OutcomeKind.RETRY, error="first try failed", run_at=T0))
    [row] = await claim(driver, now=at(1))
    await write(driver, Outcome(row.key, OutcomeKind.COMPLETE), now=at(2))
    stored = await get(driver, task_id)
    assert (stored.state, stored.attempt, stored.last_error) == (
        TaskState.COMPLETED,
        2,
        "first try failed",
    )


# ----------------------------------------------------------------------------- 9. order, queues


async def test_claims_come_by_priority_then_run_at_then_id(driver: Driver) -> None:
    ids = await driver.tasks.task_insert_many(
        [
            new("p0-late", priority=0, run_at=at(-1)),
            new("p5-late", priority=5, run_at=at(-1)),
            new("p0-early", priority=0, run_at=at(-9)),
            new("p5-early", priority=5, run_at=at(-9)),
            new("p-1", priority=-1, run_at=at(-20)),
            new("p5-late-2", priority=5, run_at=at(-1)),
            new("future", priority=99, run_at=at(1)),
        ]
    )
    expected = [ids[3], ids[1], ids[5], ids[2], ids[0], ids[4]]
    one_by_one = [(await claim(driver, limit=1))[0].id for _ in expected]
    assert one_by_one == expected
    assert await claim(driver) == []


async def test_a_batch_claim_takes_the_first_in_order(driver: Driver) -> None:
    ids = await driver.tasks.task_insert_many([new(i, priority=i % 3) for i in range(9)])
    batch = await claim(driver, limit=4)
    assert [r.id for r in batch] == [ids[2], ids[5], ids[8], ids[1]]


async def test_not_claimable_before_run_at(driver: Driver) -> None:
    [task_id] = await driver.tasks.task_insert_many([new("later", run_at=at(10))])
    assert await claim(driver, now=at(9.999999)) == []
    assert [r.id for r in await claim(driver, now=at(10))] == [task_id]


async def test_a_claim_never_crosses_queues(driver: Driver) -> None:
    a = await driver.tasks.task_insert_many([new(i, queue="A", priority=i) for i in range(3)])
    b = await driver.tasks.task_insert_many([new(i, queue="B", priority=10) for i in range(2)])
    c = await driver.tasks.task_insert_many([new("c", queue="C")])
    got_a = await claim(driver, ["A"])
    assert sorted(r.id for r in got_a) == sorted(a)
    assert {r.queue for r in got_a} == {"A"}
    assert await claim(driver, ["A"]) == []
    got = await claim(driver, ["B", "C", "Z"])
    assert sorted(r.id for r in got) == sorted(b + c)


async def claim_named(
    driver: Driver, ids: list[int], queues: Sequence[str] = ("q",), *, now: datetime = T0
) -> list[TaskRow]:
    return await driver.claims.task_claim_ids(
        list(queues), ids, now=now, lease_until=now + LEASE, worker_id="w1"
    )


async def test_a_named_claim_takes_only_what_a_claim_of_the_queues_would(
    driver: Driver,
) -> None:
    """The tasks a wake-up named, by id: ready, due, without a key, of the queues asked,
    their queue not paused; in claim order, claimed as a claim of the queues claims them."""
    ids = await driver.tasks.task_insert_many(
        [
            new("low"),
            new("high", priority=5),
            new("later", run_at=at(10)),
            new("keyed", key="k1"),
            new("elsewhere", queue="other"),
            new("paused", queue="held"),
            new("left alone"),
        ]
    )
    low, high, later, keyed, elsewhere, paused, alone = ids
    await driver.control.queue_pause("held", now=T0)
    missing = max(ids) + 1000
    asked = [low, high, later, keyed, elsewhere, paused, missing, low]
    got = await claim_named(driver, asked, ["q", "held"])
    assert [r.id for r in got] == [high, low]  # claim order, each once
    for row in got:
        assert (row.state, row.attempt, row.worker_id) == (TaskState.PROCESSING, 1, "w1")
        assert (row.lease_expires_at, row.started_at) == (T0 + LEASE, T0)
        stored = await get(driver, row.id)
        assert (stored.state, stored.attempt, stored.worker_id) == (TaskState.PROCESSING, 1, "w1")
    assert await claim_named(driver, [low, high]) == []  # taken: not again
    assert await claim_named(driver, []) == [] and await claim_named(driver, [alone], []) == []
    for task_id in (later, keyed, elsewhere, paused, alone):
        assert (await get(driver, task_id)).state is TaskState.PENDING
    # what it left is a claim's of the queues in turn
    assert [r.id for r in await claim_named(driver, [later], now=at(10))] == [later]
    assert [r.id for r in await claim(driver, ["q", "other"])] == [keyed, elsewhere, alone]


async def test_a_named_claim_skips_a_task_another_claimer_holds(driver: Driver) -> None:
    """Two claimers racing for the same named tasks: each task goes to exactly one."""
    ids = await driver.tasks.task_insert_many([new(i) for i in range(20)])
    results = await asyncio.gather(*(claim_named(driver, ids) for _ in range(4)))
    claimed = [r.id for rows in results for r in rows]
    assert sorted(claimed) == sorted(ids)


async def test_queue_names_are_compared_exactly(driver: Driver) -> None:
    lower, upper = await driver.tasks.task_insert_many(
        [new("l", queue="reports"), new("u", queue="Reports")]
    )
    assert [r.id for r in await claim(driver, ["reports"])] == [lower]
    assert await claim(driver, ["reports"]) == []
    assert [r.id for r in await claim(driver, ["Reports"])] == [upper]
    stats = await driver.admin.queue_stats(now=T0)
    assert [(s.queue, s.counts) for s in stats] == [
        ("Reports", {"processing": 1}),
        ("reports", {"processing": 1}),
    ]


# ----------------------------------------------------------------------------- 12. inspection


async def fill_for_stats(driver: Driver) -> dict[str, int]:
    a = await driver.tasks.task_insert_many(
        [
            new("a-due", queue="a", run_at=at(-10)),
            new("a-future", queue="a", run_at=at(100)),
            new("a-running", queue="a", priority=9, run_at=at(-1)),
            new("a-done", queue="a", priority=8, run_at=at(-1)),
        ]
    )
    running, done = await claim(driver, ["a"], limit=2)
    assert [running.id, done.id] == a[2:]
    await write(driver, Outcome(done.key, OutcomeKind.COMPLETE))
    b = await driver.tasks.task_insert_many(
        [new("b-retry", queue="b", run_at=at(-20)), new("b-dead", queue="b", run_at=at(-20))]
    )
    retried, dead = await claim(driver, ["b"])
    assert [retried.id, dead.id] == b
    await write(
        driver,
        Outcome(retried.key, OutcomeKind.RETRY, error="x", run_at=at(-5)),
        Outcome(dead.key, OutcomeKind.DEAD, error="y"),
    )
    await driver.tasks.task_insert_many([new("c-future", queue="c", run_at=at(50))])
    return {"running": running.id}


async def test_queue_stats_counts_and_oldest_ready_age(driver: Driver) -> None:
    await fill_for_stats(driver)
    stats = await driver.admin.queue_stats(now=T0)
    assert stats == [
        QueueStats("a", {"pending": 2, "processing": 1, "completed": 1}, 10.0, ready=1),
        QueueStats("b", {"retryable": 1, "dead": 1}, 5.0, ready=1),
        QueueStats("c", {"pending": 1}, None),
    ]
    assert await MemoryDriver().admin.queue_stats(now=T0) == []


async def test_queue_stats_counts_ready_tasks_with_and_without_a_key(driver: Driver) -> None:
    await driver.tasks.task_insert_many(
        [
            new("plain", run_at=at(-3)),
            new("keyed", key="k1", run_at=at(-2)),
            new("keyed later", key="k1", run_at=at(5)),
            new("other key", key="k2", run_at=at(-9)),
        ]
    )
    [stats] = await driver.admin.queue_stats(now=T0, archived=False)
    assert (stats.ready, stats.oldest_ready_age) == (3, 9.0)


async def test_queue_rates_count_arrivals_and_finishes_in_the_window(driver: Driver) -> None:
    def created(seconds: float, queue: str = "q") -> NewTask:
        return dataclasses.replace(
            new(seconds, queue=queue, run_at=at(-120)), created_at=at(seconds)
        )

    await driver.tasks.task_insert_many([created(-400, queue="s")])
    old_done, recent_done, recent_dead, _old_live, _ = await driver.tasks.task_insert_many(
        [created(-300), created(-30), created(-20), created(-200), created(-10)]
    )
    await driver.tasks.task_insert_many([created(-5, queue="r")])
    rows = {r.id: r for r in await claim(driver, ["q"], limit=3)}
    assert set(rows) == {old_done, recent_done, recent_dead}
    await write(driver, Outcome(rows[old_done].key, OutcomeKind.COMPLETE), now=at(-90))
    await write(driver, Outcome(rows[recent_done].key, OutcomeKind.COMPLETE), now=at(-15))
    await write(driver, Outcome(rows[recent_dead].key, OutcomeKind.DEAD, error="x"), now=at(-1))

    rates = await driver.admin.queue_rates(now=T0, window=60.0)

    # q: enqueued in the last minute: recent_done, recent_dead (archived) and one live task;
    # finished: recent_done and recent_dead (old_done finished 90 s ago). s: nothing recent.
    assert rates == [
        QueueRates("q", 60.0, 3, {"completed": 1, "dead": 1}),
        QueueRates("r", 60.0, 1, {}),
    ]
    assert (rates[0].enqueued_per_second, rates[0].finished_per_second) == (3 / 60, 2 / 60)
    assert await driver.admin.queue_rates(now=at(3600), window=60.0) == []


async def test_live_count_counts_due_tasks_and_valid_leases(driver: Driver) -> None:
    await fill_for_stats(driver)
    assert (
        await driver.tasks.live_count(None, now=T0, due_before=T0) == 3
    )  # a-due, a-running, b-retry
    assert await driver.tasks.live_count(None, now=T0, due_before=at(200)) == 5
    assert await driver.tasks.live_count(["a"], now=T0, due_before=T0) == 2
    assert await driver.tasks.live_count(["c", "zz"], now=T0, due_before=at(49)) == 0
    assert await driver.tasks.live_count(["c"], now=T0, due_before=at(50)) == 1
    expired = T0 + LEASE + timedelta(seconds=1)  # a-running's lease has run out
    assert await driver.tasks.live_count(["a"], now=expired, due_before=expired) == 1


async def test_live_count_at_most_stops_at_its_bound(driver: Driver) -> None:
    await fill_for_stats(driver)  # 5 live by at(200): 4 ready, 1 running
    counts = [
        await driver.tasks.live_count(None, now=T0, due_before=at(200), at_most=n)
        for n in (1, 2, 4, 9)
    ]
    assert counts == [1, 2, 4, 5]
    assert await driver.tasks.live_count(["a"], now=T0, due_before=T0, at_most=1) == 1
    assert await driver.tasks.live_count(["c", "zz"], now=T0, due_before=at(49), at_most=1) == 0


# ----------------------------------------------------------------------------- 7. dead letters


async def kill(driver: Driver, queue: str, *, now: datetime) -> list[int]:
    """Dead-letter every ready task of a queue."""
    claimed = await claim(driver, [queue], now=now)
    outcomes = [Outcome(r.key, OutcomeKind.DEAD, error=f"dead {r.id}") for r in claimed]
    assert (await write(driver, *outcomes, now=now)).applied == len(claimed)
    return [r.id for r in claimed]


async def test_dead_list_requeue_and_purge(driver: Driver) -> None:
    x1, x2, y1 = await driver.tasks.task_insert_many(
        [new(1, queue="x"), new(2, queue="x"), new(3, queue="y")]
    )
    [x3] = await driver.tasks.task_insert_many([new(4, queue="x", run_at=at(3))])
    assert await kill(driver, "x", now=at(1)) == [x1, x2]
    assert await kill(driver, "y", now=at(2)) == [y1]
    assert await kill(driver, "x", now=at(3)) == [x3]

    assert [r.id for r in await driver.admin.dead_list()] == [x3, y1, x2, x1]
    assert [r.id for r in await driver.admin.dead_list(queue="x", limit=2)] == [x3, x2]
    [listed] = await driver.admin.dead_list(queue="y")
    assert (listed.state, listed.last_error, listed.attempt) == (TaskState.DEAD, f"dead {y1}", 1)

    assert await driver.admin.dead_requeue([x1], now=at(10)) == [x1]
    back = await get(driver, x1)
    assert (back.state, back.attempt, back.run_at, back.finished_at) == (
        TaskState.PENDING,
        0,
        at(10),
        None,
    )
    assert await driver.admin.dead_requeue(queue="y", now=at(10)) == [y1]
    rerun = await claim(driver, ["x", "y"], now=at(10))
    assert sorted((r.id, r.attempt) for r in rerun) == sorted([(x1, 1), (y1, 1)])

    assert await driver.admin.dead_purge([x2]) == 1
    assert await driver.tasks.task_get(x2) is None
    assert await driver.admin.dead_purge([x1]) == 0  # live now, not dead: untouched
    assert await driver.admin.dead_purge(queue="y") == 0
    assert await driver.admin.dead_purge() == 1  # x3
    assert await driver.admin.dead_list() == []
    assert (await get(driver, x1)).state is TaskState.PROCESSING


async def test_dead_requeue_skips_a_task_whose_dedup_key_is_live_again(driver: Driver) -> None:
    [dead] = await driver.tasks.task_insert_many([new("old", queue="d", dedup_key="K")])
    assert await kill(driver, "d", now=at(1)) == [dead]
    [live] = await driver.tasks.task_insert_many([new("new", queue="d", dedup_key="K")])
    assert live != dead
    assert await driver.admin.dead_requeue(now=at(2)) == []
    assert (await get(driver, dead)).state is TaskState.DEAD
    assert [r.id for r in await driver.admin.dead_list()] == [dead]
    assert (await get(driver, live)).state is TaskState.PENDING


async def test_dead_requeue_takes_one_of_several_dead_tasks_sharing_a_dedup_key(
    driver: Driver,
) -> None:
    """The key was free again after each death, so two dead tasks hold it: one comes back."""
    [first] = await driver.tasks.task_insert_many([new("first", queue="d", dedup_key="K")])
    assert await kill(driver, "d", now=at(1)) == [first]
    [second] = await driver.tasks.task_insert_many([new("second", queue="d", dedup_key="K")])
    assert await kill(driver, "d", now=at(2)) == [second]

    requeued = await driver.admin.dead_requeue(now=at(3))
    assert len(requeued) == 1 and set(requeued) <= {first, second}
    [live] = await claim(driver, ["d"], now=at(3))
    assert (live.id, live.dedup_key) == (requeued[0], "K")
    [still_dead] = await driver.admin.dead_list()
    assert still_dead.id in {first, second} - set(requeued)
    assert await driver.admin.dead_requeue([first, second], now=at(4)) == []  # the key is live


async def test_requeue_and_purge_finished_tasks_of_the_states_given(driver: Driver) -> None:
    """With `states`, a re-drive takes failed tasks too and a purge any finished one; the
    others of the ids given are left as they were (the default stays dead letters only)."""
    ids = await driver.tasks.task_insert_many([new(n, queue="f") for n in range(4)])
    claimed = {r.id: r.key for r in await claim(driver, ["f"], now=at(1))}
    kinds = (OutcomeKind.FAIL, OutcomeKind.DEAD, OutcomeKind.COMPLETE)
    outcomes = [Outcome(claimed[i], kind, error="e") for i, kind in zip(ids, kinds, strict=False)]
    await write(driver, *outcomes, now=at(2))
    failed, dead, completed, running = ids
    assert await driver.admin.dead_requeue([failed], now=at(3)) == []
    both = (TaskState.FAILED, TaskState.DEAD)
    chosen = [failed, dead, completed, running]
    assert sorted(await driver.admin.dead_requeue(chosen, now=at(3), states=both)) == [
        failed,
        dead,
    ]
    assert (await get(driver, failed)).state is TaskState.PENDING
    assert await driver.admin.dead_purge([completed, failed]) == 0
    finished = (TaskState.COMPLETED, TaskState.DEAD, TaskState.FAILED)
    assert await driver.admin.dead_purge(chosen, states=finished) == 1  # the completed one
    assert await driver.tasks.task_get(completed) is None
    assert (await get(driver, running)).state is TaskState.PROCESSING
