"""The publish of deferred writes: committed staged rows moved into the hot table in batches.

A write committed in deferred mode (`SqlStaging.commit_deferred`) left one row per attempt in
`txtasks_deferred`. A publish batch is one transaction: it locks one such row (`FOR UPDATE SKIP
LOCKED`: concurrent publishers take different attempts, except that an attempt with task keys
waits while an earlier one with task keys is being published, so that a key's tasks become live
write after write; SQLite has one writer at a time), takes
the attempt's first `limit` staged rows (a range of its row numbers, along the primary key),
publishes them as the atomic commit would (`SqlStaging.publish_rows`, in `publish_batch`: task name and queue, or a
topic's groups subscribed now; key hints; dedup evaluated now, so a live task with the same
dedup key, one published earlier from the same write included, wins), deletes them, and deletes
the attempt's rows (in `txtasks_deferred` and `txtasks_stages`) with its last batch. A publisher
killed at any point rolls its batch back; the next one takes it again: every committed row is
published exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from txtasks.spark.staging import BY_BACKEND, staging_for

if TYPE_CHECKING:
    from txtasks.driver import Driver

#: Staged rows a publish batch takes at most (one transaction).
BATCH_ROWS = 10_000


@dataclass(frozen=True)
class PublishTotals:
    """What a run of publish batches did."""

    #: Staged rows taken (published, or skipped by dedup, or dropped for want of a subscriber).
    rows: int = 0
    #: Tasks made claimable.
    tasks: int = 0
    #: Batches committed.
    batches: int = 0


async def publish_pending(
    driver: Driver,
    *,
    clock: Callable[[], datetime],
    wake: Callable[[str], None],
    limit: int = BATCH_ROWS,
    max_batches: int = 1000,
) -> PublishTotals:
    """Publish batches of deferred writes until none waits (or `max_batches` ran), calling
    `wake(queue)` after each batch for every queue it gave tasks to. Costs one indexed probe
    when nothing waits."""
    if driver.capabilities.name not in BY_BACKEND:  # a backend that stages no writes
        return PublishTotals()
    staging = staging_for(driver)
    rows = tasks = batches = 0
    for _ in range(max_batches):
        done = await staging.publish(limit=limit, now=clock())
        if done is None:
            break
        rows, tasks, batches = rows + done.rows, tasks + sum(done.tasks.values()), batches + 1
        for queue in done.tasks:
            wake(queue)
    return PublishTotals(rows=rows, tasks=tasks, batches=batches)
