"""Conformance suite: topics, on every database and in memory.

A publish gives every group subscribed when it runs exactly one task (of the group's task
name, queue, priority and attempts), in one statement; a topic without subscribers drops the
publish and counts it; a dedup key is per group; keyed deliveries leave the hints a keyed
enqueue leaves; a subscription changed while publishes run never splits one publish.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import timedelta
from typing import Any

from tests.integration.conformance import T0, at, claim, get, write
from tests.integration.conftest import another
from txtasks.driver import Driver
from txtasks.keys import KeyLimits
from txtasks.options import EnqueueOptions
from txtasks.payload import payload_decode
from txtasks.publishes import new_publish
from txtasks.topics import head_of
from txtasks.types import (
    GROUP_HEADER,
    MESSAGE_HEADER,
    TOPIC_HEADER,
    NewPublish,
    Outcome,
    OutcomeKind,
    Subscription,
)

TOPIC = "order.created"
GROUPS = [
    Subscription(TOPIC, "billing", "shop.bill", "billing", priority=1, max_attempts=3),
    Subscription(TOPIC, "shipping", "shop.ship", "shipping", priority=0, max_attempts=5),
    Subscription(TOPIC, "analytics", "shop.count", "analytics", priority=-1, max_attempts=9),
]
QUEUES = ["analytics", "billing", "shipping"]


def pub(payload: Any = None, topic: str = TOPIC, **options: Any) -> NewPublish:
    return new_publish(
        topic, payload, EnqueueOptions(**options), clock=lambda: T0, max_payload_bytes=1 << 20
    )


async def publish(driver: Driver, *publishes: NewPublish) -> list[list[int]]:
    found = await driver.topics.topic_publish_many(list(publishes))
    return [[d.id for d in delivered] for delivered in found]


async def subscribe(driver: Driver, *subs: Subscription) -> None:
    await driver.topics.subscription_set_many(list(subs), now=T0)


async def test_a_publish_gives_every_group_one_task_of_its_own(driver: Driver) -> None:
    await subscribe(driver, *GROUPS)
    [ids] = await publish(driver, pub({"order": 42}, headers={"tenant": "t1"}))
    assert len(ids) == 3
    rows = sorted([await get(driver, i) for i in ids], key=lambda r: r.queue)
    assert [(r.queue, r.task_name, r.priority, r.max_attempts) for r in rows] == [
        ("analytics", "shop.count", -1, 9),
        ("billing", "shop.bill", 1, 3),
        ("shipping", "shop.ship", 0, 5),
    ]
    headers = [json.loads(r.headers or "") for r in rows]
    assert {h[GROUP_HEADER] for h in headers} == {"analytics", "billing", "shipping"}
    assert {(h[TOPIC_HEADER], h["tenant"]) for h in headers} == {(TOPIC, "t1")}
    assert len({h[MESSAGE_HEADER] for h in headers}) == 1  # one message, three deliveries
    for row in rows:
        assert payload_decode(row.payload, row.content_type) == {"order": 42}
        assert (row.state.value, row.attempt, row.dedup_key, row.partition_key) == (
            "pending", 0, None, None,
        )  # fmt: skip
    assert [s.group for s in await driver.topics.subscription_list([TOPIC])] == [
        "analytics", "billing", "shipping",
    ]  # fmt: skip


async def test_a_publish_may_set_priority_and_delay_for_every_group(driver: Driver) -> None:
    await subscribe(driver, *GROUPS)
    [ids] = await publish(driver, pub(1, priority=7, delay=30))
    rows = [await get(driver, i) for i in ids]
    assert {(r.priority, r.run_at) for r in rows} == {(7, T0 + timedelta(seconds=30))}
    assert await claim(driver, QUEUES, now=at(29)) == []
    assert len(await claim(driver, QUEUES, now=at(30))) == 3


async def test_each_group_claims_retries_and_dead_letters_on_its_own(driver: Driver) -> None:
    await subscribe(driver, *GROUPS)
    await publish(driver, pub("x"))
    [billing] = await claim(driver, ["billing"])
    [shipping] = await claim(driver, ["shipping"])
    await write(
        driver,
        Outcome(billing.key, OutcomeKind.DEAD, error="boom"),
        Outcome(shipping.key, OutcomeKind.RETRY, error="later", run_at=at(60)),
    )
    assert [r.id for r in await driver.admin.dead_list()] == [billing.id]
    assert (await get(driver, shipping.id)).state.value == "retryable"
    assert [r.queue for r in await claim(driver, QUEUES)] == ["analytics"]  # untouched by both
    assert await driver.admin.dead_requeue([billing.id], now=at(1)) == [billing.id]
    assert [r.id for r in await claim(driver, ["billing"], now=at(1))] == [billing.id]


async def test_a_topic_without_subscribers_drops_the_publish_and_counts_it(
    driver: Driver,
) -> None:
    await subscribe(driver, *GROUPS)
    assert await publish(driver, pub(1, topic="order.lost"), pub(2, topic="order.lost")) == [
        [], [],
    ]  # fmt: skip
    assert await claim(driver, QUEUES) == []
    stats = {s.topic: s for s in await driver.topics.topic_stats()}
    assert (stats["order.lost"].dropped, stats["order.lost"].groups) == (2, ())
    assert stats["order.lost"].last_dropped_at == T0
    assert stats[TOPIC].dropped == 0 and len(stats[TOPIC].groups) == 3
    assert await driver.topics.topic_drops_forget_many(before=T0, limit=10) == 0
    assert await driver.topics.topic_drops_forget_many(before=at(1), limit=1) == 1
    assert await driver.topics.topic_drops_forget_many(before=at(1), limit=10) == 1
    assert "order.lost" not in {s.topic for s in await driver.topics.topic_stats()}


async def test_topic_stats_count_each_groups_live_tasks(driver: Driver) -> None:
    await subscribe(driver, *GROUPS)
    await publish(driver, pub(1), pub(2))
    await claim(driver, ["billing"], limit=1)
    [stats] = await driver.topics.topic_stats()
    counts = {sub.group: c for sub, c in stats.groups}
    assert counts == {
        "analytics": {"pending": 2},
        "billing": {"pending": 1, "processing": 1},
        "shipping": {"pending": 2},
    }


async def test_a_group_gets_what_is_published_after_it_subscribed(driver: Driver) -> None:
    billing, shipping, analytics = GROUPS
    await subscribe(driver, billing)
    [first] = await publish(driver, pub("first"))
    await subscribe(driver, shipping, analytics)
    [second] = await publish(driver, pub("second"))
    assert (len(first), len(second)) == (1, 3)
    assert (
        await driver.topics.subscription_delete_many([(TOPIC, "billing"), (TOPIC, "nobody")]) == 1
    )
    [third] = await publish(driver, pub("third"))
    rows = [await get(driver, i) for i in third]
    assert sorted(r.queue for r in rows) == ["analytics", "shipping"]
    assert (await get(driver, first[0])).state.value == "pending"  # delivered tasks stay


async def test_subscribing_again_changes_the_groups_task_and_queue(driver: Driver) -> None:
    await subscribe(driver, GROUPS[0])
    moved = Subscription(TOPIC, "billing", "shop.bill_v2", "billing2", priority=5, max_attempts=2)
    await subscribe(driver, moved)
    [sub] = await driver.topics.subscription_list()
    assert (sub.task_name, sub.queue, sub.priority, sub.max_attempts) == (
        "shop.bill_v2", "billing2", 5, 2,
    )  # fmt: skip
    [[task_id]] = await publish(driver, pub(1))
    assert (await get(driver, task_id)).queue == "billing2"


async def test_a_dedup_key_is_per_group(driver: Driver) -> None:
    await subscribe(driver, *GROUPS)
    [first] = await publish(driver, pub("a", dedup_key="order-42"))
    assert len(first) == 3
    rows = {(await get(driver, i)).queue: await get(driver, i) for i in first}
    assert rows["billing"].dedup_key == "billing/order-42"
    [again] = await publish(driver, pub("b", dedup_key="order-42"))
    assert again == []  # every group's delivery is live: nothing new, nothing dropped
    [billing] = await claim(driver, ["billing"])
    await write(driver, Outcome(billing.key, OutcomeKind.COMPLETE))
    [third] = await publish(driver, pub("c", dedup_key="order-42"))
    [row] = [await get(driver, i) for i in third]
    assert (row.queue, payload_decode(row.payload, row.content_type)) == ("billing", "c")
    assert [s.dropped for s in await driver.topics.topic_stats()] == [0]


async def test_two_publishes_with_one_dedup_key_in_one_batch_deliver_once(
    driver: Driver,
) -> None:
    await subscribe(driver, *GROUPS)
    found = await publish(driver, pub("a", dedup_key="k"), pub("b", dedup_key="k"), pub("c"))
    assert [len(ids) for ids in found] == [3, 0, 3]
    assert len(set(found[0]) | set(found[2])) == 6


async def test_keyed_deliveries_are_claimed_by_each_groups_key_limits(driver: Driver) -> None:
    await subscribe(driver, *GROUPS)
    ordered = {q: KeyLimits(ordered=True) for q in QUEUES}
    [first] = await publish(driver, pub(1, key="customer:7"))
    [second] = await publish(driver, pub(2, key="customer:7"))
    rows = [await get(driver, i) for i in first + second]
    assert {r.partition_key for r in rows} == {"customer:7"}
    got = await claim(driver, QUEUES, keys=ordered)
    assert sorted(r.id for r in got) == sorted(first)  # the head of each group's key only
    assert await claim(driver, QUEUES, keys=ordered) == []
    await write(driver, *(Outcome(r.key, OutcomeKind.COMPLETE) for r in got))
    again = await claim(driver, QUEUES, keys=ordered)
    assert sorted(r.id for r in again) == sorted(second)


async def test_a_bulk_publish_maps_every_task_to_its_publish(driver: Driver) -> None:
    other = Subscription("order.paid", "ledger", "shop.ledger", "ledger")
    await subscribe(driver, *GROUPS, other)
    batch = [pub({"n": n}, topic=TOPIC if n % 3 else "order.paid") for n in range(300)]
    batch.append(pub("lost", topic="nobody.listens"))
    found = await publish(driver, *batch)
    assert [len(ids) for ids in found] == [1 if n % 3 == 0 else 3 for n in range(300)] + [0]
    for publish_, ids in zip(batch, found, strict=True):
        for task_id in ids:
            row = await get(driver, task_id)
            assert head_of(row.headers) == publish_.headers_head
            assert payload_decode(row.payload, row.content_type) == json.loads(publish_.payload)
    assert len({i for ids in found for i in ids}) == 100 + 200 * 3
    dropped = {s.topic: s.dropped for s in await driver.topics.topic_stats()}
    assert dropped == {"nobody.listens": 1, TOPIC: 0, "order.paid": 0}


async def test_a_subscription_change_never_splits_one_publish(driver: Driver) -> None:
    """Subscribe and unsubscribe all three groups at once (one transaction each), over and
    over, while another connection publishes, until publishes have seen both states many
    times: each publish reaches all three groups or none."""
    publisher = await another(driver)
    sizes: list[int] = []

    async def toggle() -> None:
        pairs = [(s.topic, s.group) for s in GROUPS]
        while min(sizes.count(0), sizes.count(3)) < 20:
            await driver.topics.subscription_set_many(GROUPS, now=T0)
            await asyncio.sleep(0)  # let the publisher run (the memory driver never waits)
            await driver.topics.subscription_delete_many(pairs)
            await asyncio.sleep(0)

    async def publish_while(toggling: asyncio.Task[None]) -> None:
        while not toggling.done():
            [delivered] = await publisher.topics.topic_publish_many([pub(len(sizes))])
            sizes.append(len(delivered))
            await asyncio.sleep(0)

    try:
        toggling = asyncio.ensure_future(toggle())
        await asyncio.wait_for(asyncio.gather(toggling, publish_while(toggling)), 60)
    finally:
        if publisher is not driver:
            await publisher.close()
    assert set(sizes) == {0, 3}, Counter(sizes)
    rows = await claim(driver, QUEUES, limit=100_000, now=at(0))
    assert len(rows) == 3 * sizes.count(3)
    messages = Counter(json.loads(r.headers or "")[MESSAGE_HEADER] for r in rows)
    assert set(messages.values()) == {3}


async def test_a_bulk_publish_across_statements_keeps_publish_order_in_each_group(
    driver: Driver,
) -> None:
    """1,100 keyed publishes span several statements on every database (256 publishes per
    statement, 1,000 on PostgreSQL): each group's tasks of the key are in publish order."""
    await subscribe(driver, *GROUPS)
    batch = [pub({"n": n}, key="customer:7") for n in range(1100)]
    found = await publish(driver, *batch)
    assert [len(ids) for ids in found] == [3] * 1100
    by_queue: dict[str, list[int]] = {}
    for n, ids in enumerate(found):
        for task_id in ids:
            row = await get(driver, task_id)
            assert payload_decode(row.payload, row.content_type) == {"n": n}
            by_queue.setdefault(row.queue, []).append(task_id)
    assert sorted(by_queue) == QUEUES
    assert all(ids == sorted(ids) for ids in by_queue.values())  # ids: the key's order
