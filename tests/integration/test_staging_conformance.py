"""The staging layer (`txtasks.spark.staging`) on every database, without Spark or a JVM.

What the Spark data source relies on, driven the way it drives it: a write is opened, partition
attempts stage Arrow tables under stage ids of their own, and the commit (once per commit id)
makes exactly the reported attempts' rows claimable, or the abort deletes them. Each test checks
one promise, through what a worker can claim and what is left in the staging tables.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from sqlalchemy import func, select

from txtasks.driver import MemoryDriver, SqlDriver, driver_for_url
from txtasks.errors import ConfigurationError
from txtasks.schema.tables import commits, staged, writes
from txtasks.spark.staging import (
    STAGED_COLUMNS,
    SqlStaging,
    StagedRowsMissing,
    StageTarget,
    WriteClosed,
    purge_abandoned,
    staging_for,
)
from txtasks.types import JSON_CONTENT_TYPE, NewTask, TaskRow, TaskState

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
    return await driver.task_claim_many(["q"], limit, now=now, lease_until=at(40), worker_id="w")


@pytest.fixture
async def sql(database_url: str) -> AsyncIterator[SqlDriver]:
    driver = driver_for_url(database_url)
    await driver.open()
    yield driver
    await driver.close()


@pytest.fixture
def staging(sql: SqlDriver) -> SqlStaging:
    return staging_for(sql)


def attempt(
    key: str,
    stage_id: str,
    values: Sequence[Any],
    *,
    dedup: Sequence[str | None] | None = None,
    created_at: datetime = T0,
) -> pa.Table:
    """An attempt's staged table, as the Spark encoder builds it: payloads {"v": value}."""
    count = len(values)
    columns = {
        "write_key": pa.array([key] * count, pa.large_string()),
        "stage_id": pa.array([stage_id] * count, pa.large_string()),
        "payload": pa.array([json.dumps({"v": v}).encode() for v in values], pa.large_binary()),
        "priority": pa.array(range(count), pa.int32()),
        "run_at": pa.array([T0] * count, pa.timestamp("us")),
        "dedup_key": pa.array(dedup or [None] * count, pa.large_string()),
        "created_at": pa.array([created_at] * count, pa.timestamp("us")),
    }
    return pa.table([columns[c] for c in STAGED_COLUMNS], names=list(STAGED_COLUMNS))


async def claimed_values(driver: SqlDriver) -> list[Any]:
    """Claim every ready task; their payload values, sorted by repr."""
    rows = await claim(driver)
    return sorted((json.loads(r.payload)["v"] for r in rows), key=repr)


def staged_rows(staging: SqlStaging) -> dict[str, int]:
    """Rows left in the staged table per stage id."""
    query = select(staged.c.stage_id, func.count()).group_by(staged.c.stage_id)
    with staging.driver.sync_engine.connect() as conn:
        return {stage_id: int(n) for stage_id, n in conn.execute(query).all()}


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
    assert staging.stage("w1", [attempt("w1", "w1.a", [0, 1]), attempt("w1", "w1.a", [2])]) == 3
    assert staging.stage("w1", [attempt("w1", "w1.b", AWKWARD)]) == len(AWKWARD)
    assert staging.stage("w2", [attempt("w2", "w2.a", ["other write"])]) == 1
    assert await claim(sql) == []  # staged: invisible to workers

    published = staging.commit("c1", "w1", {"w1.a": 3, "w1.b": len(AWKWARD)}, TARGET, now=at(1))

    assert published == {"q": 3 + len(AWKWARD)}
    rows = await claim(sql)
    assert sorted_values(json.loads(r.payload)["v"] for r in rows) == sorted_values(
        [0, 1, 2, *AWKWARD]
    )
    fixed = {(r.task_name, r.max_attempts, r.content_type, r.run_at, r.created_at) for r in rows}
    assert fixed == {(TARGET.task_name, TARGET.max_attempts, JSON_CONTENT_TYPE, T0, T0)}
    assert sorted(r.priority for r in rows) == sorted([0, 1, 0, *range(len(AWKWARD))])
    assert ledger(staging) == {"c1": 3 + len(AWKWARD)}
    assert staged_rows(staging) == {"w2.a": 1}  # another write's rows wait for its commit
    assert open_writes(staging) == {"w2"}  # the commit closed its write


