"""The one path every enqueue takes, in the caller's transaction or in one of its own.

`Enqueuer` is that path: the middleware's `before_enqueue` hooks, the write (tasks or a
topic's publishes), and the wake-ups once the rows are committed. Every entry point goes
through it: `App.enqueue*` and `Task.enqueue*`, `app.topics.publish*`, and the cleaner's periodic
fires (which write their tasks with the schedule's move, and use `prepare` and `committed`).

In the caller's transaction, any SQLAlchemy flavour: `Connection` and `Session` are
synchronous; `AsyncConnection` and `AsyncSession` asynchronous. The same plan of statements
runs on all four: rolled back, the tasks never exist; committed, they will run. A plain DB-API
connection wrapped in a `DbapiTx` (txtasks.dbapi) runs it too, through a SQLAlchemy Connection
that leaves the transaction to the caller.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeAlias, TypeVar

from sqlalchemy import Connection

from txtasks.dbapi import DbapiTx
from txtasks.driver.dialect import dialect_for
from txtasks.driver.insert_plan import plan_run_async, plan_run_sync
from txtasks.errors import ConfigurationError
from txtasks.publishes import publish_of_row, publish_row
from txtasks.types import Delivery, NewPublish, NewTask, TaskState
from txtasks.wakeup import NullNotifier, wakeup_after_commit
from txtasks.wakeup.commit import PendingWakeups

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    from txtasks.driver.base import Driver
    from txtasks.middleware import Middleware
    from txtasks.wakeup import Notifier

    SyncExecutor: TypeAlias = Connection | Session | DbapiTx
    AsyncExecutor: TypeAlias = AsyncConnection | AsyncSession


def _is(executor: Any, module: str, *names: str) -> bool:
    """isinstance against SQLAlchemy classes that are loaded: an object of a class whose module
    was never imported cannot be one (so neither the ORM nor asyncio support is imported)."""
    loaded = sys.modules.get(module)
    if loaded is None:
        return False
    return isinstance(executor, tuple(getattr(loaded, name) for name in names))


def _is_async(executor: Any) -> bool:
    return _is(executor, "sqlalchemy.ext.asyncio", "AsyncConnection", "AsyncSession")


def _is_sync(executor: Any) -> bool:
    return isinstance(executor, Connection | DbapiTx) or _is(executor, "sqlalchemy.orm", "Session")


def executor_dialect(executor: SyncExecutor | AsyncExecutor) -> Dialect:
    """The SQL dialect behind any of the four SQLAlchemy flavours."""
    if isinstance(executor, Connection) or _is(
        executor, "sqlalchemy.ext.asyncio", "AsyncConnection"
    ):
        return executor.dialect  # type: ignore[union-attr]
    if _is(executor, "sqlalchemy.ext.asyncio", "AsyncSession"):
        return executor.sync_session.get_bind().dialect  # type: ignore[union-attr]
    if _is(executor, "sqlalchemy.orm", "Session"):
        return executor.get_bind().dialect  # type: ignore[union-attr]
    if callable(getattr(executor, "cursor", None)) and callable(getattr(executor, "commit", None)):
        raise ConfigurationError(
            f"enqueue: {type(executor).__name__} is a DB-API connection; wrap it: "
            "`enqueue_tx(txtasks.DbapiTx(connection), ...)`, then `after_commit()` once committed"
        )
    raise ConfigurationError(
        "enqueue: expected a SQLAlchemy Connection, Session, AsyncConnection or AsyncSession, "
        f"got {type(executor).__name__}"
    )


def sync_connection(executor: Connection | Session) -> Connection:
    """The Connection a sync Connection or Session runs its transaction on."""
    return executor if isinstance(executor, Connection) else executor.connection()


@contextlib.contextmanager
def sql_executor(executor: SyncExecutor) -> Iterator[Connection | Session]:
    """The SQLAlchemy executor a plan runs on: the executor, or a Connection on a DbapiTx's
    DB-API connection (for the duration of the plan)."""
    if isinstance(executor, DbapiTx):
        with executor.sql_connection() as connection:
            yield connection
    else:
        yield executor


def wakeups_after_commit(
    executor: SyncExecutor, notifier: Notifier, ids_by_queue: Mapping[str, Sequence[int]]
) -> None:
    """Hints that go out when the executor's transaction commits, dropped if it rolls back."""
    if isinstance(executor, DbapiTx):
        executor.wakeups_add(notifier, ids_by_queue)
    else:
        wakeup_after_commit(sync_connection(executor), notifier, ids_by_queue)


