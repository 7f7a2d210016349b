"""Control of tasks and queues, as every driver applies it (see docs/control.md): which tasks a
cancel or a listing takes, what a cancel did to each task, and the rule that a cancel asked for
wins over a retry. Plain data and functions: no dependency beyond the standard library."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from txtasks.errors import ConfigurationError
from txtasks.types import (
    READY_STATES,
    Cancel,
    CancelResult,
    Outcome,
    OutcomeKind,
    TaskRow,
    TaskState,
)

#: The states a cancel acts on (a staged row belongs to a write not committed yet).
CANCELLABLE = (*(s.value for s in READY_STATES), TaskState.PROCESSING.value)
_READY_VALUES = frozenset(s.value for s in READY_STATES)
_RUNNING = TaskState.PROCESSING


def task_state(value: TaskState | str) -> TaskState:
    """A state by its name; an unknown one is an error naming the known ones."""
    try:
        return TaskState(value)
    except ValueError:
        known = ", ".join(s.value for s in TaskState)
        raise ConfigurationError(f"state: unknown state {value!r}; known: {known}") from None


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks a cancel or a listing takes: every field given must match (None: any)."""

    queue: str | None = None
    task_name: str | None = None
    key: str | None = None

    @property
    def empty(self) -> bool:
        return self.queue is None and self.task_name is None and self.key is None

    def clauses(self, table: Any) -> list[Any]:
        """The WHERE clauses of the filter on `table` (the hot table or the archive)."""
        found = []
        if self.queue is not None:
            found.append(table.c.queue == self.queue)
        if self.task_name is not None:
            found.append(table.c.task_name == self.task_name)
        if self.key is not None:
            found.append(table.c.partition_key == self.key)
        return found


def cancels_of(
    ids: Sequence[int],
    found: Sequence[Any],
    archived: dict[int, str],
) -> list[Cancel]:
    """What the cancel did to each of `ids`, in order: `found` the live rows it locked (id,
    state, queue, partition_key, cancel_requested_at), `archived` the states of the others."""
    live = {r[0]: r for r in found}
    results = []
    for task_id in ids:
        row = live.get(task_id)
        if row is None:
            state = archived.get(task_id)
            if state is None:
                results.append(Cancel(task_id, CancelResult.NOT_FOUND))
            else:
                results.append(Cancel(task_id, CancelResult.FINISHED, TaskState(state)))
        elif row[1] in _READY_VALUES:
            results.append(Cancel(task_id, CancelResult.CANCELLED, TaskState(row[1]), row[2]))
        elif row[4] is None:
            results.append(Cancel(task_id, CancelResult.REQUESTED, _RUNNING, row[2]))
        else:
            results.append(Cancel(task_id, CancelResult.ALREADY_REQUESTED, _RUNNING, row[2]))
    return results


def cancel_wins(outcome: Outcome, cancel_requested: bool) -> Outcome:
    """The outcome to record for an attempt: a retry or a release of a task whose cancel was
    asked for is recorded as cancelled instead (it must never run again); an outcome that
    finishes the task stands."""
    if cancel_requested and not outcome.kind.finishes:
        return Outcome(outcome.key, OutcomeKind.CANCEL, error=outcome.error)
    return outcome


def cancels_by_queue(results: Sequence[Cancel]) -> dict[str, list[int]]:
    """The running tasks a cancel asked to stop, by queue: whom its cancel wake-ups go to."""
    by_queue: dict[str, list[int]] = {}
    for c in results:
        if c.result is CancelResult.REQUESTED and c.queue is not None:
            by_queue.setdefault(c.queue, []).append(c.id)
    return by_queue


def task_list_order(rows: list[TaskRow]) -> list[TaskRow]:
    """Live tasks first, newest first; then finished ones, last finished first."""
    live = sorted((r for r in rows if r.state.is_live), key=lambda r: -r.id)
    done = sorted(
        (r for r in rows if not r.state.is_live),
        key=lambda r: (r.finished_at or datetime.min, r.id),
        reverse=True,
    )
    return live + done
