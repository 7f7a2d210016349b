"""Staged writes: rows kept apart from the hot table, then copied into it by one commit.

A staging writer (one Spark partition attempt) inserts its rows into `txtasks_staged` under
the write's key and a `stage_id` of its own, in one transaction. Only the columns that vary
per row are staged (payload, priority, run_at, dedup key, task key); the commit supplies the
rest. The commit, one transaction, records its `commit_id` in `txtasks_commits` (a second commit
of the same id changes nothing and discards what it was given), checks that every reported
attempt's rows are all there, deletes the rows of attempts it was not given, leaves one key hint
per task key among the rows it publishes (as every enqueue does: see `txtasks.keys`), copies
those rows into the hot table as `pending` with one INSERT ... SELECT (dropping rows that repeat
a dedup key within the write, and skipping those whose key a live task holds: the insert itself
skips a key the unique index holds, so a task enqueued with that key by a transaction
committing meanwhile wins and the commit goes on), and deletes the write's staged rows. Abort
deletes them.

A write is open from before its first attempt stages until its commit or abort: it has a row in
`txtasks_writes`. Staging ends by reading that row under a shared lock, and rolls back if it is
gone; the commit and the abort first delete it, in a transaction of their own, which waits for
the stagers that hold the lock. So an attempt still running when its write ended (the loser of a
speculative race, an attempt Spark stopped waiting for) stages nothing, and no staged row
outlives its write.

Staged rows arrive as Arrow tables (`STAGED_COLUMNS`, then `STAGED_KEY` for a keyed write):
dialects send them in bulk (COPY, multi-row INSERT, naming the batch's columns; see the modules
beside this one). `staging_for` picks a backend's staging by
its name, and the staging works through the driver's public engine and transactions. These
methods are synchronous, except the cleaner's purge: Spark's Python workers are synchronous.
This package imports neither PySpark nor (until rows are sent in bulk) PyArrow.
"""

from __future__ import annotations

import importlib
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, overload

