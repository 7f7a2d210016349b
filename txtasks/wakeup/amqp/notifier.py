"""`AmqpNotifier`: RabbitMQ wake-ups, a publisher for enqueuers and a subscriber for workers."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence

from txtasks.retry import RetryStrategy
from txtasks.wakeup.amqp.link import (
    RECONNECT_BACKOFF,
)
from txtasks.wakeup.amqp.publisher import AmqpPublisher, LoopPublisher
from txtasks.wakeup.amqp.subscriber import AmqpSubscriber
from txtasks.wakeup.base import (
    WakeupCallback,
    WakeupStats,
)


class AmqpNotifier:
    """Wake-ups through RabbitMQ: a publisher for enqueuers and a subscriber for workers."""

    def __init__(
        self,
        url: str,
        *,
        max_pending: int = 10_000,
        publish_timeout: float = 1.0,
        reconnect: RetryStrategy = RECONNECT_BACKOFF,
    ) -> None:
        self.url = url
        self.stats = WakeupStats()
        self.max_pending = max_pending
        self.publish_timeout = publish_timeout
        self.reconnect = reconnect
        self.publisher = AmqpPublisher(
            url,
            self.stats,
            max_pending=max_pending,
            publish_timeout=publish_timeout,
            reconnect=reconnect,
        )
        self.loop_publishers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, LoopPublisher
        ] = weakref.WeakKeyDictionary()
        self.subscriber = AmqpSubscriber(url, self.stats, reconnect)

    def notify(self, queue: str, ids: Sequence[int] = (), *, cancel: bool = False) -> None:
        """From a thread running an event loop, publish on that loop; else on the thread."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or loop is self.publisher.loop:
            self.publisher.notify(queue, ids, cancel=cancel)
            return
        publisher = self.loop_publishers.get(loop)
        if publisher is None:
            for old in [other for other in self.loop_publishers if other.is_closed()]:
                del self.loop_publishers[old]  # loops gone (asyncio.run per call)
            publisher = self.loop_publishers[loop] = LoopPublisher(
                self.url,
                self.stats,
                max_pending=self.max_pending,
                timeout=self.publish_timeout,
                reconnect=self.reconnect,
            )
        publisher.notify(queue, ids, cancel=cancel)

    async def subscribe(self, queues: Sequence[str], on_wakeup: WakeupCallback) -> None:
        await self.subscriber.start(queues, on_wakeup)

    def accepting(self, yes: bool) -> None:
        """Whether the subscribed worker can claim now: while not, the broker gives the
        wake-ups of its queues to other workers (see `AmqpSubscriber.accepting`)."""
        self.subscriber.accepting(yes)

    async def unsubscribe(self) -> None:
        await self.subscriber.close()
        self.stats.connected = False

    async def close(self) -> None:
        """Close the subscriber and publishers; hints still pending are published first."""
        await self.subscriber.close()
        loop = asyncio.get_running_loop()
        publisher = self.loop_publishers.pop(loop, None)
        if publisher is not None:
            await publisher.close()
        await loop.run_in_executor(None, self.publisher.close)
