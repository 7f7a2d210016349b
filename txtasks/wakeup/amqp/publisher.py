"""Publishing wake-ups: from a background thread with its own event loop (sync and async callers
hand a hint over in microseconds and never wait for the broker), or on the committing code's own
loop. Hints are coalesced per queue and bounded: a slow or absent broker means they are dropped
and counted, never raised into the application."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Sequence
from typing import Any

import aio_pika
from aio_pika.abc import AbstractConnection

from txtasks._waits import within
from txtasks.retry import RetryStrategy
from txtasks.wakeup.amqp.link import (
    EXCHANGE,
    PROPERTIES,
    RECONNECT_BACKOFF,
    Outage,
    connect_url,
    declare,
)
from txtasks.wakeup.base import (
    MAX_IDS,
    WakeupStats,
    cancel_route,
    wakeup_encode,
)

#: What a pending hint is about: a queue, and whether it is a cancel wake-up.
Hint = tuple[str, bool]


def merge_hints(pending: dict[Hint, list[int]], hint: Hint, ids: Sequence[int]) -> None:
    """Coalesce hints of one queue and kind, keeping at most the ids one message carries."""
    known = pending.setdefault(hint, [])
    known.extend(ids[: max(0, MAX_IDS - len(known))])


class _PublishLink:
    """The publisher's connection: opened lazily, reopened with backoff, declared queues cached."""

    def __init__(self, url: str, timeout: float, reconnect: RetryStrategy) -> None:
        self.url = url
        self.timeout = timeout
        self.outage = Outage("wake-up publisher", url, reconnect)
        self.connection: AbstractConnection | None = None
        self._channel: Any = None
        #: aiormq's channel under it, published to directly (aio-pika's Exchange.publish
        #: waits for the write to drain).
        self._underlay: Any = None
        self._exchange: Any = None
        self.declared: set[str] = set()
        self.retry_at = 0.0
        #: Messages were handed to the connection's writer since the last round trip: closing
        #: now could lose them (the close does not wait for the writer).
        self.unflushed = False

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
        self.connection = await aio_pika.connect(connect_url(self.url), timeout=self.timeout)
        self.connection.close_callbacks.add(self._lost)
        self._channel = await within(
            self.connection.channel(publisher_confirms=False), self.timeout
        )
        self._underlay = await within(self._channel.get_underlay_channel(), self.timeout)
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
        self.unflushed = False  # the connection broke: nothing to wait for
        await self.close()
        self.retry_at = asyncio.get_running_loop().time() + self.outage.failed(exc)

    async def publish(self, hint: Hint, ids: list[int]) -> None:
        """One message; handed to the connection's writer without waiting for the drain. A
        cancel wake-up goes to every worker of the queue (each binds its own AMQP queue to
        `cancel_route(queue)`); none connected: nobody runs a task to stop."""
        queue, cancel = hint
        if not cancel and queue not in self.declared:  # so a hint waits for the first worker
            await asyncio.wait_for(declare(self._channel, queue), self.timeout)
            self.declared.add(queue)
        await self._underlay.basic_publish(
            wakeup_encode(queue, ids, cancel=cancel),
            exchange=EXCHANGE,
            routing_key=cancel_route(queue) if cancel else queue,
            properties=PROPERTIES,
            timeout=self.timeout,
            wait=False,
        )
        self.unflushed = True

    async def publish_batch(self, batch: dict[Hint, list[int]], stats: WakeupStats) -> None:
        """One message per queue and kind; failures are counted and logged once, never raised."""
        if await self.exchange() is None:
            stats.dropped += len(batch)
            return
        for sent, (hint, ids) in enumerate(batch.items()):
            try:
                await self.publish(hint, ids)
            except Exception as exc:
                stats.dropped += len(batch) - sent
                await self.failed(exc)
                return
            stats.published += 1

    async def flush(self) -> None:
        """One round trip on the channel: every message handed over before it has been sent."""
        if self.unflushed and self._channel is not None and self._exchange is not None:
            with contextlib.suppress(Exception):
                await within(
                    self._channel.declare_exchange(
                        EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True
                    ),
                    self.timeout,
                )
        self.unflushed = False

    async def close(self) -> None:
        await self.flush()  # a process that ends right after a commit still sends its hints
        self.outage.stop()
        connection, self.connection, self._exchange = self.connection, None, None
        self._channel = self._underlay = None
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
        self._pending: dict[Hint, list[int]] = {}
        self._task: asyncio.Task[None] | None = None

    def notify(self, queue: str, ids: Sequence[int], *, cancel: bool = False) -> None:
        if len(self._pending) >= self.max_pending:
            self.stats.dropped += 1
            return
        hint = (queue, cancel)
        if hint in self._pending:
            self.stats.coalesced += 1
        merge_hints(self._pending, hint, ids)
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
        self._pending: dict[Hint, list[int]] = {}
        self._pending_count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closing = False

    def notify(self, queue: str, ids: Sequence[int], *, cancel: bool = False) -> None:
        with self._lock:
            if os.getpid() != self._pid:  # forked: the thread did not come along
                self._reset_after_fork()
            if self._closing:
                return
            if self._pending_count >= self.max_pending:
                self.stats.dropped += 1
                return
            hint = (queue, cancel)
            if hint in self._pending:
                self.stats.coalesced += 1
            merge_hints(self._pending, hint, ids)
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
            _end_tasks(loop)
            loop.close()

    def _take(self) -> dict[Hint, list[int]]:
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


def _end_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is still running on `loop` (the AMQP library's close of a lost connection)
    and let it finish, as `asyncio.run` does: a coroutine left on a closed loop would end
    later, at its collection, as an unraisable error in whatever code runs then."""
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
