"""Enqueue plans: the insert statements of an enqueue as a generator, run on any connection.

A dialect driver builds the plan (`SqlDriver.enqueue_plan`); the same plan runs on a sync
`Connection`/`Session` or an async `AsyncConnection`/`AsyncSession`.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Executable, Result
from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.types import NewTask

#: One step of an enqueue: a statement and its parameters (a list means executemany).
Step = tuple[Executable, Sequence[Mapping[str, Any]] | Mapping[str, Any] | None]
#: A generator of steps that receives each step's result and returns the new ids.
Plan = Generator[Step, Result[Any], list[int]]


def plan_run_sync(executor: Connection | Any, plan: Plan) -> list[int]:
    """Run an enqueue plan on a sync Connection or Session."""
    try:
        step = next(plan)
        while True:
            stmt, params = step
            step = plan.send(executor.execute(stmt, params))
    except StopIteration as stop:
        return list(stop.value)


async def plan_run_async(executor: AsyncConnection | Any, plan: Plan) -> list[int]:
    """Run an enqueue plan on an AsyncConnection or AsyncSession."""
    try:
        step = next(plan)
        while True:
            stmt, params = step
            step = plan.send(await executor.execute(stmt, params))
    except StopIteration as stop:
        return list(stop.value)


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
    }
