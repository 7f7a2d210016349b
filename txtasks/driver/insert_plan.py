"""Enqueue plans: the insert statements of an enqueue as a generator, run on any connection.

A dialect driver builds the plan (`SqlDialect.enqueue.enqueue_plan`); the same plan runs on a sync
`Connection`/`Session` or an async `AsyncConnection`/`AsyncSession`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Executable, Result

from txtasks._both import drive_async, drive_sync
from txtasks.types import NewTask

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

#: One step of an enqueue: a statement and its parameters (a list means executemany).
Statement = tuple[Executable, Sequence[Mapping[str, Any]] | Mapping[str, Any] | None]


@dataclass(frozen=True, slots=True)
class CopyRows:
    """A step that loads `records` (tuples of `columns`) into `table` with COPY, where the
    connection's driver can (asyncpg), in the caller's transaction; elsewhere the statement
    `fallback` builds runs instead. Its result is not read (the plan sends None)."""

    table: str
    columns: tuple[str, ...]
    records: list[tuple[Any, ...]]
    fallback: Callable[[], Statement]


@dataclass(frozen=True, slots=True)
class DriverSql:
    """A step of SQL in the driver's own form, run with `exec_driver_sql` in the caller's
    transaction: `build` makes the SQL and its parameters (None: none; a list of tuples:
    executemany) from the DBAPI driver's connection (for its own escaping of values, where
    the step writes them into the SQL). Its result is the statement's."""

    build: Callable[[Any], tuple[str, Any]]


Step = Statement | CopyRows | DriverSql
#: A generator of steps that receives each step's result and returns the new ids.
Plan = Generator[Step, Result[Any], list[int]]
#: What a plan returns (the new ids of an enqueue; the tasks of each publish of a publish).
R = TypeVar("R")


def plan_run_sync(executor: Connection | Any, plan: Generator[Step, Result[Any], R]) -> R:
    """Run an enqueue (or publish) plan on a sync Connection or Session."""

    def perform(step: Step) -> Any:
        if isinstance(step, DriverSql):
            connection = executor if isinstance(executor, Connection) else executor.connection()
            sql, values = step.build(connection.connection.driver_connection)
            return connection.exec_driver_sql(sql, values)
        stmt, params = step.fallback() if isinstance(step, CopyRows) else step
        return executor.execute(stmt, params)

    return drive_sync(plan, perform)


async def plan_run_async(
    executor: AsyncConnection | Any, plan: Generator[Step, Result[Any], R]
) -> R:
    """Run an enqueue (or publish) plan on an AsyncConnection or AsyncSession."""

    async def perform(step: Step) -> Any:
        if isinstance(step, CopyRows) and await _copy_async(executor, step):
            return None
        if isinstance(step, DriverSql):
            return await _driver_sql_async(executor, step)
        stmt, params = step.fallback() if isinstance(step, CopyRows) else step
        return await executor.execute(stmt, params)

    return await drive_async(plan, perform)


async def _copy_async(executor: AsyncConnection | Any, step: CopyRows) -> bool:
    """COPY on the asyncpg connection under `executor`, inside its transaction (which an
    earlier step of the plan began); False when the driver is not asyncpg."""
    from sqlalchemy.ext.asyncio import AsyncConnection  # loaded: the executor is async

    connection = executor if isinstance(executor, AsyncConnection) else await executor.connection()
    raw: Any = (await connection.get_raw_connection()).driver_connection
    copy = getattr(raw, "copy_records_to_table", None)
    if copy is None:
        return False
    await copy(step.table, records=step.records, columns=step.columns)
    return True


async def _driver_sql_async(executor: AsyncConnection | Any, step: DriverSql) -> Any:
    """`step` on the connection under `executor`, inside its transaction."""
    from sqlalchemy.ext.asyncio import AsyncConnection  # loaded: the executor is async

    connection = executor if isinstance(executor, AsyncConnection) else await executor.connection()
    raw: Any = (await connection.get_raw_connection()).driver_connection
    sql, values = step.build(raw)
    return await connection.exec_driver_sql(sql, values)


#: The columns a new task's row is written with, in the order `task_values` gives them (a
#: bulk enqueue's statements list them in this order: `BULK_COLUMNS` of MariaDB and SQLite).
TASK_COLUMNS = (
    "queue",
    "task_name",
    "payload",
    "content_type",
    "state",
    "priority",
    "run_at",
    "attempt",
    "max_attempts",
    "created_at",
    "dedup_key",
    "headers",
    "expires_at",
    "stage_id",
    "partition_key",
)


def task_values(row: NewTask) -> dict[str, Any]:
    """Column values of a new task."""
    return {
        "queue": row.queue,
        "task_name": row.task_name,
        "payload": row.payload,
        "content_type": row.content_type,
        "state": row.state.value,
        "priority": row.priority,
        "run_at": row.run_at,
        "attempt": 0,
        "max_attempts": row.max_attempts,
        "created_at": row.created_at,
        "dedup_key": row.dedup_key,
        "headers": row.headers,
        "expires_at": row.expires_at,
        "stage_id": row.stage_id,
        "partition_key": row.partition_key,
    }
