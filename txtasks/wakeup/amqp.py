"""RabbitMQ wake-ups through aio-pika.

Topology: a direct exchange `txtasks.wakeup`, and one AMQP queue per task queue
(`txtasks.wakeup.<queue>`) that every worker of that queue consumes from: competing consumers,
so one message wakes one worker. Messages are small JSON, non-persistent, with a TTL; consumers
take them without acks. Nothing in RabbitMQ is state: delays and retries live in the table.

Publishing runs on a background thread with its own event loop, so sync and async callers alike
hand a hint over in microseconds and never wait for the broker: a slow or absent broker means
hints are buffered (bounded), then dropped and counted, never raised into the application.

A broker that is away: publishers and subscribers reconnect by one policy (`RECONNECT_BACKOFF`,
exponential with full jitter, capped at 3 s) on plain connections (aio-pika's robust connection
retries at a fixed interval and logs each attempt), and each connection logs the outage twice:
a WARNING when it goes, an INFO when it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import aio_pika
import aiormq
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage
from yarl import URL

from txtasks.retry import Exponential, RetryStrategy
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
PROPERTIES = aiormq.spec.Basic.Properties(content_type="application/json", delivery_mode=1)
#: The wait before connection attempt n+1 after n failures in a row, for publishers and
#: subscribers alike: exponential from 0.1 s, capped at 3 s, with full jitter. A connection that
#: works starts it over. Pass another `RetryStrategy` as `AmqpNotifier(reconnect=...)`.
RECONNECT_BACKOFF = Exponential(base=0.1, cap=3.0)
#: Bound of one subscriber connection attempt: TCP, AMQP handshake, declarations, consume.
CONNECT_TIMEOUT = 5.0
#: A new connection ends an outage (logged back, backoff reset) once it has lasted this long,
#: so a flapping network is one outage, not two log lines per flap.
STABLE_AFTER = 3.0
#: aiormq's lines about each failed or lost connection: txtasks logs the outage once instead.
PER_ATTEMPT_LINES = (
    "error when creating transport",
    "Cancelling cause reader exited abnormally",
    "Unexpected connection close from remote",
)


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


def safe_url(url: str) -> str:
    """The broker URL for logs: its password masked."""
    parsed = URL(url)
    return str(parsed.with_password("******")) if parsed.password else url


def describe(exc: BaseException) -> str:
    """One line naming an error: its type, and its text when it has one."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _PerAttemptLines(logging.Filter):
    """Turns aiormq's line per failed connection into DEBUG: txtasks logs the outage once."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not str(record.msg).startswith(PER_ATTEMPT_LINES):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_library_loggers() -> None:
    """Install the filter on aiormq's connection logger (once)."""
    logger = logging.getLogger("aiormq.connection")
    if not any(isinstance(f, _PerAttemptLines) for f in logger.filters):
        logger.addFilter(_PerAttemptLines())


quiet_library_loggers()


class _Outage:
    """The broker as one connection sees it: one WARNING when lost, one INFO when back, and the
    wait before each attempt in between (DEBUG lines only)."""

    def __init__(self, what: str, url: str, reconnect: RetryStrategy) -> None:
        self.what = what
        self.broker = safe_url(url)
        self.reconnect = reconnect
        self.failures = 0
        self._since = 0.0
        self._stable: asyncio.TimerHandle | None = None

    def failed(self, exc: BaseException) -> float:
        """Count a failed or lost connection; the seconds to wait before the next attempt."""
        self.stop()
        self.failures += 1
        delay = self.reconnect.delay(self.failures)
        if self.failures == 1:
            self._since = time.monotonic()
            log.warning(
                "%s: broker %s unavailable: %s (workers poll meanwhile; reconnecting with backoff)",
                self.what,
                self.broker,
                describe(exc),
            )
        else:
            log.debug(
                "%s: attempt %d failed (%s), next in %.2fs",
                self.what,
                self.failures,
                describe(exc),
                delay,
            )
        return delay

    def connected(self) -> None:
        """A connection works: the outage is over if it lasts `STABLE_AFTER` (see `failed`)."""
        took = time.monotonic() - self._since
        self._stable = asyncio.get_running_loop().call_later(STABLE_AFTER, self._over, took)

    def stop(self) -> None:
        """The connection is gone, or closed on purpose: it never counts as stable."""
        if self._stable is not None:
            self._stable.cancel()

    def _over(self, took: float) -> None:
        if self.failures:
            log.info("%s: broker %s back after %.1fs", self.what, self.broker, took)
        self.failures = 0


