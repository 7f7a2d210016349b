"""Deferred publish (`publish` = "deferred") on every database, without Spark or a JVM.

The commit records which attempts' rows it commits; publishers (workers, the cleaner) move
them into the hot table in batches. Each test checks one promise through what a worker can
claim and what is left in the staging tables: nothing claimable before the commit, every
committed row claimable exactly once after publishers ran until none waits, whatever
publishers crash or run at once, dedup evaluated at publish.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import Connection, func, select

from cleaner import ServiceSweep
from tests.integration.test_staging_conformance import (
    GROUPS,
    T0,
    TARGET,
    at,
    attempt,
    claim,
    claim_all,
    claimed_values,
    keyed_attempt,
    ledger,
    new,
    open_writes,
    sorted_values,
    staged_rows,
    table_rows,
)
from txtasks import App
from txtasks.driver import MemoryDriver, SqlDriver, driver_for_url
from txtasks.schema.tables import deferred, key_hints, stages
from txtasks.spark import DeferredPublisher
from txtasks.spark.staging import (
    SqlStaging,
    StagedRowsMissing,
    StageTarget,
    TopicTarget,
    publish_batch,
    purge_abandoned,
    staging_for,
)
from txtasks.spark.staging.publisher import PublishTotals, publish_pending
from txtasks.testing import run_until_empty


async def publish_all(driver: SqlDriver, limit: int = 2, woken: list[str] | None = None) -> Any:
    """Run publish batches of `limit` rows until none waits."""
    wake = (woken if woken is not None else []).append
    return await publish_pending(driver, clock=lambda: at(5), wake=wake, limit=limit)


def waiting(staging: SqlStaging) -> dict[str, str]:
    """The attempts of deferred commits not all published: stage id -> commit id."""
    query = select(stages.c.stage_id, deferred.c.commit_id).join_from(
        deferred, stages, deferred.c.stage == stages.c.id
    )
    return dict(table_rows(staging, query))


def stage_two(staging: SqlStaging, key: str = "w") -> None:
    """Open write `key` and stage two attempts: values 0-4, due at T0, and 5-6, due when
    published."""
    staging.open(key, T0)
    staging.stage(key, f"{key}.a", [attempt([0, 1, 2]), attempt([3, 4])])
    staging.stage(key, f"{key}.b", [attempt([5, 6], run_at=None)])


# -- the commit ---------------------------------------------------------------------------------


async def test_a_deferred_commit_publishes_nothing_and_publishers_publish_everything_once(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    stage_two(staging)
    staging.open("other", T0)
    staging.stage("other", "other.a", [attempt(["not committed"])])

    assert staging.commit_deferred("c", "w", {"w.a": 5, "w.b": 2}, TARGET, now=at(1)) == 7

    assert await claim(sql) == []  # committed, not published yet
    assert ledger(staging) == {"c": 7}
    assert waiting(staging) == {"w.a": "c", "w.b": "c"}
    assert open_writes(staging) == {"other"}  # the commit closed its write
    woken: list[str] = []
    done = await publish_all(sql, limit=2, woken=woken)

    # batches of 2 rows: w.a takes 3 (the last one short), w.b 2 (the second one empty)
    assert done == PublishTotals(rows=7, tasks=7, batches=5)
    assert set(woken) == {"q"}
    rows = await claim(sql)
    assert sorted(json.loads(r.payload)["v"] for r in rows) == list(range(7))
    # created when published (the publishers' clock: at(5)), and due then unless given a time
    assert {(r.task_name, r.max_attempts, r.created_at) for r in rows} == {
        (TARGET.task_name, TARGET.max_attempts, at(5))
    }
    assert sorted(r.run_at for r in rows) == [T0] * 5 + [at(5)] * 2
    assert waiting(staging) == {}
    assert staged_rows(staging) == {"other.a": 1}  # another write's rows wait for its commit
    assert await publish_all(sql) == PublishTotals()  # nothing waits: one probe


async def test_a_deferred_commit_checks_the_rows_and_drops_the_losers_as_an_atomic_one(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    stage_two(staging)
    staging.open("w", T0)
    staging.stage("w", "w.loser", [attempt(["x", "y"])])

    with pytest.raises(StagedRowsMissing, match=r"attempt w\.a staged 6 rows but 5 are left"):
        staging.commit_deferred("c", "w", {"w.a": 6, "w.b": 2}, TARGET, now=T0)
    assert ledger(staging) == {} and waiting(staging) == {}

    assert staging.commit_deferred("c", "w", {"w.a": 5, "w.b": 2, "w.none": 0}, TARGET, now=T0)
    assert staged_rows(staging) == {"w.a": 5, "w.b": 2}  # the loser's rows: ended
    assert waiting(staging) == {"w.a": "c", "w.b": "c"}  # an attempt without rows: no row
    await publish_all(sql, limit=100)
    assert await claimed_values(sql) == list(range(7))


async def test_a_repeated_deferred_commit_id_publishes_nothing_twice(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    stage_two(staging, "stream")
    assert staging.commit_deferred(
        "stream:7", "stream", {"stream.a": 5, "stream.b": 2}, TARGET, now=T0
    )

    staging.open("stream", T0)  # the restarted stream replays micro-batch 7
    staging.stage("stream", "stream.c", [attempt([0, 1, 2, 3, 4, 5, 6])])
    assert staging.commit_deferred("stream:7", "stream", {"stream.c": 7}, TARGET, now=T0) is None
    assert staging.commit("stream:7", "stream", {"stream.c": 7}, TARGET, now=T0) is None

    assert staged_rows(staging) == {"stream.a": 5, "stream.b": 2}  # the replay's are discarded
    await publish_all(sql)
    assert await claimed_values(sql) == list(range(7))
    assert ledger(staging) == {"stream:7": 7}


async def test_a_streams_later_micro_batches_leave_its_unpublished_ones_alone(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    """A stream stages every micro-batch under one write: the commits and aborts of the next
    ones neither publish, nor delete, nor count the rows of a deferred one still waiting."""
    stage_two(staging, "s")
    assert staging.commit_deferred("s:1", "s", {"s.a": 5, "s.b": 2}, TARGET, now=T0) == 7
    staging.open("s", T0)
    staging.stage("s", "s.c", [attempt([7, 8])])
    assert staging.abort("s") == 1  # micro-batch 2 aborted: its attempt ended
    staging.open("s", T0)
    staging.stage("s", "s.d", [attempt([9])])
    staging.stage("s", "s.loser", [attempt(["lost"])])

    assert staging.commit("s:2", "s", {"s.d": 1}, TARGET, now=T0) == {"q": 1}  # atomic
    assert await claimed_values(sql) == [9]
    staging.open("s", T0)
    staging.stage("s", "s.e", [attempt([10])])
    assert staging.commit_deferred("s:3", "s", {"s.e": 1}, TARGET, now=T0) == 1

    assert staged_rows(staging) == {"s.a": 5, "s.b": 2, "s.e": 1}
    await publish_all(sql)
    assert await claimed_values(sql) == sorted_values([*range(7), 10])
    assert staged_rows(staging) == {} and waiting(staging) == {}


async def test_the_purge_leaves_the_rows_of_a_deferred_commit_to_its_publishers(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    stage_two(staging)
    staging.stage("w", "w.abandoned", [attempt(["x"])], now=at(-60))
    staging.commit_deferred("c", "w", {"w.a": 5, "w.b": 2}, TARGET, now=T0)
    staging.open("old", T0)
    staging.stage("old", "old.a", [attempt(["y", "z"])], now=at(-60))

    # the rows of old.a, and of w.abandoned (ended by the commit, which was not given it)
    assert await purge_abandoned(sql, before=at(3600), limit=100) == 3

    assert staged_rows(staging) == {"w.a": 5, "w.b": 2}
    await publish_all(sql)
    assert await claimed_values(sql) == list(range(7))


# -- what a publish writes ------------------------------------------------------------------------


async def test_dedup_is_evaluated_at_publish_and_a_live_task_wins(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    [before] = await sql.tasks.task_insert_many([new("live before the commit", dedup_key="k1")])
    staging.open("w", T0)
    staging.stage("w", "w.a", [attempt(["a", "b", "c"], dedup=["k1", "k2", "k2"])])
    staging.stage("w", "w.b", [attempt(["d", "e", "f"], dedup=["k2", "k3", None])])
    target = StageTarget("q", "t", 1, dedup=True)
    staging.commit_deferred("c", "w", {"w.a": 3, "w.b": 3}, target, now=T0)
    [after] = await sql.tasks.task_insert_many([new("live after the commit", dedup_key="k3")])

    done = await publish_all(sql, limit=2)

    assert (done.rows, done.tasks) == (6, 2)  # k2 once (whichever attempt came first), None
    rows = await claim(sql)
    published = {
        r.dedup_key: json.loads(r.payload)["v"] for r in rows if r.id not in (before, after)
    }
    assert published.keys() == {"k2", None} and published["k2"] in "bcd"
    assert published[None] == "f"
    assert {r.dedup_key for r in rows if r.id in (before, after)} == {"k1", "k3"}


async def test_a_keyed_deferred_write_hints_each_key_it_publishes(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    staging.open("w", T0)
    rows = [("a", None, "x"), ("b", None, "y"), ("c", None, "x"), ("d", None, None)]
    staging.stage("w", "w.a", [keyed_attempt(rows)])
    staging.commit_deferred("c", "w", {"w.a": 4}, StageTarget("q", "t", 1, keyed=True), now=T0)
    assert table_rows(staging, select(key_hints.c.partition_key)) == []

    await publish_all(sql, limit=10)

    hinted = table_rows(staging, select(key_hints.c.queue, key_hints.c.partition_key))
    assert sorted(set(hinted)) == [("q", "x"), ("q", "y")]
    claimed = await claim(sql)
    assert Counter(r.partition_key for r in claimed) == {"x": 2, "y": 1, None: 1}


async def test_a_deferred_topic_write_reaches_the_groups_subscribed_at_publish(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    await sql.topics.subscription_set_many(GROUPS[:1], now=T0)
    stage_two(staging)
    staging.commit_deferred("c", "w", {"w.a": 5, "w.b": 2}, TopicTarget("order.created"), now=T0)
    await sql.topics.subscription_set_many(
        GROUPS[1:], now=T0
    )  # after the commit, before the publish

    done = await publish_all(sql, limit=3)

    assert (done.rows, done.tasks) == (7, 21)
    claimed = await claim_all(sql)
    by_group = Counter(json.loads(r.headers or "{}")["txtasks-group"] for r in claimed)
    assert by_group == {"billing": 7, "audit": 7, "shipping": 7}


# -- publishers: crashes and concurrency ----------------------------------------------------------

#: A publisher that kills itself (SIGKILL) mid-batch: after its INSERT of the tasks, or after the
#: whole batch but before the COMMIT.
KILLED_PUBLISHER = """
import asyncio, os, signal, sys
from datetime import datetime
from txtasks.driver import driver_for_url
from txtasks.spark import staging
from txtasks.spark.staging import publisher

