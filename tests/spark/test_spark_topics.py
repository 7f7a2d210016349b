"""`.option("topic", ...)`: a Spark write published to a topic in PySpark local[2], against every
database: each row becomes one task per group subscribed at the commit, nothing before it,
exactly once."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select

from tests.spark.test_spark_write import (
    ROWS,
    claim_once,
    gate_opens_when_staged,
    last_row_gated,
    live_rows,
    orders,
    staged_count,
    state_counts,
)
from txtasks import App, KeyLimits, TaskContext
from txtasks.clock import utcnow
from txtasks.driver import driver_for_url
from txtasks.driver.urls import url_sync
from txtasks.schema.tables import commits, key_hints, topic_drops
from txtasks.testing import run_until_empty
from txtasks.types import Subscription

TOPIC = "order.created"
#: Two groups in the queue "orders", one in "shipping".
GROUPS = [
    Subscription(TOPIC, "billing", "spark.bill", "orders", priority=3, max_attempts=7),
    Subscription(TOPIC, "audit", "spark.audit", "orders", priority=1, max_attempts=2),
    Subscription(TOPIC, "shipping", "spark.ship", "shipping", priority=5, max_attempts=9),
]


def subscribe(url: str, subs: Sequence[Subscription] = GROUPS) -> None:
    async def run() -> None:
        driver = driver_for_url(url)
        await driver.open()
        try:
            await driver.topics.subscription_set_many(subs, now=utcnow())
        finally:
            await driver.close()

    asyncio.run(run())


def publisher(df: Any, url: str, **options: str) -> Any:
    out = df.write.format("txtasks").option("url", url).option("topic", TOPIC)
    for key, value in options.items():
        out = out.option(key, value)
    return out.mode("append")


def group_of(row: Any) -> str:
    return str(json.loads(row["headers"])["txtasks-group"])


def scalar(url: str, query: Any) -> Any:
    engine = create_engine(url_sync(url))
    try:
        with engine.connect() as conn:
            return conn.execute(query).all()
    finally:
        engine.dispose()


def test_a_write_to_a_topic_reaches_every_group_at_commit_and_not_before(
    spark: Any, database_url: str, tmp_path: Path
) -> None:
    subscribe(database_url)
    gate = tmp_path / "gate"
    seen: list[Counter[str]] = []
    with gate_opens_when_staged(database_url, gate, ROWS * 3 // 4, seen):
        publisher(
            last_row_gated(spark, gate), database_url, dedup="order_id", payload="order_id,amount"
        ).save()

    assert seen and seen[0] == {}  # rows staged, no group's task written yet
    assert staged_count(database_url) == 0
    rows = live_rows(database_url)
    per_group = Counter(group_of(r) for r in rows)
    assert per_group == dict.fromkeys(("billing", "audit", "shipping"), ROWS)
    for row in rows:
        sub = next(s for s in GROUPS if s.group == group_of(row))
        order = json.loads(row["payload"])
        assert (row["queue"], row["task_name"], row["priority"], row["max_attempts"]) == (
            sub.queue, sub.task_name, sub.priority, sub.max_attempts,
        )  # fmt: skip
        assert row["dedup_key"] == f"{sub.group}/{order['order_id']}"
        assert row["state"] == "pending" and order["amount"] == order["order_id"] * 10.0
    messages = {(json.loads(r["headers"])["txtasks-message"], r["payload"]) for r in rows}
    assert len(messages) == ROWS  # one message id per row, the same in its three tasks

    # a re-run: every group holds each dedup key already
    publisher(orders(spark), database_url, dedup="order_id").save()
    assert state_counts(database_url) == {"pending": 3 * ROWS}
    ledger = sorted(n for (n,) in scalar(database_url, select(commits.c.tasks)))
    assert ledger == [0, 3 * ROWS]


def test_a_crashed_attempt_retried_by_spark_publishes_each_row_once_per_group(
    spark: Any, database_url: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    from tests.spark.helpers import crash_first_attempt

    subscribe(database_url)
    marker = tmp_path / "crashed"
    crash = F.udf(lambda v: crash_first_attempt(v, ROWS // 2, str(marker)), "long", useArrow=False)
    publisher(orders(spark).withColumn("order_id", crash("order_id")), database_url).save()

    assert marker.exists(), "the first attempt did not crash"
    rows = live_rows(database_url)
    found = Counter((group_of(r), json.loads(r["payload"])["order_id"]) for r in rows)
    assert found == Counter((g.group, n) for g in GROUPS for n in range(ROWS))


def test_a_failing_write_to_a_topic_publishes_and_drops_nothing(
    spark: Any, database_url: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    from tests.spark.helpers import failing

    subscribe(database_url)
    bad = F.udf(lambda v: failing(v, ROWS - 1), "long", useArrow=False)
    gate = tmp_path / "gate"
    df = last_row_gated(spark, gate).withColumn("order_id", bad("order_id"))
    with (
        gate_opens_when_staged(database_url, gate, ROWS * 3 // 4),
        pytest.raises(Exception, match="row 39 is bad"),
    ):
        publisher(df, database_url).save()
    assert state_counts(database_url) == {}
    assert staged_count(database_url) == 0
    assert scalar(database_url, select(func.count()).select_from(topic_drops)) == [(0,)]


def test_a_keyed_write_to_a_topic_gives_each_group_the_keys_and_their_hints(
    spark: Any, database_url: str
) -> None:
    subscribe(database_url)
    # 7 customers; every tenth order has no customer: no key
    df = orders(spark).selectExpr(
        "order_id", "CASE WHEN order_id % 10 = 9 THEN NULL ELSE customer END AS customer"
    )
    publisher(df, database_url, key="customer", dedup="order_id", priority="order_id").save()
    publisher(df, database_url, key="customer", dedup="order_id").save()  # every row dropped

    rows = live_rows(database_url)
    assert len(rows) == 3 * ROWS
    for row in rows:
        order = json.loads(row["payload"])
        assert row["partition_key"] == order["customer"]
        assert row["priority"] == order["order_id"]  # the priority column, in every group
    hints = scalar(database_url, select(key_hints.c.queue, key_hints.c.partition_key))
    keys = {r["partition_key"] for r in rows} - {None}
    assert len(keys) == 7
    # one hint per key and group queue: "orders" (billing, audit) and "shipping"
    assert Counter(hints) == Counter((q, k) for q in ("orders", "shipping") for k in keys)

    claimed = claim_once(database_url, KeyLimits(concurrency=1))  # queue "orders"
    per_key = Counter(r.partition_key for r in claimed)
    assert per_key.pop(None) == 2 * (ROWS // 10)  # tasks without a key are not limited
    assert per_key == dict.fromkeys(keys, 1)  # one task of each key in the queue


def test_a_write_to_a_topic_without_subscribers_is_dropped_and_counted(
    spark: Any, database_url: str
) -> None:
    subscribe(database_url, [Subscription("order.cancelled", "billing", "spark.bill", "orders")])
    publisher(orders(spark, 10), database_url).save()

    assert state_counts(database_url) == {}
    assert staged_count(database_url) == 0
    drops = scalar(database_url, select(topic_drops.c.topic, func.count()).group_by("topic"))
    assert drops == [(TOPIC, 10)]


def test_a_stream_to_a_topic_restarted_from_its_checkpoint_publishes_every_row_once(
    spark: Any, database_url: str, tmp_path: Path
) -> None:
    subscribe(database_url)
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()

    def add_file(n: int, ids: range) -> None:
        lines = "\n".join(json.dumps({"order_id": i}) for i in ids)
        (source / f"part-{n}.json").write_text(lines + "\n")

    def run_stream() -> None:
        stream = (
            spark.readStream.schema("order_id LONG")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
            .writeStream.format("txtasks")
            .option("url", database_url)
            .option("topic", TOPIC)
            .option("stream_id", "orders-topic")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        stream.awaitTermination(120)
        assert stream.exception() is None, stream.exception()

    add_file(0, range(0, 10))
    add_file(1, range(10, 20))
    run_stream()
    # a crash after the sink committed batch 1 but before the checkpoint recorded it:
    for name in ("1", ".1.crc"):
        (checkpoint / "commits" / name).unlink()
    add_file(2, range(20, 30))
    run_stream()  # replays batch 1, then batch 2

    rows = live_rows(database_url)
    found = Counter((group_of(r), json.loads(r["payload"])["order_id"]) for r in rows)
    assert found == Counter((g.group, n) for g in GROUPS for n in range(30))


def test_bad_topic_options_fail_before_anything_is_written(spark: Any, database_url: str) -> None:
    df = orders(spark, 4)
    cases = [
        ({"task": "spark.order"}, "give option 'task' or 'topic', not both"),
        ({"topic": "no spaces"}, "'no spaces' is not a valid topic name"),
        ({"queue": "orders"}, "option 'queue' does not apply with 'topic'"),
        ({"max_attempts": "3"}, "option 'max_attempts' does not apply with 'topic'"),
    ]
    for options, message in cases:
        with pytest.raises(Exception, match=message):
            publisher(df, database_url, **options).save()
    long_key = df.selectExpr("order_id", "repeat('k', 127) AS ref")
    with pytest.raises(Exception, match=r"option 'dedup': value 'k+' is too long \(at most 126"):
        publisher(long_key, database_url, dedup="ref").save()
    assert state_counts(database_url) == {}
    assert staged_count(database_url) == 0


def test_each_group_runs_what_spark_published(spark: Any, database_url: str) -> None:
    app = App("spark-topics", database_url=database_url)
    seen: list[tuple[str, int]] = []

    def handle(order: dict[str, Any], ctx: TaskContext) -> None:
        assert ctx.headers["txtasks-topic"] == TOPIC
        seen.append((ctx.headers["txtasks-group"], order["order_id"]))

    for sub in GROUPS[0], GROUPS[2]:
        app.task(name=sub.task_name, queue=sub.queue, subscribe=TOPIC, group=sub.group)(handle)

    subscribe(database_url, [s for s in GROUPS if s.group != "audit"])  # as a worker's start
    publisher(orders(spark, 10), database_url).save()

    async def run() -> Any:
        try:
            return await run_until_empty(app)
        finally:
            await app.aclose()

    stats = asyncio.run(run())
    assert stats.outcomes == {"completed": 20}
    assert sorted(seen) == sorted((g, n) for g in ("billing", "shipping") for n in range(10))
