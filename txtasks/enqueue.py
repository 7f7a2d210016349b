"""Enqueue inside the caller's own transaction, with any SQLAlchemy flavour.

`Connection` and `Session` are synchronous; `AsyncConnection` and `AsyncSession` asynchronous.
The same plan of statements runs on all four: rolled back, the tasks never exist; committed,
they will run.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy import Connection

from txtasks.driver.dialect import dialect_for
from txtasks.driver.insert_plan import plan_run_async, plan_run_sync
from txtasks.errors import ConfigurationError
from txtasks.types import Delivery, NewPublish, NewTask

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    SyncExecutor: TypeAlias = Connection | Session
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
    return isinstance(executor, Connection) or _is(executor, "sqlalchemy.orm", "Session")


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
    raise ConfigurationError(
        "enqueue: expected a SQLAlchemy Connection, Session, AsyncConnection or AsyncSession, "
        f"got {type(executor).__name__}"
    )


def sync_connection(executor: SyncExecutor) -> Connection:
    """The Connection a sync Connection or Session runs its transaction on."""
    return executor if isinstance(executor, Connection) else executor.connection()


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
    plan = dialect_for(executor_dialect(executor)).enqueue_plan(rows)
    return plan_run_sync(executor, plan)


async def ainsert_many_tx(executor: AsyncExecutor, rows: Sequence[NewTask]) -> list[int]:
    """Insert tasks on an AsyncConnection or AsyncSession, inside its transaction."""
    _check_async(executor)
    if not rows:
        return []
    plan = dialect_for(executor_dialect(executor)).enqueue_plan(rows)
    return await plan_run_async(executor, plan)


def publish_many_tx(
    executor: SyncExecutor, publishes: Sequence[NewPublish]
) -> list[list[Delivery]]:
    """Publish on a sync Connection or Session, inside its transaction: each publish's tasks."""
    _check_sync(executor)
    if not publishes:
        return []
    plan = dialect_for(executor_dialect(executor)).publish_plan(publishes)
    return plan_run_sync(executor, plan)


async def apublish_many_tx(
    executor: AsyncExecutor, publishes: Sequence[NewPublish]
) -> list[list[Delivery]]:
    """Publish on an AsyncConnection or AsyncSession, inside its transaction."""
    _check_async(executor)
    if not publishes:
        return []
    plan = dialect_for(executor_dialect(executor)).publish_plan(publishes)
    return await plan_run_async(executor, plan)