async def async_sync_connection(executor: AsyncExecutor) -> Connection:
    """The sync Connection under an AsyncConnection or AsyncSession."""
    if _is(executor, "sqlalchemy.ext.asyncio", "AsyncConnection"):
        return executor.sync_connection  # type: ignore[union-attr,return-value]
    return (await executor.connection()).sync_connection  # type: ignore[return-value]


def _check_sync(executor: Any) -> None:
    if _is_async(executor):
        raise ConfigurationError(
            f"enqueue_tx: {type(executor).__name__} is asynchronous; use `await aenqueue_tx(...)`"
        )


def _check_async(executor: Any) -> None:
    if _is_sync(executor):
        raise ConfigurationError(
            f"aenqueue_tx: {type(executor).__name__} is synchronous; use `enqueue_tx(...)`"
        )


def insert_many_tx(executor: SyncExecutor, rows: Sequence[NewTask]) -> list[int]:
    """Insert tasks on a sync Connection or Session, inside its transaction."""
    _check_sync(executor)
    if not rows:
        return []
    with sql_executor(executor) as sql:
        plan = dialect_for(executor_dialect(sql)).enqueue.enqueue_plan(rows)
        return plan_run_sync(sql, plan)


async def ainsert_many_tx(executor: AsyncExecutor, rows: Sequence[NewTask]) -> list[int]:
    """Insert tasks on an AsyncConnection or AsyncSession, inside its transaction."""
    _check_async(executor)
    if not rows:
        return []
    plan = dialect_for(executor_dialect(executor)).enqueue.enqueue_plan(rows)
    return await plan_run_async(executor, plan)


def publish_many_tx(
    executor: SyncExecutor, publishes: Sequence[NewPublish]
) -> list[list[Delivery]]:
    """Publish on a sync Connection or Session, inside its transaction: each publish's tasks."""
    _check_sync(executor)
    if not publishes:
        return []
    with sql_executor(executor) as sql:
        plan = dialect_for(executor_dialect(sql)).topics.publish_plan(publishes)
        return plan_run_sync(sql, plan)


async def apublish_many_tx(
    executor: AsyncExecutor, publishes: Sequence[NewPublish]
) -> list[list[Delivery]]:
    """Publish on an AsyncConnection or AsyncSession, inside its transaction."""
    _check_async(executor)
    if not publishes:
        return []
    plan = dialect_for(executor_dialect(executor)).topics.publish_plan(publishes)
    return await plan_run_async(executor, plan)


# -- the core ---------------------------------------------------------------------------------

ItemT = TypeVar("ItemT", NewTask, NewPublish)
FoundT = TypeVar("FoundT")


def due_now(row: NewTask) -> bool:
    """Claimable as soon as it commits (a delayed task is found by the poll when due)."""
    return row.state is TaskState.PENDING and row.run_at <= row.created_at


def before_enqueue(middleware: Sequence[Middleware], rows: list[NewTask]) -> list[NewTask]:
    """The rows as the middleware's `before_enqueue` hooks leave them, in order."""
    for m in middleware:
        changed = m.before_enqueue(rows)
        if changed is not None:
            rows = list(changed)
    return rows


class Write(Generic[ItemT, FoundT]):
    """What one enqueue writes (tasks, or publishes) and how, in either transaction."""

    def __init__(self, items: Iterable[ItemT]) -> None:
        self.items: list[ItemT] = list(items)

    def through(self, middleware: Sequence[Middleware]) -> Write[ItemT, FoundT]:
        raise NotImplementedError

    def due(self) -> bool:
        """Whether any item is claimable once committed (only those need a wake-up)."""
        raise NotImplementedError

    def wakeups(self, found: FoundT) -> dict[str, list[int]]:
        """Ids of the tasks due now, by queue (one wake-up per queue)."""
        raise NotImplementedError

    def in_tx(self, executor: SyncExecutor) -> FoundT:
        raise NotImplementedError

    async def ain_tx(self, executor: AsyncExecutor) -> FoundT:
        raise NotImplementedError

    def own(self, driver: Driver) -> FoundT:
        raise NotImplementedError

    async def aown(self, driver: Driver) -> FoundT:
        raise NotImplementedError


class TaskWrite(Write[NewTask, list[int]]):
    """Tasks; found: their ids, in order."""

    def through(self, middleware: Sequence[Middleware]) -> TaskWrite:
        return TaskWrite(before_enqueue(middleware, self.items)) if middleware else self

    def due(self) -> bool:
        return any(due_now(r) for r in self.items)

    def wakeups(self, found: list[int]) -> dict[str, list[int]]:
        grouped: dict[str, list[int]] = {}
        for row, task_id in zip(self.items, found, strict=True):
            if due_now(row):
                grouped.setdefault(row.queue, []).append(task_id)
        return grouped

    def in_tx(self, executor: SyncExecutor) -> list[int]:
        return insert_many_tx(executor, self.items)

    async def ain_tx(self, executor: AsyncExecutor) -> list[int]:
        return await ainsert_many_tx(executor, self.items)

    def own(self, driver: Driver) -> list[int]:
        return driver.tasks.task_insert_many_sync(self.items)

    async def aown(self, driver: Driver) -> list[int]:
        return await driver.tasks.task_insert_many(self.items)


