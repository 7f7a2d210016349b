"""Plain data types shared by every layer. No dependencies beyond the standard library."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple


class TaskState(str, enum.Enum):
    """Where a task is in its lifecycle (see docs/lifecycle.md)."""

    STAGED = "staged"
    PENDING = "pending"
    PROCESSING = "processing"
    RETRYABLE = "retryable"
    COMPLETED = "completed"
    FAILED = "failed"
    DISCARDED = "discarded"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def is_live(self) -> bool:
        """Live tasks sit in the hot table; finished ones in the archive."""
        return self in LIVE_STATES

    def __str__(self) -> str:
        return self.value


LIVE_STATES = frozenset(
    {TaskState.STAGED, TaskState.PENDING, TaskState.PROCESSING, TaskState.RETRYABLE}
)
READY_STATES = (TaskState.PENDING, TaskState.RETRYABLE)
#: What a claim reads back of each row, in order (`TaskRow.from_claim`).
CLAIMED_COLUMNS = (
    "id", "queue", "task_name", "payload", "content_type", "priority", "run_at", "attempt",
    "max_attempts", "created_at", "dedup_key", "headers", "checkpoint", "last_error",
    "expires_at", "stage_id", "partition_key",
)  # fmt: skip
FINISHED_STATES = frozenset(
    {
        TaskState.COMPLETED,
        TaskState.FAILED,
        TaskState.DISCARDED,
        TaskState.DEAD,
        TaskState.CANCELLED,
    }
)

#: Queue names: 1-128 of A-Z a-z 0-9 _ . : -
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")

#: Topic names: 1-128 of A-Z a-z 0-9 _ . : - (like queue names); group names the same.
TOPIC_NAME_RE = QUEUE_NAME_RE

#: Headers every delivery of a publish carries: the topic, the publish's own id (the same in
#: every group's delivery) and the group it was delivered to (always the last header).
TOPIC_HEADER = "txtasks-topic"
MESSAGE_HEADER = "txtasks-message"
GROUP_HEADER = "txtasks-group"

JSON_CONTENT_TYPE = "application/json"
BYTES_CONTENT_TYPE = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task about to be inserted: everything the enqueue path writes."""

    queue: str
    task_name: str
    payload: bytes
    content_type: str
    priority: int
    run_at: datetime
    max_attempts: int
    created_at: datetime
    dedup_key: str | None = None
    headers: str | None = None
    expires_at: datetime | None = None
    state: TaskState = TaskState.PENDING
    #: The staging write of a STAGED row (see txtasks.spark); None otherwise.
    stage_id: str | None = None
    #: The key whose limits the task shares (see txtasks.keys); None: no key.
    partition_key: str | None = None
    #: Set only on the row `Middleware.before_enqueue` is given for a publish to this topic
    #: (one row for every group's task; see txtasks.topics.publish_row); never written.
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class NewPublish:
    """A publish about to be written: one task per group subscribed to `topic` when it runs.

    The headers of a group's delivery are `headers_head + group + headers_tail` (JSON text),
    so that every group's delivery names its group without a statement per group.
    """

    topic: str
    payload: bytes
    content_type: str
    run_at: datetime
    created_at: datetime
    headers_head: str
    headers_tail: str
    #: Each group's delivery gets the dedup key `<group>/<dedup_key>`; None: no dedup.
    dedup_key: str | None = None
    #: The key every delivery shares the limits of, in its group's queue; None: no key.
    partition_key: str | None = None
    #: Overrides each subscription's priority; None: the subscription's.
    priority: int | None = None

    @property
    def due_now(self) -> bool:
        return self.run_at <= self.created_at


@dataclass(frozen=True, slots=True)
class Delivery:
    """One task a publish wrote: its id, and its group's queue."""

    id: int
    queue: str


@dataclass(frozen=True, slots=True)
class Subscription:
    """A group subscribed to a topic: each publish to the topic gives the group one task of
    `task_name` in `queue`."""

    topic: str
    group: str
    task_name: str
    queue: str
    priority: int = 0
    max_attempts: int = 5
    created_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Any) -> Subscription:
        return cls(
            topic=row["topic"],
            group=row["group_name"],
            task_name=row["task_name"],
            queue=row["queue"],
            priority=int(row["priority"]),
            max_attempts=int(row["max_attempts"]),
            created_at=row["created_at"],
        )


@dataclass(frozen=True, slots=True)
class TopicStats:
    """One topic for `txtasks topics`: its groups (with the live tasks of each group's task in
    its queue, by state), and the publishes dropped for want of a subscriber."""

    topic: str
    groups: tuple[tuple[Subscription, dict[str, int]], ...] = ()
    #: Publishes to the topic that found no subscriber, kept for the cleaner's retention.
    dropped: int = 0
    last_dropped_at: datetime | None = None


