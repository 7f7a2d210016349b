"""Conformance suite: keys (concurrency, order, rate, turns), on every database and in memory.

Time is passed in (`now`), so every test controls it exactly.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime

import pytest
from sqlalchemy import select

from tests.integration.conformance import LEASE, T0, at, claim, get, new, write
from tests.integration.conftest import another
from txtasks.driver import Driver, SqlDriver
from txtasks.keys import KeyLimits, KeyOverride, Rate
from txtasks.schema.tables import key_hints, keys
from txtasks.types import Outcome, OutcomeKind, TaskRow

Q = {"q": KeyLimits()}


def per_key(rows: list[TaskRow]) -> Counter[str | None]:
    return Counter(r.partition_key for r in rows)


def done(row: TaskRow) -> Outcome:
    return Outcome(row.key, OutcomeKind.COMPLETE)


async def test_tasks_with_and_without_a_key_are_all_claimed(driver: Driver) -> None:
    ids = await driver.tasks.task_insert_many(
        [new(1), new(2, key="a"), new(3), new(4, key="b"), new(5, key="a")]
    )
    rows = await claim(driver, keys=Q)
    assert sorted(r.id for r in rows) == sorted(ids)
    assert per_key(rows) == {None: 2, "a": 2, "b": 1}
    assert (await get(driver, ids[1])).partition_key == "a"


#: Keys a collation would merge (case, accents, trailing spaces), and characters JSON escapes.
ODD_KEYS = [
    "Customer:42",
    "customer:42",
    "cafe",
    "café",
    "a b",
    "a b ",
    'quote " back \\ slash',
    "tab\tnew\nline",
    "\u00fcn\u00efc\u00f6de \u2603",
    "emoji \U0001f642",
]


async def test_keys_of_any_characters_are_told_apart_and_kept_exactly(driver: Driver) -> None:
    """Each key has its own slot, and its name comes back as it went in, through every
    statement a claim and an outcome read keys with."""
    limits = {"q": KeyLimits(concurrency=1)}
    ids = await driver.tasks.task_insert_many([new(i, key=k) for i in range(2) for k in ODD_KEYS])
    first = await claim(driver, keys=limits)
    assert sorted(r.partition_key or "" for r in first) == sorted(ODD_KEYS)
    assert await claim(driver, keys=limits) == []
    await write(driver, *map(done, first))  # each key's slot comes back, armed by name
    second = await claim(driver, keys=limits)
    assert sorted(r.partition_key or "" for r in second) == sorted(ODD_KEYS)
    assert sorted(r.id for r in first + second) == sorted(ids)


async def test_a_key_found_without_declared_limits(driver: Driver) -> None:
    """Tasks with a key enqueued by another application are found by a claim that declares no
    key limits (the keys' lane probes)."""
    [task_id] = await driver.tasks.task_insert_many([new(1, key="elsewhere")])
    assert [r.id for r in await claim(driver)] == [task_id]


async def test_concurrency_caps_what_runs_at_once_per_key(driver: Driver) -> None:
    limits = {"q": KeyLimits(concurrency=2)}
    await driver.tasks.task_insert_many([new(i, key="a") for i in range(5)] + [new(9, key="b")])
    first = await claim(driver, keys=limits)
    assert per_key(first) == {"a": 2, "b": 1}
    assert await claim(driver, keys=limits) == []
    a = [r for r in first if r.partition_key == "a"]
    await write(driver, done(a[0]))  # a slot comes back
    assert per_key(await claim(driver, keys=limits)) == {"a": 1}
    await write(driver, Outcome(a[1].key, OutcomeKind.RETRY, run_at=at(60)))  # and another
    assert per_key(await claim(driver, keys=limits)) == {"a": 1}
    assert await claim(driver, keys=limits) == []


async def test_racing_claims_never_exceed_a_key_s_concurrency(driver: Driver) -> None:
    other = await another(driver)
    limits = {"q": KeyLimits(concurrency=3)}
    await driver.tasks.task_insert_many([new(i, key=f"k{i % 4}") for i in range(60)])
    running: list[TaskRow] = []
    try:
        for _ in range(25):
            if running:  # one finishes per round
                await write(driver, done(running.pop(0)))
            batches = await asyncio.gather(
                claim(driver, limit=5, keys=limits, worker="w1"),
                claim(other, limit=5, keys=limits, worker="w2"),
            )
            running += [r for batch in batches for r in batch]
            assert max(per_key(running).values(), default=0) <= 3, per_key(running)
    finally:
        if other is not driver:
            await other.close()  # type: ignore[attr-defined]
    assert len(running) == 12  # every key full


async def test_an_ordered_key_starts_its_tasks_one_by_one_in_enqueue_order(driver: Driver) -> None:
    limits = {"q": KeyLimits(ordered=True)}
    later = [new(2, key="a", priority=9), new(3, key="a", run_at=at(-60))]
    ids = await driver.tasks.task_insert_many([new(1, key="a"), *later, new(4, key="b")])
    first = await claim(driver, keys=limits)
    assert sorted(r.id for r in first) == [ids[0], ids[3]]  # not the later ones, whatever
    head = next(r for r in first if r.id == ids[0])  # their priority or due time
    await write(driver, Outcome(head.key, OutcomeKind.RETRY, run_at=at(30)))
    assert await claim(driver, keys=limits) == []  # the retried head keeps its place
    assert await claim(driver, keys=limits, now=at(20)) == []
    again = await claim(driver, keys=limits, now=at(31))
    assert [(r.id, r.attempt) for r in again] == [(ids[0], 2)]
    await write(driver, Outcome(again[0].key, OutcomeKind.DEAD, error="poison"), now=at(31))
    assert [r.id for r in await claim(driver, keys=limits, now=at(32))] == [ids[1]]


async def test_a_released_task_keeps_its_place_in_an_ordered_key(driver: Driver) -> None:
    limits = {"q": KeyLimits(ordered=True)}
    ids = await driver.tasks.task_insert_many([new(i, key="a") for i in range(3)])
    [head] = await claim(driver, keys=limits)
    await write(driver, Outcome(head.key, OutcomeKind.RELEASE))
    assert [r.id for r in await claim(driver, keys=limits)] == [ids[0]]


async def test_a_rate_spaces_the_starts_of_a_key(driver: Driver) -> None:
    limits = {"q": KeyLimits(rate=Rate(2, per=10))}  # one start every 5 s
    await driver.tasks.task_insert_many([new(i, key="a") for i in range(5)] + [new(9, key="b")])
    assert per_key(await claim(driver, keys=limits)) == {"a": 1, "b": 1}
    assert await claim(driver, keys=limits, now=at(4.9)) == []
    assert per_key(await claim(driver, keys=limits, now=at(5))) == {"a": 1}
    assert await claim(driver, keys=limits, now=at(9)) == []
    assert per_key(await claim(driver, keys=limits, now=at(10))) == {"a": 1}


async def test_a_claim_tells_when_a_key_held_back_by_its_rate_may_start(driver: Driver) -> None:
    """The driver remembers, without a database read, the next start of a key whose due
    tasks its claim left waiting for the rate (an idle worker claims again then)."""
    limits = {"q": KeyLimits(rate=Rate(2, per=10))}  # one start every 5 s
    await driver.tasks.task_insert_many([new(i, key="a") for i in range(3)] + [new(9, key="b")])
    assert driver.claims.keys_wake_at(["q"], T0) is None
    assert per_key(await claim(driver, keys=limits)) == {"a": 1, "b": 1}
    assert driver.claims.keys_wake_at(["q"], T0) == at(5)  # "b" has nothing left: only "a" waits
    assert driver.claims.keys_wake_at(["other"], T0) is None
    assert per_key(await claim(driver, keys=limits, now=at(5))) == {"a": 1}
    assert driver.claims.keys_wake_at(["q"], at(5)) == at(10)
    assert driver.claims.keys_wake_at(["q"], at(11)) == at(10)  # past, but no claim looked yet
    assert per_key(await claim(driver, keys=limits, now=at(11))) == {"a": 1}
    assert await claim(driver, keys=limits, now=at(20)) == []
    assert driver.claims.keys_wake_at(["q"], at(20)) is None  # nothing waits


async def test_a_burst_allows_starts_at_once_after_a_quiet_spell(driver: Driver) -> None:
    limits = {"q": KeyLimits(rate=Rate(1, per=10, burst=3))}
    await driver.tasks.task_insert_many([new(i, key="a") for i in range(6)])
    assert len(await claim(driver, keys=limits)) == 3
    assert await claim(driver, keys=limits, now=at(9)) == []
    assert len(await claim(driver, keys=limits, now=at(10))) == 1


async def test_keys_take_turns_so_a_busy_key_does_not_starve_the_others(driver: Driver) -> None:
    await driver.tasks.task_insert_many([new(i, key="hot") for i in range(50)])
    await driver.tasks.task_insert_many([new(i, key=f"cold{i}") for i in range(10)])
    rows = await claim(driver, limit=11, keys=Q)
    assert per_key(rows) == {"hot": 1, **{f"cold{i}": 1 for i in range(10)}}
    assert per_key(await claim(driver, limit=5, keys=Q)) == {"hot": 5}


async def test_a_rescued_task_gives_its_slot_back_once(driver: Driver) -> None:
    limits = {"q": KeyLimits(concurrency=1)}
    ids = await driver.tasks.task_insert_many([new(i, key="a") for i in range(2)])
    [first] = await claim(driver, keys=limits)
    rescue = Outcome(first.key, OutcomeKind.RETRY, run_at=at(100), error="lease expired")
    result = await driver.claims.outcome_write_many([rescue], now=at(60), expired_before=at(60))
    assert result.applied == 1
    stale = await driver.claims.outcome_write_many([done(first)], now=at(61), worker_id="w1")
    assert stale.stale == (first.key,)  # the worker came back too late: fenced off
    [second] = await claim(driver, keys=limits, now=at(61))
    assert second.id == ids[1]
    assert await claim(driver, keys=limits, now=at(62)) == []


async def test_limits_set_at_run_time_override_the_declared_ones(driver: Driver) -> None:
    limits = {"q": KeyLimits(concurrency=3)}
    await driver.tasks.task_insert_many([new(i, key="a") for i in range(6)] + [new(9, key="b")])
    await driver.control.key_override_set(KeyOverride("a", concurrency=1))
    await driver.control.key_override_set(KeyOverride("b", queue="other", concurrency=5))
    assert per_key(await claim(driver, keys=limits)) == {"a": 1, "b": 1}
    assert [(o.key, o.queue, o.concurrency) for o in await driver.control.key_override_list()] == [
        ("a", None, 1),
        ("b", "other", 5),
    ]
    await driver.control.key_override_set(KeyOverride("a", queue="q", concurrency=2))
    assert per_key(await claim(driver, keys=limits)) == {"a": 1}  # this queue's wins
    assert await driver.control.key_override_clear("a", queue="q")
    assert await driver.control.key_override_clear("a")
    assert not await driver.control.key_override_clear("a")
    assert per_key(await claim(driver, keys=limits)) == {"a": 1}  # the declared 3


async def test_a_delayed_task_of_a_key_is_claimed_when_due(driver: Driver) -> None:
    ids = await driver.tasks.task_insert_many([new(1, key="a", run_at=at(30)), new(2, key="a")])
    assert [r.id for r in await claim(driver, keys=Q)] == [ids[1]]
    assert await claim(driver, keys=Q, now=at(29)) == []
    assert [r.id for r in await claim(driver, keys=Q, now=at(30))] == [ids[0]]


async def test_a_redriven_dead_letter_of_a_key_runs_again(driver: Driver) -> None:
    [task_id] = await driver.tasks.task_insert_many([new(1, key="a")])
    [row] = await claim(driver, keys=Q)
    await write(driver, Outcome(row.key, OutcomeKind.DEAD, error="poison"))
    assert await claim(driver, keys=Q) == []
    assert await driver.admin.dead_requeue([task_id], now=at(1)) == [task_id]
    assert [r.id for r in await claim(driver, keys=Q, now=at(1))] == [task_id]


async def test_the_busiest_keys_are_reported(driver: Driver) -> None:
    limits = {"q": KeyLimits(concurrency=1, rate=Rate(1, per=60))}
    await driver.tasks.task_insert_many(
        [new(i, key="a") for i in range(3)] + [new(9, key="b"), new(0)]
    )
    await driver.tasks.task_insert_many([new(5, key="later", run_at=at(600))])
    await claim(driver, keys=limits)
    stats = await driver.admin.key_stats(now=T0)
    assert [(s.queue, s.key, s.waiting, s.processing) for s in stats] == [
        ("q", "a", 2, 1),
        ("q", "b", 0, 1),
    ]
    assert stats[0].rate_limited_until == at(60)
    assert [s.key for s in await driver.admin.key_stats(now=T0, limit=1)] == ["a"]


async def test_neither_an_enqueue_nor_an_outcome_waits_for_a_claim_holding_a_key(
    driver: Driver,
) -> None:
    """A claim holds its keys' rows locked while it decides; an application's enqueue and a
    worker's outcome of the same key go through meanwhile (each leaves a hint), and the key
    is looked at again once the claim lets go. SQLite has one writer at a time, so there the
    question does not arise."""
    if not isinstance(driver, SqlDriver) or driver.capabilities.name == "sqlite":
        pytest.skip("row locks: PostgreSQL and MariaDB")
    limits = {"q": KeyLimits(concurrency=1)}
    first, second = await driver.tasks.task_insert_many([new(1, key="a"), new(2, key="a")])
    [running] = await claim(driver, keys=limits)
    assert running.id == first
    holder = await another(driver)
    assert isinstance(holder, SqlDriver)
    try:
        async with holder.db.begin() as conn:  # as a claim holds key "a"
            held = select(keys.c.id).where(keys.c.partition_key == "a").with_for_update()
            assert len((await conn.execute(held)).all()) == 1
            [third] = await asyncio.wait_for(driver.tasks.task_insert_many([new(3, key="a")]), 10)
            await asyncio.wait_for(write(driver, done(running)), 10)
    finally:
        await holder.close()
    assert [r.id for r in await claim(driver, keys=limits)] == [second]
    assert third > second


async def test_a_hint_for_a_key_a_claim_holds_waits_for_no_claim_and_arms_it_after(
    driver: Driver,
) -> None:
    """A claim locked an armed key and read its tasks before a new task of the key was
    committed; it will put the key aside (nothing left that it saw). The intake of the new
    task's hint does not wait for that claim: it leaves the key and keeps the hint, and a later
    intake arms the key once the claim has let go. Otherwise the new task would wait for
    another hint that never comes. (PostgreSQL.)"""
    if not isinstance(driver, SqlDriver) or driver.capabilities.name != "postgresql":
        pytest.skip("the intake of hints without waiting: PostgreSQL")
    limits = {"q": KeyLimits(concurrency=2)}
    [first] = await driver.tasks.task_insert_many([new(1, key="a")])
    async with driver.db.begin() as conn:  # key "a" armed
        await driver.claims.lanes.hints_take(conn, ["q"], T0)
    holder = await another(driver)
    intake = await another(driver)
    assert isinstance(holder, SqlDriver) and isinstance(intake, SqlDriver)
    try:
        async with holder.db.begin() as conn:  # a claim that read key "a" before the new task
            row = keys.c.partition_key == "a"
            held = select(keys.c.id, keys.c.ready_at).where(row).with_for_update()
            [(_id, ready_at)] = (await conn.execute(held)).all()
            assert ready_at is not None and ready_at <= T0
            [second] = await asyncio.wait_for(driver.tasks.task_insert_many([new(2, key="a")]), 10)
            # takes the hint first, and finds key "a" held: no wait, nothing claimed
            assert await asyncio.wait_for(claim(intake, keys=limits), 5) == []
            await conn.execute(keys.update().where(row).values(ready_at=None))  # put aside
        async with driver.db.connect() as conn:
            kept = (await conn.execute(select(key_hints.c.partition_key))).scalars().all()
        assert kept == ["a"]
    finally:
        await holder.close()
        await intake.close()
    claimed = await claim(driver, keys=limits)
    assert sorted(r.id for r in claimed) == [first, second]


async def test_an_outcome_does_not_wait_for_a_claim_holding_other_keys(driver: Driver) -> None:
    """A claim that locks the keys it serves holds nothing else: an outcome arming a key the
    claim did not take (here one whose slot was full, so that no claim looks at it) goes
    through while the claim is still deciding. (On MariaDB a claim that locked its keys along
    the index of ready keys also locked the entries it passed there, among them those of full
    keys; every outcome of such a key then waited for the claim to end.)"""
    if not isinstance(driver, SqlDriver) or driver.capabilities.name == "sqlite":
        pytest.skip("row locks: PostgreSQL and MariaDB")
    limits = {"q": KeyLimits(concurrency=1)}
    await driver.tasks.task_insert_many([new(1, key=f"a{i % 300}") for i in range(600)])
    running = await claim(driver, keys=limits, limit=300)  # full until their tasks end
    assert len(running) == 300
    await driver.tasks.task_insert_many([new(3, key=f"b{i}") for i in range(5)])
    holder = await another(driver)
    assert isinstance(holder, SqlDriver)
    try:
        async with holder.db.begin() as conn:  # the new keys armed
            await holder.claims.lanes.hints_take(conn, ["q"], T0)
        async with holder.db.begin() as conn:  # a claim deciding, its keys locked
            held, _stored = await holder.claims.lanes.keys_lock(
                conn, {"queues": ["q"], "now": T0, "limit": 3}
            )
            assert sorted(h.partition_key for h in held) == ["b0", "b1", "b2"]
            await asyncio.wait_for(write(driver, *map(done, running)), 10)
    finally:
        await holder.close()
    again = Counter(r.partition_key for r in await claim(driver, keys=limits, limit=400))
    assert {k: n for k, n in again.items() if k.startswith("a")} == {f"a{i}": 1 for i in range(300)}


async def test_an_outcome_arms_only_the_keys_that_have_a_ready_task_left(driver: Driver) -> None:
    """Arming a key whose last task just ended would only send a claim to look at it for
    nothing: the key with a task left is armed, the other is not (and gets no hint); a task
    enqueued later arms it again."""
    if not isinstance(driver, SqlDriver):
        pytest.skip("the rows of keys: SQL drivers")
    limits = {"q": KeyLimits(concurrency=1)}
    _a1, a2, _b1 = await driver.tasks.task_insert_many(
        [new(1, key="a"), new(2, key="a"), new(3, key="b")]
    )
    running = await claim(driver, keys=limits)
    assert per_key(running) == {"a": 1, "b": 1}
    await write(driver, *map(done, running))
    async with driver.db.begin() as conn:
        armed = dict((await conn.execute(select(keys.c.partition_key, keys.c.ready_at))).all())
        hinted = (await conn.execute(select(key_hints.c.partition_key))).scalars().all()
    assert armed["a"] is not None and armed["b"] is None, armed
    assert hinted == []
    [later] = await driver.tasks.task_insert_many([new(4, key="b")])
    assert sorted(r.id for r in await claim(driver, keys=limits)) == sorted([a2, later])


async def test_the_rows_of_idle_keys_are_forgotten_and_made_again_by_a_new_task(
    driver: Driver,
) -> None:
    """The cleaner forgets keys with no task left (their rows would otherwise pile up, one per
    customer ever seen), but not a key whose rate still spaces its next start."""
    limits = {"q": KeyLimits(concurrency=1), "paced": KeyLimits(rate=Rate(1, per=7200))}
    await driver.tasks.task_insert_many(
        [new(1, key="a"), new(2, key="b"), new(3, key="b"), new(4, queue="paced", key="p")]
    )
    first = await claim(driver, ["q", "paced"], keys=limits)
    assert per_key(first) == {"a": 1, "b": 1, "p": 1}
    await write(driver, *[done(r) for r in first if r.partition_key in ("a", "p")])
    assert per_key(await claim(driver, ["q", "paced"], keys=limits)) == {}  # a and p looked at
    assert await driver.sweeps.keys_forget_many(idle_before=T0, limit=10) == 0  # not idle yet

    # An hour later: "a" has no task and nothing ahead; "b" has tasks; "p"'s rate allows its
    # next start only two hours after the last one.
    assert await driver.sweeps.keys_forget_many(idle_before=at(3600), limit=10) == 1
    assert await driver.sweeps.keys_forget_many(idle_before=at(3600), limit=10) == 0

    [again] = await driver.tasks.task_insert_many([new(5, key="a", run_at=at(3600))])
    assert [r.id for r in await claim(driver, keys=limits, now=at(3600))] == [again]
    [paced] = await driver.tasks.task_insert_many([new(6, queue="paced", key="p", run_at=at(3600))])
    assert await claim(driver, ["paced"], keys=limits, now=at(3600)) == []  # the rate holds
    assert [r.id for r in await claim(driver, ["paced"], keys=limits, now=at(7200))] == [paced]


async def test_a_queue_rate_spaces_the_starts_of_the_whole_queue(driver: Driver) -> None:
    """A rate for a whole queue counts its tasks with a key and without; a queue without one
    claimed alongside is not held back; two claimers share the one budget."""
    rates = {"q": Rate(2, per=10)}  # one start every 5 s in all
    await driver.tasks.task_insert_many(
        [new(1), new(2), new(3, key="a"), new(4, key="b"), new(5, queue="other")]
    )

    async def take(now: datetime) -> list[TaskRow]:
        return await driver.claims.task_claim_many(
            ["q", "other"], 100, now=now, lease_until=now + LEASE, worker_id="w1",
            keys=Q, queue_rates=rates,
        )  # fmt: skip

    first = await take(T0)
    assert sorted(r.queue for r in first) == ["other", "q"]
    assert driver.claims.keys_wake_at(["q", "other"], T0) == at(5)
    assert await take(at(4.9)) == []
    other = await another(driver)
    try:
        both = await asyncio.gather(
            take(at(5)),
            other.claims.task_claim_many(
                ["q"], 100, now=at(5), lease_until=at(35), worker_id="w2",
                keys=Q, queue_rates=rates,
            ),
        )  # fmt: skip
    finally:
        if other is not driver:
            await other.close()  # type: ignore[attr-defined]
    assert sum(len(b) for b in both) == 1
    assert len(await take(at(10))) == 1
    assert len(await take(at(15))) == 1
    assert await take(at(100)) == []  # all five started