class PublishWrite(Write[NewPublish, list[list[Delivery]]]):
    """Publishes to topics; found: each publish's tasks (one per group subscribed)."""

    def through(self, middleware: Sequence[Middleware]) -> PublishWrite:
        if not middleware:
            return self
        rows = before_enqueue(middleware, [publish_row(p) for p in self.items])
        if len(rows) != len(self.items):
            raise ConfigurationError(
                f"before_enqueue: {len(self.items)} publish row(s) in, {len(rows)} out; a "
                "middleware may change a publish's row, not add or remove rows"
            )
        return PublishWrite(publish_of_row(p, r) for p, r in zip(self.items, rows, strict=True))

    def due(self) -> bool:
        return any(p.due_now for p in self.items)

    def wakeups(self, found: list[list[Delivery]]) -> dict[str, list[int]]:
        grouped: dict[str, list[int]] = {}
        for publish, delivered in zip(self.items, found, strict=True):
            if publish.due_now:
                for d in delivered:
                    grouped.setdefault(d.queue, []).append(d.id)
        return grouped

    def in_tx(self, executor: SyncExecutor) -> list[list[Delivery]]:
        return publish_many_tx(executor, self.items)

    async def ain_tx(self, executor: AsyncExecutor) -> list[list[Delivery]]:
        return await apublish_many_tx(executor, self.items)

    def own(self, driver: Driver) -> list[list[Delivery]]:
        return driver.topics.topic_publish_many_sync(self.items)

    async def aown(self, driver: Driver) -> list[list[Delivery]]:
        return await driver.topics.topic_publish_many(self.items)


class EnqueueHost(Protocol):
    """What the core reads of the application, at each call (the driver and notifier are
    made on first use)."""

    @property
    def middlewares(self) -> tuple[Middleware, ...]: ...

    @property
    def notifier(self) -> Notifier: ...

    @property
    def driver(self) -> Driver: ...


class Enqueuer:
    """The one enqueue path: middleware, then the write, then wake-ups after commit.

    `run` and `run_sync` are the same three steps; `executor` None writes in a transaction
    of its own (committed on return), else in the caller's (the wake-ups wait for its
    commit, and a rollback drops them).
    """

    def __init__(self, host: EnqueueHost) -> None:
        self.host = host

    def prepare(self, write: Write[ItemT, FoundT]) -> Write[ItemT, FoundT]:
        """The write as the middleware leaves it (raising refuses it: nothing is written)."""
        return write.through(self.host.middlewares)

    def _wakes(self, write: Write[Any, Any]) -> bool:
        """Whether a wake-up goes out: a broker is configured and some items are due now.
        Asked before the write, so that a bad broker URL fails the call cleanly."""
        return (
            bool(write.items) and not isinstance(self.host.notifier, NullNotifier) and write.due()
        )

    def committed(self, write: Write[ItemT, FoundT], found: FoundT) -> None:
        """Wake-ups for a write committed already (logs, never raises)."""
        if self._wakes(write):
            self._wake_now(write, found)

    def _wake_now(self, write: Write[ItemT, FoundT], found: FoundT) -> None:
        pending = PendingWakeups()
        pending.add(self.host.notifier, write.wakeups(found))
        pending.publish()

    def run_sync(self, write: Write[ItemT, FoundT], executor: SyncExecutor | None = None) -> FoundT:
        write = self.prepare(write)
        wakes = self._wakes(write)
        if executor is None:
            found = write.own(self.host.driver)
            if wakes:
                self._wake_now(write, found)
        else:
            found = write.in_tx(executor)
            if wakes:
                wakeups_after_commit(executor, self.host.notifier, write.wakeups(found))
        return found

    async def run(
        self, write: Write[ItemT, FoundT], executor: AsyncExecutor | None = None
    ) -> FoundT:
        write = self.prepare(write)
        wakes = self._wakes(write)
        if executor is None:
            found = await write.aown(self.host.driver)
            if wakes:
                self._wake_now(write, found)
        else:
            found = await write.ain_tx(executor)
            if wakes:
                connection = await async_sync_connection(executor)
                wakeup_after_commit(connection, self.host.notifier, write.wakeups(found))
        return found
