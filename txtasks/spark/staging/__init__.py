"""Staged writes: rows kept apart from the hot table, then copied into it by one commit.

A staging writer (one Spark partition attempt) first records itself in `txtasks_stages` (the
write's key and a `stage_id` of its own, once), which gives it a number, then inserts its rows into
`txtasks_staged` under that number and their own (0, 1, ...: the table's primary key and its one
index), one transaction per batch (none stays open while Spark computes the next). Only the columns
that vary per row are staged (payload and priority; run_at, dedup key and task key when the write
sets them); the commit supplies the rest, and its own time as each task's creation (and due time,
when the row has none). The commit, one transaction, records its `commit_id` in `txtasks_commits`
(a second commit of the same id changes nothing and discards what it was given), checks that every
reported attempt's rows are all there, deletes the rows of the write's attempts it was not given,
leaves one key hint per task key among the rows it publishes (as every enqueue does: see
`txtasks.keys`), copies those rows into the hot table as `pending` with one INSERT ... SELECT
(dropping rows that repeat a dedup key within the write, and skipping those whose key a live task
holds: the insert itself skips a key the unique index holds, so a task enqueued with that key by a
transaction committing meanwhile wins and the commit goes on), and ends the write's attempts. Abort
ends them too.

The commit's work besides its INSERT ... SELECT is per attempt, not per row. Its row check:
each attempt's last row number (one index probe) must be one less than the rows Spark
reported, so the attempt holds at most those rows, and the INSERT must then read exactly as
many rows as were reported (its own row count, per queue for a topic), else the commit raises
`StagedRowsMissing` and rolls back; a dedup write, whose INSERT leaves rows out on purpose,
counts each attempt's rows first instead. Ending an attempt moves it to the write key `DROPPED`
(one UPDATE of the write's attempts): no write reads its rows any more, and the cleaner's purge
deletes them and then the attempt, in batches, off the commit's path (`SqlStaging.purge`).
Attempt numbers are never reused, so those rows never join another attempt.

A deferred commit (`commit_deferred`) counts each reported attempt's rows, ends the others,
then records each committed attempt with rows in `txtasks_deferred` (its number, the commit,
the publish target) instead of copying its rows: publishers copy them later, in batches
(`txtasks.spark.staging.publisher`), and delete the attempt with its last batch. Until then
those rows belong to their commit: the commits and aborts of the same write key (a stream's
later micro-batches) leave its attempts alone, and so does the purge of abandoned rows.

A write is open from before its first attempt stages until its commit or abort: it has a row in
`txtasks_writes`. Each batch's transaction ends by reading that row under a shared lock, and
rolls back if it is gone; the commit and the abort first delete it, in a transaction of their
own, which waits for the stagers that hold the lock. So an attempt still running when its write
ended (the loser of a speculative race, an attempt Spark stopped waiting for) stages nothing
more, what it staged before is ended by that commit or abort (it is not an attempt the commit
was given), and no staged row is read once its write ended.

Staged rows arrive as Arrow tables (`STAGED_COLUMNS`: the required ones, then those of
`STAGED_OPTIONAL` the write sets); `stage` puts the attempt's number and each row's in front
(`stage`, `n`), and dialects send them in bulk (COPY, multi-row INSERT or LOAD DATA, naming the
batch's columns; see the modules beside this one). `staging_for` picks a backend's staging by its
name, and the staging works through the driver's public engine and transactions. These methods are
synchronous, except the cleaner's purge: Spark's Python workers are synchronous. This package
imports neither PySpark nor (until rows are sent in bulk) PyArrow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, overload

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from txtasks.clock import utcnow
from txtasks.driver.statements.key_hints import hints_insert, hints_query
from txtasks.errors import ConfigurationError, TxtasksError
from txtasks.schema.tables import commits, deferred, key_hints, staged, tasks, writes
from txtasks.schema.tables import stages as attempts
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
    "DROPPED",
    "LOCK_WAIT_TIMEOUT",
    "STAGED_COLUMNS",
    "STAGED_OPTIONAL",
    "Backlog",
    "LockWaitTimeout",
    "Published",
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
#: The write key of attempts whose write ended (committed or aborted, or not the attempt a
#: commit was given): no write reads their rows; the purge deletes them (`SqlStaging.purge`).
DROPPED = ""

#: The columns every staged batch (an Arrow table) has, in order (`stage` puts the attempt's
#: number and each row's, `stage` and `n`, in front of them).
STAGED_COLUMNS = ("payload", "priority")
#: The columns a staged batch has after those when its write sets them, in this order: each
#: task's due time (option `run_at`), dedup key (option `dedup`) and key (option `key`), each
#: maybe None. A batch without one stages NULL: due when published, no dedup key, no key.
STAGED_OPTIONAL = ("run_at", "dedup_key", "partition_key")

#: Seconds a commit waits, at most, for a lock another transaction holds (an application's
#: transaction that enqueued one of the write's dedup keys and has not committed yet), unless
#: the write sets its own bound (option `lock_wait_timeout`) or the database's is longer.
LOCK_WAIT_TIMEOUT = 600
#: Dedup keys tried at once when a commit that gave up waiting looks for the key it waited for.
PROBE_KEYS = 1000

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


class LockWaitTimeout(TxtasksError):
    """A commit waited for a lock another transaction holds (one of the write's dedup keys, that
    an application enqueued and has not committed yet) longer than its bound: nothing was
    published."""


class _LockWait(TxtasksError):
    """A statement's lock wait reached the transaction's bound (`seconds`)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"lock wait over {seconds:g} s")
        self.seconds = seconds


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


