"""`df.write.format("txtasks")` and `df.writeStream.format("txtasks")` in PySpark local[2],
against every database: nothing claimable before the commit, everything after, exactly once.
The exactly-once tests run in both publish modes (`mode`): in deferred mode, what the commit
committed becomes claimable once publishers ran until none waits (`publish`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text

from tests import pace
from tests.conftest import backends
from tests.waiting import until_sync
from txtasks import App, KeyLimits
from txtasks.clock import utcnow
from txtasks.driver import driver_for_url
from txtasks.driver.urls import backend_name, url_sync
from txtasks.schema.tables import commits, key_hints, staged, stages, tasks
from txtasks.spark.staging import DROPPED
from txtasks.spark.staging.publisher import publish_pending
from txtasks.testing import run_until_empty

ROWS = 40


@pytest.fixture(params=["atomic", "deferred"])
def mode(request: pytest.FixtureRequest) -> str:
    """The write's publish mode."""
    return str(request.param)


def publish(url: str, mode: str) -> int:
    """Deferred mode: run publishers until none waits (as workers and the cleaner do); the
    staged rows they took."""
    if mode == "atomic":
        return 0

    async def run() -> int:
        driver = driver_for_url(url)
        try:
            done = await publish_pending(driver, clock=utcnow, wake=lambda queue: None)
            return done.rows
        finally:
            await driver.close()

    return asyncio.run(run())


def state_counts(url: str) -> Counter[str]:
    engine = create_engine(url_sync(url))
    try:
        with engine.connect() as conn:
            query = select(tasks.c.state, func.count()).group_by(tasks.c.state)
            return Counter({state: int(n) for state, n in conn.execute(query).all()})
    finally:
        engine.dispose()


def staged_count(url: str) -> int:
    """Rows in the staged table of attempts of a write (staged, not yet committed; not those of
    attempts ended, which the purge deletes)."""
    engine = create_engine(url_sync(url))
    try:
        with engine.connect() as conn:
            ours = staged.join(stages, staged.c.stage == stages.c.id)
            query = select(func.count()).select_from(ours).where(stages.c.write_key != DROPPED)
            return int(conn.execute(query).scalar_one())
    finally:
        engine.dispose()


def live_rows(url: str) -> list[Any]:
    engine = create_engine(url_sync(url))
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(tasks).order_by(tasks.c.id)).mappings().all())
    finally:
        engine.dispose()


def orders(spark: Any, count: int = ROWS, partitions: int = 4) -> Any:
    """`count` orders in `partitions` partitions: order_id, customer, amount, priority."""
    return spark.range(count, numPartitions=partitions).selectExpr(
        "id AS order_id",
        "concat('customer-', cast(id % 7 AS string)) AS customer",
        "cast(id * 10 AS double) AS amount",
        "cast(id % 3 AS int) AS rank",
    )


def writer(df: Any, url: str, **options: str) -> Any:
    out = df.write.format("txtasks").option("url", url).option("task", "spark.order")
    for key, value in {"queue": "orders", **options}.items():
        out = out.option(key, value)
    return out.mode("append")


@contextlib.contextmanager
def gate_opens_when_staged(
    url: str, gate: Path, count: int, seen: list[Counter[str]] | None = None
) -> Iterator[None]:
    """While the block runs, open `gate` (touch the file) once `count` rows are staged,
    recording in `seen` what a worker could claim at that moment."""

    def watch() -> None:
        deadline = time.monotonic() + pace.seconds(90)
        try:
            while time.monotonic() < deadline:
                if staged_count(url) >= count:
                    if seen is not None:
                        seen.append(state_counts(url))
                    return
                time.sleep(0.05)
        finally:
            gate.touch()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield
    finally:
        gate.touch()
        watcher.join(pace.seconds(100))


def last_row_gated(spark: Any, gate: Path) -> Any:
    """`orders`, whose last row waits (see `tests.spark.helpers.gated`) until `gate` opens:
    with `gate_opens_when_staged`, the other three partitions have staged before it goes on."""
    from pyspark.sql import functions as F

    from tests.spark.helpers import gated

    gate_udf = F.udf(lambda v: gated(v, str(gate), ROWS - 1), "long", useArrow=False)
    return orders(spark).withColumn("order_id", gate_udf("order_id"))


