"""RabbitMQ wake-ups through aio-pika.

Topology: a direct exchange `txtasks.wakeup`, and one AMQP queue per task queue
(`txtasks.wakeup.<queue>`) that every worker of that queue consumes from: competing consumers,
so one message wakes one worker. Messages are small JSON, non-persistent, with a TTL; consumers
take them without acks. Nothing in RabbitMQ is state: delays and retries live in the table.

Publishing runs on a background thread with its own event loop, so sync and async callers alike
hand a hint over in microseconds and never wait for the broker: a slow or absent broker means
hints are buffered (bounded), then dropped and counted, never raised into the application.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
import weakref
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import aio_pika
import aiormq
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from txtasks.wakeup.base import (
    MAX_IDS,
    WakeupCallback,
    WakeupStats,
    wakeup_decode,
    wakeup_encode,
)

log = logging.getLogger("txtasks.wakeup")
T = TypeVar("T")

EXCHANGE = "txtasks.wakeup"
QUEUE_PREFIX = "txtasks.wakeup."
#: Hints older than this are useless: workers will have polled by then.
MESSAGE_TTL_MS = 60_000
#: A queue nobody consumes keeps at most this many hints (the oldest are dropped).
MAX_QUEUE_LENGTH = 10_000
RECONNECT_INTERVAL = 1.0
PROPERTIES = aiormq.spec.Basic.Properties(content_type="application/json", delivery_mode=1)
MAX_BACKOFF = 30.0


def amqp_queue_name(queue: str) -> str:
    return QUEUE_PREFIX + queue


async def declare(channel: aio_pika.abc.AbstractChannel, queue: str) -> Any:
    """Declare the exchange and the wake-up queue of `queue`, bound by the queue name."""
    exchange = await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True)
    amqp_queue = await channel.declare_queue(
        amqp_queue_name(queue),
        durable=False,
        arguments={
            "x-message-ttl": MESSAGE_TTL_MS,
            "x-max-length": MAX_QUEUE_LENGTH,
            "x-overflow": "drop-head",
        },
    )
    await amqp_queue.bind(exchange, routing_key=queue)
    return amqp_queue


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """`asyncio.wait_for` without its extra task where `asyncio.timeout` exists (3.11+)."""
    timeout = getattr(asyncio, "timeout", None)
    if timeout is None:  # pragma: no cover - Python 3.10
        return await asyncio.wait_for(awaitable, seconds)
    async with timeout(seconds):
        return await awaitable


def _merge(pending: dict[str, list[int]], queue: str, ids: Sequence[int]) -> None:
    """Coalesce hints of one queue, keeping at most the ids one message carries."""
    known = pending.setdefault(queue, [])
    known.extend(ids[: max(0, MAX_IDS - len(known))])


class _Once:
    """Log a failure once until the next success, so an outage is not a log flood."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.failing = False

    def failed(self, exc: BaseException) -> None:
        if not self.failing:
            log.warning("%s: %s (working on by polling; will retry)", self.what, exc)
        self.failing = True

    def ok(self) -> None:
        if self.failing:
            log.info("%s: back", self.what)
        self.failing = False


class _PublishLink:
    """The publisher's connection: opened lazily, retried with backoff, declared queues cached."""

    def __init__(self, url: str, timeout: float, health: _Once) -> None:
        self.url = url
        self.timeout = timeout
        self.health = health
        self.connection: AbstractRobustConnection | None = None
        self._channel: Any = None
        self._exchange: Any = None
        self.declared: set[str] = set()
        self.backoff = 0.0
        self.retry_at = 0.0

    async def exchange(self) -> Any:
        """The exchange to publish to, or None while the broker is unreachable."""
        if self._exchange is not None:
            return self._exchange
        loop = asyncio.get_running_loop()
        if loop.time() < self.retry_at:
            return None
        try:
            self.connection = await aio_pika.connect_robust(
                self.url, timeout=self.timeout, reconnect_interval=RECONNECT_INTERVAL
            )
            self._channel = await self.connection.channel(publisher_confirms=False)
            self._exchange = await self._channel.declare_exchange(
                EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True
            )
            self.declared.clear()
            self.backoff = 0.0
        except Exception as exc:
            await self.close()
            self.backoff = min(MAX_BACKOFF, max(0.5, self.backoff * 2))
            self.retry_at = loop.time() + self.backoff * random.uniform(0.5, 1.0)
            self.health.failed(exc)
        return self._exchange

    async def publish(self, queue: str, ids: list[int]) -> None:
        """One message; handed to the connection's writer without waiting for the drain."""
        if queue not in self.declared:  # so a hint waits in its queue even before any worker
            await asyncio.wait_for(declare(self._channel, queue), self.timeout)
            self.declared.add(queue)
        channel = await within(self._channel.get_underlay_channel(), self.timeout)
        await channel.basic_publish(
            wakeup_encode(queue, ids),
            exchange=EXCHANGE,
            routing_key=queue,
            properties=PROPERTIES,
            timeout=self.timeout,
            wait=False,
        )

    async def publish_batch(self, batch: dict[str, list[int]], stats: WakeupStats) -> None:
        """One message per queue; failures are counted and logged once, never raised."""
        if await self.exchange() is None:
            stats.dropped += len(batch)
            return
        for queue, ids in batch.items():
            try:
                await self.publish(queue, ids)
                stats.published += 1
                self.health.ok()
            except Exception as exc:
                stats.dropped += 1
                self.health.failed(exc)

    async def close(self) -> None:
        connection, self.connection, self._exchange = self.connection, None, None
        self._channel = None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()