url, where = sys.argv[1], sys.argv[2]
def die(original):
    def run(*args):
        original(*args)
        os.kill(os.getpid(), signal.SIGKILL)
    return run
if where == "after_insert":
    staging.SqlStaging.publish_rows = die(staging.SqlStaging.publish_rows)
else:
    staging.publish_batch = die(staging.publish_batch)
driver = driver_for_url(url)
asyncio.run(publisher.publish_pending(driver, clock=datetime.utcnow, wake=print, limit=3))
"""


@pytest.mark.parametrize("where", ["after_insert", "before_commit"])
async def test_a_publisher_killed_mid_batch_leaves_it_to_the_next_one(
    sql: SqlDriver, staging: SqlStaging, database_url: str, where: str
) -> None:
    stage_two(staging)
    staging.commit_deferred("c", "w", {"w.a": 5, "w.b": 2}, TARGET, now=T0)

    killed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", KILLED_PUBLISHER, database_url, where],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert killed.returncode == -9, killed.stderr
    assert await claim(sql) == []  # the batch rolled back
    assert staged_rows(staging) == {"w.a": 5, "w.b": 2}
    await publish_all(sql, limit=3)
    assert await claimed_values(sql) == list(range(7))
    assert staged_rows(staging) == {} and waiting(staging) == {}


async def test_concurrent_publishers_publish_every_row_once(
    sql: SqlDriver, staging: SqlStaging, database_url: str
) -> None:
    staging.open("w", T0)
    stages = {f"w.{n}": 10 for n in range(6)}
    for n, stage_id in enumerate(stages):
        staging.stage("w", stage_id, [attempt(list(range(n * 10, n * 10 + 10)))])
    staging.commit_deferred("c", "w", stages, TARGET, now=T0)
    others = [driver_for_url(database_url) for _ in range(3)]
    try:
        done = await asyncio.gather(*(publish_all(d, limit=4) for d in [sql, *others]))
    finally:
        await asyncio.gather(*(d.close() for d in others))

    assert sum(d.rows for d in done) == 60
    assert await claimed_values(sql) == sorted_values(range(60))
    assert staged_rows(staging) == {} and waiting(staging) == {}


async def test_a_publisher_skips_the_attempt_another_one_is_publishing(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    """Publisher A holds a batch of attempt w.a open; B publishes everything else meanwhile
    without waiting for A, then A commits: every row once."""
    if sql.capabilities.name == "sqlite":
        pytest.skip("SQLite runs one writer at a time: B waits for A")
    stage_two(staging)
    staging.commit_deferred("c", "w", {"w.a": 5, "w.b": 2}, TARGET, now=T0)
    holder, inside, go = staging_for(sql), threading.Event(), threading.Event()
    original = holder.publish_rows

    def hold(conn: Connection, rows_of: Any, target: Any, now: Any) -> dict[str, int]:
        published = original(conn, rows_of, target, now)
        inside.set()
        assert go.wait(60)
        return published

    holder.publish_rows = hold  # type: ignore[method-assign]

    def a_batch() -> Any:
        with sql.db.sync_engine.begin() as conn:
            return publish_batch(holder, conn, 100, at(5))

    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(a_batch)
        try:
            assert await asyncio.to_thread(inside.wait, 60)
            done = await publish_all(sql, limit=100)  # B: never waits for A's lock
        finally:
            go.set()
        assert held.result(60).rows == 5

    assert done.rows == 2
    assert await claimed_values(sql) == list(range(7))
    assert staged_rows(staging) == {} and waiting(staging) == {}


async def test_a_publish_waits_for_nothing_on_the_in_memory_driver() -> None:
    done = await publish_pending(MemoryDriver(), clock=lambda: T0, wake=print)
    assert done == PublishTotals()


# -- who publishes: the cleaner and the workers ----------------------------------------------------


async def test_the_cleaners_publisher_publishes_and_wakes_the_queues(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    from tests.recording import Recording

    doorbell = Recording()
    app = App("publish-test", driver=sql, clock=lambda: at(5), notifier=doorbell)
    stage_two(staging)
    staging.commit_deferred("c", "w", {"w.a": 5, "w.b": 2}, TARGET, now=T0)
    sweep = ServiceSweep(app, DeferredPublisher(batch_size=2))

    result = await sweep.run_once()

    assert (result.rows, result.tasks) == (7, 7)
    assert {queue for queue, _ in doorbell.calls} == {"q"}
    assert await claimed_values(sql) == list(range(7))
    assert (await sweep.run_once()).busy is False


async def test_a_worker_publishes_deferred_writes_and_runs_their_tasks_once(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    app = App("publish-test", driver=sql, clock=lambda: at(10))
    ran: list[int] = []
    app.task(name=TARGET.task_name, queue="q")(lambda payload: ran.append(payload["v"]))
    stage_two(staging)
    staging.commit_deferred("c", "w", {"w.a": 5, "w.b": 2}, TARGET, now=T0)

    await run_until_empty(app)

    assert sorted_values(ran) == list(range(7))
    assert waiting(staging) == {}
    with sql.db.sync_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(deferred)).scalar() == 0


@pytest.mark.parametrize("off", ["services", "publish_deferred"])
async def test_a_worker_without_the_publisher_leaves_deferred_writes_to_others(
    sql: SqlDriver, staging: SqlStaging, off: str
) -> None:
    """`services={"publisher": None}`, or the deprecated `publish_deferred=False`."""
    app = App("publish-test", driver=sql, clock=lambda: at(10))
    app.task(name=TARGET.task_name, queue="q")(lambda payload: None)
    stage_two(staging)
    staging.commit_deferred("c", "w", {"w.a": 5, "w.b": 2}, TARGET, now=T0)

    if off == "services":
        stats = await run_until_empty(app, services={"publisher": None})
    else:
        with pytest.warns(DeprecationWarning, match="publish_deferred is deprecated"):
            stats = await run_until_empty(app, publish_deferred=False)

    assert stats.outcomes == {}
    assert set(waiting(staging).values()) == {"c"}
