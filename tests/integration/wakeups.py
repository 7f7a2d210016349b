"""Helpers of the RabbitMQ wake-up suites (test_wakeups.py, test_wakeup_outages.py).

An app publishing wake-ups, its task, a SQLAlchemy engine and workers on the test's loop (the
`Harness`), what the handler ran (`Runs`), the claims each worker made, and the broker's lines
in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from txtasks import App
from txtasks.app import Task
from txtasks.driver.urls import url_async
from txtasks.types import TaskRow, TaskState
from txtasks.wakeup.amqp import AmqpNotifier
from txtasks.worker.worker import Worker, WorkerConfig, WorkerStats

#: Seconds any expected event may take. Polls in the wake-up tests are 30 s, so a task that
#: starts within this was woken, not found by a poll.
WAIT = 10.0
SLOW_POLL = 30.0
FAST_POLL = 0.1
#: Seconds from the broker's return to the first wake-up a worker acts on.
RESUME_BOUND = 5.0
#: Loggers an operator reads about the broker: txtasks' own and the AMQP libraries'.
BROKER_LOGGERS = ("txtasks.wakeup", "aiormq", "aio_pika")


def broker_log(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    """(level, logger, message) of each line about the broker: txtasks' and the AMQP libraries'."""

    def text(record: logging.LogRecord) -> str:
        try:
            return record.getMessage()
        except Exception:  # aio-pika 10 logs records whose arguments fail to format
            return str(record.msg)

    return [
        (r.levelname, r.name, text(r)) for r in caplog.records if r.name.startswith(BROKER_LOGGERS)
    ]


def new_queue(label: str) -> str:
    return f"wk-{label}-{uuid.uuid4().hex[:10]}"


class Runs:
    """The handler: records each payload it runs and signals when a given one starts."""

    def __init__(self) -> None:
        self.payloads: list[Any] = []
        self._started: dict[str, asyncio.Event] = {}

    def started(self, payload: str) -> asyncio.Event:
        return self._started.setdefault(payload, asyncio.Event())

    async def handler(self, payload: Any) -> None:
        self.payloads.append(payload)
        self.started(json.dumps(payload)).set()

    async def wait_started(self, payload: Any, timeout: float = WAIT) -> None:
        try:
            await asyncio.wait_for(self.started(json.dumps(payload)).wait(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"the task {payload!r} did not start within {timeout}s") from None

    def assert_each_ran_once(self, expected: list[Any]) -> None:
        key = json.dumps
        assert sorted(map(key, self.payloads)) == sorted(map(key, expected))


class ClaimCounter:
    """The worker's driver, whose claims role counts claims of either kind (and the empty
    ones) so tests see what it did."""

    def __init__(self, driver: Any) -> None:
        self._driver = driver
        self.calls = 0
        self.empty = 0

    @property
    def claims(self) -> ClaimCounter:
        return self

    def __getattr__(self, name: str) -> Any:
        role = self._driver.claims
        return getattr(role if hasattr(role, name) else self._driver, name)

    async def task_claim_many(self, *args: Any, **kwargs: Any) -> list[TaskRow]:
        return self._counted(await self._driver.claims.task_claim_many(*args, **kwargs))

    async def task_claim_ids(self, *args: Any, **kwargs: Any) -> list[TaskRow]:
        return self._counted(await self._driver.claims.task_claim_ids(*args, **kwargs))

    def _counted(self, rows: list[TaskRow]) -> list[TaskRow]:
        self.calls += 1
        self.empty += not rows
        return rows


@dataclass
class RunningWorker:
    worker: Worker
    claims: ClaimCounter
    running: asyncio.Task[WorkerStats]

    @property
    def stats(self) -> WorkerStats:
        return self.worker.stats

    def stop(self) -> None:
        self.worker.stop()


class Harness:
    """One app (the publisher side), its task, a SQLAlchemy engine, and workers, all closed."""

    def __init__(
        self,
        stack: contextlib.AsyncExitStack,
        database_url: str,
        broker_url: str,
        queue: str,
        notifier: AmqpNotifier | None = None,
    ) -> None:
        self.stack = stack
        self.database_url = database_url
        self.queue = queue
        self.runs = Runs()
        self.app = App(
            "wakeups", database_url=database_url, broker_url=broker_url, notifier=notifier
        )
        stack.push_async_callback(self.app.aclose)
        self.task: Task = self.app.task(name="wakeups.task", queue=queue)(self.runs.handler)
        self.engine: AsyncEngine = create_async_engine(url_async(database_url))
        stack.push_async_callback(self.engine.dispose)

    @classmethod
    async def create(
        cls,
        stack: contextlib.AsyncExitStack,
        database_url: str,
        broker_url: str,
        queue: str,
        notifier: AmqpNotifier | None = None,
    ) -> Harness:
        harness = cls(stack, database_url, broker_url, queue, notifier)
        # txtasks' first connection turns a fresh SQLite file to WAL, which fails at once while
        # another connection writes: make it before the test's own engine writes
        await harness.app.driver.open()
        return harness

    async def subscriber(self, broker_url: str) -> AmqpNotifier:
        """A notifier of the worker's own, so its stats are about consuming alone."""
        notifier = AmqpNotifier(broker_url)
        self.stack.push_async_callback(notifier.close)
        return notifier

    async def worker(
        self, *, poll: float, notifier: AmqpNotifier | None = None, **settings: Any
    ) -> RunningWorker:
        """A worker running as a task of the test's loop; stopped (and checked) at the end.
        `settings`: more `WorkerConfig` fields (heartbeat, lease...)."""
        claims = ClaimCounter(self.app.driver)
        config = WorkerConfig(
            poll_interval=poll, flush_interval=0.001, shutdown_grace=5, **settings
        )
        worker = Worker(self.app, config, driver=claims, notifier=notifier)  # type: ignore[arg-type]
        running = RunningWorker(worker, claims, asyncio.create_task(worker.run()))

        async def stop() -> None:
            worker.stop()
            await asyncio.wait_for(running.running, 15)  # also raises what the worker raised

        self.stack.push_async_callback(stop)
        return running

    async def enqueue(self, payload: Any, *, commit: bool = True) -> int:
        """Enqueue in the caller's AsyncConnection transaction, then commit or roll back."""
        async with self.engine.connect() as conn:
            task_id = await self.task.aenqueue_tx(conn, payload)
            await (conn.commit() if commit else conn.rollback())
        return task_id

    async def row(self, task_id: int) -> TaskRow | None:
        return await self.app.driver.tasks.task_get(task_id)

    async def done(self, *ids: int) -> bool:
        for task_id in ids:
            row = await self.row(task_id)
            if row is None or row.state is not TaskState.COMPLETED:
                return False
        return True

    async def assert_completed_once(self, *ids: int) -> None:
        for task_id in ids:
            row = await self.row(task_id)
            assert row is not None, f"task {task_id} is gone"
            assert (row.state, row.attempt) == (TaskState.COMPLETED, 1), (task_id, row)


def probing(
    check: Callable[[], bool], probe: Callable[[], Awaitable[Any]], every: float = 0.5
) -> Callable[[], Awaitable[bool]]:
    """A predicate for `until`: `check()`, running `probe()` every `every` seconds meanwhile
    (e.g. a commit whose hint makes a publisher in backoff reconnect)."""
    loop = asyncio.get_running_loop()
    next_probe = loop.time()

    async def checked() -> bool:
        nonlocal next_probe
        if check():
            return True
        if loop.time() >= next_probe:
            await probe()
            next_probe = loop.time() + every
        return False

    return checked