class LoopPublisher:
    """Publishes on the committing code's own event loop: no thread hop for async callers."""

    def __init__(self, url: str, stats: WakeupStats, *, max_pending: int, timeout: float) -> None:
        self.stats = stats
        self.max_pending = max_pending
        self.link = _PublishLink(url, timeout, _Once("wake-up publisher"))
        self._pending: dict[str, list[int]] = {}
        self._task: asyncio.Task[None] | None = None

    def notify(self, queue: str, ids: Sequence[int]) -> None:
        if len(self._pending) >= self.max_pending:
            self.stats.dropped += 1
            return
        if queue in self._pending:
            self.stats.coalesced += 1
        _merge(self._pending, queue, ids)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, {}
            await self.link.publish_batch(batch, self.stats)

    async def close(self, timeout: float = 2.0) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(self._task, return_exceptions=True), timeout)
        await self.link.close()


class AmqpPublisher:
    """Coalesces hints per queue and publishes them from a background thread."""

    def __init__(
        self,
        url: str,
        stats: WakeupStats,
        *,
        max_pending: int = 10_000,
        publish_timeout: float = 1.0,
    ) -> None:
        self.url = url
        self.stats = stats
        self.max_pending = max_pending
        self.publish_timeout = publish_timeout
        self._lock = threading.Lock()
        self._pending: dict[str, list[int]] = {}
        self._pending_count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closing = False
        self._health = _Once("wake-up publisher")

    def notify(self, queue: str, ids: Sequence[int]) -> None:
        with self._lock:
            if os.getpid() != self._pid:  # forked: the thread did not come along
                self._reset_after_fork()
            if self._closing:
                return
            if self._pending_count >= self.max_pending:
                self.stats.dropped += 1
                return
            if queue in self._pending:
                self.stats.coalesced += 1
            _merge(self._pending, queue, ids)
            self._pending_count += 1
            self._start_thread()
            loop, ready = self._loop, self._ready
        if loop is not None and ready is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(ready.set)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The background thread's loop (hints raised on it must not start another publisher)."""
        return self._loop

    def _reset_after_fork(self) -> None:
        self._pid = os.getpid()
        self._thread = None
        self._loop = None
        self._ready = None
        self._pending = {}
        self._pending_count = 0

    def _start_thread(self) -> None:
        if self._thread is not None:
            return
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._thread_main, args=(started,), name="txtasks-wakeup", daemon=True
        )
        self._thread.start()
        started.wait()

    def _thread_main(self, started: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._ready = asyncio.Event()
        started.set()
        try:
            loop.run_until_complete(self._run())
        finally:
            loop.close()

    def _take(self) -> dict[str, list[int]]:
        with self._lock:
            batch, self._pending, self._pending_count = self._pending, {}, 0
        return batch

    async def _run(self) -> None:
        """Publish whatever is pending whenever notified; after close, publish the rest, then end."""
        assert self._ready is not None
        link = _PublishLink(self.url, self.publish_timeout, self._health)
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                batch = self._take()
                if batch:
                    await link.publish_batch(batch, self.stats)
                if self._closing:
                    return
        finally:
            await link.close()

    def close(self, timeout: float = 2.0) -> None:
        with self._lock:
            self._closing = True
            thread, loop, ready = self._thread, self._loop, self._ready
        if thread is None or loop is None or ready is None:
            return
        try:
            loop.call_soon_threadsafe(ready.set)
        except RuntimeError:
            return
        thread.join(timeout)


class AmqpSubscriber:
    """Consumes the wake-up queues of a worker on the worker's own event loop."""

    def __init__(self, url: str, stats: WakeupStats) -> None:
        self.url = url
        self.stats = stats
        self._task: asyncio.Task[None] | None = None
        self._connection: AbstractRobustConnection | None = None
        self._health = _Once("wake-up subscriber")
        self._closing = False

    async def start(self, queues: Sequence[str], on_wakeup: WakeupCallback) -> None:
        await self.close()  # one subscription at a time: the latest worker's
        self._closing = False
        if self._task is None:
            wanted = frozenset(queues)
            self._task = asyncio.create_task(self._run(wanted, on_wakeup), name="txtasks-wakeups")

    def _on_message(self, wanted: frozenset[str], on_wakeup: WakeupCallback) -> Any:
        async def handle(message: AbstractIncomingMessage) -> None:
            decoded = wakeup_decode(message.body)
            if decoded is None or decoded[0] not in wanted:
                self.stats.malformed += 1
                return
            self.stats.received += 1
            on_wakeup(decoded[0])

        return handle

    async def _run(self, wanted: frozenset[str], on_wakeup: WakeupCallback) -> None:
        backoff = 0.0
        while not self._closing:
            try:
                connection = await aio_pika.connect_robust(
                    self.url, reconnect_interval=RECONNECT_INTERVAL
                )
            except Exception as exc:
                self._health.failed(exc)
                backoff = min(MAX_BACKOFF, max(0.5, backoff * 2))
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                continue
            self._connection = connection
            try:
                channel = await connection.channel()
                await channel.set_qos(prefetch_count=100)
                handler = self._on_message(wanted, on_wakeup)
                for queue in sorted(wanted):
                    amqp_queue = await declare(channel, queue)
                    await amqp_queue.consume(handler, no_ack=True)
            except Exception as exc:
                if self._closing:
                    return
                self._health.failed(exc)
                with contextlib.suppress(Exception):
                    await connection.close()
                self._connection = None
                await asyncio.sleep(RECONNECT_INTERVAL)
                continue
            self._health.ok()
            connection.reconnect_callbacks.add(self._reconnected)
            connection.close_callbacks.add(self._lost)
            self.stats.connected = True
            await asyncio.Future()  # the robust connection reconnects by itself from here on

    def _reconnected(self, *_: Any) -> None:
        self.stats.connected = True
        self._health.ok()

    def _lost(self, _connection: Any, exc: BaseException | None = None) -> None:
        self.stats.connected = False
        if exc is not None and not isinstance(exc, asyncio.CancelledError) and not self._closing:
            self._health.failed(exc)

    async def close(self) -> None:
        self._closing = True
        connection, self._connection = self._connection, None
        if connection is not None:  # first, so a setup under way fails instead of being cut
            with contextlib.suppress(Exception):
                await connection.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


class AmqpNotifier:
    """Wake-ups through RabbitMQ: a publisher for enqueuers and a subscriber for workers."""

    def __init__(
        self, url: str, *, max_pending: int = 10_000, publish_timeout: float = 1.0
    ) -> None:
        self.url = url
        self.stats = WakeupStats()
        self.max_pending = max_pending
        self.publish_timeout = publish_timeout
        self.publisher = AmqpPublisher(
            url, self.stats, max_pending=max_pending, publish_timeout=publish_timeout
        )
        self.loop_publishers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, LoopPublisher
        ] = weakref.WeakKeyDictionary()
        self.subscriber = AmqpSubscriber(url, self.stats)

    def notify(self, queue: str, ids: Sequence[int] = ()) -> None:
        """From a thread running an event loop, publish on that loop; else on the thread."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or loop is self.publisher.loop:
            self.publisher.notify(queue, ids)
            return
        publisher = self.loop_publishers.get(loop)
        if publisher is None:
            for old in [other for other in self.loop_publishers if other.is_closed()]:
                del self.loop_publishers[old]  # loops gone (asyncio.run per call)
            publisher = self.loop_publishers[loop] = LoopPublisher(
                self.url, self.stats, max_pending=self.max_pending, timeout=self.publish_timeout
            )
        publisher.notify(queue, ids)

    async def subscribe(self, queues: Sequence[str], on_wakeup: WakeupCallback) -> None:
        await self.subscriber.start(queues, on_wakeup)

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
