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


def test_closing_the_publisher_ends_every_task_left_on_its_loop() -> None:
    # a connection lost to a broker that hung up leaves the AMQP library's own close running
    # on the publisher's loop: ended before the loop closes, never collected later as a
    # coroutine of a closed loop (an unraisable error in whatever runs then)
    publisher = AmqpPublisher("amqp://app:app@127.0.0.1:9/", WakeupStats(), publish_timeout=0.2)
    publisher.notify("left", [1])
    loop = publisher.loop
    assert loop is not None
    seen: list[str] = []

    async def library_close() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("finished")

    started = threading.Event()
    # held here, as the library holds its own (a loop keeps only weak references to its tasks:
    # a task nothing else holds may be collected while pending, before the close)
    held: list[asyncio.Task[None]] = []
    loop.call_soon_threadsafe(
        lambda: (held.append(loop.create_task(library_close())), started.set())
    )
    assert started.wait(5)
    publisher.close(5)
    assert seen == ["cancelled", "finished"]
