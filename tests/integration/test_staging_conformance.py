"""The staging layer (`txtasks.spark.staging`) on every database, without Spark or a JVM.

What the Spark data source relies on, driven the way it drives it: a write is opened, partition
attempts stage Arrow tables under stage ids of their own, and the commit (once per commit id)
makes exactly the reported attempts' rows claimable, or the abort deletes them. Each test checks
one promise, through what a worker can claim and what is left in the staging tables.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from sqlalchemy import delete, func, select

from txtasks.driver import MemoryDriver, SqlDriver
from txtasks.errors import ConfigurationError
from txtasks.schema.tables import commits, key_hints, staged, stages, topic_drops, writes
from txtasks.spark.staging import (
    DROPPED,
    STAGED_COLUMNS,
    STAGED_OPTIONAL,
    Backlog,
    SqlStaging,
    StagedRowsMissing,
    StageTarget,
    TopicTarget,
    WriteClosed,
    purge_abandoned,
    staging_for,
)
from txtasks.types import JSON_CONTENT_TYPE, NewTask, Subscription, TaskRow, TaskState

T0 = datetime(2030, 1, 2, 3, 4, 5, 678901)
TARGET = StageTarget("q", "staged.task", max_attempts=4)
#: Payload values that need quoting or escaping on the way in (CSV, SQL literals).
AWKWARD = ["it's", 'say "hi"', "back\\slash", "comma, newline\n", "tab\tcr\r", "é ü 日本", ""]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def new(value: str, **fields: Any) -> NewTask:
    """A task inserted by the application (created an hour before T0)."""
    payload = json.dumps({"v": value}).encode()
    return NewTask("q", "app.task", payload, JSON_CONTENT_TYPE, 0, T0, 5, at(-3600), **fields)


async def claim(driver: SqlDriver, limit: int = 1000) -> list[TaskRow]:
    """Claim up to `limit` ready tasks of queue "q", after T0."""
    now = at(10)
    return await driver.claims.task_claim_many(
        ["q"], limit, now=now, lease_until=at(40), worker_id="w"
    )


def attempt(
    values: Sequence[Any],
    *,
    dedup: Sequence[str | None] | None = None,
    run_at: datetime | None = T0,
) -> pa.Table:
    """An attempt's staged table, as the Spark encoder builds it: payloads {"v": value}, each
    due at `run_at` (None: no run_at column, due when published), with dedup keys when given."""
    count = len(values)
    columns = {
        "payload": pa.array([json.dumps({"v": v}).encode() for v in values], pa.large_binary()),
        "priority": pa.array(range(count), pa.int32()),
    }
    if run_at is not None:
        columns["run_at"] = pa.array([run_at] * count, pa.timestamp("us"))
    if dedup is not None:
        columns["dedup_key"] = pa.array(dedup, pa.large_string())
    assert list(columns) == [*STAGED_COLUMNS, *STAGED_OPTIONAL][: len(columns)]
    return pa.table(list(columns.values()), names=list(columns))


async def claimed_values(driver: SqlDriver) -> list[Any]:
    """Claim every ready task; their payload values, sorted by repr."""
    rows = await claim(driver)
    return sorted((json.loads(r.payload)["v"] for r in rows), key=repr)


def staged_rows(staging: SqlStaging, *, ended: bool = False) -> dict[str, int]:
    """Rows left in the staged table per stage id of an attempt of a write (not committed, or
    committed in deferred mode); with `ended`, of an attempt ended (`DROPPED`: no write reads
    them, the purge deletes them)."""
    kept = stages.c.write_key == DROPPED if ended else stages.c.write_key != DROPPED
    query = (
        select(stages.c.stage_id, func.count())
        .select_from(staged.join(stages, staged.c.stage == stages.c.id))
        .where(kept)
        .group_by(stages.c.stage_id)
    )
    with staging.driver.sync_engine.connect() as conn:
        return {stage_id: int(n) for stage_id, n in conn.execute(query).all()}


def all_staged(staging: SqlStaging) -> tuple[int, int]:
    """Every row of the staged table and of the attempts table, whatever their write."""
    with staging.driver.sync_engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(staged)).scalar_one()
        return int(rows), int(conn.execute(select(func.count()).select_from(stages)).scalar_one())


def ledger(staging: SqlStaging) -> dict[str, int]:
    """The commit ledger: tasks published per commit id."""
    with staging.driver.sync_engine.connect() as conn:
        rows = conn.execute(select(commits.c.commit_id, commits.c.tasks)).all()
        return {commit_id: int(n) for commit_id, n in rows}


def open_writes(staging: SqlStaging) -> set[str]:
    with staging.driver.sync_engine.connect() as conn:
        return set(conn.execute(select(writes.c.write_key)).scalars())


def sorted_values(values: Iterable[Any]) -> list[Any]:
    return sorted(values, key=repr)


# -- commit -------------------------------------------------------------------------------------


async def test_a_commit_makes_exactly_the_staged_rows_of_its_write_claimable(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    staging.open("w1", T0)
    staging.open("w2", T0)
    assert staging.stage("w1", "w1.a", [attempt([0, 1]), attempt([2])]) == 3
    assert staging.stage("w1", "w1.b", [attempt(AWKWARD, run_at=None)]) == len(AWKWARD)
    assert staging.stage("w2", "w2.a", [attempt(["other write"])]) == 1
    assert await claim(sql) == []  # staged: invisible to workers

    published = staging.commit("c1", "w1", {"w1.a": 3, "w1.b": len(AWKWARD)}, TARGET, now=at(1))

    assert published == {"q": 3 + len(AWKWARD)}
    rows = await claim(sql)
    assert sorted_values(json.loads(r.payload)["v"] for r in rows) == sorted_values(
        [0, 1, 2, *AWKWARD]
    )
    # created by the commit, and due then unless given a time (w1.b's rows have none)
    fixed = {(r.task_name, r.max_attempts, r.content_type, r.created_at) for r in rows}
    assert fixed == {(TARGET.task_name, TARGET.max_attempts, JSON_CONTENT_TYPE, at(1))}
    assert sorted(r.run_at for r in rows) == [T0] * 3 + [at(1)] * len(AWKWARD)
    assert sorted(r.priority for r in rows) == sorted([0, 1, 0, *range(len(AWKWARD))])
    assert ledger(staging) == {"c1": 3 + len(AWKWARD)}
    assert staged_rows(staging) == {"w2.a": 1}  # another write's rows wait for its commit
    assert open_writes(staging) == {"w2"}  # the commit closed its write


def test_staged_rows_keep_every_value_of_every_column_exactly(staging: SqlStaging) -> None:
    """Each dialect sends staged rows in its own bulk format (PostgreSQL binary COPY, MariaDB
    multi-row INSERTs or LOAD DATA): every column comes back as it was given, nulls, bounds
    and characters that a format must escape included."""
    keys = [*AWKWARD, None, "k" * 255]
    count = len(keys)
    # payloads are JSON text (UTF-8) as the encoder makes them; these are what formats escape
    odd_bytes = [b"\\x41", b"back\\slash \\\\", "é ü 日本 😀".encode(), b"", b'{"v":"\\n\t"}']
    payloads = [odd_bytes[i % len(odd_bytes)] for i in range(count)]
    priorities = [(-(2**31), 2**31 - 1, 0, -1)[i % 4] for i in range(count)]
    times = [
        datetime(1999, 12, 31, 23, 59, 59, 999999),
        datetime(2000, 1, 1),
        T0,
        datetime(9999, 12, 31, 23, 59, 59, 999999),
        None,
    ]
    run_at = [times[i % len(times)] for i in range(count)]
    batch = pa.table(
        {
            "payload": pa.array(payloads, pa.large_binary()),
            "priority": pa.array(priorities, pa.int32()),
            "run_at": pa.array(run_at, pa.timestamp("us")),
            "dedup_key": pa.array(keys, pa.large_string()),
            "partition_key": pa.array(list(reversed(keys)), pa.large_string()),
        }
    )
    staging.open("w", T0)
    assert staging.stage("w", "w.a", [batch.slice(0, 3), batch.slice(3)]) == count

    c = staged.c
    columns = (c.n, c.payload, c.priority, c.run_at, c.dedup_key, c.partition_key)
    with staging.driver.sync_engine.connect() as conn:
        found = [tuple(row) for row in conn.execute(select(*columns).order_by(c.n))]
    expected = zip(
        range(count),
        payloads,
        priorities,
        run_at,
        keys,
        reversed(keys),
        strict=True,
    )
    assert found == [tuple(row) for row in expected]


async def test_a_commit_with_dedup_keys_publishes_each_key_once_and_not_over_a_live_task(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    [live] = await sql.tasks.task_insert_many([new("live", dedup_key="k1")])
    staging.open("w", T0)
    keys = ["k1", "k2", "k2", "k3", None]
    staging.stage("w", "w.a", [attempt(["a", "b", "c", "d", "e"], dedup=keys)])

    published = staging.commit("c", "w", {"w.a": 5}, StageTarget("q", "t", 1, dedup=True), now=T0)

    assert published == {"q": 3}
    rows = await claim(sql)
    by_key = {r.dedup_key: json.loads(r.payload)["v"] for r in rows if r.id != live}
    assert by_key == {"k2": "b", "k3": "d", None: "e"}  # a repeated key: its first row
    live_row = await sql.tasks.task_get(live)
    assert live_row is not None and live_row.payload == new("live").payload
    assert staged_rows(staging) == {}


async def test_a_commit_missing_staged_rows_publishes_nothing(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    staging.open("w", T0)
    staging.stage("w", "w.a", [attempt([0, 1, 2, 3, 4])])

    with pytest.raises(StagedRowsMissing, match=r"attempt w\.a staged 6 rows but 5 are left"):
        staging.commit("c", "w", {"w.a": 6}, TARGET, now=T0)
    with pytest.raises(StagedRowsMissing, match=r"attempt w\.ghost staged 2 rows but 0 are left"):
        staging.commit("c", "w", {"w.a": 5, "w.ghost": 2}, TARGET, now=T0)

    assert await claimed_values(sql) == []
    assert ledger(staging) == {}  # the commit id was not spent...
    assert staged_rows(staging) == {"w.a": 5}  # ...nor the rows deleted; the write is closed
    with pytest.raises(WriteClosed):
        staging.stage("w", "w.b", [attempt([5])])
    # an attempt that staged no rows reports 0, and the commit goes through
    assert staging.commit("c", "w", {"w.a": 5, "w.empty": 0}, TARGET, now=T0) == {"q": 5}
    assert await claimed_values(sql) == [0, 1, 2, 3, 4]


def lose_row(staging: SqlStaging, stage_id: str, n: int) -> None:
    """Delete row `n` of an attempt behind the staging's back (as the purge or a lost write
    would)."""
    number = select(stages.c.id).where(stages.c.stage_id == stage_id).scalar_subquery()
    with staging.driver.sync_engine.begin() as conn:
        conn.execute(delete(staged).where(staged.c.stage == number, staged.c.n == n))


@pytest.mark.parametrize(
    "target",
    [
        TARGET,
        StageTarget("q", "t", 1, dedup=True),
        TopicTarget("order.created"),  # fanned out to the groups subscribed below
        TopicTarget("nobody.listens"),  # no group: the rows would be dropped and counted
    ],
    ids=["task", "dedup", "topic", "topic-no-group"],
)
async def test_a_commit_whose_attempt_lost_a_row_in_its_middle_publishes_nothing(
    sql: SqlDriver, staging: SqlStaging, target: StageTarget | TopicTarget
) -> None:
    """The attempt's last row is there (its number is as reported): the publish itself finds
    the row short, and the commit rolls back."""
    await sql.topics.subscription_set_many(GROUPS, now=T0)
    staging.open("w", T0)
    staging.stage("w", "w.a", [attempt([0, 1]), attempt([2, 3, 4])])
    staging.stage("w", "w.b", [attempt([5, 6])])
    lose_row(staging, "w.a", 2)

    with pytest.raises(StagedRowsMissing, match=r"attempt w\.a staged 5 rows but 4 are left"):
        staging.commit("c", "w", {"w.a": 5, "w.b": 2}, target, now=T0)

    assert await claim_all(sql) == []
    assert ledger(staging) == {}
    assert table_rows(staging, select(topic_drops.c.id)) == []
    assert table_rows(staging, select(key_hints.c.queue)) == []
    assert staged_rows(staging) == {"w.a": 4, "w.b": 2}  # nothing ended: the write can retry


async def test_a_row_lost_after_the_commit_checked_its_attempts_publishes_nothing(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    """A row deleted by another transaction (the purge of an old write's rows) between the
    commit's check and its publish: the publish reads the rows as they are then, so its own
    row count is the check that holds (a count before it would have passed, and the write
    been published short of a row)."""
    from sqlalchemy import event

    if sql.capabilities.name == "sqlite":
        pytest.skip("SQLite runs one writer at a time: the commit excludes every change")
    staging.open("w", T0)
    staging.stage("w", "w.a", [attempt([0, 1, 2, 3, 4])])
    engine = staging.driver.sync_engine
    lost: list[str] = []

    def lose(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO TXTASKS_TASKS") and not lost:
            lost.append(statement)
            lose_row(staging, "w.a", 2)  # another connection; it commits at once

    event.listen(engine, "before_cursor_execute", lose)
    try:
        with pytest.raises(StagedRowsMissing, match=r"attempt w\.a staged 5 rows but 4 are left"):
            staging.commit("c", "w", {"w.a": 5}, TARGET, now=T0)
    finally:
        event.remove(engine, "before_cursor_execute", lose)
    assert lost
    assert await claim_all(sql) == []
    assert ledger(staging) == {}


# -- abort and closed writes ----------------------------------------------------------------------


async def test_an_abort_deletes_what_its_write_staged(sql: SqlDriver, staging: SqlStaging) -> None:
    staging.open("w", T0)
    staging.open("other", T0)
    staging.stage("w", "w.a", [attempt([0, 1, 2])])
    staging.stage("w", "w.b", [attempt([3, 4])])
    staging.stage("other", "other.a", [attempt([5])])

    assert staging.abort("w") == 2  # attempts ended: the purge deletes their rows

    assert staged_rows(staging) == {"other.a": 1}
    assert staged_rows(staging, ended=True) == {"w.a": 3, "w.b": 2}
    assert open_writes(staging) == {"other"}
    assert ledger(staging) == {}
    assert await claimed_values(sql) == []


def test_staging_under_an_empty_write_key_is_refused(staging: SqlStaging) -> None:
    """The empty write key is that of ended attempts, whose rows no write reads."""
    staging.open(DROPPED, T0)
    with pytest.raises(ConfigurationError, match="a write key must not be empty"):
        staging.stage(DROPPED, "x.a", [attempt([0])])
    assert staged_rows(staging, ended=True) == {}


def test_staging_into_a_closed_write_is_refused(staging: SqlStaging) -> None:
    with pytest.raises(WriteClosed, match="write never was committed or aborted already"):
        staging.stage("never", "never.a", [attempt([0])])

    staging.open("aborted", T0)
    staging.abort("aborted")
    with pytest.raises(WriteClosed, match=r"aborted already: attempt aborted\.a staged no row"):
        staging.stage("aborted", "aborted.a", [attempt([0, 1, 2])])

    staging.open("done", T0)
    staging.stage("done", "done.a", [attempt([0, 1])])
    staging.commit("c", "done", {"done.a": 2}, TARGET, now=T0)
    with pytest.raises(WriteClosed, match=r"attempt done\.b staged no row"):
        staging.stage("done", "done.b", [attempt([0, 1, 2, 3])])
    assert staged_rows(staging) == {}

    staging.open("done", T0)  # a stream's next micro-batch opens its write again
    assert staging.stage("done", "done.c", [attempt([7])]) == 1


async def test_a_partition_slow_between_its_batches_blocks_no_other_writer(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    """Spark computes a partition's batches as the staging asks for them: while the next one
    is slow to come, an application enqueues (on SQLite too, whose one write lock a
    transaction takes as it begins), and the partition then stages the rest."""
    staging.open("w", T0)
    slow, resume = threading.Event(), threading.Event()

    def batches() -> Iterator[pa.Table]:
        yield attempt([0, 1])
        slow.set()
        assert resume.wait(60), "the test never let the partition go on"
        yield attempt([2])

    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1) as pool:
        staged_ = loop.run_in_executor(pool, staging.stage, "w", "w.a", batches())
        try:
            assert await loop.run_in_executor(None, slow.wait, 60)
            # waits for the busy timeout, then fails, if the partition holds SQLite's lock
            [enqueued] = await sql.tasks.task_insert_many([new("meanwhile")])
        finally:
            resume.set()
        assert await staged_ == 3

    assert staged_rows(staging) == {"w.a": 3}
    assert [r.id for r in await claim(sql)] == [enqueued]
    assert staging.commit("c", "w", {"w.a": 3}, TARGET, now=T0) == {"q": 3}
    assert await claimed_values(sql) == [0, 1, 2]


async def test_an_attempt_whose_write_ends_between_its_batches_leaves_no_row(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    """An attempt that Spark stopped waiting for staged a batch, then its write was committed
    (with another attempt of the partition): its next batch is refused, and the commit deleted
    the batch before."""
    staging.open("w", T0)
    staging.stage("w", "w.winner", [attempt(["w0", "w1"])])

    def batches() -> Iterator[pa.Table]:
        yield attempt(["l0", "l1"])
        assert staging.commit("c", "w", {"w.winner": 2}, TARGET, now=T0) == {"q": 2}
        yield attempt(["l2"])

    with pytest.raises(WriteClosed, match=r"this batch's 1 rows were not staged .*the 2 rows"):
        staging.stage("w", "w.late", batches())

    assert staged_rows(staging) == {}
    assert await claimed_values(sql) == ["w0", "w1"]


# -- exactly once -------------------------------------------------------------------------------


async def test_a_repeated_commit_id_enqueues_nothing_twice(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    staging.open("stream", T0)
    staging.stage("stream", "stream.a", [attempt([0, 1, 2])])
    assert staging.commit("stream:7", "stream", {"stream.a": 3}, TARGET, now=T0) == {"q": 3}

    staging.open("stream", T0)  # the restarted stream replays micro-batch 7
    staging.stage("stream", "stream.b", [attempt([0, 1, 2])])
    assert staging.commit("stream:7", "stream", {"stream.b": 3}, TARGET, now=T0) is None

    assert await claimed_values(sql) == [0, 1, 2]
    assert staged_rows(staging) == {}  # the replay's rows are discarded...
    assert staged_rows(staging, ended=True) == {"stream.a": 3, "stream.b": 3}  # ...by the purge
    assert ledger(staging) == {"stream:7": 3}
    assert staging.commit_seen("stream:7") and not staging.commit_seen("stream:8")

    staging.open("stream", T0)
    staging.stage("stream", "stream.c", [attempt([3])])
    assert staging.commit("stream:8", "stream", {"stream.c": 1}, TARGET, now=T0) == {"q": 1}
    assert await claimed_values(sql) == [3]  # not the ended rows of its write key's attempts


async def test_of_concurrent_attempts_of_a_partition_only_the_reported_one_counts(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    """Speculation: two attempts of one partition stage at once; Spark reports one of them,
    and a third, still running after the commit, stages nothing."""
    staging.open("w", T0)
    start = threading.Barrier(2, timeout=30)

    def run(stage_id: str, values: list[str]) -> int:
        start.wait()
        return staging.stage("w", stage_id, [attempt(values)])

    with ThreadPoolExecutor(2) as pool:
        loser = pool.submit(run, "w.loser", ["l0", "l1", "l2"])
        winner = pool.submit(run, "w.winner", ["w0", "w1", "w2"])
        assert (loser.result(60), winner.result(60)) == (3, 3)
    assert staged_rows(staging) == {"w.loser": 3, "w.winner": 3}

    assert staging.commit("c", "w", {"w.winner": 3}, TARGET, now=T0) == {"q": 3}

    with pytest.raises(WriteClosed):
        staging.stage("w", "w.late", [attempt(["x0"])])
    assert await claimed_values(sql) == ["w0", "w1", "w2"]
    assert staged_rows(staging) == {}


# -- topics -------------------------------------------------------------------------------------

TOPIC = TopicTarget("order.created")
#: Three groups in two queues, each with its own task name, priority and attempts.
GROUPS = [
    Subscription("order.created", "billing", "bill", "q", priority=3, max_attempts=7),
    Subscription("order.created", "audit", "audit", "q", priority=1, max_attempts=2),
    Subscription("order.created", "shipping", "ship", "q2", priority=5, max_attempts=9),
]


async def claim_all(driver: SqlDriver, queues: Sequence[str] = ("q", "q2")) -> list[TaskRow]:
    now = at(10)
    return await driver.claims.task_claim_many(
        list(queues), 1000, now=now, lease_until=at(40), worker_id="w"
    )


def table_rows(staging: SqlStaging, query: Any) -> list[Any]:
    with staging.driver.sync_engine.connect() as conn:
        return list(conn.execute(query).all())


def keyed_attempt(rows: Sequence[tuple[Any, str | None, str | None]]) -> pa.Table:
    """An attempt of a keyed write: (value, dedup key, task key) per row."""
    table = attempt([v for v, _, _ in rows], dedup=[d for _, d, _ in rows])
    return table.append_column(
        "partition_key", pa.array([k for _, _, k in rows], pa.large_string())
    )


async def test_a_topic_commit_gives_each_row_to_every_group_subscribed_at_the_commit(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    await sql.topics.subscription_set_many(GROUPS[:2], now=T0)
    staging.open("w", T0)
    staging.stage("w", "w.a", [attempt(["a", "b"]), attempt(["c"])])
    staging.stage("w", "w.b", [attempt(AWKWARD)])
    await sql.topics.subscription_set_many(GROUPS[2:], now=T0)  # after staging, before the commit
    assert await claim_all(sql) == []  # staged: invisible to workers

    rows = 3 + len(AWKWARD)
    published = staging.commit("c", "w", {"w.a": 3, "w.b": len(AWKWARD)}, TOPIC, now=at(1))

    assert published == {"q": 2 * rows, "q2": rows}
    claimed = await claim_all(sql)
    by_group: dict[str, list[Any]] = {}
    messages: dict[Any, set[str]] = {}
    for row in claimed:
        headers = json.loads(row.headers or "{}")
        assert headers["txtasks-topic"] == "order.created"
        group = headers["txtasks-group"]
        by_group.setdefault(group, []).append(json.loads(row.payload)["v"])
        sub = next(g for g in GROUPS if g.group == group)
        assert (row.queue, row.task_name, row.priority, row.max_attempts) == (
            sub.queue, sub.task_name, sub.priority, sub.max_attempts,
        )  # fmt: skip
        assert (row.content_type, row.run_at, row.created_at) == (JSON_CONTENT_TYPE, T0, at(1))
        messages.setdefault(json.loads(row.payload)["v"], set()).add(headers["txtasks-message"])
    expected = sorted_values([*"abc", *AWKWARD])
    assert {g: sorted_values(v) for g, v in by_group.items()} == dict.fromkeys(
        ("billing", "audit", "shipping"), expected
    )
    # one message id per staged row, the same in every group's task of it
    assert all(len(ids) == 1 for ids in messages.values())
    assert len({next(iter(ids)) for ids in messages.values()}) == rows
    assert ledger(staging) == {"c": 3 * rows}
    assert staged_rows(staging) == {}


async def test_a_topic_commit_is_one_statement_per_queue_whatever_the_number_of_groups(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    from sqlalchemy import event

    groups = [Subscription("order.created", f"g{n}", f"t{n}", "q") for n in range(10)]
    groups.append(Subscription("order.created", "other", "t", "q2"))
    await sql.topics.subscription_set_many(groups, now=T0)
    staging.open("w", T0)
    staging.stage("w", "w.a", [attempt(list(range(20)))])
    inserts: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO TXTASKS_TASKS"):
            inserts.append(statement)

    engine = staging.driver.sync_engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        assert staging.commit("c", "w", {"w.a": 20}, TOPIC, now=T0) == {"q": 200, "q2": 20}
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(inserts) == 2
    assert len(await claim_all(sql, ("q", "q2"))) == 220


async def test_a_topic_commit_applies_dedup_keys_per_group(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    await sql.topics.subscription_set_many(GROUPS, now=T0)
    [live] = await sql.tasks.task_insert_many([new("live", dedup_key="billing/k1")])
    staging.open("w", T0)
    keys = ["k1", "k2", "k2", None]
    staging.stage("w", "w.a", [attempt(["a", "b", "c", "d"], dedup=keys)])

    target = replace(TOPIC, dedup=True)
    published = staging.commit("c", "w", {"w.a": 4}, target, now=T0)

    # billing holds k1 already; a repeated key within the write: its first row only
    assert published == {"q": 2 + 3, "q2": 3}
    found = {
        (json.loads(r.headers or "{}").get("txtasks-group"), r.dedup_key): json.loads(r.payload)[
            "v"
        ]
        for r in await claim_all(sql)
        if r.id != live
    }
    assert found == {
        ("billing", "billing/k2"): "b", ("billing", None): "d",
        ("audit", "audit/k1"): "a", ("audit", "audit/k2"): "b", ("audit", None): "d",
        ("shipping", "shipping/k1"): "a", ("shipping", "shipping/k2"): "b", ("shipping", None): "d",
    }  # fmt: skip
    assert ledger(staging) == {"c": 8}

    staging.open("w", T0)  # the same keys again: every group holds them
    staging.stage("w", "w.b", [attempt(["e", "f"], dedup=["k1", "k2"])])
    assert staging.commit("c2", "w", {"w.b": 2}, target, now=T0) == {}
    assert ledger(staging) == {"c": 8, "c2": 0}


async def test_a_keyed_topic_commit_hints_each_key_in_each_group_queue_it_publishes_to(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    await sql.topics.subscription_set_many(GROUPS, now=T0)
    [_live] = await sql.tasks.task_insert_many([new("live", dedup_key="shipping/d2")])
    staging.open("w", T0)
    rows = [("a", "d1", "x"), ("b", "d1", "y"), ("c", "d2", "z"), ("d", None, None)]
    staging.stage("w", "w.a", [keyed_attempt(rows)])

    target = replace(TOPIC, dedup=True, keyed=True)
    assert staging.commit("c", "w", {"w.a": 4}, target, now=T0) == {"q": 6, "q2": 2}

    hinted = table_rows(staging, select(key_hints.c.queue, key_hints.c.partition_key))
    # "y" repeats dedup key d1: no task, no hint; "z" in q2: shipping holds d2 already
    assert sorted(hinted) == [("q", "x"), ("q", "z"), ("q2", "x")]
    keyed = {
        (r.queue, json.loads(r.headers or "{}")["txtasks-group"], r.partition_key)
        for r in await claim_all(sql)
        if r.headers
    }
    assert keyed == {
        ("q", "billing", "x"), ("q", "billing", "z"), ("q", "billing", None),
        ("q", "audit", "x"), ("q", "audit", "z"), ("q", "audit", None),
        ("q2", "shipping", "x"), ("q2", "shipping", None),
    }  # fmt: skip


async def test_a_topic_commit_with_a_priority_column_uses_each_rows_priority(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    await sql.topics.subscription_set_many(GROUPS, now=T0)
    staging.open("w", T0)
    staging.stage("w", "w.a", [attempt(["a", "b", "c"])])  # priorities 0, 1, 2

    staging.commit("c", "w", {"w.a": 3}, replace(TOPIC, ranked=True), now=T0)

    found = Counter((json.loads(r.payload)["v"], r.priority) for r in await claim_all(sql))
    assert found == {("a", 0): 3, ("b", 1): 3, ("c", 2): 3}


async def test_a_topic_commit_without_a_subscriber_drops_the_rows_and_counts_them(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    await sql.topics.subscription_set_many(
        [Subscription("order.cancelled", "billing", "bill", "q")], now=T0
    )
    staging.open("w", T0)
    staging.stage("w", "w.a", [attempt(["a", "b", "c"], dedup=["k", "k", None])])
    staging.stage("w", "w.lost", [attempt(["x"])])  # an attempt Spark did not report

    assert staging.commit("c", "w", {"w.a": 3}, replace(TOPIC, dedup=True), now=at(5)) == {}

    assert await claim_all(sql) == []
    drops = table_rows(staging, select(topic_drops.c.topic, topic_drops.c.dropped_at))
    assert drops == [("order.created", at(5))] * 3
    assert ledger(staging) == {"c": 0}
    assert staged_rows(staging) == {}
    stats = {s.topic: s.dropped for s in await sql.topics.topic_stats()}
    assert stats == {"order.created": 3, "order.cancelled": 0}


async def test_a_repeated_topic_commit_id_publishes_nothing_twice(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    await sql.topics.subscription_set_many(GROUPS, now=T0)
    staging.open("stream", T0)
    staging.stage("stream", "stream.a", [attempt([0, 1])])
    assert staging.commit("s:7", "stream", {"stream.a": 2}, TOPIC, now=T0) == {"q": 4, "q2": 2}

    staging.open("stream", T0)  # the restarted stream replays micro-batch 7
    staging.stage("stream", "stream.b", [attempt([0, 1])])
    assert staging.commit("s:7", "stream", {"stream.b": 2}, TOPIC, now=T0) is None

    assert len(await claim_all(sql)) == 6
    assert staged_rows(staging) == {}
    assert ledger(staging) == {"s:7": 6}


async def test_a_topic_commit_missing_staged_rows_publishes_and_drops_nothing(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    staging.open("w", T0)
    staging.stage("w", "w.a", [attempt([0, 1])])
    with pytest.raises(StagedRowsMissing):
        staging.commit("c", "w", {"w.a": 3}, TOPIC, now=T0)
    assert table_rows(staging, select(topic_drops.c.id)) == []
    assert ledger(staging) == {}


async def test_an_unsubscribe_during_a_topic_commit_waits_for_it(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    """The commit reads the topic's groups under a shared lock: a group unsubscribed (or moved
    to another queue) while the commit runs is changed after it, never half-way."""
    from sqlalchemy import event

    if sql.capabilities.name == "sqlite":
        pytest.skip("SQLite runs one writer at a time: the commit excludes every change")
    await sql.topics.subscription_set_many(GROUPS, now=T0)
    staging.open("w", T0)
    staging.stage("w", "w.a", [keyed_attempt([("a", None, "x")])])
    engine = staging.driver.sync_engine
    read, go = threading.Event(), threading.Event()

    def hold(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if "txtasks_subscriptions" in statement and statement.lstrip().upper().startswith("SELECT"):
            read.set()
            go.wait(60)

    async def unsubscribe() -> int:
        return await sql.topics.subscription_delete_many([("order.created", "shipping")])

    event.listen(engine, "after_cursor_execute", hold)
    pool = ThreadPoolExecutor(1)
    try:
        commit = pool.submit(
            staging.commit, "c", "w", {"w.a": 1}, replace(TOPIC, keyed=True), now=T0
        )
        assert read.wait(60)
        change = asyncio.ensure_future(unsubscribe())
        done, _ = await asyncio.wait([change], timeout=1.0)
        assert not done  # it waits for the commit's lock on the group
        go.set()
        assert commit.result(60) == {"q": 2, "q2": 1}
        assert await asyncio.wait_for(change, 60) == 1
    finally:
        go.set()
        pool.shutdown()
        event.remove(engine, "after_cursor_execute", hold)
    hinted = table_rows(staging, select(key_hints.c.queue, key_hints.c.partition_key))
    assert sorted(hinted) == [("q", "x"), ("q2", "x")]
    assert len(await claim_all(sql)) == 3


# -- the cleaner's purge --------------------------------------------------------------------------


async def test_the_purge_deletes_old_staged_rows_in_batches(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    """Rows of writes that never ended, oldest first, and `staged` rows that older versions
    left in the hot table; never a published task or a newer staged row."""
    legacy_row = replace(new("legacy"), state=TaskState.STAGED, stage_id="old.1")  # at(-3600)
    [legacy] = await sql.tasks.task_insert_many([legacy_row])
    staging.open("w", T0)
    staging.stage("w", "w.old", [attempt([0, 1, 2])], now=at(-60))
    staging.stage("w", "w.new", [attempt([3])], now=at(60))
    await sql.tasks.task_insert_many([new("pending")])

    purged = [await purge_abandoned(sql, before=T0, limit=2) for _ in range(3)]

    assert purged == [2, 2, 0]
    assert await sql.tasks.task_get(legacy) is None
    assert staged_rows(staging) == {"w.new": 1}
    assert len(await claim(sql, 10)) == 1


async def test_the_rows_of_ended_attempts_are_read_by_no_write_and_purged_in_batches(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    """A commit (and an abort) ends its write's attempts, whose rows it leaves: they count in
    no backlog, no later write under the same key reads them, and the purge deletes them,
    whatever their age, then their attempts; another write's rows stay."""
    staging.open("w", T0)
    staging.stage("w", "w.a", [attempt([0, 1, 2])])
    staging.stage("w", "w.loser", [attempt(["l0", "l1"])])
    staging.open("other", T0)
    staging.stage("other", "other.a", [attempt(["o"])], now=T0)  # not older than the purge's limit
    assert staging.commit("w:1", "w", {"w.a": 3}, TARGET, now=T0) == {"q": 3}
    staging.open("w", T0)  # the stream's next micro-batch
    staging.stage("w", "w.b", [attempt([3])])
    assert staged_rows(staging, ended=True) == {"w.a": 3, "w.loser": 2}
    assert await staging.backlog() == Backlog()

    assert staging.commit("w:2", "w", {"w.b": 1}, TARGET, now=T0) == {"q": 1}
    assert await claimed_values(sql) == [0, 1, 2, 3]
    purged = [await purge_abandoned(sql, before=at(-3600), limit=2) for _ in range(5)]

    assert purged == [2, 2, 2, 0, 0]  # the rows of w.a, w.loser and w.b, none left
    assert staged_rows(staging, ended=True) == {}
    assert staged_rows(staging) == {"other.a": 1}
    assert all_staged(staging) == (1, 1)  # the ended attempts are gone too
    assert staging.commit("o", "other", {"other.a": 1}, TARGET, now=T0) == {"q": 1}
    assert await claimed_values(sql) == ["o"]


# -- picking a backend's staging ------------------------------------------------------------------


def test_each_backend_gets_its_staging_and_others_are_refused(sql: SqlDriver) -> None:
    expected = {"postgresql": "PostgresStaging", "mysql": "MySQLStaging", "sqlite": "SqlStaging"}
    assert type(staging_for(sql)).__name__ == expected[sql.capabilities.name]

    class Other(MemoryDriver):
        capabilities = type(MemoryDriver.capabilities)("elsewhere")

    with pytest.raises(ConfigurationError, match="backend 'elsewhere' cannot stage writes"):
        staging_for(Other())


def test_the_staging_layer_and_the_cleaner_load_without_pyspark() -> None:
    code = (
        "import sys, cleaner.archiver, txtasks.spark.staging.postgresql, "
        "txtasks.spark.staging.mysql, txtasks.spark.staging.memory; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pyarrow')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