async def test_a_commit_with_dedup_keys_publishes_each_key_once_and_not_over_a_live_task(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    [live] = await sql.task_insert_many([new("live", dedup_key="k1")])
    staging.open("w", T0)
    keys = ["k1", "k2", "k2", "k3", None]
    staging.stage("w", [attempt("w", "w.a", ["a", "b", "c", "d", "e"], dedup=keys)])

    published = staging.commit("c", "w", {"w.a": 5}, StageTarget("q", "t", 1, dedup=True), now=T0)

    assert published == {"q": 3}
    rows = await claim(sql)
    by_key = {r.dedup_key: json.loads(r.payload)["v"] for r in rows if r.id != live}
    assert by_key == {"k2": "b", "k3": "d", None: "e"}  # a repeated key: its first row
    live_row = await sql.task_get(live)
    assert live_row is not None and live_row.payload == new("live").payload
    assert staged_rows(staging) == {}


async def test_a_commit_missing_staged_rows_publishes_nothing(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    staging.open("w", T0)
    staging.stage("w", [attempt("w", "w.a", [0, 1, 2, 3, 4])])

    with pytest.raises(StagedRowsMissing, match=r"attempt w\.a staged 6 rows but 5 are left"):
        staging.commit("c", "w", {"w.a": 6}, TARGET, now=T0)
    with pytest.raises(StagedRowsMissing, match=r"attempt w\.ghost staged 2 rows but 0 are left"):
        staging.commit("c", "w", {"w.a": 5, "w.ghost": 2}, TARGET, now=T0)

    assert await claimed_values(sql) == []
    assert ledger(staging) == {}  # the commit id was not spent...
    assert staged_rows(staging) == {"w.a": 5}  # ...nor the rows deleted; the write is closed
    with pytest.raises(WriteClosed):
        staging.stage("w", [attempt("w", "w.b", [5])])
    # an attempt that staged no rows reports 0, and the commit goes through
    assert staging.commit("c", "w", {"w.a": 5, "w.empty": 0}, TARGET, now=T0) == {"q": 5}
    assert await claimed_values(sql) == [0, 1, 2, 3, 4]


# -- abort and closed writes ----------------------------------------------------------------------


async def test_an_abort_deletes_what_its_write_staged(sql: SqlDriver, staging: SqlStaging) -> None:
    staging.open("w", T0)
    staging.open("other", T0)
    staging.stage("w", [attempt("w", "w.a", [0, 1, 2])])
    staging.stage("w", [attempt("w", "w.b", [3, 4])])
    staging.stage("other", [attempt("other", "other.a", [5])])

    assert staging.abort("w") == 5

    assert staged_rows(staging) == {"other.a": 1}
    assert open_writes(staging) == {"other"}
    assert ledger(staging) == {}
    assert await claimed_values(sql) == []


def test_staging_into_a_closed_write_is_refused(staging: SqlStaging) -> None:
    with pytest.raises(WriteClosed, match="write never was committed or aborted already"):
        staging.stage("never", [attempt("never", "never.a", [0])])

    staging.open("aborted", T0)
    staging.abort("aborted")
    with pytest.raises(WriteClosed, match="aborted already: this attempt's 3 rows were not"):
        staging.stage("aborted", [attempt("aborted", "aborted.a", [0, 1, 2])])

    staging.open("done", T0)
    staging.stage("done", [attempt("done", "done.a", [0, 1])])
    staging.commit("c", "done", {"done.a": 2}, TARGET, now=T0)
    with pytest.raises(WriteClosed, match="this attempt's 4 rows were not staged"):
        staging.stage("done", [attempt("done", "done.b", [0, 1, 2, 3])])
    assert staged_rows(staging) == {}

    staging.open("done", T0)  # a stream's next micro-batch opens its write again
    assert staging.stage("done", [attempt("done", "done.c", [7])]) == 1


# -- exactly once -------------------------------------------------------------------------------


async def test_a_repeated_commit_id_enqueues_nothing_twice(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    staging.open("stream", T0)
    staging.stage("stream", [attempt("stream", "stream.a", [0, 1, 2])])
    assert staging.commit("stream:7", "stream", {"stream.a": 3}, TARGET, now=T0) == {"q": 3}

    staging.open("stream", T0)  # the restarted stream replays micro-batch 7
    staging.stage("stream", [attempt("stream", "stream.b", [0, 1, 2])])
    assert staging.commit("stream:7", "stream", {"stream.b": 3}, TARGET, now=T0) is None

    assert await claimed_values(sql) == [0, 1, 2]
    assert staged_rows(staging) == {}  # the replay's rows are discarded
    assert ledger(staging) == {"stream:7": 3}
    assert staging.commit_seen("stream:7") and not staging.commit_seen("stream:8")

    staging.open("stream", T0)
    staging.stage("stream", [attempt("stream", "stream.c", [3])])
    assert staging.commit("stream:8", "stream", {"stream.c": 1}, TARGET, now=T0) == {"q": 1}
    assert await claimed_values(sql) == [3]


async def test_of_concurrent_attempts_of_a_partition_only_the_reported_one_counts(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    """Speculation: two attempts of one partition stage at once; Spark reports one of them,
    and a third, still running after the commit, stages nothing."""
    staging.open("w", T0)
    start = threading.Barrier(2, timeout=30)

    def run(stage_id: str, values: list[str]) -> int:
        start.wait()
        return staging.stage("w", [attempt("w", stage_id, values)])

    with ThreadPoolExecutor(2) as pool:
        loser = pool.submit(run, "w.loser", ["l0", "l1", "l2"])
        winner = pool.submit(run, "w.winner", ["w0", "w1", "w2"])
        assert (loser.result(60), winner.result(60)) == (3, 3)
    assert staged_rows(staging) == {"w.loser": 3, "w.winner": 3}

    assert staging.commit("c", "w", {"w.winner": 3}, TARGET, now=T0) == {"q": 3}

    with pytest.raises(WriteClosed):
        staging.stage("w", [attempt("w", "w.late", ["x0"])])
    assert await claimed_values(sql) == ["w0", "w1", "w2"]
    assert staged_rows(staging) == {}


# -- the cleaner's purge --------------------------------------------------------------------------


async def test_the_purge_deletes_old_staged_rows_in_batches(
    sql: SqlDriver, staging: SqlStaging
) -> None:
    """Rows of writes that never ended, oldest first, and `staged` rows that older versions
    left in the hot table; never a published task or a newer staged row."""
    legacy_row = replace(new("legacy"), state=TaskState.STAGED, stage_id="old.1")  # at(-3600)
    [legacy] = await sql.task_insert_many([legacy_row])
    staging.open("w", T0)
    staging.stage("w", [attempt("w", "w.old", [0, 1, 2], created_at=at(-60))])
    staging.stage("w", [attempt("w", "w.new", [3], created_at=at(60))])
    await sql.task_insert_many([new("pending")])

    purged = [await purge_abandoned(sql, before=T0, limit=2) for _ in range(3)]

    assert purged == [2, 2, 0]
    assert await sql.task_get(legacy) is None
    assert staged_rows(staging) == {"w.new": 1}
    assert len(await claim(sql, 10)) == 1


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
