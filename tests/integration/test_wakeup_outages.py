"""Broker outages: wake-ups resume within 5 s of the broker's return, and the log stays short.

Publisher and subscriber both reach the real RabbitMQ through a TCP proxy. `refuse()` takes the
broker away (open connections are cut, new ones refused) and `accept()` brings it back; the
outages last several retry cycles, so a backoff that is not capped, or a line logged per retry,
fails the test. A wake-up counts as delivered when the worker acts on it (its poll is 30 s away).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from tests.integration.wakeups import (
    RESUME_BOUND,
    SLOW_POLL,
    Harness,
    RunningWorker,
    broker_log,
    new_queue,
)
from tests.tcp_proxy import TcpProxy
from tests.waiting import until
from txtasks.wakeup.amqp import AmqpNotifier

pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]

#: Longer than every backoff step up to the cap together (0.1 + 0.2 + ... + 3 s), twice over.
LONG_OUTAGE = 12.0
#: Seconds within which a connection frozen for good (half-open) is taken as lost.
FROZEN_NOTICED = 15.0


@pytest.fixture
async def stack() -> AsyncIterator[contextlib.AsyncExitStack]:
    async with contextlib.AsyncExitStack() as exit_stack:
        yield exit_stack


@pytest.fixture
async def proxy(amqp_url: str, stack: contextlib.AsyncExitStack) -> TcpProxy:
    broker = await TcpProxy.for_url(amqp_url)
    stack.push_async_callback(broker.close)
    return broker


async def setup(
    stack: contextlib.AsyncExitStack, database_url: str, url: str, label: str
) -> tuple[Harness, RunningWorker, AmqpNotifier]:
    """An app publishing to `url`, and a worker with a notifier of its own consuming from it."""
    h = await Harness.create(stack, database_url, url, new_queue(label))
    subscriber = await h.subscriber(url)
    worker = await h.worker(poll=SLOW_POLL, notifier=subscriber)
    await until(lambda: worker.claims.calls >= 1, "the worker's first claim")
    return h, worker, subscriber


async def enqueue_for(h: Harness, seconds: float) -> None:
    """The application keeps committing tasks (so keeps handing hints to its publisher)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        await h.enqueue("during the outage")
        await asyncio.sleep(0.25)


async def time_to_wakeup(h: Harness, worker: RunningWorker) -> float:
    """Seconds until a hint published from now on wakes the worker; the app commits every 0.1 s.

    Hints queued in RabbitMQ before (while the worker was away) do not count: the publisher
    must be back too. A wake-up is seen up to 0.1 s late, so this errs on the long side.
    """
    loop = asyncio.get_running_loop()
    start, published = loop.time(), h.app.notifier.stats.published
    wakeups: int | None = None  # the worker's count when the first new hint went out
    while wakeups is None or worker.stats.wakeups == wakeups:
        if loop.time() - start > 3 * RESUME_BOUND:
            raise AssertionError(f"no wake-up within {3 * RESUME_BOUND}s of the broker's return")
        if wakeups is None and h.app.notifier.stats.published > published:
            wakeups = worker.stats.wakeups
        await h.enqueue("probe")
        await asyncio.sleep(0.1)
    return loop.time() - start


def assert_one_line_per_state_change(caplog: pytest.LogCaptureFixture, url: str) -> None:
    """One WARNING per connection when the broker went, one INFO when it came back; no more."""
    lines = broker_log(caplog)
    shown = "\n".join(" ".join(line) for line in lines)
    went = sorted(text.split(":")[0] for level, _, text in lines if level != "INFO")
    back = sorted(text.split(":")[0] for level, _, text in lines if level == "INFO")
    assert went == ["wake-up publisher", "wake-up subscriber"], shown
    assert back == ["wake-up publisher", "wake-up subscriber"], shown
    assert {logger for _, logger, _ in lines} == {"txtasks.wakeup"}, shown
    address = url.rpartition("@")[2].rstrip("/")
    for _, _, text in lines:
        assert address in text, shown  # names the broker ...
        assert ":app@" not in text, shown  # ... without its password


