"""The publish of deferred writes: committed staged rows moved into the hot table in batches.

A write committed in deferred mode (`SqlStaging.commit_deferred`) left one row per attempt in
`txtasks_deferred`. A publish batch is one transaction: it locks one such row (`FOR UPDATE SKIP
LOCKED`: concurrent publishers take different attempts; SQLite has one writer at a time), takes
the attempt's first `limit` staged rows (a range of its row numbers, along the primary key),
publishes them as the atomic commit would (`SqlStaging.publish_rows`: task name and queue, or a
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

from sqlalchemy import Connection, and_, delete, func, select

from txtasks.schema.tables import deferred, staged
from txtasks.schema.tables import stages as attempts
from txtasks.spark.staging import Published, target_from_json

if TYPE_CHECKING:
    from txtasks.driver import Driver
    from txtasks.spark.staging import SqlStaging

#: Staged rows a publish batch takes at most (one transaction).
BATCH_ROWS = 10_000


def publish_batch(
    staging: SqlStaging, conn: Connection, limit: int, now: datetime
) -> Published | None:
    """Publish up to `limit` staged rows of one deferred attempt in `conn`'s transaction; None
    when no attempt waits that another publisher has not locked."""
    pick = (
        select(deferred.c.stage, deferred.c.target)
        .order_by(deferred.c.stage)  # the primary key: the lock stops at the row it returns
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    found = conn.execute(pick).first()
    if found is None:
        return None
    stage = staged.c.stage == found.stage
    first = select(staged.c.n).where(stage).order_by(staged.c.n).limit(limit).subquery()
    top, rows = conn.execute(select(func.max(first.c.n), func.count())).one()
    tasks: dict[str, int] = {}
    if rows:
        batch = and_(stage, staged.c.n <= top)
        tasks = staging.publish_rows(conn, batch, target_from_json(found.target), now)
        conn.execute(delete(staged).where(batch))
    if rows < limit:  # the attempt's last batch
        conn.execute(delete(deferred).where(deferred.c.stage == found.stage))
        conn.execute(delete(attempts).where(attempts.c.id == found.stage))
    return Published(rows=int(rows), tasks=tasks)


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
    from txtasks.spark.staging import BY_BACKEND, staging_for

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
