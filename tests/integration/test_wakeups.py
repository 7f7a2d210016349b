"""RabbitMQ wake-ups end to end: a real broker, a real database, a worker on the test's loop.

A wake-up only saves latency: these tests check that it arrives after the commit (and makes an
idle worker claim at once), that nothing is sent on rollback, and that no broker trouble (absent
at start, connections cut, broker restarted, forged messages) loses, repeats or blocks a task.

Every test uses its own task queue, because the AMQP queues outlive a test on the shared broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import aio_pika
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from cleaner import Cleaner, CleanerConfig, ReannouncerConfig
from tests.conftest import backends
from tests.integration.rabbitmq_private import PrivateRabbitMQ
from tests.integration.wakeups import (
    FAST_POLL,
    RESUME_BOUND,
    SLOW_POLL,
    WAIT,
    Harness,
    RunningWorker,
    broker_log,
    new_queue,
    probing,
)
from tests.tcp_proxy import TcpProxy
from tests.waiting import until
from txtasks.driver.urls import url_sync
from txtasks.types import CancelResult, TaskState
from txtasks.wakeup import Notifier
from txtasks.wakeup.amqp import EXCHANGE, STABLE_AFTER, AmqpNotifier, amqp_queue_name
from txtasks.wakeup.base import MAX_MESSAGE_BYTES

pytestmark = pytest.mark.rabbitmq


@pytest.fixture
async def stack() -> AsyncIterator[contextlib.AsyncExitStack]:
    async with contextlib.AsyncExitStack() as exit_stack:
        yield exit_stack


async def idle(worker: RunningWorker, notifier: Notifier) -> None:
    """Wait until the worker consumes wake-ups and its first claim has come back empty."""
    await until(lambda: notifier.stats.connected, "the worker's subscriber connects")
    await until(lambda: worker.claims.calls >= 1, "the worker's first claim")
    assert worker.claims.empty == worker.claims.calls, "the queue should start empty"


async def publish_raw(amqp_url: str, queue: str, bodies: list[bytes]) -> None:
    """Publish bodies straight into the AMQP queue of `queue`, as anybody with access could."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()  # publisher confirms: routed when publish returns
        for body in bodies:
            await channel.default_exchange.publish(
                aio_pika.Message(body), routing_key=amqp_queue_name(queue)
            )


async def next_message(amqp_queue: Any) -> Any:
    """The next message of an AMQP queue (basic.get), waiting for it to be routed there."""
    got: list[Any] = []

    async def arrived() -> bool:
        message = await amqp_queue.get(no_ack=True, fail=False)
        if message is not None:
            got.append(message)
        return bool(got)

    await until(arrived, f"a message in {amqp_queue.name}")
    return got[0]


# ----------------------------------------------------------------------------- wake-ups