class TaskRow(NamedTuple):
    """A task as stored: in the hot table (live) or the archive (finished).

    A named tuple, like `TaskKey` and `Outcome`: immutable, and built in a fraction of the time
    a frozen dataclass takes, which the worker pays for every claimed task.
    """

    id: int
    queue: str
    task_name: str
    payload: bytes
    content_type: str
    state: TaskState
    priority: int
    run_at: datetime
    attempt: int
    max_attempts: int
    created_at: datetime
    dedup_key: str | None = None
    headers: str | None = None
    checkpoint: str | None = None
    last_error: str | None = None
    worker_id: str | None = None
    lease_expires_at: datetime | None = None
    started_at: datetime | None = None
    expires_at: datetime | None = None
    finished_at: datetime | None = None
    stage_id: str | None = None
    partition_key: str | None = None
    #: The last progress its handler reported, as JSON text (`progress_report` reads it).
    progress: str | None = None
    #: A finished task that keeps its result: its return value, as JSON text.
    result: str | None = None
    #: When a cancel was asked for while the task was processing (see docs/control.md).
    cancel_requested_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Any) -> TaskRow:
        """Build from a database row mapping (column name -> value)."""
        return cls(
            id=int(row["id"]),
            queue=row["queue"],
            task_name=row["task_name"],
            payload=bytes(row["payload"]),
            content_type=row["content_type"],
            state=TaskState(row["state"]),
            priority=int(row["priority"]),
            run_at=row["run_at"],
            attempt=int(row["attempt"]),
            max_attempts=int(row["max_attempts"]),
            created_at=row["created_at"],
            dedup_key=row.get("dedup_key"),
            headers=row.get("headers"),
            checkpoint=row.get("checkpoint"),
            last_error=row.get("last_error"),
            worker_id=row.get("worker_id"),
            lease_expires_at=row.get("lease_expires_at"),
            started_at=row.get("started_at"),
            expires_at=row.get("expires_at"),
            finished_at=row.get("finished_at"),
            stage_id=row.get("stage_id"),
            partition_key=row.get("partition_key"),
            progress=row.get("progress"),
            result=row.get("result"),
            cancel_requested_at=row.get("cancel_requested_at"),
        )

    @classmethod
    def from_claim(
        cls, values: Sequence[Any], worker_id: str, lease_until: datetime, now: datetime
    ) -> TaskRow:
        """Build a row just claimed by `worker_id` from its values in `CLAIMED_COLUMNS` order:
        the claim's fast path, with no name lookups and without reading back what the claim
        itself wrote (state, worker, lease, start)."""
        (id_, queue, name, payload, content_type, priority, run_at, attempt, max_attempts,
         created_at, dedup_key, headers, checkpoint, last_error, expires_at,
         stage_id, partition_key) = values  # fmt: skip
        return cls(
            id_, queue, name, payload if type(payload) is bytes else bytes(payload),
            content_type, TaskState.PROCESSING, priority, run_at, attempt, max_attempts,
            created_at, dedup_key, headers, checkpoint, last_error, worker_id, lease_until,
            now, expires_at, None, stage_id, partition_key,
        )  # fmt: skip

    @property
    def key(self) -> TaskKey:
        """The fencing key of the attempt this row describes."""
        return TaskKey(self.id, self.attempt)

    @property
    def progress_report(self) -> Progress | None:
        """The last progress its handler reported, or None."""
        return None if self.progress is None else Progress.from_json(self.progress)


def claim_order(row: TaskRow) -> tuple[int, datetime, int]:
    """The order tasks are handed out in: priority (high first), then due time, then id."""
    return (-row.priority, row.run_at, row.id)