# -- batch writes -------------------------------------------------------------------------------


def test_a_write_becomes_claimable_at_commit_and_not_before(
    spark: Any, database_url: str, tmp_path: Path, mode: str
) -> None:
    gate = tmp_path / "gate"
    df = last_row_gated(spark, gate)
    seen: list[Counter[str]] = []
    options = {"priority": "rank", "payload": "order_id,customer,amount", "publish": mode}
    with gate_opens_when_staged(database_url, gate, ROWS * 3 // 4, seen):
        writer(df, database_url, dedup="order_id", **options).save()

    assert seen, "the staged rows were never seen"
    assert seen[0] == {}  # rows staged, nothing in the tasks table yet
    if mode == "deferred":  # committed, not published: still nothing claimable
        assert (state_counts(database_url), staged_count(database_url)) == ({}, ROWS)
    assert publish(database_url, mode) == (ROWS if mode == "deferred" else 0)
    assert staged_count(database_url) == 0
    rows = live_rows(database_url)
    assert Counter(r["state"] for r in rows) == {"pending": ROWS}
    assert sorted(r["dedup_key"] for r in rows) == sorted(str(n) for n in range(ROWS))
    assert {r["stage_id"] for r in rows} == {None}
    first = next(r for r in rows if r["dedup_key"] == "5")
    assert json.loads(first["payload"]) == {"order_id": 5, "customer": "customer-5", "amount": 50.0}
    assert (first["queue"], first["task_name"], first["priority"]) == ("orders", "spark.order", 2)


def test_rerunning_a_job_with_its_dedup_column_or_commit_id_adds_nothing(
    spark: Any, database_url: str, mode: str
) -> None:
    for _ in range(2):  # the second time, the keys are live: every row dropped
        writer(orders(spark), database_url, dedup="order_id", publish=mode).save()
        publish(database_url, mode)
    assert state_counts(database_url) == {"pending": ROWS}

    for _ in range(2):  # the second time, the same run: nothing staged is committed
        writer(orders(spark, 10), database_url, commit_id="nightly-2030-01-01", publish=mode).save()
        publish(database_url, mode)
    assert state_counts(database_url) == {"pending": ROWS + 10}
    assert staged_count(database_url) == 0
    engine = create_engine(url_sync(database_url))
    try:
        with engine.connect() as conn:
            ledger = dict(conn.execute(select(commits.c.commit_id, commits.c.tasks)).all())
    finally:
        engine.dispose()
    assert ledger["nightly-2030-01-01"] == 10  # recorded once, by the first run
    # atomic: the tasks each commit published; deferred: the rows each commit committed
    assert sorted(ledger.values()) == ([0, 10, ROWS] if mode == "atomic" else [10, ROWS, ROWS])


def test_a_failing_partition_leaves_nothing_claimable_and_nothing_staged(
    spark: Any, database_url: str, tmp_path: Path, mode: str
) -> None:
    from pyspark.sql import functions as F

    from tests.spark.helpers import failing

    bad = F.udf(lambda v: failing(v, ROWS - 1), "long", useArrow=False)
    gate = tmp_path / "gate"
    df = last_row_gated(spark, gate).withColumn("order_id", bad("order_id"))
    with (
        gate_opens_when_staged(database_url, gate, ROWS * 3 // 4),
        pytest.raises(Exception, match="row 39 is bad"),
    ):
        writer(df, database_url, publish=mode).save()
    assert publish(database_url, mode) == 0
    assert state_counts(database_url) == {}
    assert staged_count(database_url) == 0


def test_a_value_json_cannot_hold_fails_the_write_and_publishes_nothing(
    spark: Any, database_url: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    gate = tmp_path / "gate"
    nan = F.expr("CASE WHEN order_id = 39 THEN double('NaN') ELSE amount END")
    df = last_row_gated(spark, gate).select("order_id", nan.alias("amount"))
    with (
        gate_opens_when_staged(database_url, gate, ROWS * 3 // 4),
        pytest.raises(Exception, match="'amount': nan is not a JSON number"),
    ):
        writer(df, database_url).save()
    assert state_counts(database_url) == {}
    assert staged_count(database_url) == 0


def test_a_crashed_partition_attempt_retried_by_spark_enqueues_once(
    spark: Any, database_url: str, tmp_path: Path, mode: str
) -> None:
    from pyspark.sql import functions as F

    from tests.spark.helpers import crash_first_attempt

    marker = tmp_path / "crashed"
    crash = F.udf(lambda v: crash_first_attempt(v, ROWS // 2, str(marker)), "long", useArrow=False)
    df = orders(spark).withColumn("order_id", crash("order_id"))
    writer(df, database_url, publish=mode).save()
    publish(database_url, mode)

    assert marker.exists(), "the first attempt did not crash"
    rows = live_rows(database_url)
    payloads = Counter(json.loads(r["payload"])["order_id"] for r in rows)
    assert payloads == Counter(range(ROWS))
    assert {r["state"] for r in rows} == {"pending"}


def two_column_writer(database_url: str) -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from txtasks.spark import WriteOptions
    from txtasks.spark.datasource import TxtasksWriter

    schema = StructType([StructField("k", LongType()), StructField("v", StringType())])
    options = WriteOptions.parse({"url": database_url, "task": "spark.order", "dedup": "k"}, schema)
    return TxtasksWriter(options)


def batches(count: int) -> Any:
    import pyarrow as pa

    return iter([pa.RecordBatch.from_pylist([{"k": n, "v": f"v{n}"} for n in range(count)])])


def test_two_attempts_of_a_partition_that_both_staged_publish_once(database_url: str) -> None:
    """A retried (or speculative) attempt stages its rows again under its own stage id; the
    commit publishes the one Spark reports and deletes the other."""
    write = two_column_writer(database_url)
    first = write.write(batches(5))  # the attempt that lost
    second = write.write(batches(5))
    assert staged_count(database_url) == 10 and state_counts(database_url) == {}

    write.commit([second])

    live = live_rows(database_url)
    assert Counter(r["state"] for r in live) == {"pending": 5}
    assert sorted(r["dedup_key"] for r in live) == ["0", "1", "2", "3", "4"]
    assert {json.loads(r["payload"])["v"] for r in live} == {f"v{n}" for n in range(5)}
    assert staged_count(database_url) == 0
    assert first.stage_id != second.stage_id and first.rows == second.rows == 5


def test_a_commit_missing_staged_rows_publishes_nothing(database_url: str) -> None:
    """Staged rows that vanished before the commit (purged as abandoned by the cleaner) fail
    the commit: a partial write never becomes claimable."""
    from dataclasses import replace

    from txtasks.spark.staging import StagedRowsMissing

    write = two_column_writer(database_url)
    message = write.write(batches(5))
    with pytest.raises(StagedRowsMissing, match="staged 6 rows but 5 are left"):
        write.commit([replace(message, rows=6)])
    assert state_counts(database_url) == {}
    write.abort([message])
    assert staged_count(database_url) == 0


def test_an_attempt_that_stages_after_its_write_ended_stages_nothing(database_url: str) -> None:
    """A speculative loser or an attempt Spark stopped waiting for may run on after the commit
    or the abort: its staging rolls back instead of leaving rows no commit will take."""
    from txtasks.spark.staging import WriteClosed

    aborted = two_column_writer(database_url)
    aborted.abort([])
    with pytest.raises(WriteClosed, match="committed or aborted already"):
        aborted.write(batches(3))

    committed = two_column_writer(database_url)
    committed.commit([committed.write(batches(2))])
    with pytest.raises(WriteClosed, match=r"attempt [0-9a-f]+ staged no row"):
        committed.write(batches(4))

    assert staged_count(database_url) == 0
    assert state_counts(database_url) == {"pending": 2}


def test_an_abort_waits_for_an_attempt_that_is_committing_its_rows(database_url: str) -> None:
    """An attempt that found its write open commits its rows; the abort, closing the write at
    that moment, waits for it and then deletes them."""
    from sqlalchemy import event

    from txtasks.spark.datasource import _driver

    if database_url.startswith("sqlite"):
        pytest.skip("SQLite runs one writer at a time: an abort cannot overlap a staging")
    write = two_column_writer(database_url)
    engine = _driver(database_url).sync_engine
    committing, go = threading.Event(), threading.Event()
    stager: list[threading.Thread] = []
    commits: list[Any] = []

    def hold(conn: Any) -> None:  # the attempt, about to commit its rows, holds its lock on
        if stager and threading.current_thread() is stager[0]:  # the write (its first
            commits.append(conn)  # transaction recorded the attempt)
            if len(commits) == 2:
                committing.set()
                go.wait(pace.seconds(60))

    staged_rows: list[int] = []
    stager.append(threading.Thread(target=lambda: staged_rows.append(write.write(batches(3)).rows)))
    aborter = threading.Thread(target=write.abort, args=([],))
    event.listen(engine, "commit", hold)
    try:
        stager[0].start()
        assert committing.wait(pace.seconds(60))
        aborter.start()
        aborter.join(1.0)  # it cannot finish: the attempt holds the write open
        assert aborter.is_alive()
    finally:
        go.set()
        stager[0].join(pace.seconds(60))
        aborter.join(pace.seconds(60))
        event.remove(engine, "commit", hold)
    assert staged_rows == [3]  # the attempt committed its rows...
    assert staged_count(database_url) == 0  # ...and the abort deleted them


def test_the_cleaner_purges_staged_rows_of_writes_that_never_committed(database_url: str) -> None:
    from datetime import timedelta

    from txtasks.clock import utcnow
    from txtasks.driver import driver_for_url
    from txtasks.spark.staging import purge_abandoned

    write = two_column_writer(database_url)
    write.write(batches(3))

    async def purge(age: float) -> list[int]:
        before = utcnow() - timedelta(seconds=age)
        driver = driver_for_url(database_url)
        try:
            return [await purge_abandoned(driver, before=before, limit=2) for _ in range(3)]
        finally:
            await driver.close()

    assert asyncio.run(purge(3600)) == [0, 0, 0]  # staged just now: kept
    assert staged_count(database_url) == 3
    assert asyncio.run(purge(-60)) == [2, 1, 0]
    assert staged_count(database_url) == 0


def test_bad_options_fail_before_anything_is_written(spark: Any, database_url: str) -> None:
    df = orders(spark).selectExpr("*", "cast('x' AS binary) AS blob")
    cases = [
        ({"task": ""}, "option 'task'"),
        ({"payload": "order_id,nope"}, "no column 'nope'"),
        ({"dedup": "missing"}, "option 'dedup': no column 'missing'"),
        ({"key": "missing"}, "option 'key': no column 'missing'"),
        ({"key": "amount"}, "key column 'amount' must be a string or integer, not double"),
        ({"payload": "blob"}, "payload column 'blob' cannot be stored as JSON"),
        ({"priority": "customer"}, "priority column 'customer' must be an integer"),
        ({"max_attempts": "zero"}, "option 'max_attempts' must be an integer >= 1"),
        ({"queue": "no spaces"}, "queue"),
        ({"publish": "later"}, "option 'publish' must be 'atomic' or 'deferred', got 'later'"),
        ({"local_infile": "yes"}, "option 'local_infile' must be 'true' or 'false', got 'yes'"),
        ({"lock_wait_timeout": "0"}, "option 'lock_wait_timeout' must be seconds > 0"),
        ({"lock_wait_timeout": "soon"}, "option 'lock_wait_timeout' must be seconds > 0"),
    ]
    if backend_name(database_url) != "mysql":
        cases.append(({"local_infile": "true"}, "'local_infile' applies to MariaDB/MySQL only"))
    for options, message in cases:
        with pytest.raises(Exception, match=message):
            writer(df, database_url, **{"payload": "order_id", **options}).save()
    with pytest.raises(Exception, match="only mode\\('append'\\)"):
        writer(df, database_url).mode("overwrite").save()
    assert state_counts(database_url) == {}
    assert staged_count(database_url) == 0


@pytest.mark.parametrize("database_url", backends("mysql"), indirect=True)
def test_option_local_infile_stages_by_load_data(spark: Any, database_url: str, mode: str) -> None:
    """With option `local_infile`, each partition's batch goes in by LOAD DATA LOCAL INFILE
    (counted by the server), and the tasks are those of any write."""
    engine = create_engine(url_sync(database_url))
    status = text("SHOW GLOBAL STATUS LIKE 'Com_load'")
    try:
        with engine.connect() as conn:
            before = int(conn.execute(status).one()[1])
        options = {"payload": "order_id,customer", "publish": mode, "local_infile": "true"}
        writer(orders(spark), database_url, dedup="order_id", **options).save()
        with engine.connect() as conn:
            assert int(conn.execute(status).one()[1]) - before == 4  # a batch per partition
    finally:
        engine.dispose()

    publish(database_url, mode)
    rows = live_rows(database_url)
    assert Counter(r["state"] for r in rows) == {"pending": ROWS}
    first = next(r for r in rows if r["dedup_key"] == "5")
    assert json.loads(first["payload"]) == {"order_id": 5, "customer": "customer-5"}


def test_workers_run_what_spark_enqueued(spark: Any, database_url: str) -> None:
    writer(orders(spark), database_url, dedup="order_id").save()
    seen: list[dict[str, Any]] = []
    app = App("spark-test", database_url=database_url)
    app.task(name="spark.order", queue="orders")(seen.append)

    async def run() -> Any:
        try:
            return await run_until_empty(app)
        finally:
            await app.aclose()

    stats = asyncio.run(run())
    assert stats.outcomes == {"completed": ROWS}
    assert sorted(p["order_id"] for p in seen) == list(range(ROWS))


def key_hint_count(url: str) -> int:
    engine = create_engine(url_sync(url))
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(key_hints)).scalar_one())
    finally:
        engine.dispose()


def claim_once(url: str, limits: KeyLimits) -> list[Any]:
    """One claim of every ready task of queue "orders", as a worker declaring `limits` makes."""
    from txtasks.clock import utcnow
    from txtasks.driver import driver_for_url

    async def claim() -> list[Any]:
        driver = driver_for_url(url)
        await driver.open()
        try:
            now = utcnow() + timedelta(seconds=1)
            return await driver.claims.task_claim_many(
                ["orders"],
                ROWS * 2,
                now=now,
                lease_until=now + timedelta(seconds=60),
                worker_id="spark-test",
                keys={"orders": limits},
            )
        finally:
            await driver.close()

    return asyncio.run(claim())


def test_a_keyed_write_gives_each_task_its_key_and_claims_honour_its_limits(
    spark: Any, database_url: str
) -> None:
    # 7 customers; every tenth order has no customer: no key
    df = orders(spark).selectExpr(
        "order_id", "CASE WHEN order_id % 10 = 9 THEN NULL ELSE customer END AS customer"
    )
    writer(df, database_url, key="customer", dedup="order_id").save()
    writer(df, database_url, key="customer", dedup="order_id").save()  # every row dropped

    rows = live_rows(database_url)
    assert len(rows) == ROWS
    for row in rows:  # the key column stays in the payload, as the dedup column does
        assert row["partition_key"] == json.loads(row["payload"])["customer"]
    keys = {r["partition_key"] for r in rows} - {None}
    assert len(keys) == 7 and sum(r["partition_key"] is None for r in rows) == ROWS // 10
    assert key_hint_count(database_url) == 7  # one per key; none from the rerun's dropped rows

    claimed = claim_once(database_url, KeyLimits(concurrency=1))
    per_key = Counter(r.partition_key for r in claimed)
    assert per_key.pop(None) == ROWS // 10  # tasks without a key are not limited
    assert per_key == dict.fromkeys(keys, 1)  # one task of each key, on the first claim


def test_a_keyed_commit_hints_only_the_keys_of_the_tasks_it_publishes(database_url: str) -> None:
    """Rows dropped by dedup (a live task holds their dedup key, or an earlier row of the write
    does) leave no hint for their key."""
    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from txtasks.spark import WriteOptions
    from txtasks.spark.datasource import TxtasksWriter

    schema = StructType([StructField("k", LongType()), StructField("v", StringType())])
    options = {"url": database_url, "task": "spark.order", "dedup": "k", "key": "v"}

    def write(rows: list[tuple[int, str | None]]) -> None:
        writer = TxtasksWriter(WriteOptions.parse(options, schema))
        batch = pa.RecordBatch.from_pylist([{"k": k, "v": v} for k, v in rows])
        writer.commit([writer.write(iter([batch]))])

    write([(2, "z")])
    write([(1, "a"), (1, "b"), (2, "c"), (3, None)])  # "b" repeats k=1, "c" finds k=2 live

    assert {(r["dedup_key"], r["partition_key"]) for r in live_rows(database_url)} == {
        ("1", "a"),
        ("2", "z"),
        ("3", None),
    }
    engine = create_engine(url_sync(database_url))
    try:
        with engine.connect() as conn:
            hinted = conn.execute(select(key_hints.c.queue, key_hints.c.partition_key)).all()
    finally:
        engine.dispose()
    assert sorted(hinted) == [("default", "a"), ("default", "z")]


def keyed_write(url: str, mode: str, rows: list[tuple[int, str]]) -> None:
    """A write of rows (n, key) with option `key`, committed in `mode` (not published)."""
    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from txtasks.spark import WriteOptions
    from txtasks.spark.datasource import TxtasksWriter

    schema = StructType([StructField("n", LongType()), StructField("customer", StringType())])
    given = {"url": url, "task": "spark.order", "queue": "orders", "key": "customer"}
    writer = TxtasksWriter(WriteOptions.parse({**given, "publish": mode}, schema))
    batch = pa.RecordBatch.from_pylist([{"n": n, "customer": c} for n, c in rows])
    writer.commit([writer.write(iter([batch]))])


@pytest.mark.parametrize(
    "limits", [KeyLimits(ordered=True), KeyLimits(concurrency=1)], ids=["ordered", "one"]
)
@pytest.mark.parametrize("database_url", backends("postgresql", "mysql"), indirect=True)
def test_a_key_keeps_its_order_and_limits_across_two_writes(
    database_url: str, mode: str, limits: KeyLimits
) -> None:
    """The tasks of one key from two writes run one at a time, and for an ordered key in the
    order of the writes, in both modes; in deferred mode even while one publisher is in the
    middle of the first write and another one runs (it leaves the second write's keyed rows
    for later)."""
    from txtasks.schema.tables import deferred

    keyed_write(database_url, mode, [(0, "c"), (1, "c"), (2, "d")])
    keyed_write(database_url, mode, [(3, "c"), (4, "c"), (5, "d")])
    if mode == "deferred":
        engine = create_engine(url_sync(database_url))
        try:
            with engine.begin() as conn:  # a publisher in the middle of the first write
                first = select(deferred.c.stage).order_by(deferred.c.stage).limit(1)
                conn.execute(first.with_for_update()).one()
                publish(database_url, mode)  # another publisher, meanwhile
                claimed = claim_once(database_url, limits)
                assert [json.loads(r.payload)["n"] for r in claimed] == []
        finally:
            engine.dispose()

    app = App("spark-test", database_url=database_url)
    started: list[int] = []
    running: Counter[str] = Counter()
    most: Counter[str] = Counter()

    @app.task(name="spark.order", queue="orders", key_limits=limits)
    async def order(payload: dict[str, Any]) -> None:
        key = payload["customer"]
        started.append(payload["n"])
        running[key] += 1
        most[key] = max(most[key], running[key])
        await asyncio.sleep(0.01)
        running[key] -= 1

    async def run() -> Any:
        try:
            return await run_until_empty(app, concurrency=6, burst_horizon=1)
        finally:
            await app.aclose()

    stats = asyncio.run(run())  # its publisher publishes what waits (deferred)
    assert stats.outcomes == {"completed": 6}
    assert most == {"c": 1, "d": 1}  # one at a time
    if limits.ordered:
        assert [n for n in started if n in (0, 1, 3, 4)] == [0, 1, 3, 4]  # key c, write by write
        assert [n for n in started if n in (2, 5)] == [2, 5]  # key d


# -- streaming ----------------------------------------------------------------------------------


def test_a_stream_restarted_from_its_checkpoint_enqueues_every_row_once(
    spark: Any, database_url: str, tmp_path: Path, mode: str
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()

    def add_file(n: int, ids: range) -> None:
        lines = "\n".join(json.dumps({"order_id": i, "customer": f"c{i}"}) for i in ids)
        (source / f"part-{n}.json").write_text(lines + "\n")

    def run_stream() -> None:
        stream = (
            spark.readStream.schema("order_id LONG, customer STRING")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
            .writeStream.format("txtasks")
            .option("url", database_url)
            .option("task", "spark.order")
            .option("queue", "orders")
            .option("stream_id", "orders-feed")
            .option("publish", mode)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        stream.awaitTermination(120)
        assert stream.exception() is None, stream.exception()

    add_file(0, range(0, 10))
    add_file(1, range(10, 20))
    run_stream()  # micro-batches 0 and 1
    publish(database_url, mode)
    assert state_counts(database_url) == {"pending": 20}

    # a crash after the sink committed batch 1 but before the checkpoint recorded it:
    for name in ("1", ".1.crc"):
        (checkpoint / "commits" / name).unlink()
    add_file(2, range(20, 30))
    run_stream()  # replays batch 1, then batch 2
    publish(database_url, mode)

    rows = live_rows(database_url)
    assert Counter(json.loads(r["payload"])["order_id"] for r in rows) == Counter(range(30))
    assert {r["state"] for r in rows} == {"pending"}


def test_a_stream_without_a_stream_id_is_refused(
    spark: Any, database_url: str, tmp_path: Path
) -> None:
    stream = spark.readStream.format("rate").load().writeStream.format("txtasks")
    stream = stream.option("url", database_url).option("task", "spark.order")
    stream = stream.option("checkpointLocation", str(tmp_path / "checkpoint"))
    query = stream.start()
    try:
        with pytest.raises(Exception, match="option 'stream_id' is required"):
            query.awaitTermination(60)
    finally:
        query.stop()


# -- wake-ups -----------------------------------------------------------------------------------


@pytest.mark.rabbitmq
def test_the_commit_wakes_the_queue_after_the_rows_are_claimable(
    spark: Any, database_url: str, amqp_url: str
) -> None:
    from txtasks.wakeup.amqp import AmqpNotifier

    queue = f"spark-{uuid.uuid4().hex[:10]}"
    pending_when_woken: list[int] = []
    woken = threading.Event()

    def on_wakeup(name: str, **_: object) -> None:  # runs on the subscriber's loop thread
        pending_when_woken.append(state_counts(database_url)["pending"])
        woken.set()

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    notifier = AmqpNotifier(amqp_url)
    try:
        asyncio.run_coroutine_threadsafe(notifier.subscribe([queue], on_wakeup), loop).result(
            pace.seconds(10)
        )
        until_sync(lambda: notifier.stats.connected, "the subscriber to connect", timeout=10)

        writer(orders(spark, 5), database_url, queue=queue, broker_url=amqp_url).save()

        assert woken.wait(pace.seconds(10)), "no wake-up arrived after the commit"
        assert pending_when_woken[0] == 5
    finally:
        asyncio.run_coroutine_threadsafe(notifier.close(), loop).result(pace.seconds(10))
        loop.call_soon_threadsafe(loop.stop)
        runner.join(pace.seconds(10))
        loop.close()