@dataclass(frozen=True)
class Published:
    """What one publish batch of a deferred write did."""

    #: Staged rows it took (each published as tasks, or skipped by dedup, or dropped).
    rows: int
    #: Tasks it made claimable, per queue.
    tasks: Mapping[str, int]


@dataclass(frozen=True)
class Backlog:
    """The rows of deferred writes committed and not published yet."""

    #: Staged rows waiting for a publisher.
    rows: int = 0
    #: Commits with rows waiting.
    commits: int = 0
    #: When the oldest of those commits was made; None when none waits.
    oldest_committed_at: datetime | None = None


class Staging(Protocol):
    """What workers and the cleaner need of every backend's staging."""

    async def purge(self, *, before: datetime, limit: int) -> int:
        """Delete up to `limit` staged rows created before `before` (writes that never
        committed or aborted)."""

    async def publish(self, *, limit: int, now: datetime) -> Published | None:
        """Publish up to `limit` staged rows of one attempt of a deferred write (in one
        transaction): None when no deferred write waits (one indexed probe)."""

    async def backlog(self) -> Backlog:
        """The rows of deferred writes waiting for a publisher."""


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
            with self.driver.db.sync_engine.begin() as conn:
                conn.execute(insert(writes).values(write_key=write_key, opened_at=now))
        except IntegrityError:
            pass  # open already: a re-run with the same commit id, a restarted stream

    def stage(
        self,
        write_key: str,
        stage_id: str,
        batches: Iterable[Any],
        *,
        now: datetime | None = None,
    ) -> int:
        """Stage one attempt's rows (Arrow tables of `STAGED_COLUMNS` and of `STAGED_OPTIONAL`
        those the write sets) under `stage_id`, at `now` (the attempt's start): record the
        attempt (which draws its number) while the write is open, then insert each batch, numbering its rows, in a transaction of its own that commits
        only if the write is still open (else raises `WriteClosed`). No transaction stays open
        while the next batch is computed, so a slow partition holds no lock (on SQLite: the
        database's one write lock) between its batches. The batches an attempt staged before a
        failure stay under its number until its write's commit (which publishes only the
        attempts Spark reports) or abort ends them. Returns how many rows were staged."""
        number = self.record_attempt(write_key, stage_id, now or utcnow())
        count = 0
        for batch in batches:
            if batch.num_rows:
                with self.driver.db.sync_engine.begin() as conn:
                    self.insert_batch(conn, numbered(batch, number, count))
                    self.check_open(
                        conn,
                        write_key,
                        f"this batch's {batch.num_rows} rows were not staged (nor will the "
                        f"{count} rows this attempt staged before it be published: the "
                        "write's commit or abort deletes them)",
                    )
                count += batch.num_rows
        return count

    def record_attempt(self, write_key: str, stage_id: str, now: datetime) -> int:
        """Record an attempt of an open write (else raise `WriteClosed`): its number."""
        if write_key == DROPPED:
            raise ConfigurationError("staging: a write key must not be empty")
        with self.driver.db.sync_engine.begin() as conn:
            values = {"write_key": write_key, "stage_id": stage_id, "created_at": now}
            drawn = conn.execute(insert(attempts).values(values)).inserted_primary_key
            assert drawn is not None  # an INSERT of one row
            self.check_open(conn, write_key, f"attempt {stage_id} staged no row")
            return int(drawn[0])

    def check_open(self, conn: Connection, write_key: str, refused: str) -> None:
        """Raise `WriteClosed` (rolling back the transaction: `refused` says what it did)
        unless the write is open; read under a shared lock, so closing the write waits for
        this transaction."""
        still_open = (
            select(writes.c.write_key)
            .where(writes.c.write_key == write_key)
            .with_for_update(read=True)
        )
        if conn.execute(still_open).first() is None:
            raise WriteClosed(
                f"staged write {write_key} was committed or aborted already: {refused}"
            )

    def insert_batch(self, conn: Connection, batch: Any) -> None:
        """Insert one Arrow table of staged rows (numbered: `numbered`); dialects override with
        their bulk path."""
        conn.execute(insert(staged), batch.to_pylist())

    def prepare_publish(self, conn: Connection) -> None:
        """Set up the transaction of a commit that copies a whole write's rows (dialects
        override it; here nothing)."""

    def close(self, write_key: str) -> None:
        """Close a write: once this returns, no attempt stages under it any more."""
        with self.driver.db.sync_engine.begin() as conn:
            conn.execute(delete(writes).where(writes.c.write_key == write_key))

    def abort(self, write_key: str) -> int:
        """Close a write and end its attempts (the purge deletes their rows): how many."""
        self.close(write_key)
        with self.driver.db.sync_engine.begin() as conn:
            return _end(conn, write_key)

    def commit(
        self,
        commit_id: str,
        write_key: str,
        stages: Mapping[str, int],
        target: StageTarget | TopicTarget,
        *,
        now: datetime,
        lock_wait: float | None = None,
    ) -> dict[str, int] | None:
        """Make the rows of the attempts in `stages` (stage id -> rows it staged) claimable,
        once per `commit_id`, and delete the write's other staged rows.

        A `TopicTarget` fans each row out to the groups subscribed to its topic at the
        commit (see `txtasks.spark.staging.fanout`). Returns how many tasks became claimable
        per queue, or None when `commit_id` was committed before (then the write's attempts
        are ended: it repeats that commit). Raises `StagedRowsMissing`, publishing nothing,
        if an attempt's rows are not all there: checked per attempt (a probe of its last row
        number), then by the publish's own row count (see the module's docstring). The write
        is closed first (a stream opens it again for its next micro-batch).
        """
        self.close(write_key)
        counted = target.dedup  # a dedup publish leaves rows out: count them instead
        try:
            with self.bounded(lock_wait) as conn:
                self.prepare_publish(conn)
                conn.execute(insert(commits).values(commit_id=commit_id, committed_at=now, tasks=0))
                numbers = _check(conn, write_key, stages, counted=counted)
                rows = None if counted else sum(numbers.values())
                published = self.publish_rows(conn, _of_attempts(numbers), target, now, rows=rows)
                _end(conn, write_key)
                conn.execute(
                    update(commits)
                    .where(commits.c.commit_id == commit_id)
                    .values(tasks=sum(published.values()))
                )
                return published
        except IntegrityError as exc:
            self._repeated(commit_id, write_key, exc)
            return None
        except _LockWait as waited:
            key = self._blocking_key(write_key, stages, target, now) if target.dedup else None
            raise _lock_wait_error(waited.seconds, key) from None
        except _Short:  # rolled back: say which attempt lost rows
            with self.driver.db.sync_engine.connect() as conn:
                _check(conn, write_key, stages, counted=True)
            raise StagedRowsMissing(
                f"txtasks commit: the staged rows changed while write {write_key} committed "
                "(purged as abandoned by the cleaner's archiver.staged_after?); nothing was "
                "published"
            ) from None

    def commit_deferred(
        self,
        commit_id: str,
        write_key: str,
        stages: Mapping[str, int],
        target: StageTarget | TopicTarget,
        *,
        now: datetime,
        lock_wait: float | None = None,
    ) -> int | None:
        """Commit the attempts in `stages` (stage id -> rows it staged) in deferred mode, once
        per `commit_id`: count their rows (else raise `StagedRowsMissing`), record each
        attempt with rows in `txtasks_deferred`, for publishers (`publish`) to move its rows
        into the hot table later, and end the write's other attempts; no staged row is
        written. Returns how many staged rows were committed, or None when `commit_id` was
        committed before. Its lock waits are bounded as the atomic commit's (`lock_wait`)."""
        self.close(write_key)
        rows = sum(stages.values())
        try:
            with self.bounded(lock_wait) as conn:
                conn.execute(
                    insert(commits).values(commit_id=commit_id, committed_at=now, tasks=rows)
                )
                numbers = _check(conn, write_key, stages, counted=True)
                waiting = [
                    {
                        "stage": number,
                        "commit_id": commit_id,
                        "target": target_json(target),
                        "committed_at": now,
                    }
                    for number, count in numbers.items()
                    if count
                ]
                if waiting:
                    conn.execute(insert(deferred), waiting)
                _end(conn, write_key)  # the others: those not reported, and the empty ones
                return rows
        except IntegrityError as exc:
            self._repeated(commit_id, write_key, exc)
            return None
        except _LockWait as waited:
            raise _lock_wait_error(waited.seconds, None) from None

    @contextlib.contextmanager
    def bounded(self, lock_wait: float | None) -> Iterator[Connection]:
        """A transaction whose lock waits last `lock_wait` seconds at most (see `lock_waits`);
        a wait that reaches the bound raises `_LockWait` (the transaction rolled back)."""
        with (
            self.driver.db.sync_engine.connect() as conn,
            self.lock_waits(conn, lock_wait) as bound,
        ):
            try:
                with conn.begin():
                    if bound is not None:
                        self.lock_wait_local(conn, bound)
                    yield conn
            except DBAPIError as exc:
                if bound is not None and self.lock_timed_out(exc):
                    raise _LockWait(bound) from exc
                raise

    @contextlib.contextmanager
    def lock_waits(self, conn: Connection, seconds: float | None) -> Iterator[float | None]:
        """Bound the lock waits of `conn` (no transaction begun yet) while the block runs:
        `seconds`, or None for `LOCK_WAIT_TIMEOUT` or the database's own bound when it is
        longer; yields the bound set. Dialects override it; here (SQLite, whose writers wait
        for its one lock as the driver sets it) nothing is set and it yields None."""
        yield None

    def lock_wait_local(self, conn: Connection, seconds: float) -> None:
        """Bound the lock waits of `conn`'s transaction, which has just begun, to `seconds` (the
        bound `lock_waits` yielded), where the database sets it per transaction; here
        nothing."""

    def lock_timed_out(self, exc: DBAPIError) -> bool:
        """Whether `exc` is a lock wait that reached the bound `lock_waits` set."""
        return False

    def lock_probe(self, conn: Connection) -> None:
        """Make the lock waits of `conn`'s transaction as short as the database allows (the
        probes of `_blocking_key`; inside `lock_waits`, which restores the session)."""

    def keys_probe(
        self,
        conn: Connection,
        rows_of: Any,
        keys: Sequence[str],
        target: StageTarget | TopicTarget,
        now: datetime,
    ) -> None:
        """Take the locks that publishing the staged rows `rows_of` of dedup keys `keys` takes
        (raising the lock wait error of `lock_probe`'s bound if another transaction holds one):
        here, by publishing them (roll the transaction back)."""
        self.publish_rows(conn, and_(rows_of, staged.c.dedup_key.in_(keys)), target, now)

    def _blocking_key(
        self,
        write_key: str,
        stages: Mapping[str, int],
        target: StageTarget | TopicTarget,
        now: datetime,
    ) -> str | None:
        """The dedup key of a write (as staged) that another transaction holds, found by
        publishing the write's keys in rolled-back transactions that do not wait, in the
        commit's order, `PROBE_KEYS` at a time, then halving the set that waited; None when
        none is held any more (or the search failed: the error only names fewer things)."""
        try:
            with self.driver.db.sync_engine.connect() as conn, self.lock_waits(conn, None):
                with conn.begin():
                    numbers = _check(conn, write_key, stages, counted=True)
                    rows = write_rows(_of_attempts(numbers), True, now)
                    order = publish_order(rows, True, rows.c.dedup_key)
                    listed = select(rows.c.dedup_key).where(rows.c.dedup_key.is_not(None))
                    keys = [str(k) for k in conn.execute(listed.order_by(*order)).scalars()]

                def held(chunk: list[str]) -> bool:
                    tx = conn.begin()
                    try:
                        self.lock_probe(conn)
                        self.keys_probe(conn, _of_attempts(numbers), chunk, target, now)
                        return False
                    except DBAPIError as exc:
                        if self.lock_timed_out(exc):
                            return True
                        raise
                    finally:
                        tx.rollback()

                for start in range(0, len(keys), PROBE_KEYS):
                    chunk = keys[start : start + PROBE_KEYS]
                    if held(chunk):
                        while len(chunk) > 1:
                            half = len(chunk) // 2
                            chunk = chunk[:half] if held(chunk[:half]) else chunk[half:]
                        return chunk[0]
        except (DBAPIError, TxtasksError):
            log.warning("txtasks commit: the dedup key it waited for was not found", exc_info=True)
        return None

    def _repeated(self, commit_id: str, write_key: str, conflict: IntegrityError) -> None:
        """A commit failed on a conflict: if `commit_id` was committed before, end the
        attempts of its write (it repeats that commit), else raise the conflict."""
        if not self.commit_seen(commit_id):
            raise conflict  # not a repeated commit: a real conflict
        with self.driver.db.sync_engine.begin() as conn:
            _end(conn, write_key)

    def publish_rows(
        self,
        conn: Connection,
        rows_of: Any,
        target: StageTarget | TopicTarget,
        now: datetime,
        *,
        rows: int | None = None,
    ) -> dict[str, int]:
        """Publish the staged rows `rows_of` (a condition on the staged table) as `target`
        says: how many tasks became claimable, per queue. With `rows` (a target without
        dedup keys), each statement must read that many staged rows, else it raises `_Short`
        (roll the transaction back)."""
        if isinstance(target, TopicTarget):
            return self._publish_topic(conn, rows_of, target, now, rows)
        return self._publish_task(conn, rows_of, target, now, rows)

    async def publish(self, *, limit: int, now: datetime) -> Published | None:
        """Publish up to `limit` staged rows of one attempt of a deferred write, in one
        transaction (see `txtasks.spark.staging.publisher`); None when none waits."""
        async with self.driver.db.connect() as conn:
            probe = await conn.execute(select(deferred.c.stage).limit(1))
            if probe.first() is None:
                return None

        async def work(conn: AsyncConnection) -> Published | None:
            return await conn.run_sync(lambda c: publish_batch(self, c, limit, now))

        return await self.driver.db.in_transaction(work)

    def insert_tasks(self, conn: Connection, columns: Sequence[str], rows: Any, dedup: bool) -> int:
        """INSERT ... SELECT `rows` (of `columns`) into the hot table; with `dedup`, skipping
        rows whose dedup key a live task holds, committed before or by a transaction that this
        one waits for (no error). How many rows it inserted."""
        if dedup:
            stmt = self.driver.db.sql.upsert(tasks).from_select(columns, rows)
            stmt = stmt.on_conflict_do_nothing(
                index_elements=[tasks.c.dedup_key], index_where=tasks.c.dedup_key.is_not(None)
            )
        else:
            stmt = insert(tasks).from_select(columns, rows)
        # INSERT rowcount: not kept by default
        return int(conn.execute(stmt.execution_options(preserve_rowcount=True)).rowcount)

    def _publish_task(
        self, conn: Connection, rows_of: Any, target: StageTarget, now: datetime, rows: int | None
    ) -> dict[str, int]:
        """Publish staged rows as tasks of one task name and queue: how many, by queue."""
        if target.keyed:  # before the publish: its dedup check then sees the same tasks
            conn.execute(_stmt_hints(rows_of, target, now))
        query = _task_rows(rows_of, target, now)
        count = _read(self.insert_tasks(conn, TASK_COLUMNS, query, target.dedup), rows)
        return {target.queue: count} if count else {}

    def _publish_topic(
        self, conn: Connection, rows_of: Any, target: TopicTarget, now: datetime, rows: int | None
    ) -> dict[str, int]:
        """Fan staged rows out to the groups subscribed to its topic: how many tasks
        per queue (one statement per queue); with no group, record the rows as dropped."""
        groups = groups_lock(conn, target.topic)
        if not groups:
            dropped = _read(
                int(conn.execute(stmt_drops(rows_of, target.topic, now)).rowcount), rows
            )
            if dropped:
                log.warning(
                    "topic %s has no subscriber: the %d rows of this write are dropped and "
                    "counted (txtasks topics)",
                    target.topic,
                    dropped,
                )
            return {}
        if target.keyed:  # before the publish: its dedup check then sees the same tasks
            conn.execute(stmt_fanout_hints(rows_of, target, groups, now))
        message = uuid.uuid4().hex[:24]  # the publish id of every task of this commit
        published = {}
        for queue, members in by_queue(groups).items():
            query = fanout_rows(rows_of, target, members, message, now)
            count = self.insert_tasks(conn, COLUMNS, query, target.dedup)
            _read(count, None if rows is None else rows * len(members))
            if count:
                published[queue] = count
        return published

    async def backlog(self) -> Backlog:
        """The rows of deferred writes waiting for a publisher (counted: one index entry per
        row), how many commits they belong to, and the oldest commit's time."""
        d = deferred.c
        rows = select(func.count()).select_from(staged.join(deferred, staged.c.stage == d.stage))
        commits_ = select(func.count(d.commit_id.distinct()), func.min(d.committed_at))
        async with self.driver.db.connect() as conn:
            count = int((await conn.execute(rows)).scalar_one())
            writes_, oldest = (await conn.execute(commits_)).one()
        return Backlog(rows=count, commits=int(writes_), oldest_committed_at=oldest)

    def commit_seen(self, commit_id: str) -> bool:
        """Whether `commit_id` was committed already."""
        with self.driver.db.sync_engine.connect() as conn:
            found = conn.execute(
                select(commits.c.commit_id).where(commits.c.commit_id == commit_id)
            )
            return found.first() is not None

    async def purge(self, *, before: datetime, limit: int) -> int:
        """Delete up to `limit` staged rows no write reads: first those of ended attempts
        (`DROPPED`, whatever their age), then `staged` rows left in the hot table by txtasks
        versions before the staged table, then those of attempts that started before `before`
        (of writes that never committed or aborted; not those of a deferred commit, which wait
        for a publisher); then the attempts ended or started before `before` that have no row
        left."""

        async def work(conn: AsyncConnection) -> int:
            done = await _purge_attempts(conn, attempts.c.write_key == DROPPED, limit)
            if done < limit:
                done += await _purge_tasks(conn, before, limit - done)
            if done < limit:  # of writes that never ended, not waiting for a publisher
                waiting = exists().where(deferred.c.stage == attempts.c.id)
                abandoned = and_(attempts.c.created_at < before, ~waiting)
                done += await _purge_attempts(conn, abandoned, limit - done)
            old = or_(attempts.c.write_key == DROPPED, attempts.c.created_at < before)
            await conn.execute(delete(attempts).where(old, *_EMPTY))
            return done

        return await self.driver.db.in_transaction(work)