async def test_wakeups_resume_within_the_bound_after_outages_of_any_length(
    database_url: str,
    amqp_url: str,
    proxy: TcpProxy,
    stack: contextlib.AsyncExitStack,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = proxy.url_for(amqp_url)
    h, worker, _ = await setup(stack, database_url, url, "outages")
    await time_to_wakeup(h, worker)  # wake-ups work before the first outage

    caplog.set_level(logging.INFO)
    measured = []
    for seconds in (2.0, LONG_OUTAGE, 1.0):
        caplog.clear()
        await proxy.refuse()
        await enqueue_for(h, seconds)
        await proxy.accept()
        measured.append(await time_to_wakeup(h, worker))
        await until(lambda: len(broker_log(caplog)) >= 4, "both connections log their return")
        assert_one_line_per_state_change(caplog, url)
    assert max(measured) <= RESUME_BOUND, f"wake-ups resumed after {measured} s"
    assert not worker.running.done()


async def test_wakeups_resume_within_the_bound_when_the_broker_was_away_at_start(
    database_url: str,
    amqp_url: str,
    proxy: TcpProxy,
    stack: contextlib.AsyncExitStack,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    await proxy.refuse()
    url = proxy.url_for(amqp_url)
    h, worker, subscriber = await setup(stack, database_url, url, "late")
    await enqueue_for(h, LONG_OUTAGE)
    assert worker.stats.wakeups == 0
    assert (h.app.notifier.stats.published, subscriber.stats.connected) == (0, False)

    await proxy.accept()
    took = await time_to_wakeup(h, worker)
    assert took <= RESUME_BOUND, f"wake-ups resumed {took:.1f} s after the broker came back"
    await until(lambda: len(broker_log(caplog)) >= 4, "both connections log their return")
    assert_one_line_per_state_change(caplog, url)


async def test_a_flapping_network_is_one_outage_in_the_log(
    database_url: str,
    amqp_url: str,
    proxy: TcpProxy,
    stack: contextlib.AsyncExitStack,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Connections cut every 0.5 s for 6 s: one WARNING and one INFO per connection, in all."""
    url = proxy.url_for(amqp_url)
    h, worker, subscriber = await setup(stack, database_url, url, "flap")
    await time_to_wakeup(h, worker)
    caplog.set_level(logging.INFO)

    accepted = proxy.accepted
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 6.0
    while loop.time() < deadline:
        proxy.drop_all()
        await enqueue_for(h, 0.5)  # reconnecting in between, some of the time
    assert proxy.accepted > accepted + 2, "the connections came back between the cuts"

    took = await time_to_wakeup(h, worker)
    assert took <= RESUME_BOUND
    await until(lambda: len(broker_log(caplog)) >= 4, "both connections log their return")
    assert_one_line_per_state_change(caplog, url)
    assert subscriber.stats.connected


async def test_a_frozen_broker_link_is_noticed_within_15_s_and_wake_ups_resume(
    database_url: str,
    amqp_url: str,
    proxy: TcpProxy,
    stack: contextlib.AsyncExitStack,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Both connections stall for good, sockets open on both sides (half-open: neither side
    hears of it). Each is taken as lost within `FROZEN_NOTICED` seconds (the heartbeat) and
    replaced; tasks run by polling meanwhile, and wake-ups resume."""
    url = proxy.url_for(amqp_url)
    h, _slow, _ = await setup(stack, database_url, url, "frozen")
    fast_subscriber = await h.subscriber(url)
    worker = await h.worker(poll=1.0, notifier=fast_subscriber)  # polls meanwhile
    await time_to_wakeup(h, worker)
    caplog.set_level(logging.INFO)
    caplog.clear()

    loop = asyncio.get_running_loop()
    frozen_at = loop.time()
    assert proxy.freeze() >= 3  # the publisher's connection and both subscribers'
    started = worker.stats.started
    noticed: dict[str, float] = {}
    while len(noticed) < 2 and loop.time() - frozen_at < 2 * FROZEN_NOTICED:
        await h.enqueue("while frozen")  # the app keeps committing (and publishing)
        for level, logger, text in broker_log(caplog):
            if level == "WARNING" and logger == "txtasks.wakeup":
                noticed.setdefault(text.split(":")[0], loop.time() - frozen_at)
        await asyncio.sleep(0.25)
    assert set(noticed) == {"wake-up publisher", "wake-up subscriber"}, broker_log(caplog)
    assert max(noticed.values()) <= FROZEN_NOTICED, noticed
    assert worker.stats.started > started  # polling ran tasks while the link was frozen

    took = await time_to_wakeup(h, worker)
    assert took <= RESUME_BOUND
    await until(lambda: len(broker_log(caplog)) >= 6, "every connection logs its return")
    levels = sorted(level for level, _, _ in broker_log(caplog))
    assert levels == ["INFO"] * 3 + ["WARNING"] * 3, broker_log(caplog)
