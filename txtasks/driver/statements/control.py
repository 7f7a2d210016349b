"""The SQL of control, shared by every dialect (`SqlDialect` inherits it; see docs/control.md):
cancelling tasks, making a waiting task due now, pausing queues, and the reads of
`txtasks inspect` and `txtasks tasks`.

A cancel is a plan (`cancel_plan`), run in one transaction on any connection, sync or async: it
locks the live rows it names, waiting for a claim or an outcome that holds one, so that a row is
either claimed or cancelled, never both. A waiting row (pending, retryable) moves to the archive
as cancelled and its key is armed, as an outcome's would be; a processing row is marked
(`cancel_requested_at`) for its worker to notice, and the outcome of its attempt is then recorded
as cancelled, fenced like any other.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Executable, Integer, Result, bindparam, delete, insert, select, update

from txtasks.control import CANCELLABLE, TaskFilter, cancels_of
from txtasks.driver.insert_plan import Step
from txtasks.driver.statements import Statements
from txtasks.driver.statements.key_hints import hints_step
from txtasks.keys import KeyOverride, Rate
from txtasks.schema.tables import (
    Timestamp,
    along_archive_order,
    archive,
    key_limits,
    paused_queues,
    tasks,
)
from txtasks.types import READY_STATES, Cancel, TaskState

#: A plan of statements returning what it did to each task.
CancelPlan = Generator[Step, Result[Any], list[Cancel]]
#: A plan of statements returning a value.
ValuePlan = Generator[Step, Result[Any], Any]
#: The key of the override row that holds a whole queue's rate (`txtasks_key_limits`).
QUEUE_ITSELF = ""


def override_is(key: str, queue: str | None) -> Any:
    """The override row of `key` in `queue` (None: every queue, stored as "*")."""
    return (key_limits.c.partition_key == key) & (key_limits.c.queue == (queue or "*"))


_READY_VALUES = frozenset(s.value for s in READY_STATES)
_PROCESSING = TaskState.PROCESSING.value
_CANCELLED = TaskState.CANCELLED.value


def override_of(row: Any) -> KeyOverride:
    """A `txtasks_key_limits` row as the override it stores."""
    rate = None
    if row["rate_count"] is not None and row["rate_per"] is not None:
        rate = Rate(int(row["rate_count"]), float(row["rate_per"]), int(row["rate_burst"] or 1))
    ordered = row["ordered"]
    return KeyOverride(
        key=row["partition_key"],
        queue=None if row["queue"] == "*" else row["queue"],
        concurrency=row["concurrency"],
        ordered=None if ordered is None else bool(ordered),
        rate=rate,
    )


class ControlStatements(Statements):
    """Cancel, pause and inspection statements."""

    @staticmethod
    @functools.cache
    def stmt_cancel_lock() -> Executable:
        """The live rows `ids` a cancel acts on, in id order, locked (waiting for a claim or an
        outcome that holds one)."""
        return (
            select(
                tasks.c.id,
                tasks.c.state,
                tasks.c.queue,
                tasks.c.partition_key,
                tasks.c.cancel_requested_at,
            )
            .where(tasks.c.id.in_(bindparam("ids", expanding=True)), tasks.c.state.in_(CANCELLABLE))
            .order_by(tasks.c.id)
            .with_for_update()
        )

    @staticmethod
    def stmt_cancel_pick(where: TaskFilter) -> Executable:
        """Up to `limit` ids of live tasks matching `where` whose cancel is not asked for yet,
        in id order."""
        return (
            select(tasks.c.id)
            .where(
                tasks.c.state.in_(CANCELLABLE),
                tasks.c.cancel_requested_at.is_(None),
                *where.clauses(tasks),
            )
            .order_by(tasks.c.id)
            .limit(bindparam("limit", type_=Integer))
        )

    @staticmethod
    @functools.cache
    def stmt_cancel_request() -> Executable:
        """Mark the processing rows `ids` (locked by the caller) as asked to cancel at `now`."""
        return (
            update(tasks)
            .where(
                tasks.c.id.in_(bindparam("ids", expanding=True)),
                tasks.c.state == _PROCESSING,
                tasks.c.cancel_requested_at.is_(None),
            )
            .values(cancel_requested_at=bindparam("now", type_=Timestamp))
        )

    @staticmethod
    @functools.cache
    def stmt_archived_states() -> Executable:
        """The archived rows `ids`: their final states."""
        return select(archive.c.id, archive.c.state).where(
            archive.c.id.in_(bindparam("ids", expanding=True))
        )

    @classmethod
    def cancel_plan(
        cls, ids: Sequence[int] | None, where: TaskFilter | None, now: datetime, limit: int
    ) -> CancelPlan:
        """Cancel the tasks `ids`, or up to `limit` live tasks matching `where`."""
        if ids is None:
            assert where is not None
            picked = yield cls.stmt_cancel_pick(where), {"limit": limit}
            ids = list(picked.scalars())
            if not ids:
                return []
        wanted = sorted(set(ids))
        found = list((yield cls.stmt_cancel_lock(), {"ids": wanted}).all())
        queued = [r for r in found if r.state in _READY_VALUES]
        if queued:
            done = [r.id for r in queued]
            yield (
                cls.sql.outcomes.stmt_archive_copy(),
                {"ids": done, "state": _CANCELLED, "now": now},
            )
            yield cls.sql.outcomes.stmt_delete(), {"ids": done}
            pairs = sorted({(r.queue, r.partition_key) for r in queued if r.partition_key})
            if pairs:  # a slot freed or an ordered key's head moved on: claims look again
                yield from cls.sql.keys.keys_wake_plan(pairs, now)
        running = [r.id for r in found if r.state == _PROCESSING and r.cancel_requested_at is None]
        if running:
            yield cls.stmt_cancel_request(), {"ids": running, "now": now}
        seen = {r.id for r in found}
        missing = [i for i in wanted if i not in seen]
        archived: dict[int, str] = {}
        if missing:
            result = yield cls.stmt_archived_states(), {"ids": missing}
            rows: list[Any] = list(result.all())
            archived = {int(r[0]): str(r[1]) for r in rows}
        return cancels_of(list(dict.fromkeys(ids)), found, archived)

    @staticmethod
    @functools.cache
    def stmt_waiting_find() -> Executable:
        """The waiting task `task_id` (pending or retryable): its queue and key."""
        return select(tasks.c.queue, tasks.c.partition_key).where(
            tasks.c.id == bindparam("task_id", type_=Integer),
            tasks.c.state.in_(sorted(_READY_VALUES)),
        )

    @staticmethod
    @functools.cache
    def stmt_run_now() -> Executable:
        """Make the waiting task `task_id` due at `now`."""
        return (
            update(tasks)
            .where(
                tasks.c.id == bindparam("task_id", type_=Integer),
                tasks.c.state.in_(sorted(_READY_VALUES)),
            )
            .values(run_at=bindparam("now", type_=Timestamp))
        )

    @classmethod
    def run_now_plan(cls, task_id: int, now: datetime) -> ValuePlan:
        """Make a waiting task due at `now`, leaving a key hint for a task with a key; its
        queue, or None when it is not waiting."""
        row = (yield cls.stmt_waiting_find(), {"task_id": task_id}).first()
        if row is None:
            return None
        yield cls.stmt_run_now(), {"task_id": task_id, "now": now}
        hints = hints_step([(row.queue, row.partition_key, now)])
        if hints:
            yield hints
        return str(row.queue)

    @staticmethod
    @functools.cache
    def stmt_cancel_requested() -> Executable:
        """Of the rows `ids`, those whose cancel was asked for: (id, attempt)."""
        return select(tasks.c.id, tasks.c.attempt).where(
            tasks.c.id.in_(bindparam("ids", expanding=True)),
            tasks.c.cancel_requested_at.is_not(None),
        )

    @staticmethod
    def paused_queue_names() -> Any:
        """The names of the paused queues, as a subquery a claim excludes (`NOT IN`)."""
        return select(paused_queues.c.queue)

    @classmethod
    @functools.cache
    def stmt_pause(cls) -> Executable:
        """Pause `queue` at `now`; nothing if it is paused already."""
        values = {"queue": bindparam("queue"), "paused_at": bindparam("now", type_=Timestamp)}
        return cls.sql.upsert(paused_queues).values(**values).on_conflict_do_nothing()  # type: ignore[no-any-return]

    @staticmethod
    @functools.cache
    def stmt_paused_at() -> Executable:
        """When `queue` was paused (no row: it is not)."""
        return select(paused_queues.c.paused_at).where(paused_queues.c.queue == bindparam("queue"))

    @staticmethod
    @functools.cache
    def stmt_resume() -> Executable:
        """Resume `queue`."""
        return delete(paused_queues).where(paused_queues.c.queue == bindparam("queue"))

    @classmethod
    def pause_plan(cls, queue: str, now: datetime) -> ValuePlan:
        """Pause `queue`; when it was paused already, that time (else None)."""
        earlier = (yield cls.stmt_paused_at(), {"queue": queue}).scalar()
        if earlier is None:
            yield cls.stmt_pause(), {"queue": queue, "now": now}
        return earlier

    @classmethod
    def resume_plan(cls, queue: str) -> ValuePlan:
        """Resume `queue`; whether it was paused."""
        result = yield cls.stmt_resume(), {"queue": queue}
        return result.rowcount > 0  # type: ignore[attr-defined]

    @staticmethod
    def queue_rate_plan(queue: str, rate: Rate | None, now: datetime) -> ValuePlan:
        """Set (or with None, clear) the rate of `queue` as a whole, stored as its override
        with the queue's own mark for a key; whether one was stored before."""
        found = yield delete(key_limits).where(override_is(QUEUE_ITSELF, queue)), None
        if rate is not None:
            row = {
                "queue": queue,
                "partition_key": QUEUE_ITSELF,
                "rate_count": rate.count,
                "rate_per": rate.per,
                "rate_burst": rate.burst,
                "updated_at": now,
            }
            yield insert(key_limits), row
        return found.rowcount > 0  # type: ignore[attr-defined]

    @staticmethod
    def stmt_live_list(states: Sequence[str], where: TaskFilter) -> Executable:
        """Up to `limit` live tasks in `states` matching `where`, newest first (the primary
        key; with a queue, the claim and lease indexes serve the states)."""
        return (
            select(tasks)
            .where(tasks.c.state.in_(states), *where.clauses(tasks))
            .order_by(tasks.c.id.desc())
            .limit(bindparam("limit", type_=Integer))
        )

    @staticmethod
    def stmt_archive_list(state: str, where: TaskFilter) -> Executable:
        """Up to `limit` archived tasks in `state` matching `where`, last finished first: read
        along the archive's index of state and finish time."""
        stmt = (
            select(archive)
            .where(archive.c.state == state, *where.clauses(archive))
            .order_by(archive.c.finished_at.desc(), archive.c.id.desc())
            .limit(bindparam("limit", type_=Integer))
        )
        ordered: Executable = along_archive_order(stmt, by_queue=where.queue is not None)
        return ordered
