"""A process that commits, hints and ends at once (a Spark job's driver, a script) still sends
its wake-ups: closing the publisher sends what was handed to the connection first."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from tests.waiting import until
from txtasks.wakeup import WakeupStats
from txtasks.wakeup.amqp import AmqpNotifier, AmqpPublisher

pytestmark = pytest.mark.rabbitmq


async def test_a_hint_published_right_before_close_arrives(amqp_url: str) -> None:
    queue = f"close-{uuid.uuid4().hex[:10]}"
    woken = asyncio.Event()
    subscriber = AmqpNotifier(amqp_url)
    await subscriber.subscribe([queue], lambda name, **_: woken.set())
    try:
        await until(lambda: subscriber.stats.connected, "the subscriber to connect")
        stats = WakeupStats()
        publisher = AmqpPublisher(amqp_url, stats, publish_timeout=5)
        publisher.notify(queue, [1])
        closed = threading.Thread(target=publisher.close, args=(5,))
        closed.start()
        await asyncio.to_thread(closed.join)
        assert stats.published == 1
        await asyncio.wait_for(woken.wait(), 5)
        assert subscriber.stats.received == 1
    finally:
        await subscriber.close()
