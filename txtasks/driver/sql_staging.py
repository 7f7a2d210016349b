"""Staged writes: rows inserted invisible to workers, then made claimable by one commit.

A staging writer (one Spark partition attempt) inserts its rows in state `staged` under a
`stage_id` of its own, `<write key>.<random>`; a dedup key is stored as `<stage_id>/<key>` so
that attempts never collide. The commit, one transaction, records its `commit_id` in `txtasks_commits` (a second
commit of the same id changes nothing and discards what it was given), drops staged rows whose
key a live task holds (or that repeat a key within the commit), and turns the rest `pending`.
Abort deletes the staged rows. These methods are synchronous: Spark's Python workers are.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, bindparam, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from txtasks.schema.tables import commits, tasks
from txtasks.types import TaskState

STAGED = TaskState.STAGED.value
#: Rows per statement when inserting, looking up or updating staged rows.
CHUNK = 1000


def staged_key(stage_id: str, key: str) -> str:
    """The dedup key a staged row carries until its commit."""
    return f"{stage_id}/{key}"


class SqlStaging:
    """Staging queries (mixed into `SqlDriver`)."""

    if TYPE_CHECKING:

        @property
        def sync_engine(self) -> Engine: ...

    def stage_insert_sync(self, rows: Iterable[tuple[Any, ...]]) -> int:
        """Insert staged rows (tuples in `STAGED_COLUMNS` order) in one
        transaction, `CHUNK` rows at a time. No ids are returned."""
        count = 0
        with self.sync_engine.begin() as conn:
            for chunk in _chunks(rows):
                self.stage_rows(conn, chunk)
                count += len(chunk)
        return count

    def stage_rows(self, conn: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert one chunk of staged rows; dialects override with their bulk path."""
        conn.execute(insert(tasks), [dict(zip(STAGED_COLUMNS, r, strict=True)) for r in rows])

    def stage_abort_sync(self, write_key: str) -> int:
        """Delete every staged row of a write (all its stage ids start with `write_key.`)."""
        with self.sync_engine.begin() as conn:
            return _delete_staged(conn, write_key, keep=())

    def stage_commit_sync(
        self, commit_id: str, write_key: str, stage_ids: Sequence[str], *, now: datetime
    ) -> dict[str, int] | None:
        """Make the rows of `stage_ids` claimable, once per `commit_id`, and delete the other
        staged rows of the write (attempts that failed or lost a race).

        Returns how many tasks became claimable per queue, or None when `commit_id` was committed before (then
        every staged row of the write is deleted: it repeats that commit).
        """
        try:
            with self.sync_engine.begin() as conn:
                conn.execute(insert(commits).values(commit_id=commit_id, committed_at=now, tasks=0))
                published = _publish(conn, list(stage_ids))
                _delete_staged(conn, write_key, keep=stage_ids)
                count = sum(published.values())
                conn.execute(
                    update(commits).where(commits.c.commit_id == commit_id).values(tasks=count)
                )
                return published
        except IntegrityError:
            if not self.commit_seen_sync(commit_id):
                raise  # not a repeated commit: a real conflict
            with self.sync_engine.begin() as conn:
                _delete_staged(conn, write_key, keep=())
            return None

    def commit_seen_sync(self, commit_id: str) -> bool:
        """Whether `commit_id` was committed already."""
        with self.sync_engine.connect() as conn:
            found = conn.execute(
                select(commits.c.commit_id).where(commits.c.commit_id == commit_id)
            )
            return found.first() is not None


#: The columns a staged row sets, in the order of the tuples `stage_insert_sync` takes.
STAGED_COLUMNS = (
    "queue",
    "task_name",
    "payload",
    "content_type",
    "state",
    "priority",
    "run_at",
    "attempt",
    "max_attempts",
    "created_at",
    "dedup_key",
    "headers",
    "expires_at",
    "stage_id",
)


def _chunks(rows: Iterable[tuple[Any, ...]]) -> Iterator[tuple[tuple[Any, ...], ...]]:
    iterator = iter(rows)
    while chunk := tuple(itertools.islice(iterator, CHUNK)):
        yield chunk


def _delete_staged(conn: Connection, write_key: str, keep: Sequence[str]) -> int:
    """Delete the staged rows of a write, except those of the stage ids in `keep`."""
    query = delete(tasks).where(tasks.c.stage_id.like(f"{write_key}.%"), tasks.c.state == STAGED)
    if keep:
        query = query.where(tasks.c.stage_id.not_in(list(keep)))
    return int(conn.execute(query).rowcount)


def _publish(conn: Connection, stage_ids: list[str]) -> dict[str, int]:
    """Turn the staged rows pending (dedup applied); how many per queue."""
    counts: Counter[str] = Counter()
    keyed: list[Any] = []
    for start in range(0, len(stage_ids), CHUNK):
        chunk = stage_ids[start : start + CHUNK]
        mine = tasks.c.stage_id.in_(chunk) & (tasks.c.state == STAGED)
        per_queue = select(tasks.c.queue, func.count()).where(mine).group_by(tasks.c.queue)
        counts.update({queue: int(n) for queue, n in conn.execute(per_queue).all()})
        with_keys = (
            select(tasks.c.id, tasks.c.queue, tasks.c.dedup_key, tasks.c.stage_id)
            .where(mine, tasks.c.dedup_key.is_not(None))
            .order_by(tasks.c.id)
            .with_for_update()
        )
        keyed.extend(conn.execute(with_keys).all())
        conn.execute(
            update(tasks)
            .where(mine, tasks.c.dedup_key.is_(None))
            .values(state=TaskState.PENDING.value, stage_id=None)
        )
    keys = {r.id: r.dedup_key[len(r.stage_id) + 1 :] for r in keyed}
    drop = set(_duplicates(conn, keys))
    if drop:
        ordered = sorted(drop)
        for start in range(0, len(ordered), CHUNK):
            conn.execute(delete(tasks).where(tasks.c.id.in_(ordered[start : start + CHUNK])))
        counts.subtract(Counter(r.queue for r in keyed if r.id in drop))
    published = [{"b_id": i, "b_key": k} for i, k in keys.items() if i not in drop]
    if published:
        conn.execute(
            update(tasks)
            .where(tasks.c.id == bindparam("b_id"))
            .values(state=TaskState.PENDING.value, stage_id=None, dedup_key=bindparam("b_key")),
            published,
        )
    return {queue: n for queue, n in counts.items() if n > 0}


def _duplicates(conn: Connection, keyed: dict[int, str]) -> list[int]:
    """Staged rows (ids) whose key a live task holds, or an earlier staged row repeats."""
    first: dict[str, int] = {}
    drop = []
    for task_id, key in sorted(keyed.items()):
        if key in first:
            drop.append(task_id)
        else:
            first[key] = task_id
    keys = list(first)
    for start in range(0, len(keys), CHUNK):
        chunk = keys[start : start + CHUNK]
        taken = conn.execute(select(tasks.c.dedup_key).where(tasks.c.dedup_key.in_(chunk)))
        drop.extend(first[k] for k in taken.scalars())
    return sorted(drop)