async def _purge_attempts(conn: AsyncConnection, which: Any, limit: int) -> int:
    """Delete up to `limit` staged rows of the attempts `which` (a condition on them), attempt
    after attempt, each batch one range of its row numbers from its lowest left (one index
    probe): an attempt numbers its rows without gaps, so the range holds no more rows than it
    is wide."""
    done = 0
    picked = select(attempts.c.id).where(which).order_by(attempts.c.id)
    for number in (await conn.execute(picked.limit(limit))).scalars():
        stage = staged.c.stage == number
        lowest = select(staged.c.n).where(stage).order_by(staged.c.n).limit(1)
        low = (await conn.execute(lowest)).scalar()
        if low is not None:
            wide = staged.c.n < low + (limit - done)
            done += int((await conn.execute(delete(staged).where(stage, wide))).rowcount)
        if done >= limit:
            break
    return done


async def _purge_tasks(conn: AsyncConnection, before: datetime, limit: int) -> int:
    """Delete up to `limit` hot rows in state `staged` created before `before`."""
    where = (tasks.c.created_at < before, tasks.c.state == STAGED)
    pick = select(tasks.c.id).where(*where).order_by(tasks.c.id).limit(limit)
    ids = list((await conn.execute(pick)).scalars())
    if not ids:
        return 0
    return int((await conn.execute(delete(tasks).where(tasks.c.id.in_(ids), *where))).rowcount)