class _PublishLink:
    """The publisher's connection: opened lazily, reopened with backoff, declared queues cached."""

    def __init__(self, url: str, timeout: float, reconnect: RetryStrategy) -> None:
        self.url = url
        self.timeout = timeout
        self.outage = _Outage("wake-up publisher", url, reconnect)
        self.connection: AbstractConnection | None = None
        self._channel: Any = None
        self._exchange: Any = None
        self.declared: set[str] = set()
        self.retry_at = 0.0

    async def exchange(self) -> Any:
        """The exchange to publish to, or None while waiting to retry an unavailable broker."""
        if self._exchange is not None:
            return self._exchange
        if asyncio.get_running_loop().time() < self.retry_at:
            return None
        await self.close()  # what is left of a lost connection
        try:
            await self._open()
            self.outage.connected()
        except Exception as exc:
            await self.failed(exc)
        return self._exchange

    async def _open(self) -> None:
        self.connection = await aio_pika.connect(self.url, timeout=self.timeout)
        self.connection.close_callbacks.add(self._lost)
        self._channel = await within(
            self.connection.channel(publisher_confirms=False), self.timeout
        )
        self._exchange = await within(
            self._channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True),
            self.timeout,
        )
        self.declared.clear()

    def _lost(self, connection: Any, exc: BaseException | None = None) -> None:
        """The broker closed the connection (or it broke): reconnect at the next hint."""
        if connection is self.connection and self._exchange is not None:
            self._exchange = None
            lost = exc if isinstance(exc, Exception) else ConnectionError("connection closed")
            self.retry_at = asyncio.get_running_loop().time() + self.outage.failed(lost)

    async def failed(self, exc: BaseException) -> None:
        """Drop the connection; the next attempt waits for the backoff."""
        await self.close()
        self.retry_at = asyncio.get_running_loop().time() + self.outage.failed(exc)

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
        for sent, (queue, ids) in enumerate(batch.items()):
            try:
                await self.publish(queue, ids)
            except Exception as exc:
                stats.dropped += len(batch) - sent
                await self.failed(exc)
                return
            stats.published += 1

    async def close(self) -> None:
        self.outage.stop()
        connection, self.connection, self._exchange = self.connection, None, None
        self._channel = None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()


class LoopPublisher:
    """Publishes on the committing code's own event loop: no thread hop for async callers."""

    def __init__(
        self,
        url: str,
        stats: WakeupStats,
        *,
        max_pending: int,
        timeout: float,
        reconnect: RetryStrategy = RECONNECT_BACKOFF,
    ) -> None:
        self.stats = stats
        self.max_pending = max_pending
        self.link = _PublishLink(url, timeout, reconnect)
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
        reconnect: RetryStrategy = RECONNECT_BACKOFF,
    ) -> None:
        self.url = url
        self.stats = stats
        self.max_pending = max_pending
        self.publish_timeout = publish_timeout
        self.reconnect = reconnect
        self._lock = threading.Lock()
        self._pending: dict[str, list[int]] = {}
        self._pending_count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closing = False

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
        link = _PublishLink(self.url, self.publish_timeout, self.reconnect)
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
    """Consumes the wake-up queues of a worker on the worker's own event loop.

    It connects, consumes until the connection is lost, waits for the backoff and connects again,
    until closed. `stats.connected` is True while it consumes.
    """

    def __init__(
        self, url: str, stats: WakeupStats, reconnect: RetryStrategy = RECONNECT_BACKOFF
    ) -> None:
        self.url = url
        self.stats = stats
        self.reconnect = reconnect
        self._task: asyncio.Task[None] | None = None
        self._connection: AbstractConnection | None = None
        self._outage = _Outage("wake-up subscriber", url, reconnect)
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
            self.stats.connected = False
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

        self._connection = connection = await aio_pika.connect(self.url)
        connection.close_callbacks.add(closed)
        channel = await connection.channel()
        channel.close_callbacks.add(closed)
        await channel.set_qos(prefetch_count=100)
        handler = self._on_message(wanted, on_wakeup)
        for queue in sorted(wanted):
            amqp_queue = await declare(channel, queue)
            await amqp_queue.consume(handler, no_ack=True)

    async def _disconnect(self) -> None:
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
                self.url,
                self.stats,
                max_pending=self.max_pending,
                timeout=self.publish_timeout,
                reconnect=self.reconnect,
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
