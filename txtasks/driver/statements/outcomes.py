"""The statements of outcomes and leases: fenced on (id, attempt, processing), the archive copy,
retries, releases, progress and lease extensions.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Executable,
    String,
    bindparam,
    delete,
    func,
    insert,
    literal,
    select,
    tuple_,
    update,
)

from txtasks.driver.statements import Statements
from txtasks.schema.tables import (
    PROCESSING,
    TASK_COLUMNS,
    Timestamp,
    archive,
    tasks,
)
from txtasks.types import TaskKey, TaskState


def keys_match() -> Any:
    """WHERE clause fencing a batch of attempts (param `keys`): pairs still processing, held by
    the worker `fence_worker` and with a lease expired before `fence_expired` (each unless that
    parameter is NULL)."""
    pairs = tuple_(tasks.c.id, tasks.c.attempt).in_(bindparam("keys", expanding=True))
    holder = bindparam("fence_worker", type_=String)
    expiry = bindparam("fence_expired", type_=Timestamp)
    return (
        pairs
        & (tasks.c.state == PROCESSING)
        & (holder.is_(None) | (tasks.c.worker_id == holder))
        & (expiry.is_(None) | (tasks.c.lease_expires_at < expiry))
    )


def keys_param(
    keys: Sequence[TaskKey], worker_id: str | None = None, expired_before: datetime | None = None
) -> dict[str, Any]:
    """The parameters of `keys_match`: keys in id order (a consistent lock order)."""
    return {
        "keys": sorted((k.id, k.attempt) for k in keys),
        "fence_worker": worker_id,
        "fence_expired": expired_before,
    }


class OutcomeStatements(Statements):
    """Recording attempts: outcomes, archive copies, leases and progress."""

    @staticmethod
    @functools.cache
    def stmt_lock_keys(skip_locked: bool = False) -> Executable:
        """Lock the rows of still-current attempts, in id order; with `skip_locked`, leaving out
        the rows another transaction holds instead of waiting for them."""
        return (
            select(
                tasks.c.id,
                tasks.c.attempt,
                tasks.c.queue,
                tasks.c.partition_key,
                tasks.c.cancel_requested_at,
            )
            .where(keys_match())
            .order_by(tasks.c.id)
            .with_for_update(skip_locked=skip_locked)
        )

    @staticmethod
    @functools.cache
    def stmt_archive_copy() -> Executable:
        """Copy rows `ids` into the archive with their final `state`, finished at `now`."""
        cols = [c for c in TASK_COLUMNS if c not in ("state", "lease_expires_at")]
        source = select(
            *[tasks.c[c] for c in cols],
            bindparam("state", type_=String).label("state"),
            literal(None, Timestamp).label("lease_expires_at"),
            bindparam("now", type_=Timestamp).label("finished_at"),
        ).where(tasks.c.id.in_(bindparam("ids", expanding=True)))
        target = [*cols, "state", "lease_expires_at", "finished_at"]
        return insert(archive).from_select(target, source)

    @staticmethod
    @functools.cache
    def stmt_delete() -> Executable:
        """Remove rows `ids` from the hot table."""
        return delete(tasks).where(tasks.c.id.in_(bindparam("ids", expanding=True)))

    @staticmethod
    @functools.cache
    def stmt_archive_error() -> Executable:
        """Record each finished attempt's error on its archived row."""
        return (
            update(archive)
            .where(archive.c.id == bindparam("b_id"))
            .values(last_error=bindparam("b_error"))
        )

    @staticmethod
    @functools.cache
    def stmt_archive_result() -> Executable:
        """Record each completed attempt's result on its archived row."""
        return (
            update(archive)
            .where(archive.c.id == bindparam("b_id"))
            .values(result=bindparam("b_result"))
        )

    @staticmethod
    @functools.cache
    def stmt_retry() -> Executable:
        """Schedule the next attempt of a failed one (fenced)."""
        return (
            update(tasks)
            .where(
                tasks.c.id == bindparam("b_id"),
                tasks.c.attempt == bindparam("b_attempt"),
                tasks.c.state == PROCESSING,
            )
            .values(
                state=TaskState.RETRYABLE.value,
                run_at=bindparam("b_run_at", type_=Timestamp),
                last_error=bindparam("b_error"),
                checkpoint=func.coalesce(bindparam("b_checkpoint"), tasks.c.checkpoint),
                lease_expires_at=None,
                worker_id=None,
            )
        )

    @staticmethod
    @functools.cache
    def stmt_release() -> Executable:
        """Claimed but never started: back to pending, the attempt not counted (fenced)."""
        return (
            update(tasks)
            .where(keys_match())
            .values(
                state=TaskState.PENDING.value,
                attempt=tasks.c.attempt - 1,
                lease_expires_at=None,
                worker_id=None,
            )
        )

    @staticmethod
    @functools.cache
    def stmt_count_keys() -> Executable:
        """How many of the attempts `keys` are still current (a plain read: no lock)."""
        return select(func.count()).select_from(tasks).where(keys_match())

    @staticmethod
    @functools.cache
    def stmt_progress_set() -> Executable:
        """Store each attempt's last progress report (rows locked by the caller)."""
        return (
            update(tasks)
            .where(tasks.c.id == bindparam("b_id"))
            .values(progress=bindparam("b_progress"))
        )

    @staticmethod
    @functools.cache
    def stmt_lease_set() -> Executable:
        """Push the leases of rows `ids` (locked by the caller) to `lease_until`."""
        return (
            update(tasks)
            .where(tasks.c.id.in_(bindparam("ids", expanding=True)))
            .values(lease_expires_at=bindparam("lease_until", type_=Timestamp))
        )