def publish_batch(
    staging: SqlStaging, conn: Connection, limit: int, now: datetime
) -> Published | None:
    """Publish up to `limit` staged rows of one deferred attempt in `conn`'s transaction; None
    when no attempt waits that another publisher has not locked, or when the first one that
    waits has task keys and so has an earlier one that another publisher is publishing: a
    key's tasks are published write after write, so that they run in that order (the other
    publisher goes on with it)."""
    pick = (
        select(deferred.c.stage, deferred.c.target)
        .order_by(deferred.c.stage)  # the primary key: the lock stops at the row it returns
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    found = conn.execute(pick).first()
    if found is None:
        return None
    target = target_from_json(found.target)
    if target.keyed and _keyed_before(conn, found.stage):
        return None
    stage = staged.c.stage == found.stage
    first = select(staged.c.n).where(stage).order_by(staged.c.n).limit(limit).subquery()
    top, rows = conn.execute(select(func.max(first.c.n), func.count())).one()
    tasks: dict[str, int] = {}
    if rows:
        batch = and_(stage, staged.c.n <= top)
        tasks = staging.publish_rows(conn, batch, target, now)
        conn.execute(delete(staged).where(batch))
    if rows < limit:  # the attempt's last batch
        conn.execute(delete(deferred).where(deferred.c.stage == found.stage))
        conn.execute(delete(attempts).where(attempts.c.id == found.stage))
    return Published(rows=int(rows), tasks=tasks)


def _keyed_before(conn: Connection, stage: int) -> bool:
    """Whether a deferred attempt before `stage` (one that other publishers hold: the pick
    skipped it) has task keys."""
    earlier = select(deferred.c.target).where(deferred.c.stage < stage)
    return any(target_from_json(t).keyed for t in conn.execute(earlier).scalars())


def numbered(batch: Any, number: int, start: int) -> Any:
    """An Arrow table of staged rows with the attempt's number (`stage`) and each row's (`n`,
    from `start`) in front."""
    import pyarrow as pa  # type: ignore[import-untyped]

    count = batch.num_rows
    batch = batch.add_column(0, "n", pa.array(range(start, start + count), pa.int32()))
    return batch.add_column(0, "stage", pa.repeat(pa.scalar(number, pa.int64()), count))


#: The condition on the attempts for those with no staged row left and no deferred commit.
_EMPTY = (
    ~exists().where(staged.c.stage == attempts.c.id),
    ~exists().where(deferred.c.stage == attempts.c.id),
)


def _attempts_of(write_key: str) -> Any:
    """The condition on the attempts for those of a write, less those committed in deferred
    mode that wait for a publisher (a stream's earlier micro-batches)."""
    return and_(
        attempts.c.write_key == write_key, ~exists().where(deferred.c.stage == attempts.c.id)
    )


def _of_attempts(numbers: Iterable[int]) -> Any:
    """The condition on the staged table for the rows of the attempts `numbers`, written out
    in the statement (no bound value per attempt): read along the primary key, whatever the
    statistics of the attempts' table say."""
    listed: Any = bindparam("stages", sorted(numbers), expanding=True, literal_execute=True)
    return staged.c.stage.in_(listed)


def _end(conn: Connection, write_key: str) -> int:
    """End a write's attempts (`_attempts_of`): move them to `DROPPED`, whose rows no write
    reads and the purge deletes. How many attempts."""
    ended = update(attempts).where(_attempts_of(write_key)).values(write_key=DROPPED)
    return int(conn.execute(ended).rowcount)


def _lock_wait_error(seconds: float, key: str | None) -> LockWaitTimeout:
    """The error of a commit that waited `seconds` for a lock (of dedup key `key`, when known)."""
    held = f"holding dedup key {key!r} of this write" if key is not None else "holding a lock"
    return LockWaitTimeout(
        f"txtasks commit: waited {seconds:g} s for another transaction {held} (an "
        "application's enqueue that has not committed yet?) and gave up: nothing was "
        "published; raise the write's option 'lock_wait_timeout' (seconds), or end that "
        "transaction sooner"
    )


class _Short(TxtasksError):
    """A publish read fewer (or more) staged rows than the commit was given."""


def _read(count: int, rows: int | None) -> int:
    """`count`, the rows a publish statement wrote, unless it is not the `rows` it must have
    read (when given): then raise `_Short`."""
    if rows is not None and count != rows:
        raise _Short(f"{count} rows published, {rows} reported")
    return count


def _check(
    conn: Connection, write_key: str, stages: Mapping[str, int], *, counted: bool
) -> dict[int, int]:
    """Check the rows of every reported attempt (`stages`: stage id -> rows) of a write:
    `counted`, by counting them; else by a probe of each attempt's last row number, which
    must be one less than its rows (the publish's row count then checks they are all
    there). Raise `StagedRowsMissing` on the first that falls short. The reported attempts'
    numbers, with their rows."""
    a = attempts.c
    last = select(staged.c.n).where(staged.c.stage == a.id).order_by(staged.c.n.desc()).limit(1)
    listed = select(a.id, a.stage_id, last.scalar_subquery()).where(_attempts_of(write_key))
    numbers = {int(n): (stage_id, top) for n, stage_id, top in conn.execute(listed)}
    mine = {n: stage_id for n, (stage_id, _) in numbers.items() if stage_id in stages}
    per_number = {n: 0 if top is None else int(top) + 1 for n, (_, top) in numbers.items()}
    if counted:
        per_attempt = select(staged.c.stage, func.count()).where(_of_attempts(mine))
        per_number = {n: 0 for n in mine}
        for number, rows in conn.execute(per_attempt.group_by(staged.c.stage)):
            per_number[int(number)] = int(rows)
    found: dict[str, int] = {}
    for number, stage_id in mine.items():
        found[stage_id] = found.get(stage_id, 0) + per_number[number]
    for stage_id, rows in stages.items():
        if found.get(stage_id, 0) != rows:
            raise StagedRowsMissing(
                f"txtasks commit: attempt {stage_id} staged {rows} rows but "
                f"{found.get(stage_id, 0)} are left (purged as abandoned by the cleaner's "
                "archiver.staged_after, or lost by the database); nothing was published"
            )
    return {n: per_number[n] for n in mine}


def target_json(target: StageTarget | TopicTarget) -> str:
    """A publish target as the JSON a deferred commit records."""
    kind = "topic" if isinstance(target, TopicTarget) else "task"
    return json.dumps({kind: dataclasses.asdict(target)}, sort_keys=True)


def target_from_json(text: str) -> StageTarget | TopicTarget:
    """The publish target a deferred commit recorded (`target_json`)."""
    found = json.loads(text)
    if "topic" in found:
        return TopicTarget(**found["topic"])
    return StageTarget(**found["task"])


def _stmt_hints(rows_of: Any, target: StageTarget, now: datetime) -> Any:
    """INSERT ... SELECT of one key hint per task key among the rows the commit publishes at
    `now` (less those whose dedup key a live task holds), due at the key's earliest run_at (run
    it before the publish, which makes its rows live)."""
    rows = write_rows(rows_of, target.dedup, now)
    where: list[Any] = []
    if target.dedup:
        where.append(~exists().where(tasks.c.dedup_key == rows.c.dedup_key))
    queue = literal(target.queue, key_hints.c.queue.type)
    query = hints_query(queue, rows.c.partition_key, rows.c.run_at, *where, one_queue=True)
    return hints_insert(query)


#: The columns a task commit writes, in the order its SELECT gives them.
TASK_COLUMNS = (
    "queue", "task_name", "payload", "content_type", "state", "priority", "run_at", "attempt",
    "max_attempts", "created_at", "dedup_key", "partition_key",
)  # fmt: skip


def _task_rows(rows_of: Any, target: StageTarget, now: datetime) -> Any:
    """The SELECT of staged rows `rows_of` (see `write_rows`) as pending tasks
    (`TASK_COLUMNS`) created at `now`, in staging order; with dedup keys, a repeated key of the
    write only once, in key order (as an enqueue inserts keys: see `publish_order`)."""
    rows = write_rows(rows_of, target.dedup, now)
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
