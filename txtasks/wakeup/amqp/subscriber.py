"""Consuming wake-ups on a worker's event loop: connect, consume until the connection is lost,
wait for the backoff, connect again, until closed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import aio_pika
from aio_pika.abc import AbstractConnection
from aiormq.abc import DeliveredMessage

from txtasks._waits import within
from txtasks.retry import RetryStrategy
from txtasks.wakeup.amqp.link import (
    CONNECT_TIMEOUT,
    EXCHANGE,
    RECONNECT_BACKOFF,
    Outage,
    connect_url,
    declare,
)
from txtasks.wakeup.base import (
    WakeupCallback,
    WakeupStats,
    cancel_route,
    wakeup_read,
)


class AmqpSubscriber:
    """Consumes the wake-up queues of a worker on the worker's own event loop.

    It connects, consumes until the connection is lost, waits for the backoff and connects again,
    until closed. `stats.connected` is True while it consumes. Besides the shared wake-up
    queues (one message wakes one worker), it consumes an exclusive AMQP queue of its own bound
    to the cancel route of each of its queues: a cancel wake-up reaches every worker.

    While its worker has no free slot (`accepting(False)`) it stops consuming the shared
    queues, so that the broker gives their wake-ups to the workers that can claim now; cancel
    wake-ups still arrive. `stats.taking` is True while it consumes the shared queues.
    """

    def __init__(
        self, url: str, stats: WakeupStats, reconnect: RetryStrategy = RECONNECT_BACKOFF
    ) -> None:
        self.url = url
        self.stats = stats
        self.reconnect = reconnect
        self._task: asyncio.Task[None] | None = None
        self._connection: AbstractConnection | None = None
        self._outage = Outage("wake-up subscriber", url, reconnect)
        self._closing = False
        #: Whether the worker has a free slot: the shared queues are consumed only then.
        self._accepting = True
        #: Set when `_accepting` changed: `_follow` consumes or cancels accordingly.
        self._accepting_changed = asyncio.Event()
        #: The task running `_follow` for the current connection.
        self._follower: asyncio.Task[None] | None = None

    def accepting(self, yes: bool) -> None:
        """Whether the worker can claim now (it has a free slot): when not, the shared
        queues' consumers are cancelled (the broker gives their messages to other workers),
        and consumed again when it can. Calls in quick succession cost at most one change
        of consumers at a time."""
        if yes != self._accepting:
            self._accepting = yes
            self._accepting_changed.set()

    async def start(self, queues: Sequence[str], on_wakeup: WakeupCallback) -> None:
        await self.close()  # one subscription at a time: the latest worker's
        self._closing = False
        self._accepting = True
        if self._task is None:
            wanted = frozenset(queues)
            self._task = asyncio.create_task(self._run(wanted, on_wakeup), name="txtasks-wakeups")

    def _on_message(self, wanted: frozenset[str], on_wakeup: WakeupCallback) -> Any:
        async def handle(message: DeliveredMessage) -> None:
            wakeup = wakeup_read(message.body)
            if wakeup is None or wakeup.queue not in wanted:
                self.stats.malformed += 1
                return
            self.stats.received += 1
            if wakeup.cancel:
                self.stats.cancels_received += 1
                on_wakeup(wakeup.queue, cancel=True)
            else:
                on_wakeup(wakeup.queue, ids=wakeup.ids)

        return handle

    async def _run(self, wanted: frozenset[str], on_wakeup: WakeupCallback) -> None:
        while not self._closing:
            error = await self._consume_until_lost(wanted, on_wakeup)
            if self._closing:
                return
            await asyncio.sleep(self._outage.failed(error))

    async def _consume_until_lost(
        self, wanted: frozenset[str], on_wakeup: WakeupCallback
    ) -> BaseException:
        """Connect and consume until the connection or channel closes; what ended it."""
        lost: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        try:
            await within(self._consume(wanted, on_wakeup, lost), CONNECT_TIMEOUT)
            self._outage.connected()
            self.stats.connected = True
            return await lost
        except Exception as exc:
            return exc
        finally:
            self.stats.connected = self.stats.taking = False
            await self._disconnect()

    async def _consume(
        self,
        wanted: frozenset[str],
        on_wakeup: WakeupCallback,
        lost: asyncio.Future[BaseException],
    ) -> None:
        def closed(_sender: Any, exc: BaseException | None = None) -> None:
            if not lost.done():
                lost.set_result(exc if isinstance(exc, Exception) else ConnectionError("closed"))

        self._connection = connection = await aio_pika.connect(connect_url(self.url))
        connection.close_callbacks.add(closed)
        channel = await connection.channel()
        channel.close_callbacks.add(closed)
        await channel.set_qos(prefetch_count=100)
        handler = self._on_message(wanted, on_wakeup)
        amqp_queues = [await declare(channel, queue) for queue in sorted(wanted)]
        cancels = await channel.declare_queue(exclusive=True, auto_delete=True)
        for queue in sorted(wanted):
            await cancels.bind(EXCHANGE, routing_key=cancel_route(queue))
        # the shared queues last: a wake-up taken is counted as the subscriber connects.
        # Consumed on aiormq's channel: its delivery calls the handler in the task it makes
        # for the message, where aio-pika's `Queue.consume` makes a second one.
        underlay = await channel.get_underlay_channel()
        await underlay.basic_consume(cancels.name, handler, no_ack=True)
        names = [amqp_queue.name for amqp_queue in amqp_queues]
        tags: list[str] = []
        self._accepting_changed.clear()
        await self._consumers_set(underlay, names, handler, tags)
        self._follower = asyncio.create_task(self._follow(underlay, names, handler, tags))
        self._follower.add_done_callback(lambda done: closed(None, _follow_error(done)))

    async def _follow(self, underlay: Any, names: list[str], handler: Any, tags: list[str]) -> None:
        """Keep the shared queues' consumers (`tags`) as `accepting` asks, until the
        connection is given up."""
        while True:
            await self._accepting_changed.wait()
            self._accepting_changed.clear()
            await self._consumers_set(underlay, names, handler, tags)

    async def _consumers_set(
        self, underlay: Any, names: list[str], handler: Any, tags: list[str]
    ) -> None:
        """Consume the shared queues `names` if the worker accepts wake-ups, else cancel
        their consumers (`tags`, the consumer tags of those consumed now)."""
        if self._accepting and not tags:
            for name in names:
                consumed = await underlay.basic_consume(name, handler, no_ack=True)
                tags.append(consumed.consumer_tag)
        elif not self._accepting and tags:
            while tags:
                await underlay.basic_cancel(tags.pop())
        self.stats.taking = bool(tags)

    async def _disconnect(self) -> None:
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()

    async def close(self) -> None:
        self._closing = True
        self._outage.stop()
        await self._disconnect()  # first, so a setup under way fails instead of being cut
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


def _follow_error(done: asyncio.Task[None]) -> Exception:
    """What ended `_follow`: a failed consume or cancel ends the connection's use."""
    if done.cancelled():
        return ConnectionError("closed")
    error = done.exception()
    return error if isinstance(error, Exception) else ConnectionError("closed")