@dataclass(frozen=True, slots=True)
class Progress:
    """How far an attempt got, as its handler reported it (`TaskContext.progress`)."""

    done: float
    total: float | None = None
    note: str | None = None
    #: The attempt that reported it.
    attempt: int | None = None

    @property
    def fraction(self) -> float | None:
        """done / total, between 0 and 1; None without a total."""
        if not self.total:
            return None
        return max(0.0, min(1.0, self.done / self.total))

    def to_json(self) -> str:
        return json.dumps(
            {"done": self.done, "total": self.total, "note": self.note, "attempt": self.attempt},
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Progress:
        data = json.loads(text)
        return cls(data.get("done", 0), data.get("total"), data.get("note"), data.get("attempt"))


class TaskKey(NamedTuple):
    """One claimed attempt of one task: every outcome write is fenced on both."""

    id: int
    attempt: int


class OutcomeKind(str, enum.Enum):
    """What a finished attempt asks the database to record."""

    COMPLETE = "completed"
    FAIL = "failed"
    DISCARD = "discarded"
    DEAD = "dead"
    RETRY = "retryable"
    RELEASE = "pending"
    CANCEL = "cancelled"

    @property
    def finishes(self) -> bool:
        """True when the row leaves the hot table for the archive."""
        return self._value_ in _FINISHING_VALUES


FINISHING = frozenset(
    {
        OutcomeKind.COMPLETE,
        OutcomeKind.FAIL,
        OutcomeKind.DISCARD,
        OutcomeKind.DEAD,
        OutcomeKind.CANCEL,
    }
)
_FINISHING_VALUES = frozenset(k.value for k in FINISHING)  # str hashing, not Enum.__hash__


class Outcome(NamedTuple):
    """The result of one attempt, buffered by the worker and flushed in batches."""

    key: TaskKey
    kind: OutcomeKind
    error: str | None = None
    run_at: datetime | None = None
    checkpoint: str | None = None
    #: A completed attempt of a task that keeps its result: the return value as JSON text.
    result: str | None = None


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts of one queue, for `txtasks status`."""

    queue: str
    counts: dict[str, int] = field(default_factory=dict)
    oldest_ready_age: float | None = None
    #: When the queue was paused (its tasks are not claimed), or None.
    paused_at: datetime | None = None
    #: Tasks ready to start now (pending or retryable, and due): the backlog workers face.
    ready: int = 0


@dataclass(frozen=True, slots=True)
class QueueRates:
    """What arrived in one queue and what finished there over a recent window, for
    `txtasks status` and the metrics (autoscaling)."""

    queue: str
    #: The window, in seconds before the time asked about.
    window: float
    #: Tasks enqueued in the window (still live, or already archived).
    enqueued: int = 0
    #: Tasks archived in the window, by final state (completed, dead, ...).
    finished: dict[str, int] = field(default_factory=dict)

    @property
    def enqueued_per_second(self) -> float:
        return self.enqueued / self.window

    @property
    def finished_per_second(self) -> float:
        return sum(self.finished.values()) / self.window


class CancelResult(str, enum.Enum):
    """What a cancel did to one task."""

    #: It was waiting (pending or retryable): archived as cancelled, it never starts.
    CANCELLED = "cancelled"
    #: It is processing: its worker stops it, and its outcome is recorded as cancelled.
    REQUESTED = "requested"
    #: It is processing and a cancel was already asked for.
    ALREADY_REQUESTED = "already requested"
    #: It had already finished (its state says how): nothing changed.
    FINISHED = "finished"
    #: No task has this id (or it is staged: its write has not committed yet).
    NOT_FOUND = "not found"

    def __str__(self) -> str:
        return self.value


class Cancel(NamedTuple):
    """One task a cancel looked at: what it did, and the state the task was found in."""

    id: int
    result: CancelResult
    state: TaskState | None = None
    #: The queue of a task found live (for the wake-up of its worker), else None.
    queue: str | None = None

    def describe(self) -> str:
        """One line for people: `task 7: cancelled (was pending)`."""
        if self.result is CancelResult.NOT_FOUND:
            return f"task {self.id}: not found"
        if self.result is CancelResult.FINISHED:
            return f"task {self.id}: already finished ({self.state}), nothing to cancel"
        if self.result is CancelResult.CANCELLED:
            return f"task {self.id}: cancelled (was {self.state}); it will never start"
        if self.result is CancelResult.REQUESTED:
            return f"task {self.id}: running; cancel requested, its worker stops it"
        return f"task {self.id}: running; cancel was already requested"


@dataclass(frozen=True)
class KeyStats:
    """One of the busiest keys, for `txtasks status` and the metrics."""

    queue: str
    key: str
    #: Tasks ready to start (due), and processing.
    waiting: int
    processing: int
    #: When its rate lets the next task start, if that is later than now.
    rate_limited_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class PeriodicRow:
    """The stored state of one periodic schedule."""

    name: str
    schedule: str
    next_fire_at: datetime
    last_fire_at: datetime | None
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> PeriodicRow:
        return cls(
            name=row["name"],
            schedule=row["schedule"],
            next_fire_at=row["next_fire_at"],
            last_fire_at=row["last_fire_at"],
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class RunningTask:
    """A task a worker is running, as the dashboard's busy view shows it."""

    id: int
    queue: str
    task_name: str
    attempt: int
    max_attempts: int
    worker_id: str | None
    started_at: datetime | None
    lease_expires_at: datetime | None
    partition_key: str | None = None
    cancel_requested_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Any) -> RunningTask:
        return cls(**{name: row[name] for name in cls.__slots__})


@dataclass(frozen=True, slots=True)
class ProcessRow:
    """A worker or cleaner as its heartbeat row shows it."""

    id: str
    #: "worker" or "cleaner".
    kind: str
    host: str
    pid: int
    #: What it runs: its queues (a worker) or its sweeps (a cleaner), comma-separated.
    runs: str
    #: Tasks it is running (a worker), else None.
    running: int | None
    started_at: datetime
    beat_at: datetime
    #: When the row counts as gone unless it beats again.
    expires_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> ProcessRow:
        return cls(**{name: row[name] for name in cls.__slots__})

    def alive(self, now: datetime) -> bool:
        return self.expires_at > now