from sqlalchemy import (
    Connection,
    delete,
    exists,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.errors import ConfigurationError, TxtasksError
from txtasks.schema.tables import commits, key_hints, staged, tasks, writes
from txtasks.spark.staging.fanout import (
    COLUMNS,
    TopicTarget,
    by_queue,
    fanout_rows,
    groups_lock,
    publish_order,
    stmt_drops,
    stmt_fanout_hints,
    write_rows,
)
from txtasks.types import JSON_CONTENT_TYPE, TaskState

if TYPE_CHECKING:
    from txtasks.driver import Driver, SqlDriver

__all__ = [
    "STAGED_COLUMNS",
    "STAGED_KEY",
    "SqlStaging",
    "StageTarget",
    "StagedRowsMissing",
    "Staging",
    "TopicTarget",
    "WriteClosed",
    "purge_abandoned",
    "staging_for",
]

log = logging.getLogger("txtasks.spark")
STAGED = TaskState.STAGED.value
#: Stage ids per statement when deleting the rows of attempts a commit was not given.
CHUNK = 1000

#: The columns every staged batch (an Arrow table) has, in order.
STAGED_COLUMNS = (
    "write_key",
    "stage_id",
    "payload",
    "priority",
    "run_at",
    "dedup_key",
    "created_at",
)
#: The column a staged batch of a keyed write (option `key`) has besides `STAGED_COLUMNS`:
#: each task's key, or None. A batch without it stages tasks without a key.
STAGED_KEY = "partition_key"

#: Each backend's staging (by `Driver.capabilities.name`), as (module, class name).
BY_BACKEND: dict[str, tuple[str, str]] = {
    "postgresql": ("txtasks.spark.staging.postgresql", "PostgresStaging"),
    "mysql": ("txtasks.spark.staging.mysql", "MySQLStaging"),
    "sqlite": ("txtasks.spark.staging", "SqlStaging"),
    "memory": ("txtasks.spark.staging.memory", "MemoryStaging"),
}


class StagedRowsMissing(TxtasksError):
    """A commit found fewer staged rows than an attempt reported (they were purged as
    abandoned, or the database lost them): nothing is published."""


class WriteClosed(TxtasksError):
    """A staging attempt found its write committed or aborted already: it staged nothing."""


@dataclass(frozen=True)
class StageTarget:
    """What the commit adds to every staged row of a write."""

    queue: str
    task_name: str
    max_attempts: int
    #: Whether rows may carry dedup keys (the commit then applies them).
    dedup: bool = False
    #: Whether rows may carry task keys (the commit then leaves a hint per key).
    keyed: bool = False


class Staging(Protocol):
    """What the cleaner's archiver needs of every backend's staging."""

    async def purge(self, *, before: datetime, limit: int) -> int:
        """Delete up to `limit` staged rows created before `before` (writes that never
        committed or aborted)."""


@overload
def staging_for(driver: SqlDriver) -> SqlStaging: ...


@overload
def staging_for(driver: Driver) -> Staging: ...


def staging_for(driver: Any) -> Any:
    """The staging of a driver's backend."""
    name = driver.capabilities.name
    if name not in BY_BACKEND:
        raise ConfigurationError(
            f"staging: backend {name!r} cannot stage writes; "
            "it needs postgresql, mysql/mariadb or sqlite"
        )
    module, cls = BY_BACKEND[name]
    return getattr(importlib.import_module(module), cls)(driver)


async def purge_abandoned(driver: Driver, *, before: datetime, limit: int) -> int:
    """Delete up to `limit` staged rows created before `before`: those of writes whose Spark
    driver died before committing or aborting (the cleaner's archiver)."""
    return await staging_for(driver).purge(before=before, limit=limit)


class SqlStaging:
    """Staging on a SQL driver; dialects override `insert_batch` with their bulk path."""

    def __init__(self, driver: SqlDriver) -> None:
        self.driver = driver

    def open(self, write_key: str, now: datetime) -> None:
        """Open a write for staging (opening an open write changes nothing)."""
        try:
            with self.driver.sync_engine.begin() as conn:
                conn.execute(insert(writes).values(write_key=write_key, opened_at=now))
        except IntegrityError:
            pass  # open already: a re-run with the same commit id, a restarted stream

    def stage(self, write_key: str, batches: Iterable[Any]) -> int:
        """Insert staged rows (Arrow tables of `STAGED_COLUMNS`, and maybe `STAGED_KEY`) in one
        transaction, which
        commits only if the write is still open (else raises `WriteClosed`)."""
        count = 0
        with self.driver.sync_engine.begin() as conn:
            for batch in batches:
                if batch.num_rows:
                    self.insert_batch(conn, batch)
                    count += batch.num_rows
            still_open = (
                select(writes.c.write_key)
                .where(writes.c.write_key == write_key)
                .with_for_update(read=True)
            )
            if conn.execute(still_open).first() is None:
                raise WriteClosed(
                    f"staged write {write_key} was committed or aborted already: this attempt's "
                    f"{count} rows were not staged"
                )
        return count

    def insert_batch(self, conn: Connection, batch: Any) -> None:
        """Insert one Arrow table of staged rows; dialects override with their bulk path."""
        conn.execute(insert(staged), batch.to_pylist())

    def close(self, write_key: str) -> None:
        """Close a write: once this returns, no attempt stages under it any more."""
        with self.driver.sync_engine.begin() as conn:
            conn.execute(delete(writes).where(writes.c.write_key == write_key))

    def abort(self, write_key: str) -> int:
        """Close a write and delete every row it staged."""
        self.close(write_key)
        with self.driver.sync_engine.begin() as conn:
            return _delete_staged(conn, write_key)

    def commit(
        self,
        commit_id: str,
        write_key: str,
        stages: Mapping[str, int],
        target: StageTarget | TopicTarget,
        *,
        now: datetime,
    ) -> dict[str, int] | None:
        """Make the rows of the attempts in `stages` (stage id -> rows it staged) claimable,
        once per `commit_id`, and delete the write's other staged rows.

        A `TopicTarget` fans each row out to the groups subscribed to its topic at the
        commit (see `txtasks.spark.staging.fanout`). Returns how many tasks became claimable
        per queue, or None when `commit_id` was
        committed before (then every staged row of the write is deleted: it repeats that
        commit). Raises `StagedRowsMissing`, publishing nothing, if an attempt's rows are
        not all there. The write is closed first (a stream opens it again for its next
        micro-batch).
        """
        self.close(write_key)
        try:
            with self.driver.sync_engine.begin() as conn:
                conn.execute(insert(commits).values(commit_id=commit_id, committed_at=now, tasks=0))
                _check_and_drop_losers(conn, write_key, stages)
                if isinstance(target, TopicTarget):
                    published = self._publish_topic(conn, write_key, target, now)
                else:
                    published = self._publish_task(conn, write_key, target)
                count = sum(published.values())
                _delete_staged(conn, write_key)
                conn.execute(
                    update(commits).where(commits.c.commit_id == commit_id).values(tasks=count)
                )
                return published
        except IntegrityError:
            if not self.commit_seen(commit_id):
                raise  # not a repeated commit: a real conflict
            with self.driver.sync_engine.begin() as conn:
                _delete_staged(conn, write_key)
            return None

    def insert_tasks(self, conn: Connection, columns: Sequence[str], rows: Any, dedup: bool) -> int:
        """INSERT ... SELECT `rows` (of `columns`) into the hot table; with `dedup`, skipping
        rows whose dedup key a live task holds, committed before or by a transaction that this
        one waits for (no error). How many rows it inserted."""
        if dedup:
            stmt = self.driver.sql.upsert(tasks).from_select(columns, rows)
            stmt = stmt.on_conflict_do_nothing(
                index_elements=[tasks.c.dedup_key], index_where=tasks.c.dedup_key.is_not(None)
            )
        else:
            stmt = insert(tasks).from_select(columns, rows)
        # INSERT rowcount: not kept by default
        return int(conn.execute(stmt.execution_options(preserve_rowcount=True)).rowcount)

    def _publish_task(
        self, conn: Connection, write_key: str, target: StageTarget
    ) -> dict[str, int]:
        """Publish a write's staged rows as tasks of one task name and queue: how many, by
        queue."""
        if target.keyed:  # before the publish: its dedup check then sees the same tasks
            conn.execute(_stmt_hints(write_key, target))
        rows = _task_rows(write_key, target)
        count = self.insert_tasks(conn, TASK_COLUMNS, rows, target.dedup)
        return {target.queue: count} if count else {}

    def _publish_topic(
        self, conn: Connection, write_key: str, target: TopicTarget, now: datetime
    ) -> dict[str, int]:
        """Fan a write's staged rows out to the groups subscribed to its topic: how many tasks
        per queue (one statement per queue); with no group, record the rows as dropped."""
        groups = groups_lock(conn, target.topic)
        if not groups:
            dropped = int(conn.execute(stmt_drops(write_key, target.topic, now)).rowcount)
            if dropped:
                log.warning(
                    "topic %s has no subscriber: the %d rows of this write are dropped and "
                    "counted (txtasks topics)",
                    target.topic,
                    dropped,
                )
            return {}
        if target.keyed:  # before the publish: its dedup check then sees the same tasks
            conn.execute(stmt_fanout_hints(write_key, target, groups))
        message = uuid.uuid4().hex[:24]  # the publish id of every task of this commit
        published = {}
        for queue, members in by_queue(groups).items():
            rows = fanout_rows(write_key, target, members, message)
            count = self.insert_tasks(conn, COLUMNS, rows, target.dedup)
            if count:
                published[queue] = count
        return published

    def commit_seen(self, commit_id: str) -> bool:
        """Whether `commit_id` was committed already."""
        with self.driver.sync_engine.connect() as conn:
            found = conn.execute(
                select(commits.c.commit_id).where(commits.c.commit_id == commit_id)
            )
            return found.first() is not None

    async def purge(self, *, before: datetime, limit: int) -> int:
        """Delete up to `limit` staged rows created before `before` (writes that never
        committed): those of the staged table, and `staged` rows left in the hot table by
        txtasks versions before the staged table."""

        async def work(conn: AsyncConnection) -> int:
            done = await _purge(conn, tasks, before, limit, tasks.c.state == STAGED)
            if done < limit:
                done += await _purge(conn, staged, before, limit - done)
            return done

        return await self.driver.in_transaction(work)


async def _purge(
    conn: AsyncConnection, table: Any, before: datetime, limit: int, *where: Any
) -> int:
    pick = (
        select(table.c.id)
        .where(table.c.created_at < before, *where)
        .order_by(table.c.id)
        .limit(limit)
    )
    ids = list((await conn.execute(pick)).scalars())
    if not ids:
        return 0
    return int((await conn.execute(delete(table).where(table.c.id.in_(ids), *where))).rowcount)


def _delete_staged(conn: Connection, write_key: str, stage_ids: Sequence[str] | None = None) -> int:
    """Delete the staged rows of a write (only those of `stage_ids`, if given)."""
    query = delete(staged).where(staged.c.write_key == write_key)
    if stage_ids is None:
        return int(conn.execute(query).rowcount)
    done = 0
    for start in range(0, len(stage_ids), CHUNK):
        chunk = list(stage_ids[start : start + CHUNK])
        done += int(conn.execute(query.where(staged.c.stage_id.in_(chunk))).rowcount)
    return done


def _check_and_drop_losers(conn: Connection, write_key: str, stages: Mapping[str, int]) -> None:
    """Check every reported attempt's rows are all staged; delete the other attempts' rows."""
    per_stage = (
        select(staged.c.stage_id, func.count())
        .where(staged.c.write_key == write_key)
        .group_by(staged.c.stage_id)
    )
    found = {stage_id: int(n) for stage_id, n in conn.execute(per_stage).all()}
    for stage_id, rows in stages.items():
        if found.get(stage_id, 0) != rows:
            raise StagedRowsMissing(
                f"txtasks commit: attempt {stage_id} staged {rows} rows but "
                f"{found.get(stage_id, 0)} are left (purged as abandoned by the cleaner's "
                "archiver.staged_after, or lost by the database); nothing was published"
            )
    _delete_staged(conn, write_key, [s for s in found if s not in stages])


def _stmt_hints(write_key: str, target: StageTarget) -> Any:
    """INSERT ... SELECT of one key hint per task key among the rows the commit publishes (less
    those whose dedup key a live task holds), due at the key's earliest run_at (run it before
    the publish, which makes its rows live)."""
    rows = write_rows(write_key, target.dedup)
    where: list[Any] = [rows.c.partition_key.is_not(None)]
    if target.dedup:
        where.append(~exists().where(tasks.c.dedup_key == rows.c.dedup_key))
    query = (
        select(
            literal(target.queue, key_hints.c.queue.type),
            rows.c.partition_key,
            func.min(rows.c.run_at),
        )
        .where(*where)
        .group_by(rows.c.partition_key)
    )
    return insert(key_hints).from_select(["queue", "partition_key", "run_at"], query)


#: The columns a task commit writes, in the order its SELECT gives them.
TASK_COLUMNS = (
    "queue", "task_name", "payload", "content_type", "state", "priority", "run_at", "attempt",
    "max_attempts", "created_at", "dedup_key", "partition_key",
)  # fmt: skip


def _task_rows(write_key: str, target: StageTarget) -> Any:
    """The SELECT of a write's rows as pending tasks (`TASK_COLUMNS`), in staging order; with
    dedup keys, a repeated key of the write only once, in key order (as an enqueue inserts keys:
    see `publish_order`)."""
    rows = write_rows(write_key, target.dedup)
    query = select(
        literal(target.queue, tasks.c.queue.type),
        literal(target.task_name, tasks.c.task_name.type),
        rows.c.payload,
        literal(JSON_CONTENT_TYPE, tasks.c.content_type.type),
        literal(TaskState.PENDING.value, tasks.c.state.type),
        rows.c.priority,
        rows.c.run_at,
        literal(0, tasks.c.attempt.type),
        literal(target.max_attempts, tasks.c.max_attempts.type),
        rows.c.created_at,
        rows.c.dedup_key,
        rows.c.partition_key,
    )
    return query.order_by(*publish_order(rows, target.dedup, rows.c.dedup_key))
