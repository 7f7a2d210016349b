"""The in-memory driver's store: every table as a dict, guarded by one lock, shared by the
driver's role objects (`MemoryTasks`, `MemoryClaims`, ...)."""

from __future__ import annotations

import itertools
import threading
from datetime import datetime

from txtasks.control import TaskFilter
from txtasks.driver.history import HistoryRow
from txtasks.keys import KeyOverride, Rate
from txtasks.types import NewTask, PeriodicRow, ProcessRow, Subscription, TaskRow


def matches(row: TaskRow, where: TaskFilter) -> bool:
    """Whether a task is one `where` picks (its queue, task name and key)."""
    return (
        (where.queue is None or row.queue == where.queue)
        and (where.task_name is None or row.task_name == where.task_name)
        and (where.key is None or row.partition_key == where.key)
    )


class MemoryStore:
    """What the SQL drivers keep in tables: tasks live and archived, periodic schedules,
    subscriptions and drops, paused queues, heartbeats, the keys' state, the limits set at
    run time and the queues' history. A role reads and writes it holding `lock`."""

    def __init__(self) -> None:
        self.live: dict[int, TaskRow] = {}
        self.archived: dict[int, TaskRow] = {}
        self.periodic: dict[str, PeriodicRow] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        #: Which lane a claim takes first (they alternate: see `MemoryClaims`).
        self.keys_first = False
        #: Per key: when it was last served (for the turns), its rate's next start, and the
        #: limits set at run time.
        self.turns = itertools.count(1)
        self.key_turns: dict[tuple[str, str], int] = {}
        self.keys_wake: dict[str, datetime] = {}
        self.key_next_start: dict[tuple[str, str], datetime] = {}
        #: Per key: when a claim last served it (`keys_forget_many`).
        self.key_touched: dict[tuple[str, str], datetime] = {}
        self.key_overrides: dict[tuple[str | None, str], KeyOverride] = {}
        self.queue_rates: dict[str, Rate] = {}
        #: Subscriptions by (topic, group), and the times of publishes that found none.
        self.subscriptions: dict[tuple[str, str], Subscription] = {}
        self.topic_drops: list[tuple[str, datetime]] = []
        #: Paused queues, with when each was paused.
        self.paused: dict[str, datetime] = {}
        #: Heartbeat rows of workers and cleaners, by id.
        self.beats: dict[str, ProcessRow] = {}
        #: The queues' history: its rows by (minute, queue).
        self.history: dict[tuple[int, str], HistoryRow] = {}

    def insert(self, row: NewTask) -> int:
        """Insert a task (the lock held); a dedup hit returns the live task's id."""
        if row.dedup_key is not None:
            for existing in self.live.values():
                if existing.dedup_key == row.dedup_key:
                    return existing.id
        task_id = next(self.ids)
        self.live[task_id] = TaskRow(
            id=task_id,
            queue=row.queue,
            task_name=row.task_name,
            payload=row.payload,
            content_type=row.content_type,
            state=row.state,
            priority=row.priority,
            run_at=row.run_at,
            attempt=0,
            max_attempts=row.max_attempts,
            created_at=row.created_at,
            dedup_key=row.dedup_key,
            headers=row.headers,
            expires_at=row.expires_at,
            stage_id=row.stage_id,
            partition_key=row.partition_key,
        )
        return task_id