async def test_a_commit_wakes_an_idle_worker_at_once(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    h = await Harness.create(stack, database_url, amqp_url, new_queue("commit"))
    worker = await h.worker(poll=SLOW_POLL)  # the app's own notifier: the default wiring
    await idle(worker, h.app.notifier)

    task_id = await h.enqueue({"order": 1})
    await h.runs.wait_started({"order": 1})  # a poll would take 30 s

    assert worker.stats.wakeups >= 1
    assert worker.claims.calls >= 2  # the claim that found it came after the wake-up
    # its last claim found nothing: it took the task the wake-up named, by its id
    assert worker.stats.claimed_named == 1
    await until(lambda: h.done(task_id), "the task completes")
    await until(lambda: h.app.notifier.stats.published == 1, "the publisher counts its message")
    stats = h.app.notifier.stats
    assert (stats.received, stats.malformed, stats.dropped) == (1, 0, 0)
    h.runs.assert_each_ran_once([{"order": 1}])
    await h.assert_completed_once(task_id)


async def test_a_sync_session_commit_wakes_the_worker_with_one_message_per_queue(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    h = await Harness.create(stack, database_url, amqp_url, new_queue("session"))
    other = h.app.task(name="wakeups.other", queue=new_queue("session-other"))(h.runs.handler)
    worker = await h.worker(poll=SLOW_POLL)
    await idle(worker, h.app.notifier)

    engine = create_engine(url_sync(h.database_url))
    try:

        def business_transaction() -> None:
            with Session(engine) as session:
                for n in range(5):
                    h.task.enqueue_tx(session, {"line": n})
                other.enqueue_tx(session, {"line": "other"})
                session.commit()

        await asyncio.to_thread(business_transaction)
    finally:
        engine.dispose()
    for payload in [*({"line": n} for n in range(5)), {"line": "other"}]:
        await h.runs.wait_started(payload)
    # six tasks in two queues, one transaction: two messages
    await until(lambda: h.app.notifier.stats.received == 2, "both queues' wake-ups arrive")
    await until(lambda: h.app.notifier.stats.published == 2, "the publisher counts two")
    assert worker.stats.wakeups == 2
    h.runs.assert_each_ran_once([*({"line": n} for n in range(5)), {"line": "other"}])


async def test_a_rolled_back_enqueue_sends_nothing(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    h = await Harness.create(stack, database_url, amqp_url, new_queue("rollback"))
    worker = await h.worker(poll=SLOW_POLL)
    await idle(worker, h.app.notifier)

    gone = await h.enqueue("rolled back", commit=False)
    kept = await h.enqueue("committed")
    await h.runs.wait_started("committed")

    # the publisher works in order: a message for the rollback would be counted before this one
    await until(lambda: h.app.notifier.stats.published >= 1, "the publisher counts its message")
    stats = h.app.notifier.stats
    assert (stats.published, stats.received, stats.dropped) == (1, 1, 0)
    assert worker.stats.wakeups == 1
    await until(lambda: h.done(kept), "the committed task completes")
    h.runs.assert_each_ran_once(["committed"])
    if gone != kept:  # SQLite may hand the rolled-back id out again
        assert await h.row(gone) is None


async def test_a_wakeup_that_overtakes_its_commit_still_runs_the_task_once(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    h = await Harness.create(stack, database_url, amqp_url, new_queue("early"))
    worker = await h.worker(poll=0.2)
    await idle(worker, h.app.notifier)

    async with h.engine.connect() as conn:
        task_id = await h.task.aenqueue_tx(conn, "early bird")
        h.app.notify(h.queue, [task_id])  # by hand, before the row is committed
        await until(lambda: worker.stats.wakeups == 1, "the early wake-up reaches the worker")
        assert h.runs.payloads == []
        await conn.commit()

    await h.runs.wait_started("early bird")  # by the next poll or the after-commit wake-up
    await until(lambda: h.done(task_id), "the task completes")
    await until(lambda: worker.stats.wakeups == 2, "the after-commit wake-up arrives too")
    h.runs.assert_each_ran_once(["early bird"])
    await h.assert_completed_once(task_id)


async def test_forged_and_malformed_messages_are_counted_and_ignored(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    h = await Harness.create(stack, database_url, amqp_url, new_queue("forged"))
    worker = await h.worker(poll=SLOW_POLL)
    stats = h.app.notifier.stats
    await idle(worker, h.app.notifier)

    malformed = [
        b"\x00\xffnot json at all",
        json.dumps({"queue": "somebody-else", "ids": [1]}).encode(),  # not this worker's queue
        json.dumps({"queue": h.queue, "ids": ["1; DROP TABLE txtasks_tasks"]}).encode(),
        json.dumps({"queue": h.queue, "ids": [True]}).encode(),
        b"[" + b"1," * (MAX_MESSAGE_BYTES // 2) + b"1]",  # too large
        b"x" * (1024 * 1024),
    ]
    await publish_raw(amqp_url, h.queue, malformed)
    await until(lambda: stats.malformed == len(malformed), "every malformed message is counted")
    assert (stats.received, worker.stats.wakeups) == (0, 0)
    assert not worker.running.done()

    # a valid-looking forgery with made-up ids: two empty claims (the ids it names, then
    # the queue, since a named task was not taken), nothing else
    claims = worker.claims.calls
    await publish_raw(amqp_url, h.queue, [json.dumps({"queue": h.queue, "ids": [987654]}).encode()])
    await until(lambda: worker.claims.calls == claims + 2, "the forged wake-up makes two claims")
    await until(lambda: worker.worker.idle.is_set(), "the worker waits again")
    assert worker.claims.calls == claims + 2
    assert (stats.received, worker.stats.wakeups, worker.claims.empty) == (1, 1, claims + 2)

    # the worker still runs real tasks, woken as usual
    task_id = await h.enqueue("real")
    await h.runs.wait_started("real")
    await until(lambda: h.done(task_id), "the real task completes")

    # a forgery naming the finished task does not run it again
    claims = worker.claims.calls
    await publish_raw(
        amqp_url, h.queue, [json.dumps({"queue": h.queue, "ids": [task_id]}).encode()]
    )
    await until(lambda: worker.claims.calls == claims + 2, "the forged wake-up makes two claims")
    assert worker.claims.empty == worker.claims.calls - 1  # only the real task's claim had rows
    assert stats.malformed == len(malformed)
    h.runs.assert_each_ran_once(["real"])
    await h.assert_completed_once(task_id)
    assert not worker.running.done()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_topology_one_small_transient_json_message_per_queue(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    h = await Harness.create(stack, database_url, amqp_url, new_queue("topology"))
    other = h.app.task(name="wakeups.other", queue=new_queue("topology-other"))(h.runs.handler)
    async with h.engine.connect() as conn:  # no worker yet: the messages wait in their queues
        ids = [await h.task.aenqueue_tx(conn, n) for n in range(3)]
        other_id = await other.aenqueue_tx(conn, "other")
        await conn.commit()
    await until(lambda: h.app.notifier.stats.published == 2, "one message per task queue")

    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        # a direct, durable exchange (declaring it otherwise would fail: PRECONDITION_FAILED)
        await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True)
        for queue, queue_ids in ((h.queue, ids), (other.options.queue, [other_id])):
            amqp_queue = await channel.declare_queue(amqp_queue_name(queue), passive=True)
            message = await next_message(amqp_queue)
            assert json.loads(message.body) == {"queue": queue, "ids": queue_ids}
            assert len(message.body) < 200
            assert message.content_type == "application/json"
            assert message.delivery_mode == aio_pika.DeliveryMode.NOT_PERSISTENT
            assert message.routing_key == queue and message.exchange == EXCHANGE
            assert await amqp_queue.get(no_ack=True, fail=False) is None  # coalesced: just one


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_competing_workers_one_message_wakes_one_worker(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    h = await Harness.create(stack, database_url, amqp_url, new_queue("compete"))
    workers: list[RunningWorker] = []
    for _ in range(2):
        notifier = await h.subscriber(amqp_url)
        worker = await h.worker(poll=SLOW_POLL, notifier=notifier)
        await idle(worker, notifier)
        workers.append(worker)

    def wakeups() -> int:
        return sum(w.stats.wakeups for w in workers)

    for n in range(4):
        await h.enqueue(n)
        await h.runs.wait_started(n)
        await until(lambda: wakeups() == len(h.runs.payloads), "one wake-up per message")
    assert [w.stats.wakeups for w in workers] == [2, 2]  # the broker deals them out in turn
    assert sum(w.stats.started for w in workers) == 4
    h.runs.assert_each_ran_once(list(range(4)))


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_deeply_nested_message_is_malformed_not_fatal(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    """Small but nested past the recursion limit: `json.loads` raises RecursionError."""
    h = await Harness.create(stack, database_url, amqp_url, new_queue("nested"))
    worker = await h.worker(poll=SLOW_POLL)
    stats = h.app.notifier.stats
    await idle(worker, h.app.notifier)

    await publish_raw(amqp_url, h.queue, [b"[" * 5000 + b"]" * 5000])
    task_id = await h.enqueue("after the bomb")
    await h.runs.wait_started("after the bomb")  # still woken: the consumer survived
    await until(lambda: h.done(task_id), "the task completes")
    assert stats.malformed == 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_stopped_worker_no_longer_takes_wakeups_from_the_others(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    """Competing consumers: a message goes to one consumer, so a stopped one must leave."""
    queue = new_queue("handover")
    # a process whose worker has stopped, while its app stays open (it still enqueues, say)
    old = await Harness.create(stack, database_url, amqp_url, queue)
    old_worker = await old.worker(poll=SLOW_POLL)
    await idle(old_worker, old.app.notifier)
    old_worker.stop()
    await old_worker.running

    h = await Harness.create(stack, database_url, amqp_url, queue)
    worker = await h.worker(poll=SLOW_POLL)
    await idle(worker, h.app.notifier)
    for n in range(3):
        await h.enqueue(f"task {n}")
        await h.runs.wait_started(f"task {n}")  # woken each time, not found by a 30 s poll
    assert worker.stats.wakeups == 3


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_new_worker_on_the_same_app_gets_the_wakeups(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    """A worker restarted in the same process (same App) is woken like the first one."""
    h = await Harness.create(stack, database_url, amqp_url, new_queue("restarted"))
    first = await h.worker(poll=SLOW_POLL)
    await idle(first, h.app.notifier)
    first.stop()
    await first.running

    second = await h.worker(poll=SLOW_POLL)
    await until(lambda: second.claims.calls >= 1, "the new worker's first claim")
    await h.enqueue("after the restart")
    await h.runs.wait_started("after the restart")
    assert (first.stats.wakeups, second.stats.wakeups) == (0, 1)


# ----------------------------------------------------------------------------- cancel wake-ups

#: Poll and heartbeat of the workers of the cancel tests: neither turns within a test, so a
#: look for cancels can only come from a cancel wake-up.
NEVER = 60.0


class UntilCancelled:
    """An async handler that runs until cancelled, and records that it saw CancelledError."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def handler(self, payload: Any) -> None:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def finished(h: Harness, task_id: int) -> TaskState:
    async def state() -> TaskState | None:
        row = await h.row(task_id)
        return row.state if row is not None and not row.state.is_live else None

    return await until(state, f"task {task_id} to finish")


async def test_a_cancel_wakes_every_worker_of_the_queue_and_stops_the_running_handler(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    h = await Harness.create(stack, database_url, amqp_url, new_queue("cancel"))
    long = UntilCancelled()
    task = h.app.task(name="wakeups.long", queue=h.queue)(long.handler)
    workers: list[RunningWorker] = []
    for _ in range(2):
        notifier = await h.subscriber(amqp_url)
        worker = await h.worker(poll=NEVER, notifier=notifier, heartbeat=NEVER, lease=3 * NEVER)
        await idle(worker, notifier)
        workers.append(worker)
    task_id = await task.aenqueue(None)
    await asyncio.wait_for(long.started.wait(), WAIT)
    [running] = [w for w in workers if w.stats.started]

    assert (await h.app.control.acancel(task_id)).result is CancelResult.REQUESTED
    await asyncio.wait_for(long.cancelled.wait(), WAIT)  # the heartbeat's look: in 60 s
    assert await finished(h, task_id) is TaskState.CANCELLED
    # the wake-up reached both workers (not one of them, as an ordinary one would); the one
    # running the task looked for cancels once, the other held nothing and read nothing
    assert [w.stats.cancel_wakeups for w in workers] == [1, 1]
    assert running.stats.cancel_looks == 1
    assert sum(w.stats.cancel_looks for w in workers) == 1
    await until(lambda: running.stats.outcomes == {"cancelled": 1}, "the outcome is counted")


async def test_ordinary_wakeups_to_a_busy_worker_look_for_no_cancel(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    h = await Harness.create(stack, database_url, amqp_url, new_queue("busy"))
    long = UntilCancelled()
    task = h.app.task(name="wakeups.long", queue=h.queue)(long.handler)
    worker = await h.worker(poll=NEVER, heartbeat=NEVER, lease=3 * NEVER)
    await idle(worker, h.app.notifier)
    long_id = await task.aenqueue(None)
    await asyncio.wait_for(long.started.wait(), WAIT)

    ids = []
    for n in range(5):  # each started by its wake-up (the poll is 60 s) while `long` runs
        ids.append(await h.enqueue(n))
        await h.runs.wait_started(n)
    await until(lambda: h.done(*ids), "the short tasks complete")
    await until(worker.worker.idle.is_set, "the worker waits for its next wake-up")
    claims = worker.claims.calls
    await publish_raw(amqp_url, h.queue, [b'{"queue": "%s", "ids": []}' % h.queue.encode()])
    await until(lambda: worker.claims.calls > claims, "the claim after an older publisher's")
    assert worker.stats.wakeups == 7  # `long`, the 5 short tasks, the older publisher
    assert (worker.stats.cancel_wakeups, worker.stats.cancel_looks) == (0, 0)

    # the sync API sends a cancel wake-up too (from a thread, as sync code calls it)
    assert (await asyncio.to_thread(h.app.control.cancel, long_id)).result is CancelResult.REQUESTED
    await asyncio.wait_for(long.cancelled.wait(), WAIT)
    assert await finished(h, long_id) is TaskState.CANCELLED
    assert (worker.stats.cancel_wakeups, worker.stats.cancel_looks) == (1, 1)


# ----------------------------------------------------------------------------- broker trouble


async def test_an_absent_broker_never_blocks_or_breaks_the_enqueuer(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    # the worst broker: it accepts the TCP connection, then never answers
    silent: list[asyncio.StreamWriter] = []
    accepted = asyncio.Event()

    async def swallow(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent.append(writer)
        accepted.set()

    def hang_up() -> None:
        for writer in silent:
            writer.transport.abort()

    blackhole = await asyncio.start_server(swallow, "127.0.0.1", 0)
    stack.push_async_callback(blackhole.wait_closed)
    stack.callback(blackhole.close)
    stack.callback(hang_up)
    url = f"amqp://app:app@127.0.0.1:{blackhole.sockets[0].getsockname()[1]}/"
    # a long publish timeout: the publisher stays stuck until the broker hangs up
    h = await Harness.create(
        stack, database_url, url, new_queue("absent"), AmqpNotifier(url, publish_timeout=60)
    )
    stats = h.app.notifier.stats

    first = await h.enqueue("one")  # returns: the hint is handed to the publisher's thread
    await asyncio.wait_for(accepted.wait(), WAIT)  # the publisher is now stuck connecting
    second = await h.enqueue("two")  # and commits do not wait for it
    third = await h.task.aenqueue("three")  # nor do enqueues in a transaction of their own
    fourth = h.task.enqueue("four")
    assert (stats.published, stats.dropped) == (0, 0)  # so nothing was given up yet either

    hang_up()
    await until(lambda: stats.dropped >= 1, "the publisher gives up and counts the drop")
    assert stats.published == 0 and not stats.connected
    for task_id in (first, second, third, fourth):
        row = await h.row(task_id)
        assert row is not None and row.state is TaskState.PENDING

    # nothing listening at all (connection refused) is the same: counted, never raised
    proxy = await TcpProxy.for_url(amqp_url)
    stack.push_async_callback(proxy.close)
    await proxy.refuse()
    refused = await Harness.create(stack, database_url, proxy.url_for(amqp_url), h.queue)
    await refused.enqueue("five")
    refused.task.enqueue("six")
    await until(lambda: refused.app.notifier.stats.dropped >= 1, "refused hints are dropped")
    assert refused.app.notifier.stats.published == 0


async def test_a_worker_started_without_a_broker_polls_then_resumes_wakeups(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    proxy = await TcpProxy.for_url(amqp_url)
    stack.push_async_callback(proxy.close)
    await proxy.refuse()
    h = await Harness.create(stack, database_url, amqp_url, new_queue("late-broker"))
    subscriber = await h.subscriber(proxy.url_for(amqp_url))
    worker = await h.worker(poll=FAST_POLL, notifier=subscriber)

    # phase 1: no broker for the worker; tasks complete by polling
    ids = [await h.enqueue(f"polled {n}") for n in range(3)]
    await until(lambda: h.done(*ids), "tasks complete by polling")
    assert not subscriber.stats.connected
    assert (worker.stats.wakeups, subscriber.stats.received) == (0, 0)
    assert not worker.running.done()

    # phase 2: the broker comes back; the subscriber reconnects by itself
    await proxy.accept()
    await until(lambda: subscriber.stats.connected, "the subscriber reconnects", timeout=20)
    # the hints published during phase 1 (some coalesced) waited in the AMQP queue
    published = h.app.notifier.stats
    await until(lambda: published.published + published.coalesced == 3, "phase 1 hints went out")
    backlog = published.published
    await until(lambda: subscriber.stats.received == backlog, "the waiting hints are delivered")
    late = await h.enqueue("woken")
    await h.runs.wait_started("woken")
    await until(lambda: subscriber.stats.received == backlog + 1, "the new wake-up arrives")
    assert worker.stats.wakeups == backlog + 1
    await until(lambda: h.done(late), "the task completes")
    h.runs.assert_each_ran_once([*(f"polled {n}" for n in range(3)), "woken"])
    await h.assert_completed_once(*ids, late)


async def test_connections_dropped_mid_run_lose_nothing_and_wakeups_resume(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    proxy = await TcpProxy.for_url(amqp_url)
    stack.push_async_callback(proxy.close)
    # publisher and subscriber both go through the proxy
    h = await Harness.create(stack, database_url, proxy.url_for(amqp_url), new_queue("dropped"))
    subscriber = await h.subscriber(proxy.url_for(amqp_url))
    worker = await h.worker(poll=FAST_POLL, notifier=subscriber)
    await until(lambda: subscriber.stats.connected, "the subscriber connects")
    first = await h.enqueue("before")
    await until(lambda: worker.stats.wakeups >= 1, "wake-ups work before the cut")
    await until(lambda: h.done(first), "the first task completes")
    assert proxy.connections == 2  # the publisher's and the subscriber's

    accepted = proxy.accepted
    proxy.drop_all()
    wakeups = worker.stats.wakeups
    during = [await h.enqueue(f"during {n}") for n in range(3)]  # commits return normally
    await until(lambda: h.done(*during), "tasks keep completing by polling")

    await until(lambda: subscriber.stats.connected, "the subscriber reconnects by itself")
    probes: list[int] = []

    async def probe() -> None:  # the publisher reconnects at a hint, once its backoff is over
        probes.append(await h.enqueue(f"probe {len(probes)}"))

    await until(probing(lambda: worker.stats.wakeups > wakeups, probe), "wake-ups resume")
    assert proxy.accepted >= accepted + 2  # both connected again
    await until(lambda: h.done(*probes), "the probes complete")
    h.runs.assert_each_ran_once(
        ["before", *(f"during {n}" for n in range(3)), *(f"probe {n}" for n in range(len(probes)))]
    )
    await h.assert_completed_once(first, *during, *probes)
    assert not worker.running.done()


@pytest.fixture
def private_broker() -> Iterator[PrivateRabbitMQ]:
    with PrivateRabbitMQ.running() as broker:
        yield broker


@pytest.mark.parametrize("database_url", backends("postgresql"), indirect=True)
async def test_a_broker_restart_loses_no_task_and_wakeups_resume(
    database_url: str,
    private_broker: PrivateRabbitMQ,
    stack: contextlib.AsyncExitStack,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    h = await Harness.create(stack, database_url, private_broker.url, new_queue("restart"))
    subscriber = await h.subscriber(private_broker.url)
    worker = await h.worker(poll=FAST_POLL, notifier=subscriber)
    await until(lambda: subscriber.stats.connected, "the subscriber connects")
    first = await h.enqueue("before")
    await until(lambda: worker.stats.wakeups >= 1, "wake-ups work before the restart")

    await asyncio.to_thread(private_broker.stop)  # the worker keeps running meanwhile
    await until(lambda: not subscriber.stats.connected, "the subscriber notices")
    wakeups = worker.stats.wakeups
    during = [await h.enqueue(f"during {n}") for n in range(3)]  # commits return normally
    await until(lambda: h.done(first, *during), "tasks complete by polling without a broker")
    assert worker.stats.wakeups == wakeups

    await asyncio.to_thread(private_broker.start)  # returns once the broker takes connections
    probes: list[int] = []

    async def probe() -> None:
        probes.append(await h.enqueue(f"probe {len(probes)}"))

    await until(
        probing(lambda: worker.stats.wakeups > wakeups, probe, every=0.1),
        "wake-ups resume",
        timeout=RESUME_BOUND,
    )
    # a connection whose setup the just-started broker answered too slowly is given up, but
    # its consumer, already at the broker, delivers until it closes: wake-ups may resume
    # before the next attempt connects
    await until(lambda: subscriber.stats.connected, "the subscriber is connected again")
    await until(lambda: h.done(*probes), "the probes complete")
    h.runs.assert_each_ran_once(
        ["before", *(f"during {n}" for n in range(3)), *(f"probe {n}" for n in range(len(probes)))]
    )
    await h.assert_completed_once(first, *during, *probes)
    assert not worker.running.done()
    # one line as each connection went, one as it came back (once it has lasted STABLE_AFTER):
    # from txtasks, naming the broker
    await until(
        lambda: sum(level == "INFO" for level, _, _ in broker_log(caplog)) >= 2,
        "each connection says it is back",
        timeout=STABLE_AFTER + 5,
    )
    lines = broker_log(caplog)
    assert sorted((level, text.split(":")[0]) for level, _, text in lines) == [
        ("INFO", "wake-up publisher"),
        ("INFO", "wake-up subscriber"),
        ("WARNING", "wake-up publisher"),
        ("WARNING", "wake-up subscriber"),
    ], lines


# ----------------------------------------------------------------------------- the cleaner


async def test_the_cleaner_reannounces_a_task_whose_wakeup_was_lost(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    h = await Harness.create(stack, database_url, amqp_url, new_queue("reannounce"))
    worker = await h.worker(poll=SLOW_POLL)
    await idle(worker, h.app.notifier)
    # committed without a wake-up, as when the broker was away at commit time
    [task_id] = await h.app.driver.tasks.task_insert_many([h.app.new_task(h.task, {"lost": 1})])
    after = 0.5
    config = CleanerConfig(
        reannouncer=ReannouncerConfig(interval=0.2, after=after),
        rescuer=None,
        archiver=None,
        retention=None,
        periodic=None,
    )
    cleaner = Cleaner(h.app, config)
    await cleaner.start()
    stack.push_async_callback(cleaner.stop)

    await h.runs.wait_started({"lost": 1})  # a poll would take 30 s

    assert worker.stats.wakeups >= 1
    assert h.app.notifier.stats.published >= 1
    await until(lambda: h.done(task_id), "the task completes")
    row = await h.row(task_id)
    assert row is not None and row.started_at is not None
    assert row.started_at - row.run_at >= timedelta(seconds=after)  # not before the threshold
    h.runs.assert_each_ran_once([{"lost": 1}])


@pytest.mark.parametrize("database_url", backends("sqlite", "postgresql"), indirect=True)
async def test_a_worker_without_a_free_slot_leaves_wake_ups_to_idle_workers(
    database_url: str, amqp_url: str, stack: contextlib.AsyncExitStack
) -> None:
    # worker A runs a long task in its only slot; every wake-up after that goes to worker B,
    # none waits on A for a slot (polls are 30 s: only a wake-up starts a task in time)
    h = await Harness.create(stack, database_url, amqp_url, new_queue("full"))
    gate, holding = asyncio.Event(), asyncio.Event()

    async def long_task(_payload: object) -> None:
        holding.set()
        await gate.wait()

    blocker = h.app.task(name="wakeups.long", queue=h.queue)(long_task)
    stack.callback(gate.set)  # released before the workers stop
    to_a = await h.subscriber(amqp_url)
    a = await h.worker(poll=SLOW_POLL, notifier=to_a, concurrency=1)
    await idle(a, to_a)
    await blocker.aenqueue("hold")
    await asyncio.wait_for(holding.wait(), WAIT)
    await until(lambda: not to_a.stats.taking, "the full worker stops taking wake-ups")
    assert to_a.stats.connected  # still connected: cancel wake-ups reach it
    received = to_a.stats.received

    to_b = await h.subscriber(amqp_url)
    b = await h.worker(poll=SLOW_POLL, notifier=to_b, concurrency=5)
    await idle(b, to_b)
    for n in range(6):
        await h.enqueue(n)
        await h.runs.wait_started(n)
    assert (a.stats.claimed, b.stats.claimed) == (1, 6)
    assert to_a.stats.received == received

    gate.set()  # A's slot frees: it takes wake-ups again
    await until(lambda: to_a.stats.taking, "the worker takes wake-ups again")
