"""Conformance suite: topics in the caller's transaction, on every database, with each
SQLAlchemy flavour; and topics through the worker (subscriptions stored at its start, every
group's handler run once, an undeployed handler dead-lettered with a reason naming it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Table, select

from tests.integration.conformance import (
    FLAVOURS,
    Calls,
    Publish,
    Write,
    order_names,
    own_table,
    run_tx,
    sync_engine,
    table_rows,
)
from tests.recording import Recording
from txtasks import App
from txtasks.driver.dialect import dialect_for
from txtasks.driver.insert_plan import plan_run_sync
from txtasks.driver.mysql import MySQLDialect
from txtasks.driver.urls import backend_name
from txtasks.schema.tables import key_hints, tasks, topic_drops
from txtasks.testing import run_until_empty
from txtasks.types import Subscription

TOPIC = "order.created"


@pytest.fixture
def orders(database_url: str) -> Iterator[Table]:
    with own_table(database_url) as table:
        yield table


def shop(app: App) -> dict[str, Calls]:
    """Three groups of `order.created` in three queues, each recording what it ran."""
    calls = {"billing": Calls(), "shipping": Calls(), "analytics": Calls()}
    for name, handler in calls.items():
        app.task(name=f"shop.{name}", queue=name, subscribe=TOPIC, group=name)(handler)
    return calls


def topic_tasks(url: str) -> list[Any]:
    return table_rows(url, tasks, tasks.c.headers.is_not(None))


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_a_committed_publish_reaches_every_group_with_the_callers_writes(
    app: App, database_url: str, orders: Table, flavour: str
) -> None:
    calls = shop(app)
    await app.topics.asubscribe()
    steps = [Write("order 42"), Publish(app, TOPIC, {"order": 42}), Write("after")]
    _, ids, _ = await run_tx(database_url, flavour, steps)
    assert len(ids) == 3
    assert order_names(database_url) == ["order 42", "after"]
    assert sorted(r.id for r in topic_tasks(database_url)) == sorted(ids)
    await run_until_empty(app)
    assert {name: c.payloads for name, c in calls.items()} == {
        "billing": [{"order": 42}], "shipping": [{"order": 42}], "analytics": [{"order": 42}],
    }  # fmt: skip


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_a_rolled_back_publish_reaches_no_group_and_is_not_counted(
    app: App, database_url: str, orders: Table, flavour: str
) -> None:
    shop(app)
    await app.topics.asubscribe()
    steps = [
        Write("order 42"),
        Publish(app, TOPIC, 1, {"key": "customer:1"}),
        Publish(app, "nobody.listens", 2),
    ]
    await run_tx(database_url, flavour, steps, commit=False)
    assert order_names(database_url) == []
    assert topic_tasks(database_url) == []
    assert table_rows(database_url, key_hints) == []
    assert table_rows(database_url, topic_drops) == []


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_a_dedup_key_hit_in_every_group_keeps_the_callers_transaction(
    app: App, database_url: str, orders: Table, flavour: str
) -> None:
    shop(app)
    await app.topics.asubscribe()
    steps = [
        Write("before"),
        Publish(app, TOPIC, "first", {"dedup_key": "order-42"}),
        Publish(app, TOPIC, "again", {"dedup_key": "order-42"}),
        Write("after"),
    ]
    _, first, again, _ = await run_tx(database_url, flavour, steps)
    assert (len(first), again) == (3, [])
    [_, across, _] = await run_tx(database_url, flavour, [Write("x"), steps[1], Write("y")])
    assert across == []
    assert order_names(database_url) == ["before", "after", "x", "y"]
    keys = sorted(r.dedup_key for r in topic_tasks(database_url))
    assert keys == ["analytics/order-42", "billing/order-42", "shipping/order-42"]
    assert table_rows(database_url, topic_drops) == []


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_a_bulk_publish_in_the_callers_transaction(
    app: App, database_url: str, orders: Table, flavour: str
) -> None:
    shop(app)
    await app.topics.asubscribe()
    batch = [app.topics.new_publish(TOPIC, n) for n in range(5)]
    batch.append(app.topics.new_publish("nobody.listens", "lost"))
    [found] = await run_tx(database_url, flavour, [Publish(app, publishes=batch)])
    assert [len(ids) for ids in found] == [3, 3, 3, 3, 3, 0]
    assert len(topic_tasks(database_url)) == 15
    assert [r.topic for r in table_rows(database_url, topic_drops)] == ["nobody.listens"]


@pytest.mark.parametrize("flavour", ["connection", "async_session"])
async def test_keyed_publishes_leave_a_hint_per_group_queue(
    app: App, database_url: str, flavour: str
) -> None:
    shop(app)
    await app.topics.asubscribe()
    steps = [Publish(app, TOPIC, n, {"key": "customer:7"}) for n in range(3)]
    await run_tx(database_url, flavour, steps)
    hints = table_rows(database_url, key_hints)
    assert sorted((h.queue, h.partition_key) for h in hints) == [
        ("analytics", "customer:7"),
        ("analytics", "customer:7"),
        ("analytics", "customer:7"),
        ("billing", "customer:7"),
        ("billing", "customer:7"),
        ("billing", "customer:7"),
        ("shipping", "customer:7"),
        ("shipping", "customer:7"),
        ("shipping", "customer:7"),
    ]  # fmt: skip (one per publish and queue, as one keyed enqueue per task leaves)


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_one_wake_up_per_group_queue_after_the_commit(
    database_url: str, orders: Table, flavour: str
) -> None:
    recording = Recording()
    app = App("wakes", database_url=database_url, notifier=recording)  # type: ignore[arg-type]
    try:
        shop(app)
        await app.topics.asubscribe()
        steps = [Publish(app, TOPIC, n) for n in range(4)]
        steps.append(Publish(app, TOPIC, "later", {"delay": 3600}))
        await run_tx(database_url, flavour, steps, commit=False)
        assert recording.calls == []
        results = await run_tx(database_url, flavour, steps)
        by_queue = dict(recording.calls)
        assert len(recording.calls) == len(by_queue) == 3
        for queue in ("billing", "shipping", "analytics"):
            expected = [
                i for ids in results[:4] for i in ids if _queue_of(database_url, i) == queue
            ]
            assert by_queue[queue] == expected
    finally:
        await app.aclose()


def _queue_of(url: str, task_id: int) -> str:
    [row] = table_rows(url, tasks, tasks.c.id == task_id)
    return str(row.queue)


async def test_the_worker_stores_the_subscriptions_of_the_queues_it_serves(
    app: App, database_url: str
) -> None:
    shop(app)
    await run_until_empty(app, queues=["billing", "shipping"])
    subs = await app.driver.topics.subscription_list()
    assert [(s.topic, s.group, s.task_name, s.queue) for s in subs] == [
        (TOPIC, "billing", "shop.billing", "billing"),
        (TOPIC, "shipping", "shop.shipping", "shipping"),
    ]


async def test_an_undeployed_subscriber_is_dead_lettered_naming_topic_and_group(
    app: App, database_url: str
) -> None:
    shop(app)
    gone = Subscription(TOPIC, "fraud", "shop.fraud_check", "billing")  # no such handler
    await app.driver.topics.subscription_set_many([gone], now=app.clock())
    await app.topics.asubscribe()
    await app.topics.apublish(TOPIC, {"order": 1})
    await run_until_empty(app)
    [dead] = await app.driver.admin.dead_list()
    assert dead.task_name == "shop.fraud_check"
    assert "no task named 'shop.fraud_check'" in (dead.last_error or "")
    assert "delivered by topic 'order.created' to group 'fraud'" in (dead.last_error or "")
    assert "txtasks unsubscribe order.created fraud" in (dead.last_error or "")


async def test_the_read_then_insert_publish_without_returning(app: App, database_url: str) -> None:
    """MySQL 8 has no INSERT ... RETURNING: its publish reads the topics' subscriptions (locked
    until the commit) and inserts their tasks as an enqueue does. Run here on each database."""
    shop(app)
    await app.topics.asubscribe()
    batch = [
        app.topics.new_publish(TOPIC, 1, key="k"),
        app.topics.new_publish("nobody.listens", 2),
        app.topics.new_publish(TOPIC, 3),
    ]
    with sync_engine(database_url) as engine, engine.begin() as conn:
        if backend_name(database_url) != "mysql":
            found = plan_run_sync(conn, _ReadFirst.publish_plan(batch, dialect_for(conn.dialect)))
        else:
            found = plan_run_sync(conn, MySQLDialect.topics.publish_plan(batch))
    assert [len(d) for d in found] == [3, 0, 3]
    rows = topic_tasks(database_url)
    assert sorted(r.id for r in rows) == sorted(d.id for ds in found for d in ds)
    heads = {json.loads(r.headers)["txtasks-group"] for r in rows}
    assert heads == {"billing", "shipping", "analytics"}
    assert [r.topic for r in table_rows(database_url, topic_drops)] == ["nobody.listens"]
    assert len(table_rows(database_url, key_hints)) == 3
    with sync_engine(database_url) as engine, engine.connect() as conn:
        assert (
            conn.execute(select(tasks.c.partition_key).where(tasks.c.id == found[0][0].id)).scalar()
            == "k"
        )


class _ReadFirst:
    """The read-then-insert plan on a database that has RETURNING (to test it there)."""

    @staticmethod
    def publish_plan(batch: list[Any], dialect: Any) -> Any:
        cls = type("NoReturning", (type(dialect),), {"returning_insert": False})
        return cls.topics.publish_plan(batch)
