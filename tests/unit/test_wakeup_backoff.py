"""Reconnecting to an absent broker: capped exponential backoff with jitter, and a short log.

No broker here: a local server that hangs up on every connection (or never answers) stands in
for a broker that is away. Its accept count shows how often txtasks tries to connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from tests.waiting import until
from txtasks.retry import Constant, Exponential
from txtasks.wakeup.amqp import RECONNECT_BACKOFF, AmqpNotifier

PASSWORD = "s3cret-pw"
#: Loggers an operator would read about the broker: txtasks' own and the AMQP libraries'.
BROKER_LOGGERS = ("txtasks.wakeup", "aiormq", "aio_pika")


class AwayBroker:
    """Listens on 127.0.0.1; hangs up on each connection at once, or (`silent`) never answers."""

    def __init__(self, *, silent: bool = False) -> None:
        self.silent = silent
        self.accepted = 0
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.writers.append(writer)
        if not self.silent:
            writer.transport.abort()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"amqp://app:{PASSWORD}@127.0.0.1:{port}/"

    async def close(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@contextlib.asynccontextmanager
async def away_broker(*, silent: bool = False) -> AsyncIterator[AwayBroker]:
    broker = AwayBroker(silent=silent)
    broker.server = await asyncio.start_server(broker.handle, "127.0.0.1", 0)
    try:
        yield broker
    finally:
        await broker.close()


def broker_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        f"{r.levelname} {r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.name.startswith(BROKER_LOGGERS)
    ]


def test_the_reconnect_backoff_grows_exponentially_to_a_cap_of_a_few_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert isinstance(RECONNECT_BACKOFF, Exponential)
    draws = [RECONNECT_BACKOFF.delay(n) for n in range(1, 200) for _ in range(20)]
    assert all(0 <= d <= 3.0 for d in draws)
    assert min(draws) < 0.05 and max(draws) > 2.5  # full jitter: anywhere below the ceiling

    monkeypatch.setattr("random.uniform", lambda low, high: high)  # the ceilings themselves
    ceilings = [RECONNECT_BACKOFF.delay(n) for n in range(1, 9)]
    assert ceilings == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.0, 3.0, 3.0])


async def test_an_absent_broker_is_retried_often_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Subscriber and publisher retry at the default backoff; one line each, from txtasks."""
    caplog.set_level(logging.INFO)
    async with away_broker() as broker:
        url = broker.url
        notifier = AmqpNotifier(url, publish_timeout=0.5)
        try:
            await notifier.subscribe(["mail"], lambda queue, **_: None)
            # the subscriber alone: capped at 3 s, 8 attempts take 1-2 s on average (not ~20 s)
            await until(lambda: broker.accepted >= 8, "eight connection attempts", timeout=15)
            assert not notifier.stats.connected
            for _ in range(5):  # the application commits: its publisher tries too
                notifier.notify("mail", [1])
                await until(lambda: notifier.stats.dropped >= 1, "the hint is counted as dropped")
        finally:
            await notifier.close()

    lines = broker_lines(caplog)
    assert len(lines) == 2, lines
    assert lines[0].startswith("WARNING txtasks.wakeup: wake-up subscriber: "), lines
    assert lines[1].startswith("WARNING txtasks.wakeup: wake-up publisher: "), lines
    for line in lines:
        assert url.replace(PASSWORD, "******") in line
        assert PASSWORD not in line


async def test_an_error_without_text_is_logged_by_its_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker that never answers: the publisher's connect times out (str() of it is empty)."""
    caplog.set_level(logging.INFO)
    async with away_broker(silent=True) as broker:
        notifier = AmqpNotifier(broker.url, publish_timeout=0.2)
        try:
            await asyncio.to_thread(notifier.notify, "mail", [1])  # from a thread: the sync path
            await until(lambda: notifier.stats.dropped >= 1, "the hint is counted as dropped")
        finally:
            await notifier.close()

    [line] = broker_lines(caplog)
    assert line.startswith("WARNING txtasks.wakeup: wake-up publisher: "), line
    assert "TimeoutError" in line, line


def test_the_reconnect_backoff_is_a_setting_of_the_notifier() -> None:
    notifier = AmqpNotifier("amqp://app:app@127.0.0.1:1/", reconnect=Constant(0.5))
    assert notifier.subscriber.reconnect == Constant(0.5)
    assert notifier.publisher.reconnect == Constant(0.5)
    assert AmqpNotifier("amqp://app:app@127.0.0.1:1/").subscriber.reconnect is RECONNECT_BACKOFF


def test_aiormq_lines_per_connection_are_debug_and_its_other_lines_stay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    aiormq_log = logging.getLogger("aiormq.connection")
    caplog.set_level(logging.INFO)
    aiormq_log.error("error when creating transport: %r", ConnectionRefusedError(111))
    aiormq_log.warning("Connection %r was blocked by: %r", "conn", "low on memory")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "Connection 'conn' was blocked by: 'low on memory'")
    ]

    # a connection's attempt cut short (its time ran out, or it was lost again) cancels the
    # channel's RPC under way: aiormq's channel says so once per attempt too
    caplog.clear()
    channel_log = logging.getLogger("aiormq.channel")
    channel_log.warning("Closing channel %r because RPC call %s cancelled", "ch", "Declare")
    channel_log.warning(
        "Closing channel %r locally because RPC call %s cancelled before Channel.Open was sent",
        "ch",
        "Open",
    )
    channel_log.warning("Frame %r has no consumer tag", "frame")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "Frame 'frame' has no consumer tag")
    ]

    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="aiormq.connection")  # asked for: shown, as DEBUG
    aiormq_log.error("Unexpected connection close from remote %r", "broker")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("DEBUG", "Unexpected connection close from remote 'broker'")
    ]
